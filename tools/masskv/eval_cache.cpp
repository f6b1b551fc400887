// `masskv eval`'s results cache (eval_cache.hpp): the records' JSON, the keys, the checks.
#include "eval_cache.hpp"

#include <fmt/core.h>

#include <cmath>
#include <fstream>
#include <string_view>

#include "masskv/error.hpp"
#include "masskv/select/prefill_select.hpp"
#include "parse.hpp"

namespace masskv::cli {

using nlohmann::json;

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t sample_seed(std::uint64_t seed, const std::string& task, std::int64_t length,
                          int index) {
  std::uint64_t h = mix(seed);
  for (const char c : task) h = mix(h ^ static_cast<unsigned char>(c));
  h = mix(h ^ static_cast<std::uint64_t>(length));
  return mix(h ^ static_cast<std::uint64_t>(index));
}

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

namespace {

std::string row_tag_of_protocol(const MethodRow& m, const RowTags& t) {
  if (m.entmax) return t.settings + t.conversion;
  if (base_method(m.method) == "two_stage") return t.settings + t.two_stage + t.codes;
  if (base_method(m.method) == "token_codes") {
    // Rows of plain "token_codes" written before its default rule became log_prob are the
    // round robin's (now "token_codes+rr", record_key): the default's rows carry "|lp".
    // Two passes became the default later still: rows say "|2p" when they ran two passes, so
    // that the rows written before (one pass unless spelled "+twopass") keep their meaning.
    const std::vector<std::string>& mods = split_reselect(m.method).mods;
    const auto has = [&](const char* x) { return std::find(mods.begin(), mods.end(), x) != mods.end(); };
    const bool explicit_rule = has("lse") || has("rr");
    // And the first pass's channels weighed by the keys' spread later again: "|2ps"; "|2p"
    // rows weighed them by |q| alone (now "+qonly").
    const char* passes = has("onepass") ? "" : has("qonly") ? "|2p" : "|2ps";
    return t.settings + t.codes + (explicit_rule ? "" : "|lp") + passes;
  }
  if (is_prefill(m.method)) {
    const select::PrefillSelectConfig c;
    const std::string pf =
        fmt::format("{}|pfq{}s{}m{}", t.settings, c.q_block, c.sink_blocks, c.budget.min_keys);
    return m.method.rfind("prefill_learned", 0) == 0 ? pf + t.selector : pf;
  }
  if (base_method(m.method) == "learned_codes") return t.settings + t.codes + t.selector;
  return base_method(m.method) == "learned" ? t.settings + t.selector : t.settings;
}

}  // namespace

std::string row_tag(const MethodRow& m, const RowTags& t) {
  // Strict rows keep the keys of caches written before the standard protocol existed.
  const std::string proto = m.protocol == eval::Protocol::standard ? "|standard" : "";
  return row_tag_of_protocol(m, t) + proto;
}

namespace {

// Removes modifier `mod` ("+name") from a method spelling; whether it was there.
bool erase_modifier(std::string& method, std::string_view mod) {
  for (auto at = method.find(mod); at != std::string::npos; at = method.find(mod, at + 1)) {
    const std::size_t end = at + mod.size();
    if (end == method.size() || method[end] == '+' || method[end] == '@') {
      method.erase(at, mod.size());
      return true;
    }
  }
  return false;
}

}  // namespace

std::string record_key(const std::string& model, const SampleId& s, const MethodRow& m,
                       const std::string& tag) {
  // token_codes' rule in one spelling: "+rr" is what plain "token_codes" meant before its
  // default became log_prob (those rows have no "|lp" in their tag), and the default's rows
  // ("|lp") are "+lse"'s. So each rule finds every row computed under it, whatever its name.
  // The passes likewise: "+twopass" (spelled, or "|2ps" in the tag) ends the key, "+onepass"
  // (the rows before two passes became the default) is left out; "|2p" rows, and rows that
  // spell "+twopass" with neither tag (written before the tags), ran two passes with the
  // channels by |q| alone: "+twopass+qonly".
  std::string method = m.method, t = tag;
  if (base_method(method) == "token_codes") {
    (void)erase_modifier(method, "+rr");
    if (const auto lp = t.find("|lp"); lp != std::string::npos) {
      t.erase(lp, 3);
      method.insert(std::string_view("token_codes").size(), "+lse");
    }
    bool two = erase_modifier(method, "+twopass");
    (void)erase_modifier(method, "+onepass");
    bool qonly = erase_modifier(method, "+qonly");
    if (const auto p = t.find("|2ps"); p != std::string::npos) {
      t.erase(p, 4);
      two = true;
    } else if (const auto p2 = t.find("|2p"); p2 != std::string::npos) {
      t.erase(p2, 3);
      two = qonly = true;
    } else if (two) {
      // "+twopass" spelled on a row tagged neither way: written before the tags, when two passes
      // chose the channels by |q| alone (eval-standard-smollm2's sessions 23-24 rows).
      qonly = true;
    }
    if (two) {
      method.insert(std::min(method.find('@'), method.size()), qonly ? "+twopass+qonly" : "+twopass");
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


ResultCache::ResultCache(std::filesystem::path path) : file_(std::move(path), "--cache") {
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

const Record* ResultCache::find(const std::string& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

void ResultCache::add(Record r, const std::string& settings) {
  std::lock_guard<std::mutex> lock(mutex_);
  json j = r;
  j["settings"] = settings;
  // Model outputs may end inside a UTF-8 character (generation stops at a token boundary):
  // such bytes are written as U+FFFD rather than failing the run.
  file_.append(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  entries_[key_of(r, settings)] = std::move(r);
}

std::string ResultCache::key_of(const Record& r, const std::string& tag) {
  return record_key(r.model, {r.task, r.length, r.index, r.seed}, {r.method, r.budget, false},
                    tag);
}

std::optional<std::string> ResultCache::load(const std::string& line) {
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

}  // namespace masskv::cli
