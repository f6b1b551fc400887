// Training data of a learned selector (docs/design.md §2.8, docs/learned.md): what the frozen model
// computes on real text, per chosen layer — the selector inputs (x_k of every position, x_q of
// sampled query positions) and the dense attention at those queries as targets — collected by
// one dense prefill per sequence and streamed to one file per layer.
//
// The activation file (little-endian; one layer; written by ActivationWriter, read back by
// read_activations):
//   8 bytes "MKVACT01", then 12 u32: input (0 qk, 1 hidden), layer, groups (of the targets:
//   1 = mean over all q heads, n_head_kv = mean over each kv group's q heads), q_width, k_width,
//   n_head_kv, page_size, budget_den (the Quest masses are at budget 1/budget_den), n_layer,
//   n_embd, n_head, head_dim; then records, each a u32 tag:
//   'S' u32 length                      a sequence starts; its key rows follow in order
//   'K' u32 pos0, u32 n, f32[n][k_width] key-side inputs of positions pos0 .. pos0+n-1
//   'Q' u32 pos, f32[q_width] x_q, f32[n_head_kv] quest, f32[groups][pos + 1] target
//                                       a sampled query of the current sequence (its keys up
//                                       to pos came before it; positions ascending)
//   'E'                                 end: a file without it is truncated
// qk: x_q = q [n_head][head_dim], x_k = k [n_head_kv][head_dim] after QK-norm and RoPE (as
// attention scores them); hidden: x_q = x_k = the attention input after the attention norm
// [n_embd]. target = the model's softmax attention of the query over the causal prefix 0..pos
// (f64, from the same captured f32 q and k; scale ModelConfig::attn_scale), averaged over the
// group's q heads. quest[g] = the mass of kv group g's mean attention inside the pages the Quest
// page bound selects for that group at the budget (select::page_upper_bounds +
// select_topk_pages: max over the group's heads, the last page kept; page_size, 1/budget_den
// of the prefix's pages, at least one), the training-free baseline of the report.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "masskv/learn/selector.hpp"
#include "masskv/model/model.hpp"

namespace masskv::learn {

struct ActivationHeader {
  Input input = Input::qk;
  int layer = 0;
  int groups = 1;
  int q_width = 0, k_width = 0;
  int n_head_kv = 0;
  int page_size = 16;
  int budget_den = 16;
  int n_layer = 0, n_embd = 0, n_head = 0, head_dim = 0;
};

struct ActivationSequence {
  std::int64_t length = 0;
  std::vector<float> keys;  // [length][k_width]
};

struct ActivationQuery {
  int seq = 0;  // index into LayerActivations::sequences
  std::int64_t pos = 0;
  std::vector<float> x;       // [q_width]
  std::vector<float> quest;   // [n_head_kv]
  std::vector<float> target;  // [groups][pos + 1]

  std::span<const float> target_of(int group) const {
    const auto n = static_cast<std::size_t>(pos + 1);
    return {target.data() + static_cast<std::size_t>(group) * n, n};
  }
};

struct LayerActivations {
  ActivationHeader header;
  std::vector<ActivationSequence> sequences;
  std::vector<ActivationQuery> queries;  // in file order: by sequence, then position
};

// Streams one layer's file; records must come in the documented order (checked: Error
// invalid_argument naming the record's argument). It writes `path`.part and close() writes 'E'
// and renames it to `path`, so `path` exists only complete; a writer destroyed without close()
// leaves the .part file.
class ActivationWriter {
 public:
  ActivationWriter(const std::string& path, const ActivationHeader& header);
  ~ActivationWriter();
  ActivationWriter(const ActivationWriter&) = delete;
  ActivationWriter& operator=(const ActivationWriter&) = delete;

  void begin_sequence(std::int64_t length);
  void keys(std::int64_t pos0, int n, std::span<const float> rows);  // [n][k_width]
  void query(std::int64_t pos, std::span<const float> x, std::span<const float> quest,
             std::span<const float> target);
  void close();

 private:
  void put(const void* data, std::size_t bytes);
  std::string part_path() const { return path_ + ".part"; }
  std::string path_;
  ActivationHeader header_;
  std::FILE* file_ = nullptr;
  std::int64_t length_ = -1, keys_seen_ = 0, last_query_ = -1;
};

// Reads a whole file. Throws Error(io, "path") for I/O and Error(invalid_argument, "path") for
// a malformed or truncated file.
LayerActivations read_activations(const std::string& path);
// The header only, without the records (cheap; for reuse checks).
ActivationHeader read_activation_header(const std::string& path);

// What to collect. groups is 1 or the model's n_head_kv; every layer must exist.
struct CollectConfig {
  std::vector<int> layers;
  Input input = Input::qk;
  int groups = 1;
  int queries = 128;            // sampled query positions per sequence (fewer if it is short)
  std::int64_t min_prefix = 64; // queries sit at positions >= min_prefix
  std::uint64_t seed = 0;
  int page_size = 16;  // of the Quest masses
  int budget_den = 16;
};

// Query positions of a sequence of `length` tokens: `count` distinct positions in
// [min_prefix, length), drawn with density proportional to the position (long prefixes are
// where selection matters), ascending; fewer when the range is smaller than count.
std::vector<std::int64_t> sample_query_positions(std::int64_t length, int count,
                                                 std::int64_t min_prefix, std::uint64_t seed);

// `count` windows of `tokens` tokens each from a long text, starting at paragraph starts spread
// evenly over it (the windows of eval's real-text haystacks, eval/haystack.hpp); the tokenizer
// adds its default BOS. Throws Error(invalid_argument, "text") when the text is too short.
std::vector<std::vector<model::TokenId>> text_sequences(const model::Tokenizer& tokenizer,
                                                        std::string_view text, int count,
                                                        std::int64_t tokens);

// The file of `layer` under `dir` (dir/layerNN.mkva).
std::string activation_path(const std::string& dir, int layer);

// Prefills each sequence densely (SessionOptions::capture), computes the targets and the Quest
// masses, and writes dir/layerNN.mkva per layer (the directory must exist). Memory: the model's
// keys of the chosen layers for one sequence, never the files. progress(tokens done, total).
// Throws Error(invalid_argument, "layers"/"groups"/"queries"/"sequences") for bad settings.
void collect_activations(const model::Model& model,
                         std::span<const std::vector<model::TokenId>> sequences,
                         const CollectConfig& config, const std::string& dir,
                         const std::function<void(std::int64_t, std::int64_t)>& progress = {});

}  // namespace masskv::learn
