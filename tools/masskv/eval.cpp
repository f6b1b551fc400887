// `masskv eval`: RULER-style tasks on a real model, dense against every selector at matched KV
// budgets (issue 6). Work is cached per (model, task, length, seed, sample, method, budget) in
// a JSON-lines file, so a stopped run resumes and a widened run reuses what it has.
#include <fmt/core.h>
#include <fmt/os.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/eval/runner.hpp"
#include "masskv/eval/tasks.hpp"
#include "masskv/learn/conversion.hpp"
#include "masskv/learn/project.hpp"
#include "masskv/line_file.hpp"
#include "masskv/model/locate.hpp"
#include "model_options.hpp"
#include "parse.hpp"
#include "plots.hpp"
#include "progress.hpp"
#include "text.hpp"

namespace masskv::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct EvalOptions {
  std::string model = "smollm2";
  bool full = false;
  bool quick = false;  // the default; the flag exists for explicitness
  std::vector<std::string> tasks, lengths, methods, budgets;  // empty: the preset's
  std::vector<std::string> protocols{"standard", "strict"};   // eval::Protocol names
  int samples = 0;                                            // 0: the preset's
  std::uint64_t seed = 1;
  int threads = 0;
  int workers = 0;  // samples at once (0: one per thread)
  int batch = 0;    // configurations per decode step (0: all of a sample's)
  std::string out_dir = "out/eval";
  std::string cache;  // default <out_dir>/cache.jsonl
  std::string text;   // default: the Debian Policy Manual
  int page_size = 16;
  int sink_pages = 1;
  int window = 0;
  double top_p_mass = 0.95;
  int candidate_factor = 8;  // two_stage
  double entmax_alpha = 1.5;
  std::string selector_file;  // the `learned` method's selector
  std::string selector_key_format = "f32";
  bool alpha_given = false;
  // --entmax-conversion: the entmax rows run the converted model (its α and temperatures).
  std::string entmax_conversion;
  std::vector<float> temperature;  // loaded from it; empty: no conversion
  std::uint64_t conversion_hash = 0;
  bool conversion_identity = false;  // a `convert --identity` file: t = 1, not converted
  bool plots = true;
  bool report_only = false;  // tables from the cache alone; missing results stay missing
  bool dry_run = false;
};

// --quick (default) and --full. The quick suite is sized to finish in minutes on 2 cores; its
// intervals are too wide for 1-point claims (the targets are judged on --full).
struct Preset {
  std::vector<std::string> tasks, lengths, methods, budgets;
  int samples;
};

Preset quick_preset() {
  // The tasks on which SmolLM2-135M's dense decode is well above chance at 1K-2K: a sparse
  // method can only show a loss where dense has something to lose (vt, cwe and qa_text are
  // near 0 for dense at this model size; they stay in --full).
  // Both protocols (EvalOptions::protocols): dense, the oracle, Quest and the default selector
  // (token_codes, chosen on the development split: docs/results/dev-selection-smollm2/); the
  // other selectors and the entmax rows are in --full.
  return {{"niah_single_number", "niah_multikey", "niah_multivalue", "niah_single_uuid"},
          {"1K", "2K"},
          {"dense", "oracle", "quest", "token_codes"},
          {"1/16"},
          3};
}

Preset full_preset(const std::string& model) {
  std::vector<std::string> tasks;
  for (const eval::TaskInfo& t : eval::tasks()) tasks.emplace_back(t.name);
  return {tasks,
          model == "gemma3" ? std::vector<std::string>{"1K", "2K", "4K", "8K", "16K", "32K"}
                            : std::vector<std::string>{"1K", "2K", "4K", "8K"},
          {"dense", "oracle", "quest", "token_codes", "two_stage", "sink_recent", "top_p", "dense_entmax",
           "entmax_support", "gaussian_tau"},
          {"1/32", "1/16", "1/8", "256"},
          20};
}

// ---- methods --------------------------------------------------------------------------------

// A row of the report: a decode method at a budget. Dense rows have budget "-".
struct MethodRow {
  std::string method, budget;
  bool entmax = false;  // entmax attention: converted with --entmax-conversion, else plain
  eval::Protocol protocol = eval::Protocol::strict;
};

// "quest@8": quest with each layer's selection reused for 8 decode steps
// (SessionOptions::reselect_every); "quest@8c0.9" also selects again when a q head's query
// turns further than cos 0.9 from the selection's (reselect_cos). Before the '@', "+MOD"
// modifiers set a selector option (kModifiers): "oracle+tokens", "two_stage+pages".
struct Reselect {
  std::string method;             // the base method, without modifiers
  std::vector<std::string> mods;  // its modifiers, in the order written
  int every = 1;
  double min_cos = -1;
};

struct Modifier {
  std::string_view name, method, help;
  void (*apply)(select::SelectorConfig&);
};
const Modifier kModifiers[] = {
    {"tokens", "oracle", "the oracle's top tokens in place of its top pages",
     [](select::SelectorConfig& c) { c.oracle_tokens = true; }},
    {"pages", "two_stage", "whole pages ranked by their best token in place of single tokens",
     [](select::SelectorConfig& c) { c.two_stage_pages = true; }},
    {"keys", "two_stage", "the candidates' tokens on their stored keys, a reference for the codes",
     [](select::SelectorConfig& c) { c.scorer = "token_keys"; }},
    {"all", "two_stage", "every page a candidate, no page stage: a reference",
     [](select::SelectorConfig& c) { c.candidate_factor = 1 << 20; }},
    {"mean", "two_stage", "candidate pages by q·mu, the page mean, in place of the bound",
     [](select::SelectorConfig& c) { c.two_stage_pages_by = select::TwoStagePages::mean; }},
    {"gauss", "two_stage", "candidate pages by q·mu + v/2, the Gaussian page model",
     [](select::SelectorConfig& c) { c.two_stage_pages_by = select::TwoStagePages::gauss; }},
    {"rescore", "two_stage", "the codes' best 2 × the free budget rescored on their stored keys",
     [](select::SelectorConfig& c) { c.rescore_factor = 2; }},
    {"lse", "token_codes",
     "one ranking per kv group: the max over its q heads of each head's log-probability, no "
     "round robin (token_codes' default since 2026-12-06; rows keyed as before)",
     [](select::SelectorConfig& c) { c.group = select::GroupRule::log_prob; }},
    {"rr", "token_codes", "the q heads' round robin (each head in turn takes its best token): "
     "token_codes' rule before 2026-12-06",
     [](select::SelectorConfig& c) { c.group = select::GroupRule::union_heads; }},
    // Any selector (method ""): the first layers dense, counted in the budget.
    {"dense1", "", "the first layer decodes densely, its reads counted in the budget",
     [](select::SelectorConfig& c) { c.dense_layers = 1; }},
    {"dense2", "", "the first two layers decode densely, counted in the budget",
     [](select::SelectorConfig& c) { c.dense_layers = 2; }},
};

