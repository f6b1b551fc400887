// `masskv bench keys`: the selector key formats (DESIGN.md §2.9, kv/key_formats.hpp) on a
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
#include <string>
#include <vector>

#include "commands.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/key_formats.hpp"
#include "masskv/select/selector.hpp"
#include "parse.hpp"
#include "progress.hpp"
#include "qkv_dump.hpp"

namespace masskv::cli {
namespace {

using kv::KeyFormat;

struct KeysOptions {
  std::vector<std::string> dumps;
  std::vector<std::string> formats{"int4", "mxfp4", "nvfp4"};
  int page_size = 16;
  std::string budget = "1/16";
  double top_p = 0.9;
  std::string mapping = "softmax";
  std::string json_path;
};

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
  require(o.top_p > 0 && o.top_p <= 1, ErrorCode::invalid_argument, "--top-p",
          "must be in (0, 1], got ", o.top_p);
  const Mapping map = parse_mapping(o.mapping, "--mapping");
  require(o.page_size >= 1 && o.page_size <= 256 && (o.page_size & (o.page_size - 1)) == 0,
          ErrorCode::invalid_argument, "--page", "must be a power of two in [1, 256], got ",
          o.page_size);
  std::vector<KeyFormat> formats{KeyFormat::bf16};  // the reference first
  for (const auto& name : o.formats) {
    const KeyFormat f = kv::parse_key_format(name, "--formats");
    if (f != KeyFormat::bf16) formats.push_back(f);
  }
  for (const auto& path : o.dumps) {
    const QkvDump h = read_qkv_dump_header(path);
    for (KeyFormat f : formats) kv::check_key_dim(f, h.head_dim, "--formats");
  }

  std::vector<Cell> cells;
  Progress progress("bench keys", static_cast<long>(o.dumps.size() * formats.size()));
  for (const auto& path : o.dumps) {
    const QkvDump d = read_qkv_dump(path);
    const int P = o.page_size, pages = static_cast<int>((d.context + P - 1) / P);
    const int k = std::max(1, static_cast<int>(std::ceil(frac * pages)));
    const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
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
  fmt::print(
      "\n## masskv bench keys — {} dump(s) of {} ({} tokens, {} queries × {} q heads, {} kv "
      "heads, d = {}), page {}, {}; k = {} of the pages, top-p {}\n\n",
      o.dumps.size(), h.model, h.context, h.steps, h.hq, h.hkv, h.head_dim, o.page_size, o.mapping,
      o.budget, o.top_p);
  fmt::print(
      "Bytes per token and kv head; recall against the bf16 keys' selection (mean over dumps, "
      "queries and q heads; min in parentheses); score ns/token: selector_key_scores on this "
      "CPU (the dot products on the codes, no mapping).\n\n");
  fmt::print(
      "| format | bits/value d=64 | d=128 | bytes/token d=64 | d=128 | bf16 / format d=64 | d=128 "
      "| recall@k | mass@k | mass recall | score ns/token |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  nlohmann::json j;
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
      j["cells"].push_back({{"dump", c.dump},
                            {"format", kv::to_string(f)},
                            {"recall_at_k", c.recall_k},
                            {"recall_at_k_min", c.recall_k_min},
                            {"mass_at_k", c.mass_k},
                            {"mass_recall", c.mass},
                            {"mass_recall_min", c.mass_min},
                            {"score_ns_per_token", c.ns_per_token}});
    }
    rk /= n;
    mk /= n;
    mr /= n;
    ns /= n;
    const auto bytes = [&](int dim) { return kv::row_bytes(f, dim); };
    const auto ratio = [&](int dim) {
      return static_cast<double>(kv::row_bytes(KeyFormat::bf16, dim)) / bytes(dim);
    };
    fmt::print(
        "| {} | {:.3g} | {:.3g} | {} | {} | {:.2f}× | {:.2f}× | {:.4f} ({:.3f}) | {:.4f} | {:.4f} "
        "({:.3f}) | {:.1f} |\n",
        kv::to_string(f), 8 * kv::bytes_per_value(f, 64), 8 * kv::bytes_per_value(f, 128),
        bytes(64), bytes(128), ratio(64), ratio(128), rk, rk_min, mk, mr, mr_min, ns);
    j["formats"].push_back({{"format", kv::to_string(f)},
                            {"bytes_per_token_d64", bytes(64)},
                            {"bytes_per_token_d128", bytes(128)},
                            {"recall_at_k", rk},
                            {"recall_at_k_min", rk_min},
                            {"mass_at_k", mk},
                            {"mass_recall", mr},
                            {"mass_recall_min", mr_min},
                            {"score_ns_per_token", ns}});
  }
  if (!o.json_path.empty()) {
    j["config"] = {{"page_size", o.page_size},
                   {"budget", o.budget},
                   {"top_p", o.top_p},
                   {"mapping", o.mapping},
                   {"dumps", o.dumps}};
    auto out = fmt::output_file(o.json_path);
    out.print("{}\n", j.dump(1));
  }
}

}  // namespace

void register_bench_keys(CLI::App& bench) {
  auto o = std::make_shared<KeysOptions>();
  auto* s = bench.add_subcommand(
      "keys",
      "Selector key formats (bf16, int4, mxfp4, nvfp4) on a model's real keys and queries "
      "(masskv dump files): bytes per token, and the page recall of quantised-key scores "
      "against bf16-key scores");
  s->add_option("-i,--dumps", o->dumps, "Files written by masskv dump (comma-separated)")
      ->delimiter(',')
      ->required();
  s->add_option("-f,--formats", o->formats,
                "Formats compared with bf16: int4, mxfp4, nvfp4 (kv/key_formats.hpp)")
      ->delimiter(',')
      ->capture_default_str();
  s->add_option("--page", o->page_size, "Page size (tokens)")->capture_default_str();
  s->add_option("-b,--budget", o->budget, "k of recall@k, as a fraction of the pages")
      ->capture_default_str();
  s->add_option("--top-p", o->top_p, "Mass of the reference page set of the mass recall")
      ->capture_default_str();
  s->add_option("-m,--mapping", o->mapping, "Scores to masses: softmax or entmax<alpha>")
      ->capture_default_str();
  s->add_option("--json", o->json_path, "Write results as JSON to this file");
  s->callback([o] { run_keys(*o); });
}

}  // namespace masskv::cli
