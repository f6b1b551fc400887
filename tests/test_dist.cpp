// Context parallelism on the CPU (docs/dist.md): the in-process communicator, round-robin
// sharding, and distributed selection / decode against the single-rank selector, the
// single-rank decode and the f64 reference, for 1..8 ranks; collectives are counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <vector>

#include "expect_error.hpp"
#include "harness.hpp"
#include "masskv/attn/decode.hpp"
#include "masskv/attn/merge.hpp"
#include "masskv/dist/communicator.hpp"
#include "masskv/dist/decode.hpp"
#include "masskv/dist/select.hpp"
#include "masskv/dist/shard.hpp"
#include "selector_fixture.hpp"

namespace masskv::test {
namespace {

using dist::CommStats;
using dist::Communicator;
using dist::LocalShard;
using dist::ReduceOp;

// ---- communicator ---------------------------------------------------------------------------

TEST(InProcessComm, GatherAndReduceAreRankOrderedIdenticalAndCounted) {
  for (int R = 1; R <= 8; ++R) {
    std::vector<std::vector<double>> gathered(R), summed(R), maxed(R);
    std::vector<std::vector<float>> summed_f(R);
    std::vector<CommStats> stats(R);
    dist::run_in_process(R, [&](Communicator& comm) {
      const int r = comm.rank();
      ASSERT_EQ(comm.size(), R);
      // Values whose float sum depends on the order: a fixed order gives one answer.
      const std::vector<double> mine = {r + 0.5, -r * 1e16, 1.0 / (r + 1)};
      gathered[r].resize(3 * R);
      comm.all_gather(mine, gathered[r]);
      summed[r] = mine;
      comm.all_reduce(summed[r], ReduceOp::sum);
      maxed[r] = mine;
      comm.all_reduce(maxed[r], ReduceOp::max);
      summed_f[r] = {1e8f * (r % 2 ? 1.0f : -1.0f), 1.0f + static_cast<float>(r)};
      comm.all_reduce(summed_f[r], ReduceOp::sum);
      stats[r] = comm.stats();
    });
    for (int r = 0; r < R; ++r) {
      for (int s = 0; s < R; ++s) {
        EXPECT_EQ(gathered[r][3 * s], s + 0.5);
        EXPECT_EQ(gathered[r][3 * s + 1], -s * 1e16);
      }
      double sum = 0, mx = -INFINITY;
      float sf = 0;
      for (int s = 0; s < R; ++s) {
        sum += 1.0 / (s + 1);
        mx = std::max(mx, s + 0.5);
        sf += 1e8f * (s % 2 ? 1.0f : -1.0f);
      }
      EXPECT_EQ(summed[r][2], sum);  // rank order, bit for bit
      EXPECT_EQ(maxed[r][0], mx);
      EXPECT_EQ(summed_f[r][0], sf);
      EXPECT_EQ(std::memcmp(summed[r].data(), summed[0].data(), 3 * sizeof(double)), 0);
      EXPECT_EQ(stats[r].collectives, 4);
      EXPECT_EQ(stats[r].all_gathers, 1);
      EXPECT_EQ(stats[r].all_reduces, 3);
      EXPECT_EQ(stats[r].bytes_sent, 3 * 8 * 3 + 2 * 4);
      EXPECT_EQ(stats[r].bytes_received, 3 * 8 * R + 2 * 3 * 8 + 2 * 4);
    }
  }
}

TEST(InProcessComm, MismatchAndFailuresThrowOnEveryRankInsteadOfHanging) {
  // Different sizes: every rank sees the same mismatch and throws.
  expect_error(
      [] {
        dist::run_in_process(3, [](Communicator& comm) {
          std::vector<double> x(static_cast<std::size_t>(comm.rank() + 1)), y(x.size() * 3);
          comm.all_gather(x, y);
        });
      },
      ErrorCode::shape_mismatch, "send");
  expect_error(
      [] {
        dist::run_in_process(2, [](Communicator& comm) {
          std::vector<float> x(2), y(3);
          comm.all_gather(x, y);
        });
      },
      ErrorCode::shape_mismatch, "recv");
  // One rank fails before a collective the others wait in: the group is aborted and the
  // original error (not the abort's) comes back.
  expect_error(
      [] {
        dist::run_in_process(4, [](Communicator& comm) {
          if (comm.rank() == 2) fail(ErrorCode::out_of_range, "rank2", "failed on purpose");
          std::vector<double> x(1);
          comm.all_reduce(x, ReduceOp::sum);
        });
      },
      ErrorCode::out_of_range, "rank2");
}

// ---- cases ----------------------------------------------------------------------------------

struct DistCase {
  std::vector<int> lengths;
  int Hq = 4, Hkv = 1, d = 64, P = 16;
  DType dtype = DType::f32;
};

// Case i: every axis advances with its own stride so that each value of each axis appears.
// Lengths give page counts not divisible by the rank counts, partial last pages, sequences
// with fewer pages than ranks (some ranks hold nothing of them) and one-token sequences.
DistCase dist_case(int i) {
  static const int lengths[] = {1, 17, 100, 333, 64, 250, 1000};
  static const int ratios[] = {1, 3, 4, 8};
  static const int dims[] = {64, 128};
  static const int pages[] = {16, 8, 4};
  static const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  DistCase c;
  c.lengths = {lengths[i % 7], 1 + (37 * i + 11) % 190};
  if (i % 3 == 1) c.lengths.push_back(9);
  c.Hkv = 1 + i % 2;
  c.Hq = c.Hkv * ratios[(i / 2) % 4];
  c.d = dims[(i / 3) % 2];
  c.P = pages[(i * 5) % 3];
  c.dtype = dtypes[(i / 4) % 3];
  return c;
}

std::string describe(const DistCase& c) {
  std::ostringstream os;
  os << "lengths";
  for (int l : c.lengths) os << ' ' << l;
  os << " Hq " << c.Hq << " Hkv " << c.Hkv << " d " << c.d << " P " << c.P << " dtype "
     << to_string(c.dtype);
  return os.str();
}

SelCase build(const DistCase& c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  return random_case(rng, c.lengths, c.Hq, c.Hkv, c.d, c.P, c.dtype);
}

std::vector<LocalShard> shard_all(const SelCase& s, int R) {
  std::vector<LocalShard> shards;
  for (int r = 0; r < R; ++r) shards.emplace_back(s.view(), r, R);
  return shards;
}

select::TopkPolicy policy_of(int i, int max_pages) {
  select::TopkPolicy p;
  const int budgets[] = {0, 1, 3, 5, 8, 1000};
  p.budget_pages = std::min(budgets[i % 6], max_pages + 2);
  p.sink_pages = i % 3 == 0 ? 0 : 1;
  p.window_tokens = (i / 2) % 3 == 0 ? 0 : 20;
  return p;
}

// ---- sharding -------------------------------------------------------------------------------

TEST(LocalShard, HoldsEachPageOnceWithItsKeysAndSummaries) {
  for (int i = 0; i < 6; ++i) {
    const DistCase c = dist_case(i);
    const SelCase s = build(c, 40 + i);
    const kv::PagedKVView g = s.view();
    const kv::SummariesView gs = s.cache.summaries();
    for (int R = 1; R <= 8; R += 3) {
      std::vector<int> seen(g.table.indices.size(), 0);
      for (int r = 0; r < R; ++r) {
        const LocalShard sh(g, r, R);
        const kv::PagedKVView l = sh.view();
        const kv::SummariesView ls = sh.summaries();
        for (std::size_t lb = 0; lb < sh.local_batch().size(); ++lb) {
          const int b = sh.local_batch()[lb];
          EXPECT_EQ(sh.local_seq(b), static_cast<int>(lb));
          for (int lp = 0; lp < l.table.num_pages(static_cast<int>(lb)); ++lp) {
            const int j = sh.sharding().global_page(r, lp);
            ASSERT_EQ(sh.sharding().owner(j), r);
            ++seen[static_cast<std::size_t>(g.table.indptr[b] + j)];
            const int len = g.table.page_len(b, j, c.P);
            ASSERT_EQ(l.table.page_len(static_cast<int>(lb), lp, c.P), len) << describe(c);
            const std::int32_t gp = g.table.page(b, j), pl = l.table.page(static_cast<int>(lb), lp);
            const std::size_t row = dtype_size(c.dtype) * c.d;
            for (int h = 0; h < c.Hkv; ++h) {
              for (int t = 0; t < len; ++t) {
                for (const bool values : {false, true}) {
                  const auto* gsrc = static_cast<const char*>(values ? g.v : g.k);
                  const auto* lsrc = static_cast<const char*>(values ? l.v : l.k);
                  ASSERT_EQ(std::memcmp(gsrc + g.offset(gp, h, t) * dtype_size(c.dtype),
                                        lsrc + l.offset(pl, h, t) * dtype_size(c.dtype), row),
                            0);
                }
              }
              // Quest bounds need the min/max bit for bit.
              ASSERT_EQ(std::memcmp(gs.min + gs.at(gp, h), ls.min + ls.at(pl, h), 4 * c.d), 0);
              ASSERT_EQ(std::memcmp(gs.max + gs.at(gp, h), ls.max + ls.at(pl, h), 4 * c.d), 0);
            }
          }
        }
      }
      for (int x : seen) ASSERT_EQ(x, 1) << describe(c) << " R " << R;
    }
  }
}

TEST(LocalShard, RejectsBadRanks) {
  const SelCase s = build(dist_case(0), 1);
  expect_error([&] { LocalShard(s.view(), 0, 0); }, ErrorCode::invalid_argument, "ranks");
  expect_error([&] { LocalShard(s.view(), 3, 3); }, ErrorCode::out_of_range, "rank");
}

// ---- selection ------------------------------------------------------------------------------

// Runs the distributed selection on R ranks; checks every rank got the same selection and
// took one collective; returns rank 0's.
SelectionStorage dist_select(const SelCase& s, const std::vector<LocalShard>& shards,
                             const select::TopkPolicy& policy) {
  const int R = static_cast<int>(shards.size());
  std::vector<SelectionStorage> sel(R);
  std::vector<CommStats> stats(R);
  dist::run_in_process(R, [&](Communicator& comm) {
    dist::QuestSelectArgs a;
    a.q = s.qview();
    a.shard = &shards[static_cast<std::size_t>(comm.rank())];
    a.policy = policy;
    dist::quest_select(comm, a, sel[comm.rank()]);
    stats[comm.rank()] = comm.stats();
  });
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(sel[r].ids, sel[0].ids);
    EXPECT_EQ(sel[r].count, sel[0].count);
    EXPECT_EQ(stats[r].collectives, 1);
  }
  return sel[0];
}

SelectionStorage single_select(const SelCase& s, const select::TopkPolicy& policy) {
  const kv::SummariesView sum = s.cache.summaries();
  select::QuestArgs qa;
  qa.q = s.qview();
  qa.table = s.table.table();
  qa.page_size = s.P;
  qa.summaries = &sum;
  qa.policy = policy;
  SelectionStorage out;
  select::quest_select(qa, out);
  return out;
}

TEST(DistSelect, EqualsSingleRankQuestSelectForOneToEightRanks) {
  OneThread one;
  int compared = 0;
  for (int i = 0; i < 12; ++i) {
    const DistCase c = dist_case(i);
    const SelCase s = build(c, 300 + i);
    for (int R = 1; R <= 8; ++R) {
      const std::vector<LocalShard> shards = shard_all(s, R);
      for (int p = 0; p < 3; ++p) {
        const select::TopkPolicy policy = policy_of(i + 5 * p + R, 1000);
        const SelectionStorage want = single_select(s, policy);
        const SelectionStorage got = dist_select(s, shards, policy);
        ASSERT_EQ(got.max_per_head, want.max_per_head) << describe(c) << " R " << R;
        ASSERT_EQ(got.ids, want.ids)
            << describe(c) << " R " << R << " budget " << policy.budget_pages;
        ASSERT_EQ(got.count, want.count);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 12 * 8 * 3);
}

TEST(DistSelect, TiesGoToTheLowerPageAcrossRanks) {
  // Every page holds the same keys, so every bound ties: the single-rank rule (lower id
  // first) must hold even though the tied pages live on different ranks.
  OneThread one;
  const int Hkv = 1, Hq = 2, d = 64, P = 8, len = 8 * 23 + 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> N;
  std::vector<float> page_keys(static_cast<std::size_t>(P) * d), k, v;
  for (float& x : page_keys) x = N(rng);
  for (int t = 0; t < len; ++t) {
    for (int c = 0; c < d; ++c) {
      k.push_back(page_keys[static_cast<std::size_t>(t % P) * d + c]);
      v.push_back(N(rng));
    }
  }
  std::vector<float> q(static_cast<std::size_t>(Hq) * d);
  for (float& x : q) x = N(rng);
  const SelCase s = make_case({k}, {v}, q, Hq, Hkv, d, P, DType::f32);
  for (int R = 2; R <= 8; ++R) {
    select::TopkPolicy policy;
    policy.budget_pages = 7;
    const SelectionStorage got = dist_select(s, shard_all(s, R), policy);
    EXPECT_EQ(got.ids, single_select(s, policy).ids) << R;
    EXPECT_EQ(std::vector<std::int32_t>(got.ids.begin(), got.ids.begin() + 7),
              (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 23}));
  }
}

// ---- decode ---------------------------------------------------------------------------------

struct DecodeRun {
  std::vector<float> out, stat;
  CommStats stats;
  dist::DecodeStats dstats;
};

// Distributed selection (when `sparse`) then decode on R ranks; every rank must produce the
// same bits. Returns rank 0's result and the largest per-rank collective count.
DecodeRun dist_decode(const SelCase& s, const std::vector<LocalShard>& shards, Mapping mapping,
                      const select::TopkPolicy* sparse, const dist::EntmaxTauConfig& tau,
                      SelectionStorage* selection_out) {
  const int R = static_cast<int>(shards.size());
  std::vector<DecodeRun> runs(R);
  std::vector<SelectionStorage> sels(R);
  dist::run_in_process(R, [&](Communicator& comm) {
    const int r = comm.rank();
    const LocalShard& sh = shards[static_cast<std::size_t>(r)];
    if (sparse) {
      dist::QuestSelectArgs qa;
      qa.q = s.qview();
      qa.shard = &sh;
      qa.policy = *sparse;
      dist::quest_select(comm, qa, sels[r]);
    }
    const SelectionView view = sels[r].view();
    DecodeRun& run = runs[r];
    run.out.resize(s.q.size());
    run.stat.resize(static_cast<std::size_t>(s.B) * s.Hq);
    dist::DecodeArgs a;
    a.q = s.qview();
    a.shard = &sh;
    a.mapping = mapping;
    a.selection = sparse ? &view : nullptr;
    a.out = View3<float>::contiguous(run.out.data(), s.B, s.Hq, s.d);
    a.lse_or_tau = run.stat;
    a.chunk_pages = 2;
    a.impl = attn::Impl::simd;
    a.tau = tau;
    dist::decode(comm, a, &run.dstats);
    run.stats = comm.stats();
  });
  for (int r = 1; r < R; ++r) {
    EXPECT_EQ(std::memcmp(runs[r].out.data(), runs[0].out.data(), 4 * runs[0].out.size()), 0);
    EXPECT_EQ(std::memcmp(runs[r].stat.data(), runs[0].stat.data(), 4 * runs[0].stat.size()), 0);
    EXPECT_EQ(runs[r].stats.collectives, runs[0].stats.collectives);
  }
  if (selection_out) *selection_out = sels[0];
  return runs[0];
}

struct Reference {
  std::vector<double> out, stat;     // f64 reference
  std::vector<float> single, sstat;  // single-rank attn::decode
};

Reference single_rank(const SelCase& s, Mapping mapping, const SelectionView* sel) {
  Reference ref;
  ref.single.resize(s.q.size());
  ref.sstat.resize(static_cast<std::size_t>(s.B) * s.Hq);
  attn::DecodeArgs a;
  a.q = s.qview();
  a.cache = s.view();
  a.mapping = mapping;
  a.selection = sel;
  a.out = View3<float>::contiguous(ref.single.data(), s.B, s.Hq, s.d);
  a.lse_or_tau = ref.sstat;
  a.chunk_pages = 3;
  a.impl = attn::Impl::simd;
  attn::decode(a);
  ref.out.resize(s.q.size());
  ref.stat.resize(ref.sstat.size());
  attn::decode_reference(a, ref.out, ref.stat);
  return ref;
}

// Tolerances: the harness's (tests/harness.hpp: out 1e-5 relative per row, lse / tau 1e-5 of
// max(1, |x|)) against the f64 reference, for the distributed result as for the single-rank
// one; so the two agree within 2e-5.
struct Worst {
  double out = 0, stat = 0;
  std::int64_t max_collectives = 0;
  int max_rounds = 0, fallback_heads = 0, runs = 0;
};

void check_against_single(const SelCase& s, const std::vector<LocalShard>& shards, Mapping mapping,
                          const select::TopkPolicy* sparse, const dist::EntmaxTauConfig& tau,
                          const std::string& what, Worst& worst) {
  SelectionStorage sel;
  const DecodeRun run = dist_decode(s, shards, mapping, sparse, tau, &sel);
  const SelectionView view = sel.view();
  const Reference ref = single_rank(s, mapping, sparse ? &view : nullptr);
  const Errors e = compare(run.out, ref.out, run.stat, ref.stat, s.d);
  const Errors e1 = compare(ref.single, ref.out, ref.sstat, ref.stat, s.d);
  const Tolerance tol;
  EXPECT_LE(e.out, tol.out) << what;
  EXPECT_LE(e.stat, tol.stat) << what;
  EXPECT_LE(e1.out, tol.out) << what;  // the single-rank decode itself
  worst.out = std::max(worst.out, e.out);
  worst.stat = std::max(worst.stat, e.stat);
  worst.max_collectives = std::max(worst.max_collectives, run.stats.collectives);
  worst.max_rounds = std::max(worst.max_rounds, run.dstats.tau_rounds);
  worst.fallback_heads += run.dstats.fallback_heads;
  ++worst.runs;
  // Collective limits per layer and step (docs/dist.md): softmax 2, entmax 3, when the tau
  // takes its one all-gather.
  const std::int64_t limit = (mapping.is_entmax() ? 2 : 1) + (sparse ? 1 : 0);
  EXPECT_EQ(run.stats.collectives, limit + run.dstats.tau_rounds) << what;
  if (run.dstats.tau_rounds == 0) {
    EXPECT_LE(run.stats.collectives, mapping.is_entmax() ? 3 : 2);
  }
}

void check_dense_and_sparse(const SelCase& s, const std::vector<LocalShard>& shards,
                            Mapping mapping, const select::TopkPolicy& policy,
                            const dist::EntmaxTauConfig& tau, const std::string& what,
                            Worst& worst) {
  const std::string m = mapping.is_entmax() ? " alpha " + std::to_string(mapping.alpha) : "";
  check_against_single(s, shards, mapping, nullptr, tau, what + m + " dense", worst);
  check_against_single(s, shards, mapping, &policy, tau, what + m + " sparse", worst);
}

void report(const char* name, const Worst& w) {
  std::printf(
      "%s: %d runs, worst out rel err %.3g, lse/tau err %.3g, max collectives %lld, "
      "max tau rounds %d, fallback heads %d\n",
      name, w.runs, w.out, w.stat, static_cast<long long>(w.max_collectives), w.max_rounds,
      w.fallback_heads);
}

TEST(DistDecode, SoftmaxDenseAndSparseEqualSingleRankInTwoCollectives) {
  OneThread one;
  Worst worst;
  for (int i = 0; i < 10; ++i) {
    const DistCase c = dist_case(i);
    const SelCase s = build(c, 500 + i);
    for (int R = 1; R <= 8; ++R) {
      const std::vector<LocalShard> shards = shard_all(s, R);
      const select::TopkPolicy policy = policy_of(i + R, 1000);
      check_dense_and_sparse(s, shards, Mapping::softmax(), policy, {},
                             describe(c) + " R " + std::to_string(R), worst);
    }
  }
  report("softmax", worst);
  EXPECT_LE(worst.max_collectives, 2);
}

TEST(DistDecode, EntmaxDenseAndSparseEqualSingleRankInThreeCollectives) {
  // A candidate cap no rank exceeds here: the tau takes its one all-gather.
  OneThread one;
  dist::EntmaxTauConfig tau;
  tau.max_candidates = 2048;
  Worst worst;
  for (const double alpha : {1.5, 2.0, 1.25}) {
    for (int i = 0; i < 8; ++i) {
      const DistCase c = dist_case(i + 3);
      const SelCase s = build(c, 700 + i);
      for (int R = 1; R <= 8; ++R) {
        const std::vector<LocalShard> shards = shard_all(s, R);
        const select::TopkPolicy policy = policy_of(i + 2 * R, 1000);
        check_dense_and_sparse(s, shards, Mapping::entmax(alpha), policy, tau,
                               describe(c) + " R " + std::to_string(R), worst);
      }
    }
  }
  report("entmax (one all-gather)", worst);
  EXPECT_EQ(worst.max_rounds, 0);
  EXPECT_LE(worst.max_collectives, 3);
}

TEST(DistDecode, EntmaxFallbackRoundsGiveTheSameResult) {
  // Caps of 0 and 3 candidates force the batched-candidate bisection on most heads.
  OneThread one;
  for (const double alpha : {1.5, 2.0, 1.25}) {
    Worst worst;
    for (int i = 0; i < 6; ++i) {
      const DistCase c = dist_case(2 * i);
      const SelCase s = build(c, 900 + i);
      for (const int R : {2, 3, 8}) {
        dist::EntmaxTauConfig tau;
        tau.max_candidates = i % 2 ? 3 : 0;
        tau.batch = i % 3 == 0 ? 8 : 32;
        const std::vector<LocalShard> shards = shard_all(s, R);
        const select::TopkPolicy policy = policy_of(i + R, 1000);
        check_dense_and_sparse(s, shards, Mapping::entmax(alpha), policy, tau,
                               describe(c) + " R " + std::to_string(R), worst);
      }
    }
    report(alpha == 1.5   ? "entmax 1.5 fallback"
           : alpha == 2.0 ? "entmax 2 fallback"
                          : "entmax 1.25 fallback",
           worst);
    EXPECT_GT(worst.fallback_heads, 0);
    EXPECT_LE(worst.max_rounds, 12);
  }
}

TEST(DistTau, EqualsTheThresholdOfTheConcatenation) {
  // Scores of each head split over R ranks as the decode would (each rank's candidates from
  // append_local_candidates); the global tau must equal entmax_threshold on all scores.
  std::mt19937 rng(17);
  std::normal_distribution<float> N;
  for (const double alpha : {1.5, 2.0, 1.7}) {
    for (const int cap : {0, 4, 1000}) {
      for (int R = 1; R <= 6; ++R) {
        const int heads = 5;
        std::vector<std::vector<float>> scores(heads);
        std::vector<double> want(heads);
        for (int i = 0; i < heads; ++i) {
          scores[i].resize(static_cast<std::size_t>(20 + 37 * i));
          for (float& x : scores[i]) x = static_cast<float>(i + 1) * N(rng);
          want[i] = entmax_threshold(std::span<const float>(scores[i]), alpha).tau;
        }
        std::vector<std::vector<double>> got(R);
        dist::run_in_process(R, [&](Communicator& comm) {
          std::vector<std::vector<double>> cand(heads);
          for (int i = 0; i < heads; ++i) {
            std::vector<float> mine;  // a strided share of the scores
            for (std::size_t t = comm.rank(); t < scores[i].size(); t += R)
              mine.push_back(scores[i][t]);
            attn::append_local_candidates(mine, alpha, cand[i]);
          }
          got[comm.rank()].resize(heads);
          dist::EntmaxTauConfig cfg;
          cfg.max_candidates = cap;
          dist::solve_global_tau(comm, cand, alpha, cfg, got[comm.rank()]);
        });
        for (int i = 0; i < heads; ++i) {
          // Exact solvers agree to rounding; the bisection fallback of alpha 1.7 to 1e-9.
          const double tol =
              (alpha == 1.7 && cap < 1000 ? 2e-9 : 1e-12) * std::max(1.0, std::fabs(want[i]));
          EXPECT_NEAR(got[0][i], want[i], tol) << "alpha " << alpha << " cap " << cap << " R " << R;
          for (int r = 1; r < R; ++r) EXPECT_EQ(got[r][i], got[0][i]);
        }
      }
    }
  }
}

TEST(DistDecode, RejectsBadArgumentsOnEveryRank) {
  const SelCase s = build(dist_case(1), 3);
  const std::vector<LocalShard> shards = shard_all(s, 2);
  std::vector<float> out(s.q.size());
  const auto run = [&](auto&& edit) {
    dist::run_in_process(2, [&](Communicator& comm) {
      dist::DecodeArgs a;
      a.q = s.qview();
      a.shard = &shards[static_cast<std::size_t>(comm.rank())];
      a.out = View3<float>::contiguous(out.data(), s.B, s.Hq, s.d);
      edit(a, comm);
      std::vector<float> local_out(out.size());
      a.out.data = local_out.data();
      dist::decode(comm, a);
    });
  };
  expect_error([&] { run([](dist::DecodeArgs& a, Communicator&) { a.q.n0 = 1; }); },
               ErrorCode::shape_mismatch, "q");
  expect_error([&] { run([](dist::DecodeArgs& a, Communicator&) { a.shard = nullptr; }); },
               ErrorCode::invalid_argument, "shard");
  expect_error(
      [&] {
        run([&](dist::DecodeArgs& a, Communicator& comm) { a.shard = &shards[1 - comm.rank()]; });
      },
      ErrorCode::invalid_argument, "comm");
  expect_error(
      [&] { run([](dist::DecodeArgs& a, Communicator&) { a.mapping = Mapping::entmax(3.0); }); },
      ErrorCode::invalid_argument, "alpha");
  OwnedSelection tok;
  tok.ids.assign(static_cast<std::size_t>(s.B) * s.Hkv, 0);
  tok.count.assign(static_cast<std::size_t>(s.B) * s.Hkv, 1);
  tok.view = {SelectionView::Unit::token, s.B, s.Hkv, 1, tok.ids, tok.count};
  expect_error([&] { run([&](dist::DecodeArgs& a, Communicator&) { a.selection = &tok.view; }); },
               ErrorCode::unsupported, "selection");
  expect_error(
      [&] {
        dist::run_in_process(2, [&](Communicator& comm) {
          dist::QuestSelectArgs qa;
          qa.q = s.qview();
          qa.q.n2 = 32;
          qa.shard = &shards[static_cast<std::size_t>(comm.rank())];
          SelectionStorage sel;
          dist::quest_select(comm, qa, sel);
        });
      },
      ErrorCode::shape_mismatch, "q");
}

}  // namespace
}  // namespace masskv::test
