// `masskv study`: selectors × budgets on synthetic attention inputs with named structure,
// under softmax and entmax (docs/design.md §2.2–§2.7): measured δ, recall, output error, the
// certified-exact fraction and the tightness of the certified δ bound, next to the tokens and
// bytes each selection reads. `masskv bench select`: the selector's cost per step next to the
// attention time it saves, in the same run.
#include <fmt/core.h>
#include <fmt/os.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/attn/decode.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/int4_keys.hpp"
#include "masskv/select/diagnostics.hpp"
#include "masskv/select/selector.hpp"
#include "parse.hpp"
#include "plots.hpp"
#include "progress.hpp"
#include "qkv_dump.hpp"
#include "study_common.hpp"

namespace masskv::cli {
namespace {

using select::Method;

struct StudyOptions {
  std::int64_t context = 8192;
  int hq = 8, hkv = 2, head_dim = 64, page_size = 16, steps = 2;
  std::vector<std::string> generators{"gaussian", "needles", "heavy", "drift", "sinks"};
  std::vector<std::string> selectors{"sink_recent",  "quest",          "top_p", "top_p_q4",
                                     "gaussian_tau", "entmax_support", "oracle"};
  std::vector<std::string> budgets{"1/64", "1/32", "1/16", "1/8", "1/4"};
  std::vector<std::string> mappings{"softmax", "entmax1.5", "entmax2"};
  double top_p = 0.95;
  int sink_pages = 1, window = 32;
  std::uint64_t seed = 1;
  std::string out_dir;
  Output out;
  bool dry_run = false;
  bool plots = true;
};

// ---- synthetic generators -----------------------------------------------------------------
// Each fills keys/values [L][Hkv][d] and queries [B][Hq][d] of one sequence per step b.
// Scores are q·k/sqrt(d); the q scale sets how peaked attention is.
struct Inputs {
  std::vector<std::vector<float>> k, v;  // per sequence
  std::vector<float> q;
};

Inputs generate(const std::string& name, const StudyOptions& o, std::int64_t L,
                std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.0f, 1.0f);
  const int d = o.head_dim, Hkv = o.hkv, g = o.hq / o.hkv;
  const std::size_t row = static_cast<std::size_t>(Hkv) * d;
  Inputs in;
  in.q.resize(static_cast<std::size_t>(o.steps) * o.hq * d);
  for (int b = 0; b < o.steps; ++b) {
    std::vector<float> k(static_cast<std::size_t>(L) * row), v(k.size());
    for (auto& x : v) x = N(rng) + 0.2f;
    // Per kv head: the group's query direction u (unit), heads = u + noise.
    std::vector<float> u(row);
    for (int h = 0; h < Hkv; ++h) {
      double n2 = 0;
      for (int x = 0; x < d; ++x) n2 += (u[h * d + x] = N(rng)) * u[h * d + x];
      for (int x = 0; x < d; ++x) u[h * d + x] /= static_cast<float>(std::sqrt(n2));
    }
    float qscale = 1.5f;
    std::vector<float> drift(row, 0.0f);
    std::student_t_distribution<float> T(2.5f);
    std::uniform_int_distribution<std::int64_t> pos(0, L - 1);
    for (std::int64_t t = 0; t < L; ++t) {
      float tok = 1.0f;
      if (name == "heavy") tok = std::min(8.0f, 0.5f + 0.5f * std::fabs(T(rng)));
      if (name == "drift" && t % 16 == 0) {
        for (auto& x : drift) x = 0.98f * x + 0.3f * N(rng);
      }
      for (std::size_t x = 0; x < row; ++x) {
        k[static_cast<std::size_t>(t) * row + x] =
            tok * N(rng) + (name == "drift" ? drift[x] : 0.0f);
      }
    }
    if (name == "needles") {  // 16 keys along the group direction at random positions
      for (int n = 0; n < 16; ++n) {
        const std::int64_t t = pos(rng);
        for (int h = 0; h < Hkv; ++h) {
          for (int x = 0; x < d; ++x) {
            k[static_cast<std::size_t>(t) * row + h * d + x] +=
                0.9f * std::sqrt(static_cast<float>(d)) * u[h * d + x];
          }
        }
      }
      qscale = 1.0f;
    }
    if (name == "sinks") {  // the first 4 tokens soak up mass, as in trained models
      for (std::int64_t t = 0; t < std::min<std::int64_t>(4, L); ++t) {
        for (int h = 0; h < Hkv; ++h) {
          for (int x = 0; x < d; ++x) {
            k[static_cast<std::size_t>(t) * row + h * d + x] +=
                1.2f * std::sqrt(static_cast<float>(d)) * u[h * d + x];
          }
        }
      }
    }
    if (name == "drift") {  // q recalls the keys of a random past stretch
      const std::int64_t t0 = pos(rng);
      for (int h = 0; h < Hkv; ++h) {
        double n2 = 0;
        for (int x = 0; x < d; ++x) {
          const float m = k[static_cast<std::size_t>(t0) * row + h * d + x];
          n2 += m * m;
        }
        for (int x = 0; x < d; ++x) {
          u[h * d + x] = 0.5f * u[h * d + x] + k[static_cast<std::size_t>(t0) * row + h * d + x] /
                                                   static_cast<float>(std::sqrt(n2));
        }
      }
    }
    for (int h = 0; h < Hkv; ++h) {
      for (int i = 0; i < g; ++i) {
        for (int x = 0; x < d; ++x) {
          in.q[(static_cast<std::size_t>(b) * o.hq + h * g + i) * d + x] =
              qscale * (std::sqrt(static_cast<float>(d)) * u[h * d + x] * 0.8f + 0.6f * N(rng));
        }
      }
    }
    in.k.push_back(std::move(k));
    in.v.push_back(std::move(v));
  }
  return in;
}

struct Row {
  std::string generator, mapping, selector, budget;
  double budget_frac = 1;
  double tokens = 0, tokens_frac = 0, bytes_frac = 0;
  double delta = 0, delta_max = 0, delta_bound = 0, recall = 0, rel_error = 0, err_bound = 0;
  double certified = 0, tightness = 0;
  bool held = true;
};

// Bytes one selector reads per step for one (sequence, kv head), besides the selected KV:
// the summaries it scans (f32: min/max for bounds, mean/M2 for the page model), the INT4
// selector key of every token (top_p_q4, with the min/max of its bound candidates) or, for
// the oracle, every key.
double selector_bytes(const SelectorSpec& s, int pages, std::int64_t L, int d) {
  const double per = 4.0 * d;  // one f32 [d] summary row
  if (uses_quant_keys(s)) {
    return pages * 2 * per + static_cast<double>(L) * kv::int4::bytes_per_value() * d;
  }
  switch (s.method) {
    case Method::quest:
    case Method::entmax_support:
      return pages * 2 * per;
    case Method::top_p:
    case Method::gaussian_tau:
      return pages * 4 * per;
    case Method::oracle:
      return static_cast<double>(L) * d * 2.0;
    default:
      return 0;
  }
}

// The rows of -o and of study.csv / study.json: one per generator, mapping, selector, budget.
Rows study_rows(const std::vector<Row>& rows) {
  Rows out = Rows::array();
  for (const auto& r : rows) {
    out.push_back({{"generator", r.generator},
                   {"mapping", r.mapping},
                   {"selector", r.selector},
                   {"budget", r.budget},
                   {"budget_frac", r.budget_frac},
                   {"tokens", r.tokens},
                   {"tokens_frac", r.tokens_frac},
                   {"bytes_frac", r.bytes_frac},
                   {"delta", r.delta},
                   {"delta_max", r.delta_max},
                   {"delta_bound", r.delta_bound},
                   {"recall", r.recall},
                   {"rel_error", r.rel_error},
                   {"error_bound", r.err_bound},
                   {"certified", r.certified},
                   {"tightness", r.tightness},
                   {"bounds_held", r.held}});
  }
  return out;
}

// study.json (the command, the settings and the rows) and study.csv in -O DIR.
void write_outputs(const std::vector<Row>& rows, const StudyOptions& o, const std::string& cmd) {
  if (o.out_dir.empty()) return;
  Rows j;
  j["command"] = cmd;
  j["config"] = {{"context", o.context},
                 {"hq", o.hq},
                 {"hkv", o.hkv},
                 {"head_dim", o.head_dim},
                 {"page_size", o.page_size},
                 {"steps", o.steps},
                 {"top_p", o.top_p},
                 {"sink_pages", o.sink_pages},
                 {"window", o.window},
                 {"seed", o.seed}};
  j["rows"] = study_rows(rows);
  std::filesystem::create_directories(o.out_dir);
  fmt::output_file(o.out_dir + "/study.json").print("{}\n", j.dump(1));
  fmt::output_file(o.out_dir + "/study.csv").print("{}", to_csv(j["rows"]));
}

// Runs scripts/plot_study.py on the CSV.
void make_plots(const StudyOptions& o) {
  if (!o.plots || o.out_dir.empty()) return;
  run_plot_script("study", "plot_study.py", {o.out_dir + "/study.csv", o.out_dir});
}

bool is_dump(const std::string& gname) { return gname.rfind("dump:", 0) == 0; }

// Real inputs from `masskv dump`: every step's sequence is the dumped context, each with the
// query of one dumped token.
Inputs load_dump(const std::string& gname) {
  QkvDump d = read_qkv_dump(gname.substr(5));
  Inputs in;
  in.q = std::move(d.q);
  for (int b = 0; b < d.steps; ++b) {
    in.k.push_back(d.k);
    in.v.push_back(d.v);
  }
  return in;
}

// With dump generators the shapes (context, heads, head_dim, steps) come from the files, which
// must agree with each other.
StudyOptions with_dump_shapes(StudyOptions o) {
  bool first = true;
  for (const auto& gname : o.generators) {
    if (!is_dump(gname)) continue;
    const QkvDump h = read_qkv_dump_header(gname.substr(5));
    const std::int64_t ctx = h.context;
    require(first || (ctx == o.context && h.hq == o.hq && h.hkv == o.hkv &&
                      h.head_dim == o.head_dim && h.steps == o.steps),
            ErrorCode::invalid_argument, "--generators", gname,
            ": shapes differ from the other dumps (context, heads, head_dim, steps)");
    o.context = ctx;
    o.hq = h.hq;
    o.hkv = h.hkv;
    o.head_dim = h.head_dim;
    o.steps = h.steps;
    first = false;
  }
  return o;
}

// Bytes a study of L tokens holds at once: per step f32 K and V, and the paged cache with its
// summaries and selector keys (about as much again).
double study_bytes(std::int64_t L, int hq, int hkv, int head_dim, int steps) {
  return static_cast<double>(steps) * static_cast<double>(L) * (hkv * head_dim * 16.0 + hq * 8.0);
}

void run_study(const StudyOptions& o_in, const std::string& cmdline, const CLI::App& app) {
  const StudyOptions o = with_dump_shapes(o_in);
  const std::int64_t L = o.context;
  check_head_shape(o.hq, o.hkv);
  const double bytes = require_memory(study_bytes(L, o.hq, o.hkv, o.head_dim, o.steps),
                                      "--ctx-size", "the keys, values and paged cache of --steps");
  std::vector<Mapping> maps;
  for (const auto& m : o.mappings) maps.push_back(parse_mapping(m, "--mapping"));
  std::vector<SelectorSpec> methods;
  for (const auto& s : o.selectors) methods.push_back(parse_selector(s, "--selectors"));
  const bool quant_keys = std::any_of(methods.begin(), methods.end(), uses_quant_keys);
  require(!quant_keys || o.head_dim % kv::int4::kBlock == 0, ErrorCode::invalid_argument,
          "--selectors", "top_p_q4 needs INT4 selector keys: head_dim ", o.head_dim,
          " is not a multiple of ", kv::int4::kBlock);
  std::vector<double> fracs;
  for (const auto& b : o.budgets) fracs.push_back(parse_fraction(b, "--budget"));
  for (const auto& gname : o.generators) {
    require(gname == "gaussian" || gname == "needles" || gname == "heavy" || gname == "drift" ||
                gname == "sinks" || is_dump(gname),
            ErrorCode::invalid_argument, "--generators", "unknown generator '", gname,
            "' (gaussian, needles, heavy, drift, sinks, dump:FILE)");
  }
  if (dry_run_plan(o.dry_run, app, {{"memory", format_bytes(bytes)}})) return;

  // Work list: per generator and mapping, dense once, then selectors × budgets.
  long total = 0;
  for (std::size_t mi = 0; mi < maps.size(); ++mi) {
    for (const SelectorSpec& m : methods) {
      if (entmax_only(m) && !maps[mi].is_entmax()) continue;
      total += static_cast<long>(fracs.size());
    }
    total += 1;
  }
  total *= static_cast<long>(o.generators.size());
  Progress progress("study", total);
  std::vector<Row> rows;
  const double dense_kv_bytes = 2.0 * 2.0 * o.head_dim * static_cast<double>(L);  // f16 K+V

  for (std::size_t gi = 0; gi < o.generators.size(); ++gi) {
    const std::string& gname = o.generators[gi];
    Inputs in = is_dump(gname) ? load_dump(gname) : generate(gname, o, L, o.seed * 1000 + gi);
    const std::vector<std::span<const float>> ks(in.k.begin(), in.k.end()),
        vs(in.v.begin(), in.v.end());
    StepCache step_cache = make_step_cache(o.hkv, o.head_dim, o.page_size, L, ks, vs, quant_keys);
    kv::PagedKVCache& cache = step_cache.cache;
    const std::vector<kv::SeqId>& seqs = step_cache.seqs;
    const kv::PageTableStorage table = cache.page_table(seqs);
    select::SelectArgs sa;
    sa.q = View3<const float>::contiguous(in.q.data(), o.steps, o.hq, o.head_dim);
    sa.cache = cache.view(table);
    sa.summaries = cache.summaries();
    sa.selector_keys = cache.selector_keys();
    const int pages = static_cast<int>((L + o.page_size - 1) / o.page_size);

    for (std::size_t mi = 0; mi < maps.size(); ++mi) {
      const Mapping map = maps[mi];
      auto evaluate = [&](const SelectorSpec& spec, double frac, const std::string& budget_name) {
        progress.set_note(
            fmt::format("{} {} {} {}", gname, o.mappings[mi], spec.name, budget_name));
        const select::SelectorConfig sc =
            study_selector_config(spec, map, frac, L, {o.top_p, o.sink_pages, o.window});
        select::SelectOutput out;
        select::run_selector(sa, sc, out);
        const SelectionView sel = out.selection.view();
        select::DiagnosticsArgs da;
        da.q = sa.q;
        da.cache = sa.cache;
        da.summaries = sa.summaries;
        da.mapping = map;
        da.selection = &sel;
        da.study = true;
        std::vector<select::HeadDiagnostics> diag;
        select::diagnose(da, diag);
        Row r;
        r.generator = gname;
        r.mapping = o.mappings[mi];
        r.selector = spec.name;
        r.budget = budget_name;
        r.budget_frac = frac;
        double sum_delta = 0, sum_bound = 0;
        for (const auto& D : diag) {
          r.tokens += static_cast<double>(D.selected_tokens);
          r.delta += D.delta;
          r.delta_max = std::max(r.delta_max, D.delta);
          r.delta_bound += D.delta_bound;
          r.recall += D.recall;
          r.rel_error += D.rel_error;
          r.err_bound += D.error_bound;
          r.certified += D.certified;
          r.held = r.held && D.bounds_held;
          sum_delta += D.delta;
          sum_bound += D.delta_bound;
        }
        const double n = static_cast<double>(diag.size());
        for (double* x : {&r.tokens, &r.delta, &r.delta_bound, &r.recall, &r.rel_error,
                          &r.err_bound, &r.certified}) {
          *x /= n;
        }
        r.tightness = sum_bound > 0 ? sum_delta / sum_bound : 1.0;
        r.tokens_frac = r.tokens / static_cast<double>(L);
        r.bytes_frac = (r.tokens * 4.0 * o.head_dim + selector_bytes(spec, pages, L, o.head_dim)) /
                       dense_kv_bytes;
        rows.push_back(r);
        progress.advance();
      };
      evaluate(SelectorSpec{Method::dense, select::MassSource::page_gaussian, "dense"}, 1.0, "1");
      for (const SelectorSpec& m : methods) {
        if (entmax_only(m) && !map.is_entmax()) continue;
        for (std::size_t bi = 0; bi < fracs.size(); ++bi) evaluate(m, fracs[bi], o.budgets[bi]);
      }
    }
  }
  progress.finish();

  const bool all_held = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.held; });
  write_results(o.out, study_rows(rows), [&](std::FILE* f) {
    fmt::print(f,
               "\n## masskv study — {} tokens, Hq={}, Hkv={}, d={}, page {}, {} step(s) per "
               "generator, top-p {}, sinks {} page(s), window {}\n\n",
               L, o.hq, o.hkv, o.head_dim, o.page_size, o.steps, o.top_p, o.sink_pages, o.window);
    fmt::print(f,
               "δ: dropped mass (mean over heads and steps); recall: entmax support / softmax "
               "90%-mass set; err: ‖o − ô‖/‖o‖; cert: heads certified exact; tight: Σδ / Σδ-bound; "
               "bytes: (KV read + selector reads) / dense KV.\n\n");
    fmt::print(f,
               "| generator | mapping | selector | budget | tokens | bytes | δ | δ max | δ bound | "
               "tight | recall | err | cert | bounds held |\n");
    fmt::print(f, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|\n");
    for (const auto& r : rows) {
      fmt::print(
          f,
          "| {} | {} | {} | {} | {:.0f} | {:.4f} | {:.2e} | {:.2e} | {:.2e} | {:.2f} | {:.3f} | "
          "{:.2e} | {:.2f} | {} |\n",
          r.generator, r.mapping, r.selector, r.budget, r.tokens, r.bytes_frac, r.delta,
          r.delta_max, r.delta_bound, r.tightness, r.recall, r.rel_error, r.certified,
          r.held ? "yes" : "**NO**");
    }
    // Tokens needed to reach δ <= target: the smallest budget in the sweep that does, per
    // generator, mapping and selector (a coarse reading of the sweep).
    fmt::print(f, "\n### Smallest swept budget with mean δ ≤ 1% (tokens read, bytes fraction)\n\n");
    fmt::print(f,
               "| generator | mapping | selector | budget | tokens | bytes "
               "|\n|---|---|---|---:|---:|---:|\n");
    std::map<std::tuple<std::string, std::string, std::string>, const Row*> best;
    for (const auto& r : rows) {
      if (r.delta > 0.01 || r.selector == "dense") continue;
      auto& b = best[{r.generator, r.mapping, r.selector}];
      if (!b || r.tokens < b->tokens) b = &r;
    }
    for (const auto& [key, r] : best) {
      fmt::print(f, "| {} | {} | {} | {} | {:.0f} | {:.4f} |\n", r->generator, r->mapping,
                 r->selector, r->budget, r->tokens, r->bytes_frac);
    }
    fmt::print(f, "\nevery certified bound held: {}\n", all_held ? "yes" : "NO");
  });
  write_outputs(rows, o, cmdline);
  make_plots(o);
}

