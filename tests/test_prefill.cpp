// Prefill: every implementation against the f64 reference (causal, ragged, dense and
// block-sparse, softmax and entmax) on a sampled grid covering every value of every axis.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

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
  c.q_block = i % 4 == 1 ? 16 : 8;
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