// "oracle+tokens (the oracle's top tokens ...), ...": --methods' help, from the table.
std::string modifier_help() {
  std::string out;
  for (const Modifier& m : kModifiers) {
    out += fmt::format("{}{}+{} ({})", out.empty() ? "" : ", ", m.method.empty() ? "METHOD" : m.method,
                       m.name, m.help);
  }
  return out;
}

const Modifier& modifier_of(const std::string& spec, const std::string& base,
                            const std::string& mod) {
  for (const Modifier& m : kModifiers) {
    if (m.name != mod) continue;
    require(m.method.empty() || m.method == base, ErrorCode::invalid_argument, "--methods", "'",
            spec, "': +", mod, " applies to ", m.method, " only");
    require(!m.method.empty() || (base != "dense" && base != "dense_entmax" &&
                                  base.rfind("prefill_", 0) != 0),
            ErrorCode::invalid_argument, "--methods", "'", spec, "': +", mod,
            " applies to decode selectors (not dense or sparse prefill rows)");
    return m;
  }
  std::string known;
  for (const Modifier& m : kModifiers)
    known += fmt::format(" {}+{}", m.method.empty() ? "METHOD" : m.method, m.name);
  fail(ErrorCode::invalid_argument, "--methods", "'", spec, "': unknown modifier '+", mod,
       "' (known:", known, ")");
}

Reselect split_reselect(const std::string& m) {
  const auto at = m.find('@');
  Reselect r{m.substr(0, at), {}, 1, -1};
  for (auto plus = r.method.rfind('+'); plus != std::string::npos; plus = r.method.rfind('+')) {
    r.mods.insert(r.mods.begin(), r.method.substr(plus + 1));
    r.method.resize(plus);
  }
  for (const std::string& mod : r.mods) (void)modifier_of(m, r.method, mod);
  if (at == std::string::npos) return r;
  r.every = 0;
  const std::string rest = m.substr(at + 1);
  const char* const end = rest.data() + rest.size();
  const auto [p, ec] = std::from_chars(rest.data(), end, r.every);
  bool ok = ec == std::errc() && r.every >= 1;
  if (ok && p != end) {
    const std::string c(p + 1, end);
    char* stop = nullptr;
    r.min_cos = std::strtod(c.c_str(), &stop);
    ok = *p == 'c' && !c.empty() && stop == c.c_str() + c.size() && r.min_cos >= -1 &&
         r.min_cos <= 1;
  }
  require(ok, ErrorCode::invalid_argument, "--methods", "'", m,
          "': write METHOD@R or METHOD@RcCOS (R decode steps >= 1, COS in [-1, 1])");
  return r;
}
std::string base_method(const std::string& m) { return split_reselect(m).method; }

bool is_dense(const std::string& m) { return m == "dense" || m == "dense_entmax"; }
// Sparse prefill rows (docs/prefill.md): the context prefilled sparsely, decode dense.
bool is_prefill(const std::string& m) { return m.rfind("prefill_", 0) == 0; }
// Methods a top-p budget ("p0.9") applies to: those with a page mass estimate.
bool takes_top_p(const std::string& m) {
  return m == "learned" || m == "top_p" || m == "oracle" || m == "quest";
}
bool needs_entmax(const std::string& m) {
  return m == "dense_entmax" || m == "entmax_support" || m == "gaussian_tau";
}

std::vector<MethodRow> method_rows(const std::vector<std::string>& methods,
                                   const std::vector<std::string>& budgets,
                                   const std::vector<eval::Protocol>& protocols) {
  std::vector<MethodRow> rows;
  for (const eval::Protocol protocol : protocols) {
  for (const std::string& m : methods) {
    const std::string base = split_reselect(m).method;
    require(m.find('@') == std::string::npos || (!is_dense(base) && !is_prefill(base)),
            ErrorCode::invalid_argument, "--methods", "'", m,
            "': @R (reuse a selection) applies to decode selectors only");
    if (is_prefill(base)) {
      (void)parse_prefill_row(base, "--methods");
    } else if (!is_dense(base)) {
      (void)select::parse_method(base, "--methods");
    }
    if (is_dense(base)) {
      rows.push_back({m, "-", needs_entmax(base), protocol});
      continue;
    }
    for (const std::string& b : budgets) {
      if (is_top_p_budget(b) && !takes_top_p(base)) continue;  // no mass estimate to stop on
      if (is_top_p_budget(b) && is_prefill(base)) continue;
      rows.push_back({m, b, needs_entmax(base), protocol});
    }
  }
  }
  return rows;
}

eval::DecodeConfig decode_config(const MethodRow& row, std::int64_t length, const EvalOptions& o) {
  eval::DecodeConfig c;
  c.protocol = row.protocol;
  c.mapping = row.entmax ? Mapping::entmax(o.entmax_alpha) : Mapping::softmax();
  if (row.entmax) c.score_multipliers = o.temperature;
  if (is_dense(row.method)) return c;
  if (const auto pf = parse_prefill_row(row.method, "--methods")) {
    c.prefill = *pf;
    c.prefill.budget = parse_prefill_budget(row.budget, "--budgets");
    return c;
  }
  const Reselect rs = split_reselect(row.method);
  c.reselect_every = rs.every;
  c.reselect_cos = rs.min_cos;
  select::SelectorConfig s;
  s.method = select::parse_method(rs.method, "--methods");
  s.mapping = c.mapping;
  s.sink_pages = o.sink_pages;
  s.window_tokens = o.window;
  s.candidate_factor = o.candidate_factor;
  s.budget = parse_budget(row.budget, length, "--budgets");
  for (const std::string& mod : rs.mods) modifier_of(row.method, rs.method, mod).apply(s);
  const bool fixed = s.budget.kind == select::Budget::Kind::fixed;
  switch (s.method) {
    case select::Method::top_p:
      if (fixed) {  // the budget is the cap of --top-p-mass
        s.budget.kind = select::Budget::Kind::top_p;
        s.budget.p = o.top_p_mass;
      }
      break;
    case select::Method::entmax_support:
    case select::Method::gaussian_tau:
      s.budget.kind = select::Budget::Kind::adaptive;
      break;
    default:
      break;
  }
  c.selector = s;
  return c;
}