// ---- bench select ---------------------------------------------------------------------------
struct BenchOptions {
  std::vector<std::string> depths{"32K", "64K", "128K", "256K"};
  int hq = 32, hkv = 8, head_dim = 128, page_size = 16;
  std::string budget = "1/32";
  std::vector<std::string> selectors{"sink_recent", "quest", "top_p", "gaussian_tau",
                                     "entmax_support"};
  double alpha = 1.5;
  int reps = 5;
  std::uint64_t seed = 1;
  Output out;
  bool dry_run = false;
};

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <class F>
double median_us(int reps, F&& f) {
  std::vector<double> t;
  f();
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_us();
    f();
    t.push_back(now_us() - t0);
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<std::size_t>(reps / 2)];
}

void run_bench(const BenchOptions& o, const CLI::App& app) {
  const double frac = parse_fraction(o.budget, "--budget");
  check_head_shape(o.hq, o.hkv);
  double bytes = 0;  // one depth at a time
  for (const auto& ds : o.depths) {
    bytes = std::max(bytes, study_bytes(parse_count(ds, "--depth"), o.hq, o.hkv, o.head_dim, 1));
  }
  require_memory(bytes, "--depth", "the keys, values and paged cache");
  if (dry_run_plan(o.dry_run, app, {{"memory", format_bytes(bytes)}})) return;
  StudyOptions so;
  so.hq = o.hq;
  so.hkv = o.hkv;
  so.head_dim = o.head_dim;
  so.page_size = o.page_size;
  so.steps = 1;
  struct BRow {
    std::int64_t context;
    std::string selector;
    double select_us, pages, sparse_us, dense_us;
  };
  std::vector<BRow> rows;
  const Mapping map = Mapping::entmax(o.alpha);
  Progress progress("bench select", static_cast<long>(o.depths.size() * (o.selectors.size() + 1)));
  for (const auto& ds : o.depths) {
    const std::int64_t L = parse_count(ds, "--depth");
    progress.set_note(fmt::format("fill {}", L));
    Inputs in = generate("drift", so, L, o.seed + static_cast<std::uint64_t>(L));
    kv::CacheConfig cfg;
    cfg.num_kv_heads = o.hkv;
    cfg.head_dim = o.head_dim;
    cfg.page_size = o.page_size;
    cfg.dtype = DType::f16;
    cfg.capacity_pages = static_cast<int>((L + o.page_size - 1) / o.page_size);
    // token_codes and two_stage score on the page codes, kept on append when any selector asks.
    for (const auto& name : o.selectors) {
      cfg.page_codes |= select::needs_page_codes(parse_selector(name, "--selectors").method);
    }
    kv::PagedKVCache cache(cfg);
    const kv::SeqId s = cache.create();
    cache.append(s, in.k[0], in.v[0], static_cast<int>(L));
    in.k.clear();
    in.v.clear();
    const kv::PageTableStorage table = cache.page_table(std::span<const kv::SeqId>(&s, 1));
    std::vector<float> out(static_cast<std::size_t>(o.hq) * o.head_dim), st(o.hq);
    attn::DecodeArgs a;
    a.q = View3<const float>::contiguous(in.q.data(), 1, o.hq, o.head_dim);
    a.cache = cache.view(table);
    a.mapping = map;
    a.out = View3<float>::contiguous(out.data(), 1, o.hq, o.head_dim);
    a.lse_or_tau = st;
    const double dense_us = median_us(o.reps, [&] { attn::decode(a); });
    progress.advance();
    for (const auto& name : o.selectors) {
      progress.set_note(fmt::format("{} {}", L, name));
      const select::SelectorConfig sc =
          study_selector_config(parse_selector(name, "--selectors"), map, frac, L, {0.95, 1, 64});
      select::SelectArgs sa;
      sa.q = a.q;
      sa.cache = a.cache;
      sa.summaries = cache.summaries();
      sa.page_codes = cache.page_codes();
      select::SelectOutput so_out;
      const double sel_us = median_us(o.reps, [&] { select::run_selector(sa, sc, so_out); });
      const SelectionView sel = so_out.selection.view();
      attn::DecodeArgs b = a;
      b.selection = &sel;
      const double sparse_us = median_us(o.reps, [&] { attn::decode(b); });
      const double pages =
          std::accumulate(so_out.selection.count.begin(), so_out.selection.count.end(), 0.0) /
          static_cast<double>(so_out.selection.count.size());
      rows.push_back({L, name, sel_us, pages, sparse_us, dense_us});
      progress.advance();
    }
  }
  progress.finish();
  Rows j = Rows::array();
  for (const auto& r : rows) {
    j.push_back({{"context", r.context},
                 {"selector", r.selector},
                 {"select_us", r.select_us},
                 {"pages_per_head", r.pages},
                 {"sparse_us", r.sparse_us},
                 {"dense_us", r.dense_us},
                 {"saved_us", r.dense_us - r.sparse_us}});
  }
  write_results(o.out, j, [&](std::FILE* f) {
    fmt::print(f,
               "\n## masskv bench select — CPU, f16 KV, Hq={}, Hkv={}, d={}, page {}, entmax α={}, "
               "budget cap {} (drifting keys)\n\n",
               o.hq, o.hkv, o.head_dim, o.page_size, o.alpha, o.budget);
    fmt::print(f,
               "| context | selector | select µs | items/head | sparse decode µs | dense decode µs "
               "| saved µs | select / saved |\n|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& r : rows) {
      const double saved = r.dense_us - r.sparse_us;
      fmt::print(f, "| {} | {} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {:.2f} |\n",
                 r.context, r.selector, r.select_us, r.pages, r.sparse_us, r.dense_us, saved,
                 saved > 0 ? r.select_us / saved : INFINITY);
    }
  });
}

}  // namespace

