// `masskv bench keys`: the selector key formats (docs/design.md §2.9, kv/key_formats.hpp) on a
// model's real keys and queries (`masskv dump` files): bytes per token against bf16, and how
// well the page masses of quantised-key scores select the pages the bf16-key scores select
// (the same scorer as MassSource::quant_keys: the mapping of q·k̂/sqrt(d) over all tokens,
// summed per page).
#include <fmt/core.h>
#include <fmt/os.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/key_formats.hpp"
#include "masskv/learn/project.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/select/selector.hpp"
#include "model_options.hpp"
#include "parse.hpp"
#include "progress.hpp"
#include "qkv_dump.hpp"

namespace masskv::cli {
namespace {

using kv::KeyFormat;

struct KeysOptions {
  std::vector<std::string> dumps;
  std::vector<std::string> formats{"int4", "mxfp4", "nvfp4", "mxfp8"};
  int page_size = 16;
  std::string budget = "1/16";
  double top_p = 0.9;
  std::string mapping = "softmax";
  std::string selector_file;
  Output out;
};

// The dump's layer in the selector, checked against the dump's model; throws
// Error(invalid_argument, "--selector-file") for what bench keys cannot project.
const learn::LayerSelector& selector_layer(const learn::Selector& s, const QkvDump& h,
                                           const std::string& path) {
  require(s.architecture == h.arch && s.n_head == h.hq && s.n_head_kv == h.hkv &&
              s.head_dim == h.head_dim,
          ErrorCode::invalid_argument, "--selector-file", "the selector was distilled on ",
          s.architecture, " (", s.n_head, " q heads, ", s.n_head_kv, " kv heads, head_dim ",
          s.head_dim, "), ", path, " is ", h.arch, " (", h.hq, ", ", h.hkv, ", ", h.head_dim, ")");
  require(s.input == learn::Input::qk, ErrorCode::invalid_argument, "--selector-file",
          "a hidden-input selector reads the layer input, which dump files do not hold");
  const learn::LayerSelector* l = s.find(h.layer);
  require(l != nullptr, ErrorCode::invalid_argument, "--selector-file",
          "the selector has no layer ", h.layer, " (", path, ")");
  require(!l->rope, ErrorCode::invalid_argument, "--selector-file",
          "a qk selector with its own RoPE is not supported here");
  require(h.q_multiplier > 0, ErrorCode::invalid_argument, "--selector-file", path,
          " predates the q_multiplier header field; write it again with masskv dump");
  return *l;
}

// The selector's view of a dump (recall of the 4-bit selector key cache against bf16,
// docs/design.md §2.9): q and k replaced by their d_s projections, one "head" per selector group,
// so that the scores below are ŝ = q_s·k_s (scale 1).
void project_dump(const learn::Selector& s, const learn::LayerSelector& l, QkvDump& d) {
  const std::vector<float> qmodel = [&] {
    std::vector<float> q(d.q);
    for (float& x : q) x = static_cast<float>(x / d.q_multiplier);  // the model's own q
    return q;
  }();
  std::vector<float> scratch;
  const auto G = static_cast<std::size_t>(l.groups), D = static_cast<std::size_t>(l.dim);
  const std::vector<double> no_rope;
  d.q.assign(static_cast<std::size_t>(d.steps) * G * D, 0.f);
  learn::project(s, l, learn::Side::query, qmodel.data(), static_cast<std::size_t>(d.steps),
                 d.positions, no_rope, d.q.data(), scratch);
  const std::vector<float> kmodel = std::move(d.k);
  const auto n = static_cast<std::size_t>(d.context);
  d.k.assign(n * G * D, 0.f);
  learn::project(s, l, learn::Side::key, kmodel.data(), n, {}, no_rope, d.k.data(), scratch);
  d.v.assign(d.k.size(), 0.f);  // the cache needs values; recall reads only keys
  d.hq = d.hkv = l.groups;
  d.head_dim = l.dim;
}

// Page masses of one q head: the mapping of its token scores, summed per page.
void page_masses(const std::vector<double>& scores, int page_size, const Mapping& map,
                 std::vector<double>& probs, std::vector<double>& mass) {
  probs.resize(scores.size());
  if (map.is_entmax()) {
    entmax(std::span<const double>(scores), map.alpha, std::span<double>(probs));
  } else {
    softmax(std::span<const double>(scores), std::span<double>(probs));
  }
  const auto P = static_cast<std::size_t>(page_size);
  mass.assign((probs.size() + P - 1) / P, 0.0);
  for (std::size_t t = 0; t < probs.size(); ++t) mass[t / P] += probs[t];
}

// Pages by descending mass (ties: lower page first).
std::vector<int> ranking(const std::vector<double>& mass) {
  std::vector<int> r(mass.size());
  std::iota(r.begin(), r.end(), 0);
  std::stable_sort(r.begin(), r.end(), [&](int a, int b) { return mass[a] > mass[b]; });
  return r;
}

struct Recall {
  double at_k = 0, mass_at_k = 0, mass = 0;
};

// recall@k: the share of the reference's k best pages among the format's k best; mass@k:
// the reference mass of the format's k best over that of the reference's k best (near-ties
// swapped at the cut cost recall@k but not mass@k). Mass recall: S_ref is the smallest prefix of
// the reference ranking with mass >= p; the format's first |S_ref| pages hold this share of S_ref's
// reference mass (1: as good).
Recall recall(const std::vector<double>& ref, const std::vector<double>& got, int k, double p) {
  const std::vector<int> rr = ranking(ref), rg = ranking(got);
  std::vector<std::uint8_t> in_ref(ref.size(), 0);
  for (int i = 0; i < k; ++i) in_ref[static_cast<std::size_t>(rr[i])] = 1;
  int hit = 0;
  double top_ref = 0, top_got = 0;
  for (int i = 0; i < k; ++i) {
    hit += in_ref[static_cast<std::size_t>(rg[i])];
    top_ref += ref[static_cast<std::size_t>(rr[i])];
    top_got += ref[static_cast<std::size_t>(rg[i])];
  }
  double held_ref = 0;
  std::size_t m = 0;
  while (m < rr.size() && held_ref < p) held_ref += ref[static_cast<std::size_t>(rr[m++])];
  double held = 0;
  for (std::size_t i = 0; i < m; ++i) held += ref[static_cast<std::size_t>(rg[i])];
  return {static_cast<double>(hit) / k, top_got / top_ref, held / held_ref};
}

struct Cell {  // one (dump, format)
  std::string dump;
  KeyFormat format;
  double recall_k = 0, recall_k_min = 1, mass_k = 0, mass = 0, mass_min = 1, ns_per_token = 0;
  long heads = 0;
};

double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void run_keys(const KeysOptions& o) {
  require(!o.dumps.empty(), ErrorCode::invalid_argument, "--dumps",
          "give one or more files written by masskv dump");
  const double frac = parse_fraction(o.budget, "--budget");
  const Mapping map = parse_mapping(o.mapping, "--mapping");
  std::vector<KeyFormat> formats{KeyFormat::bf16};  // the reference first
  for (const auto& name : o.formats) {
    const KeyFormat f = kv::parse_key_format(name, "--formats");
    if (f != KeyFormat::bf16) formats.push_back(f);
  }
  std::optional<learn::Selector> selector;
  if (!o.selector_file.empty()) selector = learn::load(o.selector_file);
  for (const auto& path : o.dumps) {
    const QkvDump h = read_qkv_dump_header(path);
    const int dim = selector ? selector_layer(*selector, h, path).dim : h.head_dim;
    for (KeyFormat f : formats) kv::check_key_dim(f, dim, "--formats");
  }

  std::vector<Cell> cells;
  Progress progress("bench keys", static_cast<long>(o.dumps.size() * formats.size()));
  for (const auto& path : o.dumps) {
    QkvDump d = read_qkv_dump(path);
    if (selector) project_dump(*selector, selector_layer(*selector, d, path), d);
    const int P = o.page_size, pages = static_cast<int>((d.context + P - 1) / P);
    const int k = std::max(1, static_cast<int>(std::ceil(frac * pages)));
    const float scale = selector ? 1.0f : 1.0f / std::sqrt(static_cast<float>(d.head_dim));
    const int g = d.hq / d.hkv;
    std::vector<std::vector<double>> ref_mass;  // [step * hq + head]
    std::vector<double> scores, probs, mass;
    for (KeyFormat f : formats) {
      progress.set_note(fmt::format("{} {}", path, kv::to_string(f)));
      kv::CacheConfig cfg;
      cfg.num_kv_heads = d.hkv;
      cfg.head_dim = d.head_dim;
      cfg.page_size = P;
      cfg.dtype = DType::bf16;  // bf16 keys: the reference format stores them unchanged
      cfg.capacity_pages = pages;
      cfg.selector_keys = true;
      cfg.selector_key_format = f;
      kv::PagedKVCache cache(cfg);
      const kv::SeqId s = cache.create();
      cache.append(s, d.k, d.v, static_cast<int>(d.context));
      const kv::PageTableStorage table = cache.page_table(std::span<const kv::SeqId>(&s, 1));
      const kv::SelectorKeysView keys = cache.selector_keys();
      Cell c{path, f};
      double ns = 0;
      for (int step = 0; step < d.steps; ++step) {
        for (int qh = 0; qh < d.hq; ++qh) {
          const float* q = d.q.data() + (static_cast<std::size_t>(step) * d.hq + qh) * d.head_dim;
          const double t0 = now_ns();
          select::selector_key_scores(keys, table.table(), 0, qh / g, q, scale, scores);
          ns += now_ns() - t0;
          page_masses(scores, P, map, probs, mass);
          if (f == KeyFormat::bf16) {
            ref_mass.push_back(mass);
            continue;
          }
          const Recall r =
              recall(ref_mass[static_cast<std::size_t>(step) * d.hq + qh], mass, k, o.top_p);
          c.recall_k += r.at_k;
          c.recall_k_min = std::min(c.recall_k_min, r.at_k);
          c.mass_k += r.mass_at_k;
          c.mass += r.mass;
          c.mass_min = std::min(c.mass_min, r.mass);
          ++c.heads;
        }
      }
      c.ns_per_token = ns / (static_cast<double>(d.steps) * d.hq * static_cast<double>(d.context));
      if (c.heads > 0) {
        c.recall_k /= static_cast<double>(c.heads);
        c.mass_k /= static_cast<double>(c.heads);
        c.mass /= static_cast<double>(c.heads);
      } else {
        c.recall_k = c.mass_k = c.mass = 1;  // the reference against itself
      }
      cells.push_back(c);
      progress.advance();
    }
  }
  progress.finish();

  const QkvDump h = read_qkv_dump_header(o.dumps.front());
  // The row widths whose sizes are printed: the selector's d_s (and twice it), else the
  // models' head dims.
  const int d1 = selector ? selector_layer(*selector, h, o.dumps.front()).dim : 64, d2 = 2 * d1;
  // One row per format (means over dumps; kind "format"), then one per format and dump
  // (kind "dump").
  Rows rows = Rows::array(), dump_rows = Rows::array();
  for (KeyFormat f : formats) {
    double rk = 0, rk_min = 1, mk = 0, mr = 0, mr_min = 1, ns = 0;
    int n = 0;
    for (const Cell& c : cells) {
      if (c.format != f) continue;
      rk += c.recall_k;
      mk += c.mass_k;
      mr += c.mass;
      ns += c.ns_per_token;
      rk_min = std::min(rk_min, c.recall_k_min);
      mr_min = std::min(mr_min, c.mass_min);
      ++n;
      dump_rows.push_back({{"kind", "dump"},
                           {"format", kv::to_string(f)},
                           {"dump", c.dump},
                           {"recall_at_k", c.recall_k},
                           {"recall_at_k_min", c.recall_k_min},
                           {"mass_at_k", c.mass_k},
                           {"mass_recall", c.mass},
                           {"mass_recall_min", c.mass_min},
                           {"score_ns_per_token", c.ns_per_token}});
    }
    const auto bytes = [&](int dim) { return static_cast<double>(kv::row_bytes(f, dim)); };
    const auto ratio = [&](int dim) {
      return static_cast<double>(kv::row_bytes(KeyFormat::bf16, dim)) / bytes(dim);
    };
    rows.push_back({{"kind", "format"},
                    {"format", kv::to_string(f)},
                    {"dim", d1},
                    {"bits_per_value", 8 * kv::bytes_per_value(f, d1)},
                    {"bytes_per_token", bytes(d1)},
                    {"bf16_over_format", ratio(d1)},
                    {"dim2", d2},
                    {"bits_per_value_dim2", 8 * kv::bytes_per_value(f, d2)},
                    {"bytes_per_token_dim2", bytes(d2)},
                    {"bf16_over_format_dim2", ratio(d2)},
                    {"recall_at_k", rk / n},
                    {"recall_at_k_min", rk_min},
                    {"mass_at_k", mk / n},
                    {"mass_recall", mr / n},
                    {"mass_recall_min", mr_min},
                    {"score_ns_per_token", ns / n},
                    {"page_size", o.page_size},
                    {"budget", o.budget},
                    {"top_p_mass", o.top_p},
                    {"mapping", o.mapping},
                    {"selector_file", o.selector_file}});
  }
  const std::size_t n_formats = rows.size();
  for (auto& r : dump_rows) rows.push_back(r);
  write_results(o.out, rows, [&](std::FILE* out) {
    fmt::print(out,
               "\n## masskv bench keys — {} dump(s) of {} ({} tokens, {} queries × {} q heads, {} "
               "kv heads, d = {}), page {}, {}; k = {} of the pages, top-p {}\n\n",
               o.dumps.size(), h.model, h.context, h.steps, h.hq, h.hkv, h.head_dim, o.page_size,
               o.mapping, o.budget, o.top_p);
    if (selector) {
      fmt::print(out,
                 "Keys and queries: the d_s = {} projections of learned selector {} (scores "
                 "q_s·k_s, one head per selector group).\n\n",
                 d1, o.selector_file);
    }
    fmt::print(out,
               "Bytes per token and kv head; recall against the bf16 keys' selection (mean over "
               "dumps, queries and q heads; min in parentheses); score ns/token: "
               "selector_key_scores on this CPU (the dot products on the codes, no mapping).\n\n");
    fmt::print(out,
               "| format | bits/value d={0} | d={1} | bytes/token d={0} | d={1} | bf16 / format "
               "d={0} | d={1} | recall@k | mass@k | mass recall | score ns/token |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
               d1, d2);
    for (std::size_t i = 0; i < n_formats; ++i) {
      const auto& r = rows[i];
      fmt::print(out,
                 "| {} | {:.3g} | {:.3g} | {} | {} | {:.2f}× | {:.2f}× | {:.4f} ({:.3f}) | {:.4f} "
                 "| {:.4f} ({:.3f}) | {:.1f} |\n",
                 r["format"].get<std::string>(), r["bits_per_value"].get<double>(),
                 r["bits_per_value_dim2"].get<double>(), r["bytes_per_token"].get<double>(),
                 r["bytes_per_token_dim2"].get<double>(), r["bf16_over_format"].get<double>(),
                 r["bf16_over_format_dim2"].get<double>(), r["recall_at_k"].get<double>(),
                 r["recall_at_k_min"].get<double>(), r["mass_at_k"].get<double>(),
                 r["mass_recall"].get<double>(), r["mass_recall_min"].get<double>(),
                 r["score_ns_per_token"].get<double>());
    }
  });
}

}  // namespace

void register_bench_keys(CLI::App& bench) {
  auto o = std::make_shared<KeysOptions>();
  auto* s = bench.add_subcommand(
      "keys",
      "Selector key formats (bf16, int4, mxfp4, nvfp4, mxfp8) on a model's real keys and queries "
      "(masskv dump files): bytes per token, and the page recall of quantised-key scores "
      "against bf16-key scores");
  s->add_option("--dumps", o->dumps, "Files written by masskv dump (comma-separated)")
      ->delimiter(',')
      ->required();
  s->add_option("--formats", o->formats,
                "Formats compared with bf16: int4, mxfp4, nvfp4, mxfp8 (kv/key_formats.hpp)")
      ->delimiter(',')
      ->capture_default_str();
  add_page(s, o->page_size);
  s->add_option("--budget", o->budget, "k of recall@k, as a fraction of the pages")
      ->capture_default_str();
  add_top_p_mass(s, o->top_p, "Mass of the reference page set of the mass recall");
  s->add_option("--mapping", o->mapping, "Scores to masses: softmax or entmax<alpha>")
      ->capture_default_str();
  add_selector_file(s, o->selector_file,
                    "Compare the formats on a learned selector's key cache instead (a qk-input "
                    "selector from masskv distill: its projections of the dumps' q and k)");
  add_output(s, o->out);
  s->footer(
      "Examples:\n"
      "  masskv bench keys --dumps out/dump/layer02.mkvd\n"
      "  masskv bench keys --dumps out/dump/layer02.mkvd --formats int4,nvfp4 --budget 1/8 "
      "-o json --out keys.json\n"
      "  masskv bench keys --dumps out/dump/layer02.mkvd --selector-file selector.gguf");
  s->callback([o] { run_keys(*o); });
}

}  // namespace masskv::cli
