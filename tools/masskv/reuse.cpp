// `masskv reuse`: what a page selection loses when it is reused instead of recomputed — made
// for an earlier decode step's query (age a) or by the previous layer — measured on a model's
// real attention inputs (`masskv dump`). At B = 1 the GPU step's selection chain, not its
// bytes, bounds the speedup (docs/gpu-results.md); refreshing the selection every few steps or sharing
// it across layers would take it off the critical path, and this is the quality side of that
// trade. Per head: δ (dropped mass), recall, ‖o − ô‖/‖o‖ (select::diagnose, study mode) and the
// overlap of the reused pages with a fresh selection's.
#include <fmt/core.h>
#include <fmt/os.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/diagnostics.hpp"
#include "masskv/select/selector.hpp"
#include "parse.hpp"
#include "plots.hpp"
#include "progress.hpp"
#include "qkv_dump.hpp"
#include "study_common.hpp"

namespace masskv::cli {
namespace {

struct ReuseOptions {
  std::vector<std::string> inputs;
  std::vector<std::string> selectors{"quest", "top_p"};
  std::vector<std::string> budgets{"1/16", "1/8"};
  std::vector<std::string> mappings{"softmax", "entmax1.5"};
  std::vector<int> ages{1, 2, 4, 8};
  // Reuse policies as the model runs them (SessionOptions::reselect_every / reselect_cos):
  // walking the queries in order, a layer selects again after policy_every steps or when a
  // q head's query turns past each cosine of policy_cos.
  int policy_every = 16;
  std::vector<double> policy_cos;
  int page_size = 16;
  StudySelectorParams params;
  std::string out_dir;
  Output out;
  bool plots = true;
};

// Means over the heads of one (layer, mapping, selector, budget, source).
// delta_fresh: the fresh selection's δ on the same queries (rows of different ages and the
// previous-layer rows cover different queries, so each is compared with its own).
struct Measure {
  double tokens = 0, delta = 0, delta_fresh = 0, delta_max = 0, recall = 0, rel_error = 0;
  double overlap = 0;
  long heads = 0;
  double selects = -1;  // policy rows: share of the steps that selected (-1: not a policy row)
};

struct Row {
  int layer = 0;
  std::string mapping, selector, budget, source;
  // Steps between the selection's query and the evaluated one; -1: previous layer; -2 - i:
  // policy i (ReuseOptions::policy_cos[i]).
  int age = 0;
  Measure m;
};

// Rows [first, first + n) of a selection.
SelectionView rows_of(const SelectionView& s, int first, int n) {
  const auto per_row = static_cast<std::size_t>(s.num_kv_heads);
  SelectionView r = s;
  r.batch = n;
  r.ids = s.ids.subspan(first * per_row * static_cast<std::size_t>(s.max_per_head),
                        n * per_row * static_cast<std::size_t>(s.max_per_head));
  r.count = s.count.subspan(first * per_row, n * per_row);
  return r;
}

// Share of `fresh`'s pages that `used` also holds (lists are ascending, §3).
double overlap(std::span<const std::int32_t> used, std::span<const std::int32_t> fresh) {
  if (fresh.empty()) return 1.0;
  return static_cast<double>(select::common_ids(used, fresh)) / static_cast<double>(fresh.size());
}

// `used` evaluated on queries `q` (one row per sequence of `cache`), against `fresh`, the
// selection made for those very queries, whose δ per head is `fresh_delta` ([B][Hq]; empty
// when `used` is `fresh`). `deltas` receives δ per head.
Measure measure(View3<const float> q, const kv::PagedKVView& cache,
                const kv::SummariesView& summaries, Mapping map, const SelectionView& used,
                const SelectionView& fresh, std::span<const double> fresh_delta,
                std::vector<double>* deltas = nullptr) {
  select::DiagnosticsArgs da;
  da.q = q;
  da.cache = cache;
  da.summaries = summaries;
  da.mapping = map;
  da.selection = &used;
  da.study = true;
  std::vector<select::HeadDiagnostics> diag;
  select::diagnose(da, diag);
  Measure m;
  const int group = static_cast<int>(q.n1) / used.num_kv_heads;
  for (std::size_t i = 0; i < diag.size(); ++i) {
    const select::HeadDiagnostics& D = diag[i];
    const int b = static_cast<int>(i / q.n1), h = static_cast<int>(i % q.n1) / group;
    m.tokens += static_cast<double>(D.selected_tokens);
    m.delta += D.delta;
    m.delta_fresh += fresh_delta.empty() ? D.delta : fresh_delta[i];
    m.delta_max = std::max(m.delta_max, D.delta);
    m.recall += D.recall;
    m.rel_error += D.rel_error;
    m.overlap += overlap(used.list(b, h), fresh.list(b, h));
    if (deltas != nullptr) deltas->push_back(D.delta);
  }
  m.heads = static_cast<long>(diag.size());
  for (double* x : {&m.tokens, &m.delta, &m.delta_fresh, &m.recall, &m.rel_error, &m.overlap}) {
    *x /= static_cast<double>(m.heads);
  }
  return m;
}

// The selections a layer uses when it walks the fresh selections' queries in order under the
// policy (select every `every` steps, or when a q head turns past `min_cos`), and the share of
// steps that selected. Row s of the result is the fresh row of the step that last selected.
std::pair<SelectionStorage, double> policy_selection(const SelectionView& fresh,
                                                     const std::vector<float>& q, int row_floats,
                                                     int head_dim, int every, double min_cos) {
  SelectionStorage used;
  used.reset(fresh.unit, fresh.batch, fresh.num_kv_heads, fresh.max_per_head);
  const auto row = [&](int s) {
    return std::span<const float>(q).subspan(static_cast<std::size_t>(s) * row_floats,
                                             static_cast<std::size_t>(row_floats));
  };
  int made = 0, selections = 0;
  for (int s = 0; s < fresh.batch; ++s) {
    if (s == 0 || s - made >= every ||
        !select::queries_within_cos(row(s), row(made), head_dim, min_cos)) {
      made = s;
      ++selections;
    }
    for (int h = 0; h < fresh.num_kv_heads; ++h) {
      const auto l = fresh.list(made, h);
      std::copy(l.begin(), l.end(), used.slots(s, h).begin());
      used.count[static_cast<std::size_t>(s) * fresh.num_kv_heads + h] =
          static_cast<std::int32_t>(l.size());
    }
  }
  return {std::move(used), static_cast<double>(selections) / fresh.batch};
}

std::string source_name(int age) {
  if (age < 0) return "prev layer";
  return age == 0 ? "fresh" : fmt::format("step −{}", age);
}

// Means over layers, per (mapping, selector, budget, source): configurations in the order
// first seen, each with its ages in order and the previous-layer row last.
std::vector<Row> layer_means(const std::vector<Row>& rows) {
  std::vector<Row> out;
  std::map<std::tuple<std::string, std::string, std::string, int>, std::size_t> at;
  std::vector<int> n;
  for (const Row& r : rows) {
    auto [it, fresh] = at.try_emplace({r.mapping, r.selector, r.budget, r.age}, out.size());
    if (fresh) {
      out.push_back(r);
      out.back().m = {};
      out.back().m.selects = r.m.selects < 0 ? -1 : 0;
      n.push_back(0);
    }
    Measure& m = out[it->second].m;
    m.tokens += r.m.tokens;
    m.delta += r.m.delta;
    m.delta_fresh += r.m.delta_fresh;
    m.delta_max = std::max(m.delta_max, r.m.delta_max);
    m.recall += r.m.recall;
    m.rel_error += r.m.rel_error;
    m.overlap += r.m.overlap;
    m.heads += r.m.heads;
    if (m.selects >= 0) m.selects += r.m.selects;
    ++n[it->second];
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    Measure& m = out[i].m;
    for (double* x : {&m.tokens, &m.delta, &m.delta_fresh, &m.recall, &m.rel_error, &m.overlap}) {
      *x /= n[i];
    }
    if (m.selects >= 0) m.selects /= n[i];
  }
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> config;
  for (const Row& r : out) config.try_emplace({r.mapping, r.selector, r.budget}, config.size());
  const auto order = [&](const Row& r) {
    return std::pair(config.at({r.mapping, r.selector, r.budget}), r.age < 0 ? INT_MAX : r.age);
  };
  std::stable_sort(out.begin(), out.end(),
                   [&](const Row& a, const Row& b) { return order(a) < order(b); });
  return out;
}

// The rows of -o and of reuse.csv / reuse.json: one per layer, mapping, selector, budget and
// source.
Rows reuse_rows(const std::vector<Row>& rows) {
  Rows out = Rows::array();
  for (const Row& r : rows) {
    out.push_back({{"layer", r.layer},
                   {"mapping", r.mapping},
                   {"selector", r.selector},
                   {"budget", r.budget},
                   {"source", r.source},
                   {"age", r.age},
                   {"tokens", r.m.tokens},
                   {"delta", r.m.delta},
                   {"delta_fresh", r.m.delta_fresh},
                   {"delta_max", r.m.delta_max},
                   {"recall", r.m.recall},
                   {"rel_error", r.m.rel_error},
                   {"overlap", r.m.overlap},
                   {"heads", r.m.heads},
                   {"selects", r.m.selects}});
  }
  return out;
}

// reuse.json (the command, the settings and the rows) and reuse.csv in -O DIR.
void write_outputs(const std::vector<Row>& rows, const ReuseOptions& o, const std::string& cmd) {
  std::filesystem::create_directories(o.out_dir);
  Rows j;
  j["command"] = cmd;
  j["config"] = {{"page_size", o.page_size},
                 {"top_p", o.params.top_p},
                 {"sink_pages", o.params.sink_pages},
                 {"window", o.params.window}};
  j["rows"] = reuse_rows(rows);
  fmt::output_file(o.out_dir + "/reuse.csv").print("{}", to_csv(j["rows"]));
  fmt::output_file(o.out_dir + "/reuse.json").print("{}\n", j.dump(1));
}

void run_reuse(const ReuseOptions& o, const std::string& cmdline) {
  require(!o.inputs.empty(), ErrorCode::invalid_argument, "--inputs",
          "name at least one file written by masskv dump");
  std::vector<Mapping> maps;
  for (const auto& m : o.mappings) maps.push_back(parse_mapping(m, "--mapping"));
  std::vector<SelectorSpec> specs;
  for (const auto& s : o.selectors) {
    specs.push_back(parse_selector(s, "--selectors"));
    require(!uses_quant_keys(specs.back()) && !select::uses_learned_keys(specs.back().method) &&
                !select::needs_page_codes(specs.back().method),
            ErrorCode::invalid_argument, "--selectors", s,
            " is not studied here (bound- and moment-based selectors only)");
  }
  std::vector<double> fracs;
  for (const auto& b : o.budgets) fracs.push_back(parse_fraction(b, "--budget"));
  for (int a : o.ages) {
    require(a >= 1, ErrorCode::invalid_argument, "--ages", "ages must be >= 1 (got ", a, ")");
  }
  long work = 0;
  for (const Mapping& map : maps) {
    for (const SelectorSpec& s : specs) {
      if (!entmax_only(s) || map.is_entmax()) work += static_cast<long>(fracs.size());
    }
  }
  Progress progress("reuse", work * static_cast<long>(o.inputs.size()));

  // Each configuration's fresh selection of the previous file, for the next layer's rows.
  using Key = std::tuple<std::size_t, std::size_t, std::size_t>;
  std::map<Key, select::SelectOutput> prev, cur;
  int prev_layer = -2, hq = 0, hkv = 0, head_dim = 0, steps = 0;
  std::int64_t context = 0;
  std::vector<Row> rows;
  for (std::size_t fi = 0; fi < o.inputs.size(); ++fi) {
    const QkvDump d = read_qkv_dump(o.inputs[fi]);
    if (fi == 0) {
      std::tie(hq, hkv, head_dim, steps, context) =
          std::tuple(d.hq, d.hkv, d.head_dim, d.steps, d.context);
    }
    require(d.hq == hq && d.hkv == hkv && d.head_dim == head_dim && d.steps == steps &&
                d.context == context,
            ErrorCode::invalid_argument, "--inputs", o.inputs[fi],
            ": shapes differ from the first file's (context, heads, head_dim, steps)");
    require(steps >= 2, ErrorCode::invalid_argument, "--inputs", o.inputs[fi], " holds ", steps,
            " query; reuse needs at least 2 (masskv dump --steps)");
    const std::vector<std::span<const float>> ks(static_cast<std::size_t>(steps), d.k),
        vs(static_cast<std::size_t>(steps), d.v);
    StepCache sc = make_step_cache(hkv, head_dim, o.page_size, context, ks, vs, false);
    const auto q_rows = [&](int first, int n) {
      return View3<const float>::contiguous(
          d.q.data() + static_cast<std::size_t>(first) * hq * head_dim, n, hq, head_dim);
    };
    // Sequences [0, n): every one holds the same context.
    std::map<int, kv::PageTableStorage> tables;
    const auto cache_rows = [&](int n) {
      auto it = tables.find(n);
      if (it == tables.end()) {
        it = tables
                 .emplace(n, sc.cache.page_table(std::span<const kv::SeqId>(
                                 sc.seqs.data(), static_cast<std::size_t>(n))))
                 .first;
      }
      return sc.cache.view(it->second);
    };
    const kv::SummariesView sums = sc.cache.summaries();
    const bool has_prev = d.layer == prev_layer + 1;
    for (std::size_t mi = 0; mi < maps.size(); ++mi) {
      for (std::size_t si = 0; si < specs.size(); ++si) {
        if (entmax_only(specs[si]) && !maps[mi].is_entmax()) continue;
        for (std::size_t bi = 0; bi < fracs.size(); ++bi) {
          progress.set_note(fmt::format("layer {} {} {} {}", d.layer, o.mappings[mi],
                                        o.selectors[si], o.budgets[bi]));
          select::SelectArgs sa;
          sa.q = q_rows(0, steps);
          sa.cache = cache_rows(steps);
          sa.summaries = sums;
          select::SelectOutput& out = cur[{mi, si, bi}];
          select::run_selector(
              sa, study_selector_config(specs[si], maps[mi], fracs[bi], context, o.params), out);
          const SelectionView fresh = out.selection.view();
          const auto add = [&](int age, const Measure& m) {
            rows.push_back({d.layer, o.mappings[mi], o.selectors[si], o.budgets[bi],
                            source_name(age), age, m});
          };
          std::vector<double> fresh_delta;  // [steps][hq]
          add(0, measure(sa.q, sa.cache, sums, maps[mi], fresh, fresh, {}, &fresh_delta));
          for (int a : o.ages) {
            if (a >= steps) continue;
            const int n = steps - a;
            add(a, measure(q_rows(a, n), cache_rows(n), sums, maps[mi], rows_of(fresh, 0, n),
                           rows_of(fresh, a, n),
                           std::span(fresh_delta).subspan(static_cast<std::size_t>(a) * hq)));
          }
          for (std::size_t pi = 0; pi < o.policy_cos.size(); ++pi) {
            const auto [used, selects] = policy_selection(fresh, d.q, hq * head_dim, head_dim,
                                                          o.policy_every, o.policy_cos[pi]);
            Measure m = measure(sa.q, sa.cache, sums, maps[mi], used.view(), fresh, fresh_delta);
            m.selects = selects;
            rows.push_back({d.layer, o.mappings[mi], o.selectors[si], o.budgets[bi],
                            fmt::format("R {} cos {:g}", o.policy_every, o.policy_cos[pi]),
                            -2 - static_cast<int>(pi), m});
          }
          if (has_prev) {
            const SelectionView used = prev.at({mi, si, bi}).selection.view();
            add(-1, measure(sa.q, sa.cache, sums, maps[mi], used, fresh, fresh_delta));
          }
          progress.advance();
        }
      }
    }
    std::swap(prev, cur);
    prev_layer = d.layer;
  }
  progress.finish();
  for (int a : o.ages) {
    if (a >= steps) {
      fmt::print(stderr, "masskv reuse: age {} skipped: the dumps hold {} queries\n", a, steps);
    }
  }

  write_results(o.out, reuse_rows(rows), [&](std::FILE* f) {
    fmt::print(
        f,
        "\n## masskv reuse — {} file(s), {} tokens of context, Hq={}, Hkv={}, d={}, page {}, {} "
        "queries per file, top-p {}, sinks {} page(s), window {}\n\n",
        o.inputs.size(), context, hq, hkv, head_dim, o.page_size, steps, o.params.top_p,
        o.params.sink_pages, o.params.window);
    fmt::print(
        f,
        "Means over files (layers) and heads. source: fresh = selected for the evaluated query; "
        "step −a = the selection made a decode steps earlier; prev layer = the previous layer's "
        "selection (same kv head index). δ / fresh: against the fresh selections' δ on the same "
        "queries and layers. overlap: share of the fresh selection's pages that the reused one "
        "holds. R r cos c: the queries walked in order, a layer selecting again after r steps or "
        "when a q head's query turns past cosine c from the selection's (reselect_every, "
        "reselect_cos); selects: share of its steps that selected.\n\n");
    fmt::print(
        f,
        "| mapping | selector | budget | source | tokens | δ | δ / fresh | δ max | recall | err | "
        "overlap | selects |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const std::vector<Row> means = layer_means(rows);
    for (const Row& r : means) {
      fmt::print(
          f,
          "| {} | {} | {} | {} | {:.0f} | {:.4f} | {} | {:.3f} | {:.3f} | {:.4f} | {:.3f} | {} |\n",
          r.mapping, r.selector, r.budget, r.source, r.m.tokens, r.m.delta,
          r.m.delta_fresh > 0 ? fmt::format("{:.2f}", r.m.delta / r.m.delta_fresh) : "—",
          r.m.delta_max, r.m.recall, r.m.rel_error, r.m.overlap,
          r.m.selects >= 0 ? fmt::format("{:.2f}", r.m.selects) : "—");
    }
  });
  if (!o.out_dir.empty()) {
    write_outputs(rows, o, cmdline);
    if (o.plots) run_plot_script("reuse", "plot_reuse.py", {o.out_dir + "/reuse.csv", o.out_dir});
  }
}

}  // namespace

void register_reuse(CLI::App& app, const std::string& cmdline) {
  auto o = std::make_shared<ReuseOptions>();
  auto* r = app.add_subcommand(
      "reuse",
      "What a page selection loses when reused: made for an earlier decode step's query or by "
      "the previous layer, on a model's real q/k/v (masskv dump): dropped mass, recall, output "
      "error, overlap with a fresh selection");
  r->add_option("--inputs", o->inputs,
                "Files written by masskv dump (comma-separated; consecutive layers also give the "
                "previous-layer rows)")
      ->delimiter(',')
      ->required();
  r->add_option("--selectors", o->selectors,
                "sink_recent, quest, top_p, gaussian_tau, entmax_support, oracle")
      ->delimiter(',')
      ->capture_default_str();
  add_budget_fractions(r, o->budgets);
  add_mappings(r, o->mappings);
  r->add_option("--ages", o->ages,
                "Decode steps between the selection's query and the evaluated one (each < the "
                "dumps' --steps)")
      ->delimiter(',')
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  r->add_option("--policy-every", o->policy_every,
                "Policy rows: a layer selects again after this many steps (reselect_every)")
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  r->add_option("--policy-cos", o->policy_cos,
                "Policy rows, one per value: ... or when a q head's query turns past this cosine "
                "(reselect_cos; -1: steps only)")
      ->delimiter(',')
      ->check(real_in(-1, 1));
  add_page(r, o->page_size);
  add_top_p_mass(r, o->params.top_p);
  add_kept_items(r, o->params.sink_pages, o->params.window);
  add_output(r, o->out);
  add_out_dir(r, o->out_dir,
              "Write reuse.csv, reuse.json and reuse_*.png (scripts/plot_reuse.py) here");
  add_no_plots(r, o->plots);
  r->footer(
      "Examples:\n"
      "  masskv reuse --inputs out/dump/layer02.mkvd,out/dump/layer03.mkvd -O out/reuse\n"
      "  masskv reuse --inputs out/dump/layer02.mkvd --selectors quest --budget 1/8 --ages 1,4,16 "
      "--no-plots\n"
      "  masskv reuse --inputs out/dump/layer02.mkvd -o csv --out reuse.csv --no-plots");
  r->callback([o, cmdline] { run_reuse(*o, cmdline); });
}

}  // namespace masskv::cli
