// `masskv bench attn`: CPU decode attention, dense vs sparse (page-bound top-k), with the
// read bandwidth of this machine measured in the same run (docs/design.md §6: ratios measured
// side by side). Not a test: timings are reported, never asserted.
#include <fmt/core.h>
#include <fmt/os.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_cache.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/attn/decode.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/select/page_bound.hpp"
#include "membw.hpp"
#include "parse.hpp"
#include "progress.hpp"

namespace masskv::cli {

std::vector<kv::SeqId> fill_cache(kv::PagedKVCache& cache, int seqs, std::int64_t length,
                                  std::uint64_t seed, Progress& progress) {
  const auto& cfg = cache.config();
  const int row = cfg.num_kv_heads * cfg.head_dim;
  constexpr int batch = 256;
  std::mt19937_64 rng(seed);
  std::vector<float> chan_scale(static_cast<std::size_t>(row)), chan_bias(chan_scale.size());
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (std::size_t c = 0; c < chan_scale.size(); ++c) {
    chan_scale[c] = 0.5f + std::fabs(gauss(rng));
    chan_bias[c] = 0.3f * gauss(rng);
  }
  std::vector<float> k(static_cast<std::size_t>(batch) * row), v(k.size());
  std::vector<kv::SeqId> ids;
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto uniform = [&x] {  // xorshift64*: fast enough to fill GiBs
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return static_cast<float>((x * 0x2545F4914F6CDD1Dull) >> 40) * 0x1p-24f * 2.0f - 1.0f;
  };
  for (int s = 0; s < seqs; ++s) {
    const kv::SeqId id = cache.create();
    ids.push_back(id);
    for (std::int64_t t = 0; t < length; t += batch) {
      const int n = static_cast<int>(std::min<std::int64_t>(batch, length - t));
      for (int i = 0; i < n; ++i) {
        const float drift = uniform();  // a per-token shift makes some pages score higher
        for (int c = 0; c < row; ++c) {
          const std::size_t o = static_cast<std::size_t>(i) * row + c;
          k[o] = chan_scale[static_cast<std::size_t>(c)] * (uniform() + 0.5f * drift) +
                 chan_bias[static_cast<std::size_t>(c)];
          v[o] = uniform();
        }
      }
      cache.append(id, std::span<const float>(k.data(), static_cast<std::size_t>(n) * row),
                   std::span<const float>(v.data(), static_cast<std::size_t>(n) * row), n);
      progress.advance(n);
    }
  }
  return ids;
}

namespace {

struct Options {
  std::vector<std::string> depths{"4K", "16K", "32K", "64K", "128K", "256K"};
  std::vector<int> threads{1, 2};
  int hq = 32, hkv = 8, head_dim = 128, page_size = 16;
  std::string kv_dtype = "f16";
  std::vector<std::string> budgets{"1/32", "1/16", "1/8"};
  int sink_pages = 1;
  int window = 64;
  std::string mapping = "softmax";
  double alpha = 1.5;
  double min_seconds = 0.25;
  int min_reps = 5;
  std::uint64_t seed = 1;
  Output out;
  bool dry_run = false;
};

// Timing summary of one measured quantity, µs.
struct Stat {
  double median = 0, mean = 0, sd = 0;
  int reps = 0;
};

Stat summarise(std::vector<double> us) {
  Stat s;
  s.reps = static_cast<int>(us.size());
  s.mean = std::accumulate(us.begin(), us.end(), 0.0) / s.reps;
  double v = 0;
  for (double x : us) v += (x - s.mean) * (x - s.mean);
  s.sd = s.reps > 1 ? std::sqrt(v / (s.reps - 1)) : 0.0;
  std::nth_element(us.begin(), us.begin() + s.reps / 2, us.end());
  s.median = us[static_cast<std::size_t>(s.reps / 2)];
  return s;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Layer-sized caches to rotate over so that no context is served from the CPU's caches:
// together they span at least 512 MiB (16x a 32 MiB L3), between 2 and 8 of them.
int rotation_count(double cache_bytes) {
  return std::clamp(static_cast<int>(std::ceil(512.0 * (1 << 20) / cache_bytes)), 2, 8);
}


struct DenseRow {
  std::int64_t context;
  int threads;
  Stat us;
  double bytes, gbps, read_gbps;
};

struct SparseRow {
  std::int64_t context;
  int threads;
  std::string budget;
  double pages_selected;  // mean per kv head
  Stat select_us, total_us;
  double kv_bytes, summary_bytes, dense_us, speedup, bytes_ratio;
};

void run(Options opt, const CLI::App& app) {
  resolve_threads(opt.threads);
  const Mapping mapping = opt.mapping == "entmax" ? Mapping::entmax(opt.alpha) : Mapping::softmax();
  mapping.validate();
  const DType dtype = parse_dtype(opt.kv_dtype, "--kv-dtype");
  check_head_shape(opt.hq, opt.hkv);
  std::vector<std::int64_t> depths;
  for (const auto& d : opt.depths) depths.push_back(parse_count(d, "--depth"));
  std::vector<double> budgets;
  for (const auto& b : opt.budgets) budgets.push_back(parse_fraction(b, "--budget"));
  const double kv_bytes_per_token =
      2.0 * opt.hkv * opt.head_dim * static_cast<double>(dtype_size(dtype));
  // The largest depth's caches (its rotation of copies) must fit before any of them is filled.
  double peak = 0;
  for (const std::int64_t d : depths) {
    const double bytes = kv_bytes_per_token * static_cast<double>(d);
    peak = std::max(peak, rotation_count(bytes) * bytes * 1.25);  // + summaries, bounds
  }
  require_memory(peak + (1 << 30), "--depth", "the KV caches (and the 1 GiB bandwidth probe)");
  if (dry_run_plan(opt.dry_run, app, {{"memory", format_bytes(peak + (1 << 30))}})) return;
  // Read bandwidth probe: 1 GiB, well beyond the last-level cache.
  std::vector<double> read_gbps;
  for (int t : opt.threads) read_gbps.push_back(measure_read_bandwidth(1ull << 30, t, 5).gb_per_s);

  std::vector<DenseRow> dense_rows;
  std::vector<SparseRow> sparse_rows;
  double cache_bpt = 0, summary_bpt = 0, bound_bpt = 0;

  std::mt19937_64 qrng(opt.seed ^ 0xabcdef);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  constexpr int q_sets = 16;  // vary q between iterations
  std::vector<float> qs(static_cast<std::size_t>(q_sets) * opt.hq * opt.head_dim);
  for (auto& x : qs) x = gauss(qrng);
  std::vector<float> out(static_cast<std::size_t>(opt.hq) * opt.head_dim);
  std::vector<float> lse(static_cast<std::size_t>(opt.hq));

  for (std::int64_t context : depths) {
    const int rot = rotation_count(kv_bytes_per_token * static_cast<double>(context));
    const int pages_per_seq = static_cast<int>((context + opt.page_size - 1) / opt.page_size);
    kv::CacheConfig cfg;
    cfg.num_kv_heads = opt.hkv;
    cfg.head_dim = opt.head_dim;
    cfg.page_size = opt.page_size;
    cfg.dtype = dtype;
    cfg.capacity_pages = rot * pages_per_seq;
    kv::PagedKVCache cache(cfg);
    std::vector<kv::SeqId> seqs;
    {
      Progress fill(fmt::format("fill {} x {} tokens", rot, context), rot * context);
      seqs = fill_cache(cache, rot, context, opt.seed + static_cast<std::uint64_t>(context), fill);
    }
    cache_bpt = cache.kv_bytes_per_token();
    summary_bpt = cache.summary_bytes_per_token();
    std::vector<kv::PageTableStorage> tables;
    for (auto s : seqs) tables.push_back(cache.page_table(std::span<const kv::SeqId>(&s, 1)));
    const select::BoundStore bounds(cache.summaries());
    const select::BoundStoreView bounds_view = bounds.view();
    bound_bpt = bounds.bytes_per_token(opt.page_size);
    SelectionStorage selection;

    const long steps_total = static_cast<long>(opt.threads.size() * (1 + budgets.size()));
    Progress progress(fmt::format("bench {} tokens", context), steps_total);
    for (std::size_t ti = 0; ti < opt.threads.size(); ++ti) {
      const int threads = opt.threads[ti];
      omp_set_num_threads(threads);
      int iter = 0;
      auto decode_once = [&](const SelectionView* sel, int r) {
        attn::DecodeArgs a;
        a.q = View3<const float>::contiguous(
            qs.data() + static_cast<std::size_t>(iter % q_sets) * opt.hq * opt.head_dim, 1,
            opt.hq, opt.head_dim);
        a.cache = cache.view(tables[static_cast<std::size_t>(r)]);
        a.mapping = mapping;
        a.selection = sel;
        a.out = View3<float>::contiguous(out.data(), 1, opt.hq, opt.head_dim);
        a.lse_or_tau = lse;
        attn::decode(a);
      };
      // Runs `step` until both min_reps and min_seconds are reached; returns µs per step.
      auto time_steps = [&](auto&& step) {
        std::vector<double> us;
        step();  // warm-up
        const double t_end = now_us() + opt.min_seconds * 1e6;
        while (static_cast<int>(us.size()) < opt.min_reps || now_us() < t_end) {
          const double t0 = now_us();
          step();
          us.push_back(now_us() - t0);
        }
        return us;
      };

      progress.set_note(fmt::format("dense, {} thread(s)", threads));
      const Stat dense = summarise(time_steps([&] {
        decode_once(nullptr, iter % rot);
        ++iter;
      }));
      const double dense_bytes = kv_bytes_per_token * static_cast<double>(context);
      dense_rows.push_back({context, threads, dense, dense_bytes,
                            dense_bytes / dense.median / 1e3, read_gbps[ti]});
      progress.advance();

      for (std::size_t bi = 0; bi < budgets.size(); ++bi) {
        progress.set_note(fmt::format("sparse {}, {} thread(s)", opt.budgets[bi], threads));
        const int k_pages = std::max(1, static_cast<int>(std::ceil(pages_per_seq * budgets[bi])));
        std::vector<double> sel_us;
        double pages_sum = 0;
        int pages_n = 0;
        const Stat total = summarise(time_steps([&] {
          const int r = iter % rot;
          const double t0 = now_us();
          select::QuestArgs qa;
          qa.q = View3<const float>::contiguous(
              qs.data() + static_cast<std::size_t>(iter % q_sets) * opt.hq * opt.head_dim, 1,
              opt.hq, opt.head_dim);
          qa.table = tables[static_cast<std::size_t>(r)].table();
          qa.page_size = opt.page_size;
          qa.bounds_bf16 = &bounds_view;
          qa.policy = {k_pages, opt.sink_pages, opt.window};
          select::quest_select(qa, selection);
          sel_us.push_back(now_us() - t0);
          const SelectionView sel = selection.view();
          decode_once(&sel, r);
          pages_sum += std::accumulate(selection.count.begin(), selection.count.end(), 0.0) /
                       static_cast<double>(selection.count.size());
          ++pages_n;
          ++iter;
        }));
        const double pages = pages_sum / pages_n;
        const double kv_b = pages * opt.page_size * kv_bytes_per_token;
        const double sum_b = bound_bpt * static_cast<double>(context);
        sparse_rows.push_back({context, threads, opt.budgets[bi], pages, summarise(sel_us), total,
                               kv_b, sum_b, dense.median, dense.median / total.median,
                               dense_bytes / (kv_b + sum_b)});
        progress.advance();
      }
    }
  }

  // Every row carries the shape and the machine's read bandwidth at its thread count, so the
  // csv/json rows stand alone.
  const auto config = [&](Rows j, int threads) {
    const auto ti = static_cast<std::size_t>(
        std::find(opt.threads.begin(), opt.threads.end(), threads) - opt.threads.begin());
    j["kv_dtype"] = opt.kv_dtype;
    j["hq"] = opt.hq;
    j["hkv"] = opt.hkv;
    j["head_dim"] = opt.head_dim;
    j["page_size"] = opt.page_size;
    j["mapping"] = mapping.is_entmax() ? fmt::format("entmax{:g}", opt.alpha) : "softmax";
    j["sink_pages"] = opt.sink_pages;
    j["window"] = opt.window;
    j["read_gbps"] = read_gbps[ti];
    j["kv_bytes_per_token"] = cache_bpt;
    j["summary_bytes_per_token"] = summary_bpt;
    j["bound_bytes_per_token"] = bound_bpt;
    return j;
  };
  Rows rows = Rows::array();
  for (const auto& r : dense_rows) {
    rows.push_back(config({{"kind", "dense"},
                           {"context", r.context},
                           {"threads", r.threads},
                           {"us_median", r.us.median},
                           {"us_mean", r.us.mean},
                           {"us_sd", r.us.sd},
                           {"reps", r.us.reps},
                           {"kv_bytes", r.bytes},
                           {"gbps", r.gbps}},
                          r.threads));
  }
  for (const auto& r : sparse_rows) {
    rows.push_back(config({{"kind", "sparse"},
                           {"context", r.context},
                           {"threads", r.threads},
                           {"budget", r.budget},
                           {"us_median", r.total_us.median},
                           {"us_mean", r.total_us.mean},
                           {"us_sd", r.total_us.sd},
                           {"reps", r.total_us.reps},
                           {"kv_bytes", r.kv_bytes},
                           {"bound_bytes", r.summary_bytes},
                           {"pages_per_head", r.pages_selected},
                           {"select_us_median", r.select_us.median},
                           {"dense_us", r.dense_us},
                           {"speedup", r.speedup},
                           {"bytes_ratio", r.bytes_ratio}},
                          r.threads));
  }
  write_results(opt.out, rows, [&](std::FILE* f) {
    fmt::print(f,
               "\n## masskv bench attn — CPU decode, {} KV, Hq={}, Hkv={}, d={}, page {}, {}\n\n",
               opt.kv_dtype, opt.hq, opt.hkv, opt.head_dim, opt.page_size,
               mapping.is_entmax() ? fmt::format("entmax α={}", opt.alpha) : "softmax");
    for (std::size_t ti = 0; ti < opt.threads.size(); ++ti)
      fmt::print(f, "read bandwidth (1 GiB sum, {} thread(s)): {:.1f} GB/s\n", opt.threads[ti],
                 read_gbps[ti]);
    fmt::print(
        f,
        "memory per token: KV {:.0f} B, f32 summaries (min/max/mean/M2/count/max‖v‖) {:.1f} B, "
        "bf16 bounds (min/max, outward rounded) {:.1f} B\n\n",
        cache_bpt, summary_bpt, bound_bpt);
    fmt::print(
        f, "| context | threads | dense µs (median ± sd) | KV read MB | GB/s | % of read BW |\n");
    fmt::print(f, "|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& r : dense_rows)
      fmt::print(f, "| {} | {} | {:.0f} ± {:.0f} | {:.1f} | {:.1f} | {:.0f}% |\n", r.context,
                 r.threads, r.us.median, r.us.sd, r.bytes / 1e6, r.gbps,
                 100.0 * r.gbps / r.read_gbps);
    fmt::print(
        f,
        "\n| context | threads | budget | pages/head | select µs | sparse µs (select incl.) | KV "
        "read MB | bounds read MB | speedup vs dense | bytes ratio | speedup / bytes ratio |\n");
    fmt::print(f, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& r : sparse_rows)
      fmt::print(f,
                 "| {} | {} | {} | {:.0f} | {:.0f} | {:.0f} ± {:.0f} | {:.2f} | {:.2f} | {:.2f}× | "
                 "{:.2f}× | {:.2f} |\n",
                 r.context, r.threads, r.budget, r.pages_selected, r.select_us.median,
                 r.total_us.median, r.total_us.sd, r.kv_bytes / 1e6, r.summary_bytes / 1e6,
                 r.speedup, r.bytes_ratio, r.speedup / r.bytes_ratio);
  });
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand(
      "bench",
      "Model benchmark in llama-bench's conventions (ppN / tgN at depths, ours vs llama.cpp "
      "with --peer); subcommands benchmark the attention kernels. Timings are reported, never "
      "asserted");
  bench->require_subcommand(0, 1);
  register_bench_model(*bench);
  register_bench_dist(*bench);
  register_bench_keys(*bench);
  auto opt = std::make_shared<Options>();
  auto* attn = bench->add_subcommand(
      "attn",
      "CPU decode attention: dense vs sparse (top-k pages on the bf16 page bound, selection "
      "time included), with this machine's read bandwidth measured in the same run");
  add_depths(attn, opt->depths, 1, "Context lengths (tokens)");
  add_thread_list(attn, opt->threads, "Thread counts to run");
  add_head_shape(attn, opt->hq, opt->hkv, opt->head_dim, opt->page_size);
  add_kv_dtype(attn, opt->kv_dtype);
  attn->add_option("--budget", opt->budgets, "Sparse budgets as fractions of the context")
      ->delimiter(',')
      ->capture_default_str();
  add_kept_items(attn, opt->sink_pages, opt->window);
  attn->add_option("--mapping", opt->mapping, "softmax or entmax")
      ->check(CLI::IsMember({"softmax", "entmax"}))
      ->capture_default_str();
  add_alpha(attn, opt->alpha, "entmax alpha");
  attn->add_option("--min-seconds", opt->min_seconds, "Minimum timed seconds per row")
      ->check(real_in(0, 3600))
      ->capture_default_str();
  add_repetitions(attn, opt->min_reps, "Minimum repetitions per row");
  add_seed(attn, opt->seed, "Random seed");
  add_output(attn, opt->out);
  add_dry_run(attn, opt->dry_run);
  attn->footer(
      "Examples:\n"
      "  masskv bench attn -d 4K,32K -t 1,2 --budget 1/16\n"
      "  masskv bench attn -d 16K -t 0 -o csv --out attn.csv\n"
      "  masskv bench attn -d 16K --mapping entmax --alpha 1.5 --kv-dtype bf16");
  attn->callback([opt, attn] { run(*opt, *attn); });
}

}  // namespace masskv::cli
