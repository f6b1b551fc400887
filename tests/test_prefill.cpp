// Prefill: every implementation against the f64 reference (causal, ragged, dense and
// block-sparse, softmax and entmax) on a sampled grid covering every value of every axis.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attn/microkernels.hpp"
#include "harness.hpp"

namespace masskv::test {
namespace {

using kv::Layout;

PrefillCase grid_case(int i) {
  static const int lengths[] = {1, 15, 16, 17, 113, 300, 1000, 4097};
  static const int ratios[] = {1, 3, 4, 8};
  static const int dims[] = {64, 128, 256, 96};
  static const int pages[] = {1, 16, 64};
  static const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  static const Mapping maps[] = {Mapping::softmax(), Mapping::entmax(1.5), Mapping::entmax(2.0),
                                 Mapping::entmax(1.25)};
  PrefillCase c;
  const int len = lengths[i % 8];
  const int len2 = 1 + (len * 7 + 5 * i) % 90;
  c.kv.lengths = {len, len2};
  // Long sequences get a chunked-prefill step of new queries (runtime: the reference is
  // O(queries * length)); short ones a full or half prefill.
  c.num_queries = {len > 113 ? 40 + i % 7 : len - (i % 3 == 0 ? len / 2 : 0), len2};
  c.kv.num_kv_heads = 1 + i % 2;
  c.num_q_heads = c.kv.num_kv_heads * ratios[(i / 2) % 4];
  c.kv.head_dim = dims[(i * 3) % 4];
  c.kv.page_size = pages[(i / 3) % 3];
  if (c.kv.page_size == 1 && len > 1000) c.kv.page_size = 16;
  c.kv.dtype = dtypes[(i * 5) % 3];
  c.kv.layout = (i / 5) % 2 ? Layout::NHD : Layout::HND;
  c.kv.seed = 300 + i;
  c.kv.value_offset = 0.5f;
  c.mapping = maps[(i / 4) % 4];
  c.block_sparse = i % 2 == 1;
  c.q_block = i % 4 == 1 ? 16 : i % 4 == 3 ? 64 : 8;  // 64: tiles inside one mask row
  c.k_block = i % 3 == 0 ? 16 : 32;
  c.keep = 0.4;
  c.q_sd = c.mapping.is_entmax() ? 3.0f : 1.5f;
  return c;
}

TEST(Prefill, EveryImplMatchesReferenceOnSampledGrid) {
  Errors worst;
  for (int i = 0; i < 32; ++i) {
    const Errors e = check_prefill(grid_case(i));
    worst.out = std::max(worst.out, e.out);
    worst.stat = std::max(worst.stat, e.stat);
  }
  std::printf("worst out rel err %.3g, lse/tau err %.3g\n", worst.out, worst.stat);
}

}  // namespace
}  // namespace masskv::test

namespace masskv::test {
namespace {

// docs/design.md §6: prefill output bits do not depend on the thread count, and simd == fast.
TEST(Prefill, BitIdenticalForOneAndTwoThreads) {
  KVConfig kv;
  kv.lengths = {300, 77};
  kv.num_kv_heads = 2;
  kv.head_dim = 64;
  kv.dtype = DType::bf16;
  const HandCache cache(kv);
  std::vector<std::int32_t> q_indptr{0, 100, 177};
  const std::vector<float> q = random_q(177, 8, 64, 3.0f, 2);
  const int saved = omp_get_max_threads();
  for (const Mapping map : {Mapping::softmax(), Mapping::entmax(1.5), Mapping::entmax(1.25)}) {
    std::vector<std::vector<float>> outs;
    for (int run = 0; run < 3; ++run) {
      std::vector<float> out(177 * 8 * 64), stat(177 * 8);
      attn::PrefillArgs args;
      args.q = View3<const float>::contiguous(q.data(), 177, 8, 64);
      args.q_indptr = q_indptr;
      args.cache = cache.view();
      args.mapping = map;
      args.out = View3<float>::contiguous(out.data(), 177, 8, 64);
      args.lse_or_tau = stat;
      args.impl = run == 2 ? attn::Impl::simd : attn::Impl::fast;
      omp_set_num_threads(run == 0 ? 1 : 2);
      attn::prefill(args);
      out.insert(out.end(), stat.begin(), stat.end());
      outs.push_back(out);
    }
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[2].data(), outs[0].size() * sizeof(float)));
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace masskv::test

namespace masskv::test {
namespace {

// A query whose mask row selects nothing gets out = 0 and lse = -inf (softmax) / NaN (entmax).
TEST(Prefill, EmptyMaskRowGivesZeroOutput) {
  KVConfig kv;
  kv.lengths = {40, 20};
  kv.num_kv_heads = 1;
  kv.head_dim = 64;
  const HandCache cache(kv);
  std::vector<std::int32_t> q_indptr{0, 8, 16};
  const std::vector<float> q = random_q(16, 2, 64, 1.0f, 2);
  // q_block 8, k_block 16: sequence 0 has 1 x 3 blocks (all on), sequence 1 has 1 x 2 (off).
  std::vector<std::uint8_t> bits{1, 1, 1, 0, 0};
  std::vector<std::int64_t> offsets{0, 3};
  const attn::BlockMask mask{8, 16, bits, offsets};
  for (const Mapping map : {Mapping::softmax(), Mapping::entmax(2.0)}) {
    for (const ImplEntry& impl : prefill_impls()) {
      std::vector<float> out(16 * 2 * 64, 7.0f), stat(16 * 2, 7.0f);
      attn::PrefillArgs args;
      args.q = View3<const float>::contiguous(q.data(), 16, 2, 64);
      args.q_indptr = q_indptr;
      args.cache = cache.view();
      args.mapping = map;
      args.block_mask = &mask;
      args.out = View3<float>::contiguous(out.data(), 16, 2, 64);
      args.lse_or_tau = stat;
      args.impl = impl.impl;
      attn::prefill(args);
      for (int row = 8; row < 16; ++row) {
        for (int h = 0; h < 2; ++h) {
          for (int c = 0; c < 64; ++c) ASSERT_EQ(out[(row * 2 + h) * 64 + c], 0.0f) << impl.name;
          if (map.is_entmax()) {
            EXPECT_TRUE(std::isnan(stat[row * 2 + h])) << impl.name;
          } else {
            EXPECT_EQ(stat[row * 2 + h], -INFINITY) << impl.name;
          }
        }
      }
      for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isfinite(stat[i])) << impl.name;
    }
  }
}

}  // namespace
}  // namespace masskv::test

// The max micro-kernel (softmax rows of prefill): equal to std::max_element on every length
// around the vector widths, with -inf entries (masked keys) and the maximum in every slot.
TEST(Prefill, MaxKernelMatchesMaxElement) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-50.f, 50.f);
  for (const bool simd : {false, true}) {
    const masskv::attn::mk::Kernels& k = masskv::attn::mk::kernels(simd);
    for (int n = 1; n <= 70; ++n) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (int at = 0; at < n; ++at) {
        for (float& v : x) v = u(rng) < 0 ? -INFINITY : u(rng);
        x[static_cast<std::size_t>(at)] = 60.f + static_cast<float>(at);
        EXPECT_EQ(k.max(x.data(), n), *std::max_element(x.begin(), x.end()))
            << k.name << " n " << n << " at " << at;
      }
      std::fill(x.begin(), x.end(), -INFINITY);
      EXPECT_EQ(k.max(x.data(), n), -INFINITY) << k.name << " n " << n;
    }
  }
}
