// `masskv bench dist`: context-parallel decode on the CPU with threads as ranks
// (dist::InProcessComm; docs/dist.md). Reports, per step, the collectives and bytes each rank
// exchanges and the deviation from the single-rank decode. The exchange is the algorithm's,
// the transport is not: wall times here are threads on one machine, not NCCL on GPUs.
#include <fmt/core.h>
#include <fmt/os.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_cache.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/attn/decode.hpp"
#include "masskv/dist/decode.hpp"
#include "masskv/dist/select.hpp"
#include "masskv/select/page_bound.hpp"
#include "parse.hpp"
#include "progress.hpp"

namespace masskv::cli {
namespace {

struct DistOptions {
  std::vector<std::string> depths{"4K", "32K"};
  std::vector<int> ranks{1, 2, 4, 8};
  int hq = 32, hkv = 8, head_dim = 128, page_size = 16, batch = 1;
  std::string kv_dtype = "f16";
  std::string budget = "1/16";
  int max_candidates = dist::EntmaxTauConfig{}.max_candidates;
  std::uint64_t seed = 1;
  Output out;
  bool dry_run = false;
};

struct Row {
  std::int64_t context = 0;
  int ranks = 0;
  std::string attention, mode;
  std::int64_t collectives = 0, bytes_sent = 0, bytes_received = 0;
  int tau_rounds = 0, fallback_heads = 0;
  double rel_diff = 0, step_us = 0;
};

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(b[i])));
  }
  return norm > 0 ? diff / norm : diff;
}

void run_dist(const DistOptions& opt, const CLI::App& app) {
  const DType dtype = parse_dtype(opt.kv_dtype, "--kv-dtype");
  const double fraction = parse_fraction(opt.budget, "--budget");
  check_head_shape(opt.hq, opt.hkv);
  double peak = 0;  // one depth's cache at a time
  for (const std::string& depth : opt.depths) {
    peak = std::max(peak, 2.5 * opt.batch * opt.hkv * opt.head_dim *
                              static_cast<double>(dtype_size(dtype)) *
                              static_cast<double>(parse_count(depth, "--depth")));
  }
  require_memory(peak, "--depth", "the KV cache (× --batch)");
  if (dry_run_plan(opt.dry_run, app, {{"memory", format_bytes(peak)}})) return;
  const Mapping mappings[] = {Mapping::softmax(), Mapping::entmax(1.5), Mapping::entmax(2.0)};
  std::vector<Row> rows;
  for (const std::string& depth : opt.depths) {
    const std::int64_t context = parse_count(depth, "--depth");
    kv::CacheConfig cfg;
    cfg.num_kv_heads = opt.hkv;
    cfg.head_dim = opt.head_dim;
    cfg.page_size = opt.page_size;
    cfg.dtype = dtype;
    cfg.capacity_pages =
        static_cast<int>(opt.batch * ((context + opt.page_size - 1) / opt.page_size));
    kv::PagedKVCache cache(cfg);
    std::vector<kv::SeqId> seqs;
    {
      Progress fill("fill " + depth, static_cast<long>(context * opt.batch));
      seqs = fill_cache(cache, opt.batch, context, opt.seed, fill);
    }
    const kv::PageTableStorage table = cache.page_table(seqs);
    const kv::PagedKVView view = cache.view(table);
    std::vector<float> q(static_cast<std::size_t>(opt.batch) * opt.hq * opt.head_dim);
    std::mt19937_64 rng(opt.seed + 7);
    std::normal_distribution<float> gauss(0.0f, 2.0f);
    for (float& x : q) x = gauss(rng);
    const View3<const float> qv =
        View3<const float>::contiguous(q.data(), opt.batch, opt.hq, opt.head_dim);
    select::TopkPolicy policy;
    policy.budget_pages = std::max(
        1, static_cast<int>(std::ceil(fraction * static_cast<double>(context) / opt.page_size)));

    for (const int R : opt.ranks) {
      std::vector<dist::LocalShard> shards;
      for (int r = 0; r < R; ++r) shards.emplace_back(view, r, R);
      for (const Mapping& mapping : mappings) {
        for (const bool sparse : {false, true}) {
          // Single rank on the whole cache: the reference for the deviation column.
          const kv::SummariesView sum = cache.summaries();
          SelectionStorage want_sel;
          if (sparse) {
            select::quest_select({qv, table.table(), opt.page_size, &sum, nullptr, 0, policy},
                                 want_sel);
          }
          const SelectionView want_view = want_sel.view();
          std::vector<float> want(q.size()), got(q.size());
          attn::DecodeArgs a;
          a.q = qv;
          a.cache = view;
          a.mapping = mapping;
          a.selection = sparse ? &want_view : nullptr;
          a.out = View3<float>::contiguous(want.data(), opt.batch, opt.hq, opt.head_dim);
          a.impl = attn::Impl::simd;
          attn::decode(a);

          Row row{context, R,
                  mapping.is_entmax() ? fmt::format("entmax {}", mapping.alpha) : "softmax",
                  sparse ? fmt::format("quest {}", opt.budget) : "dense"};
          const auto t0 = std::chrono::steady_clock::now();
          dist::run_in_process(R, [&](dist::Communicator& comm) {
            const dist::LocalShard& sh = shards[static_cast<std::size_t>(comm.rank())];
            SelectionStorage sel;
            if (sparse) dist::quest_select(comm, {qv, &sh, 0, policy}, sel);
            const SelectionView sv = sel.view();
            std::vector<float> out(q.size());
            dist::DecodeArgs da;
            da.q = qv;
            da.shard = &sh;
            da.mapping = mapping;
            da.selection = sparse ? &sv : nullptr;
            da.out = View3<float>::contiguous(out.data(), opt.batch, opt.hq, opt.head_dim);
            da.impl = attn::Impl::simd;
            da.tau.max_candidates = opt.max_candidates;
            dist::DecodeStats ds;
            dist::decode(comm, da, &ds);
            if (comm.rank() == 0) {  // every rank exchanges the same sizes
              got = out;
              row.collectives = comm.stats().collectives;
              row.bytes_sent = comm.stats().bytes_sent;
              row.bytes_received = comm.stats().bytes_received;
              row.tau_rounds = ds.tau_rounds;
              row.fallback_heads = ds.fallback_heads;
            }
          });
          row.step_us =
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                  .count();
          row.rel_diff = rel_diff(got, want);
          rows.push_back(row);
        }
      }
    }
  }

  Rows j = Rows::array();
  for (const Row& r : rows) {
    j.push_back({{"context", r.context},
                 {"ranks", r.ranks},
                 {"attention", r.attention},
                 {"mode", r.mode},
                 {"collectives", r.collectives},
                 {"bytes_sent", r.bytes_sent},
                 {"bytes_received", r.bytes_received},
                 {"tau_rounds", r.tau_rounds},
                 {"fallback_heads", r.fallback_heads},
                 {"rel_diff", r.rel_diff},
                 {"step_us", r.step_us}});
  }
  write_results(opt.out, j, [&](std::FILE* f) {
    fmt::print(f,
               "| context | ranks | attention | mode | collectives | sent B/rank | received B/rank "
               "| tau rounds | fallback heads | max rel diff vs 1 rank | step µs (threads) |\n");
    fmt::print(f, "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const Row& r : rows) {
      fmt::print(f, "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2g} | {:.0f} |\n", r.context,
                 r.ranks, r.attention, r.mode, r.collectives, r.bytes_sent, r.bytes_received,
                 r.tau_rounds, r.fallback_heads, r.rel_diff, r.step_us);
    }
  });
}

}  // namespace