std::string attention_label(const MethodRow& row, const EvalOptions& o) {
  if (!row.entmax) return "softmax";
  return o.temperature.empty()
             ? fmt::format("entmax{:g} on a softmax-trained model", o.entmax_alpha)
         : o.conversion_identity ? fmt::format("entmax{:g}, t = 1 (unconverted)", o.entmax_alpha)
                                 : fmt::format("converted entmax{:g}", o.entmax_alpha);
}

// ---- the cache ------------------------------------------------------------------------------

struct SampleId {
  std::string task;
  std::int64_t length;
  int index;
  std::uint64_t seed;  // the sample's own seed, derived from --seed
};

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t sample_seed(std::uint64_t seed, const std::string& task, std::int64_t length,
                          int index) {
  std::uint64_t h = mix(seed);
  for (const char c : task) h = mix(h ^ static_cast<unsigned char>(c));
  h = mix(h ^ static_cast<std::uint64_t>(length));
  return mix(h ^ static_cast<std::uint64_t>(index));
}

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

void to_json(json& j, const Record& r) {
  j = json{{"model", r.model},
           {"task", r.task},
           {"length", r.length},
           {"index", r.index},
           {"seed", r.seed},
           {"method", r.method},
           {"budget", r.budget},
           {"protocol", r.protocol},
           {"score", r.score},
           {"output", r.output},
           {"answers", r.answers},
           {"steps", r.steps},
           {"kv_read", r.kv_read},
           {"delta_bound", r.delta_bound},
           {"certified", r.certified},
           {"decode_seconds", r.decode_seconds},
           {"prefill_seconds", r.prefill_seconds},
           {"prefill_kv_read", r.prefill_kv_read},
           {"fresh_select", r.fresh_select},
           {"selector_read", r.selector_read}};
}

void from_json(const json& j, Record& r) {
  j.at("model").get_to(r.model);
  j.at("task").get_to(r.task);
  j.at("length").get_to(r.length);
  j.at("index").get_to(r.index);
  j.at("seed").get_to(r.seed);
  j.at("method").get_to(r.method);
  j.at("budget").get_to(r.budget);
  j.at("score").get_to(r.score);
  j.at("output").get_to(r.output);
  j.at("answers").get_to(r.answers);
  j.at("steps").get_to(r.steps);
  j.at("kv_read").get_to(r.kv_read);
  j.at("delta_bound").get_to(r.delta_bound);
  j.at("certified").get_to(r.certified);
  j.at("decode_seconds").get_to(r.decode_seconds);
  j.at("prefill_seconds").get_to(r.prefill_seconds);
  r.prefill_kv_read = j.value("prefill_kv_read", 1.0);  // older caches: dense prefill
  r.fresh_select = j.value("fresh_select", 1.0);        // older caches: no reuse
  r.protocol = j.value("protocol", std::string("strict"));  // older caches: the only protocol
  r.selector_read = j.value("selector_read", 0.0);          // older caches: not counted
}

// Everything that changes a result is in the key: the page size, the kept pages and the
// selector parameters too, so a run with other settings never reads stale entries.
std::string settings_tag(const EvalOptions& o) {
  return fmt::format("p{}s{}w{}tp{:g}a{:g}", o.page_size, o.sink_pages, o.window, o.top_p_mass,
                     o.entmax_alpha);
}

// The conversion file's hash, in the entmax rows' keys only: another fit never reads their
// results, and the softmax rows of a run with a conversion reuse those of a run without.
std::string conversion_tag(const EvalOptions& o) {
  return o.temperature.empty() ? std::string() : fmt::format("c{:016x}", o.conversion_hash);
}

// FNV-1a 64 of a file's bytes: the learned rows' key names the selector they ran, so a new
// selector file never reuses old results.
std::string file_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), ErrorCode::io, "--selector-file", "cannot read ", path);
  std::uint64_t h = 0xcbf29ce484222325ULL;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h = (h ^ static_cast<unsigned char>(buf[i])) * 0x100000001b3ULL;
    }
  }
  return fmt::format("{:016x}", h);
}

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

std::string row_tag_of_protocol(const MethodRow& m, const RowTags& t) {
  if (m.entmax) return t.settings + t.conversion;
  if (base_method(m.method) == "two_stage") return t.settings + t.two_stage + t.codes;
  if (base_method(m.method) == "token_codes") {
    // Rows of plain "token_codes" written before its default rule became log_prob are the
    // round robin's (now "token_codes+rr", record_key): the default's rows carry "|lp".
    const std::vector<std::string>& mods = split_reselect(m.method).mods;
    const bool explicit_rule = std::find(mods.begin(), mods.end(), "lse") != mods.end() ||
                               std::find(mods.begin(), mods.end(), "rr") != mods.end();
    return t.settings + t.codes + (explicit_rule ? "" : "|lp");
  }
  if (is_prefill(m.method)) {
    const select::PrefillSelectConfig c;
    const std::string pf =
        fmt::format("{}|pfq{}s{}m{}", t.settings, c.q_block, c.sink_blocks, c.budget.min_keys);
    return m.method.rfind("prefill_learned", 0) == 0 ? pf + t.selector : pf;
  }
  return base_method(m.method) == "learned" ? t.settings + t.selector : t.settings;
}

std::string row_tag(const MethodRow& m, const RowTags& t) {
  // Strict rows keep the keys of caches written before the standard protocol existed.
  const std::string proto = m.protocol == eval::Protocol::standard ? "|standard" : "";
  return row_tag_of_protocol(m, t) + proto;
}