void register_study(CLI::App& app, const std::string& cmdline) {
  auto o = std::make_shared<StudyOptions>();
  auto* s = app.add_subcommand(
      "study",
      "Selectors x budgets on synthetic attention inputs (softmax and entmax): dropped "
      "mass, recall, output error, certificates, bytes read; table, CSV/JSON, PNG plots");
  add_ctx_size(s, o->context, 1, "Context length (tokens)");
  add_head_shape(s, o->hq, o->hkv, o->head_dim, o->page_size);
  s->add_option("--steps", o->steps, "Decode steps (independent sequences) per generator")
      ->check(int_in(1, 4096))
      ->capture_default_str();
  s->add_option("--generators", o->generators,
                "Inputs: synthetic gaussian, needles, heavy, drift, sinks; or dump:FILE, a model's "
                "real q/k/v written by masskv dump (its shapes replace --ctx-size, --hq, --hkv, "
                "--head-dim, --steps)")
      ->delimiter(',')
      ->capture_default_str();
  s->add_option("--selectors", o->selectors,
                "sink_recent, quest, top_p, top_p_q4 (top_p with page masses from scores on INT4 "
                "selector keys), gaussian_tau, entmax_support, oracle (dense always)")
      ->delimiter(',')
      ->capture_default_str();
  add_budget_fractions(s, o->budgets);
  add_mappings(s, o->mappings);
  add_top_p_mass(s, o->top_p);
  add_kept_items(s, o->sink_pages, o->window);
  add_seed(s, o->seed, "Random seed");
  add_output(s, o->out);
  add_out_dir(s, o->out_dir,
              "Write study.csv, study.json and PNG plots (scripts/plot_study.py) here");
  add_no_plots(s, o->plots);
  add_dry_run(s, o->dry_run);
  s->footer(
      "Examples:\n"
      "  masskv study -O docs/results\n"
      "  masskv study -c 32K --generators needles,drift --selectors quest,top_p --budget 1/32,1/16 "
      "--mapping softmax -o csv --no-plots\n"
      "  masskv study --generators dump:out/dump/layer02.mkvd --selectors quest --budget 1/8 "
      "--no-plots");
  s->callback([o, cmdline, s] { run_study(*o, cmdline, *s); });

  auto b = std::make_shared<BenchOptions>();
  auto* bench = app.get_subcommand("bench");
  auto* sel = bench->add_subcommand(
      "select",
      "Selector cost per decode step next to the attention time it saves (dense vs "
      "sparse decode on its selection), same run");
  add_depths(sel, b->depths, 1, "Context lengths");
  add_head_shape(sel, b->hq, b->hkv, b->head_dim, b->page_size);
  sel->add_option("--budget", b->budget, "Budget (cap) as a fraction of the context")
      ->capture_default_str();
  sel->add_option("--selectors", b->selectors, "Selectors to time")
      ->delimiter(',')
      ->capture_default_str();
  add_alpha(sel, b->alpha, "entmax alpha of the attention");
  add_repetitions(sel, b->reps, "Timed repetitions (median reported)");
  add_seed(sel, b->seed, "Random seed");
  add_output(sel, b->out);
  add_dry_run(sel, b->dry_run);
  sel->footer(
      "Examples:\n"
      "  masskv bench select -d 32K,128K\n"
      "  masskv bench select -d 64K --selectors quest,gaussian_tau --budget 1/16 -r 9\n"
      "  masskv bench select -d 32K -o json --out select.json");
  sel->callback([b, sel] { run_bench(*b, *sel); });
}

}  // namespace masskv::cli