void register_bench_dist(CLI::App& bench) {
  auto opt = std::make_shared<DistOptions>();
  auto* cmd = bench.add_subcommand(
      "dist",
      "Context-parallel decode with threads as ranks: collectives and bytes exchanged per "
      "step (per rank) and the deviation from single-rank decode, for softmax and entmax, "
      "dense and Quest-sparse. Times are threads on this machine, not NCCL");
  add_depths(cmd, opt->depths, 1, "Context lengths (tokens)");
  cmd->add_option("--ranks", opt->ranks, "Rank counts to run (threads)")
      ->delimiter(',')
      ->check(threads(1))
      ->capture_default_str();
  add_batch(cmd, opt->batch, 1, 4096, "Sequences per step");
  add_head_shape(cmd, opt->hq, opt->hkv, opt->head_dim, opt->page_size);
  add_kv_dtype(cmd, opt->kv_dtype);
  cmd->add_option("--budget", opt->budget, "Sparse budget as a fraction of the context")
      ->capture_default_str();
  cmd->add_option("--max-candidates", opt->max_candidates,
                  "Entmax: candidate scores per rank and q head in the tau all-gather; heads "
                  "over it take batched-bisection rounds")
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  add_seed(cmd, opt->seed, "Random seed");
  add_output(cmd, opt->out);
  add_dry_run(cmd, opt->dry_run);
  cmd->footer(
      "Examples:\n"
      "  masskv bench dist -d 4K --ranks 1,2,4\n"
      "  masskv bench dist -d 32K --ranks 8 --budget 1/32 -o json --out dist.json\n"
      "  masskv bench dist -d 256K -b 4 --dry-run");
  cmd->callback([opt, cmd] { run_dist(*opt, *cmd); });
}

}  // namespace masskv::cli