std::string record_key(const std::string& model, const SampleId& s, const MethodRow& m,
                       const std::string& tag) {
  // token_codes' rule in one spelling: "+rr" is what plain "token_codes" meant before its
  // default became log_prob (those rows have no "|lp" in their tag), and the default's rows
  // ("|lp") are "+lse"'s. So each rule finds every row computed under it, whatever its name.
  std::string method = m.method, t = tag;
  if (base_method(method) == "token_codes") {
    const auto at = method.find("+rr");
    if (at != std::string::npos &&
        (at + 3 == method.size() || method[at + 3] == '+' || method[at + 3] == '@'))
      method.erase(at, 3);
    if (const auto lp = t.find("|lp"); lp != std::string::npos) {
      t.erase(lp, 3);
      method.insert(std::string_view("token_codes").size(), "+lse");
    }
  }
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", model, s.task, s.length, s.seed, s.index, method,
                     m.budget, t);
}

// A record's values in their ranges and its method and budget ones this build knows: a
// hand-edited or foreign line (a score of 7 showed as 700 % accuracy) is refused on load, as
// an unreadable line is. Throws Error naming the field.
void check_record(const Record& r) {
  const auto unit = [](double v, const char* field) {
    require(std::isfinite(v) && v >= 0 && v <= 1, ErrorCode::invalid_argument, field,
            "must be in [0, 1], got ", v);
  };
  unit(r.score, "score");
  unit(r.kv_read, "kv_read");
  unit(r.delta_bound, "delta_bound");
  unit(r.certified, "certified");
  unit(r.prefill_kv_read, "prefill_kv_read");
  unit(r.fresh_select, "fresh_select");
  for (const double s : {r.decode_seconds, r.prefill_seconds}) {
    require(std::isfinite(s) && s >= 0, ErrorCode::invalid_argument, "seconds",
            "must be finite and >= 0, got ", s);
  }
  require(r.length > 0 && r.index >= 0 && r.steps >= 0, ErrorCode::invalid_argument, "length",
          "length > 0, index >= 0 and steps >= 0 expected");
  (void)eval::parse_protocol(r.protocol, "protocol");
  const std::string base = base_method(r.method);  // throws on a malformed @R
  if (is_dense(base)) {
    require(r.budget == "-", ErrorCode::invalid_argument, "budget", "dense rows have '-'");
  } else if (is_prefill(base)) {
    (void)parse_prefill_row(base, "method");
    (void)parse_prefill_budget(r.budget, "budget");
  } else {
    (void)select::parse_method(base, "method");
    (void)parse_budget(r.budget, r.length, "budget");
  }
}

// The results of every run, one JSON record a line (docs/eval.md). LineFile keeps it whole: a
// run killed mid-write loses at most the record it was writing, never one written before or
// after it.
class ResultCache {
 public:
  explicit ResultCache(fs::path path) : file_(std::move(path), "--cache") {
    const std::string name = file_.path().string();
    std::size_t lineno = 0;
    for (const std::string& line : file_.lines()) {
      ++lineno;
      if (line.empty()) continue;
      if (const auto why = load(line)) {
        fmt::print(stderr, "masskv eval: warning: {}:{}: cache line skipped ({})\n", name,
                   lineno, *why);
      }
    }
    if (const std::string& tail = file_.torn_tail(); !tail.empty()) {
      // A whole record that lost only its newline is kept (written again, whole); anything
      // else was a record cut by a kill: it is dropped from the file, the rest is intact.
      if (!load(tail)) {
        file_.append(tail);
      } else {
        fmt::print(stderr,
                   "masskv eval: warning: {}: its last line was cut off ({} bytes, a run killed "
                   "mid-write): removed; that result will be computed again\n",
                   name, tail.size());
      }
    }
  }

  const Record* find(const std::string& key) const {
    const auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }

