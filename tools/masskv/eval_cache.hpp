// `masskv eval`'s results cache (eval.cpp): one JSON record a line per (model, task, length,
// seed, sample, method, budget, settings), the keys that name them, the file that keeps them
// whole through kills.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "eval_rows.hpp"
#include "masskv/line_file.hpp"

namespace masskv::cli {

struct SampleId {
  std::string task;
  std::int64_t length;
  int index;
  std::uint64_t seed;  // the sample's own seed, derived from --seed
};

// The sample's own seed, from --seed and its place.
std::uint64_t sample_seed(std::uint64_t seed, const std::string& task, std::int64_t length,
                          int index);

struct Record {
  std::string model, task, method, budget, output;
  std::string protocol = "strict";  // eval::Protocol's name
  std::int64_t length = 0;
  int index = 0, steps = 0;
  std::uint64_t seed = 0;
  double score = 0, kv_read = 1, delta_bound = 0, certified = 1, decode_seconds = 0,
         prefill_seconds = 0, prefill_kv_read = 1, fresh_select = 1, selector_read = 0;
  std::vector<std::string> answers;
};

void to_json(nlohmann::json& j, const Record& r);
void from_json(const nlohmann::json& j, Record& r);

// FNV-1a 64 of a file's bytes (hex): the learned rows' key names the selector they ran.
std::string file_hash(const std::string& path);

// The settings a row's results depend on: the run's tag; for entmax rows the conversion file's
// hash, for learned rows the selector file's hash and its key cache format.
// Sparse prefill rows add their fixed settings (query block, sink blocks, budget floor).
struct RowTags {
  std::string settings, selector, conversion;
  std::string two_stage;  // its candidate factor: other settings never share its results
  // The page codes' definition (kv/page_codes.hpp) in the rows that score on them: results of
  // an earlier definition (f32 ranges, f64 per-channel scores) are never reused.
  std::string codes = "|codes8";
};

// A row's tag: RowTags' parts its results depend on, and the protocol.
std::string row_tag(const MethodRow& m, const RowTags& t);
// A record's key in the cache (token_codes' rules in one spelling each).
std::string record_key(const std::string& model, const SampleId& s, const MethodRow& m,
                       const std::string& tag);
// Throws Error naming the field of a record out of its range or of an unknown method/budget.
void check_record(const Record& r);

// The results of every run, one JSON record a line (docs/eval.md). LineFile keeps it whole: a
// run killed mid-write loses at most the record it was writing, never one written before or
// after it.
class ResultCache {
 public:
  // Reads the file (a line that does not load is skipped with a warning; a torn last line is
  // removed, or written again whole if it was a whole record missing its newline).
  explicit ResultCache(std::filesystem::path path);
  const Record* find(const std::string& key) const;
  // Appends the record (one whole line) and keys it under `settings`; thread-safe.
  void add(Record r, const std::string& settings);
  std::size_t size() const { return entries_.size(); }

 private:
  static std::string key_of(const Record& r, const std::string& tag);
  // Adds the record of one line; nullopt if it was read, else why not.
  std::optional<std::string> load(const std::string& line);
  LineFile file_;
  std::map<std::string, Record> entries_;
  std::mutex mutex_;
};


}  // namespace masskv::cli