  void add(Record r, const std::string& settings) {
    std::lock_guard<std::mutex> lock(mutex_);
    json j = r;
    j["settings"] = settings;
    // Model outputs may end inside a UTF-8 character (generation stops at a token boundary):
    // such bytes are written as U+FFFD rather than failing the run.
    file_.append(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    entries_[key_of(r, settings)] = std::move(r);
  }

  std::size_t size() const { return entries_.size(); }

 private:
  static std::string key_of(const Record& r, const std::string& tag) {
    return record_key(r.model, {r.task, r.length, r.index, r.seed}, {r.method, r.budget, false},
                      tag);
  }
  // Adds the record of one line; nullopt if it was read, else why not.
  std::optional<std::string> load(const std::string& line) {
    try {
      const json j = json::parse(line);
      Record r = j.get<Record>();
      check_record(r);
      entries_[key_of(r, j.value("settings", std::string()))] = std::move(r);
      return std::nullopt;
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  }
  LineFile file_;
  std::map<std::string, Record> entries_;
  std::mutex mutex_;
};

// ---- the report -----------------------------------------------------------------------------

// Wilson score interval of a mean score over n samples at 95% (scores in [0, 1]; for partial
// scores it treats the mean as a proportion: an approximation, said in docs/eval.md).
std::pair<double, double> wilson(double mean, double n) {
  if (n <= 0) return {0, 1};
  const double z = 1.959963984540054, z2 = z * z;
  const double centre = (mean + z2 / (2 * n)) / (1 + z2 / n);
  const double half = z / (1 + z2 / n) * std::sqrt(mean * (1 - mean) / n + z2 / (4 * n * n));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

struct Cell {
  std::string task, method, budget, attention, protocol;
  std::int64_t length = 0;
  double n = 0, score = 0, kv_read = 0, delta_bound = 0, certified = 0, steps = 0, seconds = 0;
  double fresh_select = 0, selector_read = 0;
  void add(const Record& r) {
    selector_read += r.selector_read;
    n += 1;
    score += r.score;
    // Sparse prefill rows decode densely: their KV read is the prefill's.
    kv_read += is_prefill(r.method) ? r.prefill_kv_read : r.kv_read;
    delta_bound += r.delta_bound;
    certified += r.certified;
    fresh_select += r.fresh_select;
    steps += r.steps;
    seconds += r.decode_seconds;
  }
  double mean(double v) const { return n > 0 ? v / n : NAN; }
};

std::string pct(double v) { return std::isnan(v) ? "-" : fmt::format("{:.1f}", 100 * v); }

std::string machine_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

struct RunInfo {
  std::string cmdline, model_path, model_name, date, machine;
  int workers = 0, kernel_threads = 1;
  double wall_seconds = 0;
  std::size_t computed = 0, reused = 0, missing = 0;
};

void write_reports(const EvalOptions& o, const RunInfo& info, const std::vector<Cell>& cells,
                   const std::vector<Record>& records) {
  fs::create_directories(o.out_dir);
  const fs::path dir(o.out_dir);
  // Markdown: one row per task × length × method × budget.
  {
    auto md = fmt::output_file((dir / "results.md").string());
    md.print("# masskv eval — {}\n\n", info.model_name);
    md.print("- command: `{}`\n- date: {}\n- machine: {} ({} worker(s) × {} thread(s))\n",
             info.cmdline, info.date, info.machine, info.workers, info.kernel_threads);
    md.print("- model: `{}`\n- wall time: {:.0f} s ({} results computed, {} from the cache)\n\n",
             info.model_path, info.wall_seconds, info.computed, info.reused);
    if (info.missing > 0) {
      md.print(
          "- **incomplete** (`--report-only`): {} of the {} results asked for are not in the "
          "cache; n counts the samples each cell has\n\n",
          info.missing, info.missing + info.reused);
    }
    md.print(
        "Accuracy = mean task score in % with its 95% Wilson interval over n samples; KV read "
        "= KV rows attention read per decode step / what dense reads (all layers; for the "
        "prefill_* rows, which decode densely: the (query, key) pairs the sparse prefill "
        "attended / what dense prefill attends, docs/prefill.md); δ bound = "
        "mean certified upper bound on the dropped attention mass per head and step (no "
        "unselected key read; 0 = nothing dropped); certified = heads whose selection is "
        "proven exact; tok/s = decode steps per second of one worker thread, a batched step's "
        "time divided among its rows (attention: each row its own; the rest: equal shares). "
        "{}\n\n",
        o.temperature.empty()
            ? "Rows marked entmax run α-entmax attention on a softmax-trained model (no "
              "conversion): compare them with `dense_entmax`, not with `dense`."
            : fmt::format("Rows marked converted entmax run the entmax conversion `{}` "
                          "(`masskv convert`, per-head temperatures; file hash {:016x}): "
                          "`dense_entmax` is the converted model itself, its selectors are "
                          "exact against it where certified.",
                          o.entmax_conversion, o.conversion_hash));
    md.print(
        "| task | length | protocol | method | budget | attention | n | accuracy % (95% CI) | "
        "KV read % | selector read % | δ bound | certified % | selected % | tok/s |\n");
    md.print(
        "| --- | ---: | --- | --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | "
        "---: |\n");
    for (const Cell& c : cells) {
      const double m = c.mean(c.score);
      const auto [lo, hi] = wilson(m, c.n);
      md.print(
          "| {} | {} | {} | {} | {} | {} | {:.0f} | {} ({}–{}) | {} | {} | {:.3g} | {} | {} | "
          "{:.1f} |\n",
          c.task, c.length, c.protocol, c.method, c.budget, c.attention, c.n, pct(m), pct(lo),
          pct(hi), pct(c.mean(c.kv_read)), pct(c.mean(c.selector_read)), c.mean(c.delta_bound),
          pct(c.mean(c.certified)), pct(c.mean(c.fresh_select)),
          c.seconds > 0 ? c.steps / c.seconds : 0.0);
    }
  }
  // CSV: the same cells.
  {
    auto csv = fmt::output_file((dir / "results.csv").string());
    csv.print(
        "task,length,protocol,method,budget,attention,n,accuracy,ci_lo,ci_hi,kv_read,"
        "selector_read,delta_bound,certified,fresh_select,tok_s\n");
    for (const Cell& c : cells) {
      const double m = c.mean(c.score);
      const auto [lo, hi] = wilson(m, c.n);
      csv.print(
          "{},{},{},{},{},{},{:.0f},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g}\n",
          c.task, c.length, c.protocol, c.method, c.budget, c.attention, c.n, m, lo, hi,
          c.mean(c.kv_read), c.mean(c.selector_read), c.mean(c.delta_bound), c.mean(c.certified),
          c.mean(c.fresh_select), c.seconds > 0 ? c.steps / c.seconds : 0.0);
    }
  }
  // JSON: run info, cells and every record (outputs included).
  {
    json j;
    j["command"] = info.cmdline;
    j["date"] = info.date;
    j["machine"] = info.machine;
    j["threads"] = info.workers;  // the key older results.json files use
    j["missing"] = info.missing;
    j["kernel_threads"] = info.kernel_threads;
    j["model"] = info.model_path;
    j["wall_seconds"] = info.wall_seconds;
    for (const Cell& c : cells) {
      const double m = c.mean(c.score);
      const auto [lo, hi] = wilson(m, c.n);
      j["cells"].push_back({{"task", c.task},
                            {"length", c.length},
                            {"protocol", c.protocol},
                            {"method", c.method},
                            {"budget", c.budget},
                            {"attention", c.attention},
                            {"n", c.n},
                            {"accuracy", m},
                            {"ci", {lo, hi}},
                            {"kv_read", c.mean(c.kv_read)},
                            {"selector_read", c.mean(c.selector_read)},
                            {"delta_bound", c.mean(c.delta_bound)},
                            {"certified", c.mean(c.certified)},
                            {"fresh_select", c.mean(c.fresh_select)},
                            {"tok_s", c.seconds > 0 ? c.steps / c.seconds : 0.0}});
    }
    j["records"] = records;
    std::ofstream((dir / "results.json").string())
        << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
}

// The console summary: methods × lengths, accuracy averaged over the tasks.
void print_summary(const std::vector<Cell>& cells, const std::vector<MethodRow>& rows,
                   const std::vector<std::int64_t>& lengths, bool converted) {
  fmt::print("\n| protocol | method | budget | attention |");
  for (const std::int64_t L : lengths) fmt::print(" {} acc % | KV read % | sel. read % |", L);
  fmt::print(" δ bound | selected % |\n| --- | --- | --- | --- |");
  for (std::size_t i = 0; i < lengths.size(); ++i) fmt::print(" ---: | ---: | ---: |");
  fmt::print(" ---: | ---: |\n");
  for (const MethodRow& r : rows) {
    const std::string_view proto = eval::to_string(r.protocol);
    fmt::print("| {} | {} | {} | {} |", proto, r.method, r.budget,
               !r.entmax   ? "softmax"
               : converted ? "converted entmax"
                           : "entmax");
    double delta = 0, n = 0, fresh = 0;
    for (const std::int64_t L : lengths) {
      double acc = 0, kv = 0, sel = 0, k = 0;
      for (const Cell& c : cells) {
        if (c.method == r.method && c.budget == r.budget && c.protocol == proto &&
            c.length == L && c.n > 0) {
          acc += c.mean(c.score);
          kv += c.mean(c.kv_read);
          sel += c.mean(c.selector_read);
          delta += c.delta_bound;
          fresh += c.fresh_select;
          n += c.n;
          k += 1;
        }
      }
      fmt::print(" {} | {} | {} |", k > 0 ? pct(acc / k) : "-", k > 0 ? pct(kv / k) : "-",
                 k > 0 ? pct(sel / k) : "-");
    }
    fmt::print(" {:.3g} | {} |\n", n > 0 ? delta / n : NAN, n > 0 ? pct(fresh / n) : "-");
  }
}

// ---- the run --------------------------------------------------------------------------------

struct Job {
  SampleId id;
  std::vector<std::size_t> rows;  // indices into the method rows still to compute
};

void run_eval(EvalOptions o, const std::string& cmdline, const CLI::App& app) {
  const auto t_start = std::chrono::steady_clock::now();
  const Preset preset = o.full ? full_preset(o.model) : quick_preset();
  if (o.tasks.empty()) o.tasks = preset.tasks;
  if (o.lengths.empty()) o.lengths = preset.lengths;
  if (o.methods.empty()) o.methods = preset.methods;
  if (o.budgets.empty()) o.budgets = preset.budgets;
  if (o.samples == 0) o.samples = preset.samples;
  // The options' ranges were checked as they were parsed (checks.hpp); the rest before the model.
  bool needs_text = false;
  for (const std::string& t : o.tasks) needs_text |= eval::find_task(t, "--tasks").needs_text;
  std::vector<std::int64_t> lengths;
  for (const std::string& l : o.lengths) lengths.push_back(parse_count(l, "--lengths"));
  std::vector<eval::Protocol> protocols;
  for (const std::string& p : o.protocols) {
    const eval::Protocol pr = eval::parse_protocol(p, "--protocol");
    if (std::find(protocols.begin(), protocols.end(), pr) == protocols.end()) {
      protocols.push_back(pr);
    }
  }
  require(!protocols.empty(), ErrorCode::invalid_argument, "--protocol", "names no protocol");
  const std::vector<MethodRow> rows = method_rows(o.methods, o.budgets, protocols);
  for (const std::string& b : o.budgets) (void)parse_budget(b, 1024, "--budgets");
  const bool learned = std::any_of(rows.begin(), rows.end(), [](const MethodRow& r) {
    return base_method(r.method) == "learned" || r.method.rfind("prefill_learned", 0) == 0;
  });
  require(!learned || !o.selector_file.empty(), ErrorCode::invalid_argument, "--selector-file",
          "--methods learned and prefill_learned<K> need a selector file");
  const kv::RowFormat key_format =
      kv::parse_row_format(o.selector_key_format, "--selector-key-format");
  const std::string selector_tag =
      learned ? fmt::format("|sel{}k{}", file_hash(o.selector_file), kv::to_string(key_format))
              : std::string();

  const std::string path = model::resolve_model(o.model).string();
  const auto mdl = model::Model::load(path);
  const model::ChatTemplate chat = model::ChatTemplate::from_gguf(mdl->file());
  const std::string model_name = fs::path(path).filename().string();
  if (!o.entmax_conversion.empty()) {
    learn::EntmaxConversion conv;
    try {
      conv = learn::load_conversion(o.entmax_conversion);
    } catch (const Error& e) {
      fail(e.code(), "--entmax-conversion", e.what());
    }
    conv.check_model(*mdl, "--entmax-conversion");
    require(!o.alpha_given || o.entmax_alpha == conv.alpha, ErrorCode::invalid_argument, "--alpha",
            o.entmax_alpha, " differs from the conversion's α ", conv.alpha,
            " (--entmax-conversion sets it)");
    o.entmax_alpha = conv.alpha;
    o.temperature = conv.temperature;
    o.conversion_hash = conv.file_hash;
    o.conversion_identity = conv.proxy == "identity";
  }
  for (const std::int64_t L : lengths) {
    require(L <= mdl->config().n_ctx_train, ErrorCode::invalid_argument, "--lengths", L,
            " tokens exceed the model's context of ", mdl->config().n_ctx_train);
  }
  if (dry_run_plan(o.dry_run, app,
                   {{"model_path", path},
                    {"report_rows", std::to_string(rows.size())},
                    {"samples_per_task_and_length", std::to_string(o.samples)}})) {
    return;
  }
  const std::string text = needs_text ? load_text(o.text, "--file") : std::string();
  const int reserve = eval::template_overhead(*mdl, chat) + 2;
  const RowTags tags{settings_tag(o), selector_tag, conversion_tag(o),
                     fmt::format("|c{}", o.candidate_factor)};
  std::shared_ptr<const learn::Selector> selector;
  if (learned) {
    selector = std::make_shared<const learn::Selector>(learn::load(o.selector_file));
    learn::check_model(*selector, mdl->config());
  }
  ResultCache cache(o.cache.empty() ? fs::path(o.out_dir) / "cache.jsonl" : fs::path(o.cache));

  // Plan: every (task, length, sample) with the rows it still lacks.
  std::vector<Job> jobs;
  std::size_t reused = 0;
  long work = 0;  // progress units: prefilled tokens + decode steps (estimated)
  for (const std::string& task : o.tasks) {
    for (const std::int64_t L : lengths) {
      for (int i = 0; i < o.samples; ++i) {
        Job job{{task, L, i, sample_seed(o.seed, task, L, i)}, {}};
        // Attentions prefilled (softmax, entmax): one context prefill of ~L tokens each, shared
        // by both protocols.
        bool soft = false, ent = false;
        for (std::size_t r = 0; r < rows.size(); ++r) {
          if (cache.find(record_key(model_name, job.id, rows[r], row_tag(rows[r], tags))) !=
              nullptr) {
            ++reused;
            continue;
          }
          job.rows.push_back(r);
          if (is_prefill(rows[r].method)) {
            work += static_cast<long>(L);  // its own prefill
          } else {
            (rows[r].entmax ? ent : soft) = true;
          }
          work += 48;
        }
        work += static_cast<long>(L) * ((soft ? 1 : 0) + (ent ? 1 : 0));
        if (!job.rows.empty()) jobs.push_back(std::move(job));
      }
    }
  }
  const int threads = o.threads > 0 ? o.threads : omp_get_num_procs();
  const int workers =
      std::max(1, std::min<int>(o.workers > 0 ? std::min(o.workers, threads) : threads,
                                static_cast<int>(jobs.size())));
  // The threads not running a sample of their own go to the kernels inside the samples.
  const int kernel_threads = std::max(1, threads / workers);
  fmt::print(stderr,
             "masskv eval: {} on {} tasks × {} lengths × {} samples × {} methods: {} results "
             "cached, {} samples to run on {} worker(s) × {} thread(s)\n",
             model_name, o.tasks.size(), lengths.size(), o.samples, rows.size(), reused,
             jobs.size(), workers, kernel_threads);
  std::size_t missing = 0;  // only --report-only leaves results uncomputed
  if (o.report_only) {
    for (const Job& j : jobs) missing += j.rows.size();
    fmt::print(stderr, "masskv eval: --report-only: {} results missing, not computed\n", missing);
    jobs.clear();
  }

  // Samples run in parallel, each on threads / workers OpenMP threads: on 2 cores one thread
  // per sample (no barriers across cores) beats two inside every step of one sample; on many
  // cores and few long samples the kernels take the rest.
  std::atomic<std::size_t> next{0};
  std::mutex progress_mutex;
  std::exception_ptr failure;
  std::mutex failure_mutex;
  std::size_t computed = 0;
  {
    Progress bar("eval", std::max(1L, work));
    const auto worker = [&] {
      omp_set_num_threads(kernel_threads);
      try {
        for (std::size_t j = next++; j < jobs.size(); j = next++) {
          {
            std::lock_guard<std::mutex> lock(failure_mutex);
            if (failure) return;
          }
          const Job& job = jobs[j];
          eval::GenerateArgs ga;
          ga.tokenizer = &mdl->tokenizer();
          ga.text = text;
          ga.length = job.id.length;
          ga.reserve_tokens = reserve;
          ga.seed = job.id.seed;
          const eval::Sample sample = eval::make_sample(job.id.task, ga);
          {
            std::lock_guard<std::mutex> lock(progress_mutex);
            bar.set_note(fmt::format("{} {} #{}", job.id.task, job.id.length, job.id.index));
          }
          // Both protocols in one run_sample: they share the context's prefill.
          std::vector<eval::DecodeConfig> configs;
          for (const std::size_t r : job.rows) {
            configs.push_back(decode_config(rows[r], job.id.length, o));
          }
          eval::RunOptions ro;
          ro.page_size = o.page_size;
          ro.max_batch = o.batch;
          ro.learned_selector = selector;
          ro.learned_key_format = key_format;
          const auto outcomes =
              eval::run_sample(*mdl, chat, sample, configs, ro, [&](std::int64_t n) {
                std::lock_guard<std::mutex> lock(progress_mutex);
                bar.advance(static_cast<long>(n));
              });
          for (std::size_t k = 0; k < outcomes.size(); ++k) {
            const eval::Outcome& oc = outcomes[k];
            const MethodRow& row = rows[job.rows[k]];
            Record rec;
            rec.model = model_name;
            rec.task = job.id.task;
            rec.length = job.id.length;
            rec.index = job.id.index;
            rec.seed = job.id.seed;
            rec.method = row.method;
            rec.budget = row.budget;
            rec.protocol = std::string(eval::to_string(row.protocol));
            rec.output = oc.output;
            rec.answers = sample.answers;
            rec.score = oc.score;
            rec.steps = oc.steps;
            rec.kv_read = oc.kv_read;
            rec.delta_bound = oc.delta_bound;
            rec.certified = oc.certified;
            rec.decode_seconds = oc.decode_seconds;
            rec.prefill_seconds = oc.prefill_seconds;
            rec.prefill_kv_read = oc.prefill_kv_read;
            rec.fresh_select = oc.fresh_select;
            rec.selector_read = oc.selector_read;
            cache.add(std::move(rec), row_tag(row, tags));
          }
          std::lock_guard<std::mutex> lock(progress_mutex);
          computed += outcomes.size();
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    };
    std::vector<std::thread> pool;
    for (int w = 1; w < workers; ++w) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();
    bar.finish();
  }
  if (failure) std::rethrow_exception(failure);

  // Aggregate what this run asked for (the cache may hold more).
  std::vector<Cell> cells;
  std::vector<Record> records;
  for (const std::string& task : o.tasks) {
    for (const std::int64_t L : lengths) {
      for (const MethodRow& row : rows) {
        Cell c{task, row.method, row.budget, attention_label(row, o),
               std::string(eval::to_string(row.protocol)), L};
        for (int i = 0; i < o.samples; ++i) {
          const SampleId id{task, L, i, sample_seed(o.seed, task, L, i)};
          if (const Record* r = cache.find(record_key(model_name, id, row, row_tag(row, tags)))) {
            c.add(*r);
            records.push_back(*r);
            // The row's spelling, not the cached record's: a record found under another
            // spelling of the same rule (record_key: token_codes' old rows as "+rr") is
            // reported as what this run asked for.
            records.back().method = row.method;
          }
        }
        cells.push_back(c);
      }
    }
  }
  RunInfo info;
  info.cmdline = cmdline;
  info.model_path = path;
  info.model_name = model_name;
  info.date = utc_now();
  info.machine = machine_name();
  info.workers = workers;
  info.kernel_threads = kernel_threads;
  info.computed = computed;
  info.reused = reused;
  info.missing = missing;
  info.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  write_reports(o, info, cells, records);
  print_summary(cells, rows, lengths, !o.temperature.empty());
  fmt::print("\nfull table: {}/results.md (also results.csv, results.json)\n", o.out_dir);
  if (o.plots) {
    run_plot_script("eval", "plot_eval.py", {o.out_dir + "/results.csv", o.out_dir});
  }
}

}  // namespace

void register_eval(CLI::App& app, const std::string& cmdline) {
  auto o = std::make_shared<EvalOptions>();
  auto* e = app.add_subcommand(
      "eval",
      "Long-context tasks (RULER-style, generated from a seed) on a real model: dense against "
      "every selector at matched KV budgets; accuracy, KV read, certified δ bound, speed");
  add_model(e, o->model);
  auto* quick = e->add_flag("--quick", o->quick,
                            "The quick suite (default): niah_single_number, niah_multikey, "
                            "niah_multivalue, niah_single_uuid × 1K, 2K × 3 samples; dense, "
                            "oracle, quest, token_codes at budget 1/16; both protocols; minutes "
                            "on 2 cores");
  e->add_flag("--full", o->full,
              "The full suite: every task, lengths up to the model's limit (SmolLM2 8K, "
              "Gemma 3 32K), budgets 1/32, 1/16, 1/8, 256 tokens, 20 samples")
      ->excludes(quick);
  std::string task_names;
  for (const eval::TaskInfo& t : eval::tasks()) {
    task_names += (task_names.empty() ? "" : ", ") + std::string(t.name);
  }
  e->add_option("--tasks", o->tasks, "Tasks: " + task_names)->delimiter(',');
  e->add_option("--protocol", o->protocols,
                "standard (the field's: the whole prompt prefilled, every generated token "
                "decoded sparsely), strict (the question and answer prefix decoded sparsely "
                "too), or both, comma-separated; docs/eval.md \"Protocols\"")
      ->delimiter(',')
      ->capture_default_str();
  e->add_option("--lengths", o->lengths,
                "Prompt lengths in tokens (K suffix), e.g. 1K,4K; at most the model's context")
      ->delimiter(',')
      ->check(count_in(1, kMaxTokens));
  e->add_option("--methods", o->methods,
                "dense, token_codes (the default selector: every token on its 2-bit page code, the q heads pooled by log-probability), "
                "two_stage (candidate pages by the bound, then their tokens on the codes), "
                "sink_recent, quest, top_p, oracle, learned "
                "(with --selector-file), "
                "dense_entmax, entmax_support, gaussian_tau (the last three run entmax "
                "attention: on the softmax model, or converted with --entmax-conversion); "
                "sparse prefill with dense decode (docs/prefill.md): prefill_token, "
                "prefill_block<K>, prefill_shared<K>, prefill_index<K>, prefill_learned<K> (with "
                "--selector-file) for key blocks K = 16, "
                "64, 128 (the budget: of the keys before each query block). A decode selector "
                "with @R (quest@8) reuses each layer's selection for R decode steps; @RcCOS "
                "(quest@8c0.9) also selects again when a query turns past cos COS. Modifiers "
                "METHOD+MOD set a selector option (docs/eval.md \"Modifiers\"): " +
                    modifier_help())
      ->delimiter(',');
  e->add_option("--budgets", o->budgets,
                "KV budgets: fractions of the length (1/16) or tokens (256); caps for top_p, "
                "entmax_support and gaussian_tau. Top-p budgets pMASS[:CAP] (p0.9, p0.9:1/8): "
                "the smallest page set with estimated mass >= MASS, for learned, top_p, quest "
                "and oracle (other methods skip them)")
      ->delimiter(',');
  e->add_option("--samples", o->samples, "Samples per task and length (0: the preset's)")
      ->check(int_in(0, 1 << 20));
  add_seed(e, o->seed, "Seed of the generated samples");
  add_threads(e, o->threads, "Threads in all (0: all cores)");
  e->add_option("--workers", o->workers,
                "Samples run at once, each on threads / workers kernel threads (0: one sample "
                "per thread; fewer, for long samples on many cores)")
      ->check(int_in(0, max_threads()))
      ->capture_default_str();
  add_batch(e, o->batch, 0, 1 << 16,
            "Methods decoded together per step, one forward pass for all (0: all of a "
            "sample's; 1: one at a time)");
  add_out_dir(e, o->out_dir, "Write results.md, results.csv, results.json and PNG plots here")
      ->capture_default_str();
  e->add_option("--cache", o->cache, "Results cache (JSON lines; default OUT_DIR/cache.jsonl)");
  add_file(e, o->text, "Real text for the haystacks (default: the Debian Policy Manual)");
  add_page(e, o->page_size, "KV page size (tokens)");
  add_kept_items(e, o->sink_pages, o->window);
  add_top_p_mass(e, o->top_p_mass, "Target estimated mass of top_p");
  add_candidates(e, o->candidate_factor);
  add_alpha(e, o->entmax_alpha, "α of the entmax rows")->each([o](const std::string&) {
    o->alpha_given = true;
  });
  add_entmax_conversion(e, o->entmax_conversion,
                        "Entmax rows run the converted entmax model of this `masskv convert` "
                        "file (its α and per-head temperatures) instead of plain entmax on the "
                        "softmax model");
  add_selector_file(e, o->selector_file,
                    "The learned selector of the `learned` method (its hash keys the cache)");
  add_selector_key_format(e, o->selector_key_format);
  add_no_plots(e, o->plots);
  e->add_flag("--report-only", o->report_only,
              "Write the tables from the cache alone (a long run's state): missing results are "
              "not computed, each cell's n says how many samples it has");
  add_dry_run(e, o->dry_run);
  e->footer(
      "Examples:\n"
      "  masskv eval                 (the quick suite, out/eval)\n"
      "  masskv eval --tasks niah_single_number --lengths 1K --methods dense,quest --budgets 1/16 "
      "-O out/eval-one\n"
      "  masskv eval --full --report-only   (the tables of a long run so far, from its cache)");
  e->callback([o, cmdline, e] { run_eval(*o, cmdline, *e); });
}

}  // namespace masskv::cli
