// Decode: every implementation against the f64 reference on a sampled grid covering every
// value of every axis (DESIGN.md §6), plus the split/sparsity/determinism properties of §2.2
// and §2.6.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "harness.hpp"
#include "masskv/mapping.hpp"

namespace masskv::test {
namespace {

using kv::Layout;

const Mapping kMappings[] = {Mapping::softmax(), Mapping::entmax(1.5), Mapping::entmax(2.0),
                             Mapping::entmax(1.25)};

// Case i of the sampled grid: each axis advances with a different stride so that, over the
// grid, every value of every axis appears (and most pairs do), without the full product.
DecodeCase grid_case(int i) {
  static const int lengths[] = {1, 15, 16, 17, 113, 1000, 4097};
  static const int ratios[] = {1, 3, 4, 8};
  static const int dims[] = {64, 128, 256, 96};
  static const int pages[] = {1, 16, 64};
  static const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  DecodeCase c;
  const int len = lengths[i % 7];
  // Several sequences of different lengths in one batch.
  c.kv.lengths = {len, 1 + (len * 5 + 3 * i) % 300};
  if (i % 3 == 0) c.kv.lengths.push_back(len > 16 ? len - 16 : len + 16);
  c.kv.num_kv_heads = 1 + i % 2;
  c.num_q_heads = c.kv.num_kv_heads * ratios[(i / 2) % 4];
  c.kv.head_dim = dims[(i * 3) % 4];
  c.kv.page_size = pages[(i / 3) % 3];
  if (c.kv.page_size == 1 && len > 1000) c.kv.page_size = 16;
  c.kv.dtype = dtypes[(i * 5) % 3];
  c.kv.layout = (i / 5) % 2 ? Layout::NHD : Layout::HND;
  c.kv.seed = 100 + i;
  c.kv.value_offset = 0.5f;
  c.mapping = kMappings[(i / 4) % 4];
  c.selection = (i * 7 / 3) % 3;
  c.chunk_pages = 1 + (i % 5) * 3;
  c.q_sd = c.mapping.is_entmax() ? 3.0f : 1.5f;
  return c;
}

TEST(Decode, EveryImplMatchesReferenceOnSampledGrid) {
  Errors worst;
  for (int i = 0; i < 56; ++i) {
    const Errors e = check_decode(grid_case(i));
    worst.out = std::max(worst.out, e.out);
    worst.stat = std::max(worst.stat, e.stat);
  }
  std::printf("worst out rel err %.3g, lse/tau err %.3g\n", worst.out, worst.stat);
}

TEST(Decode, LongContextMatchesReference) {
  // The longest lengths are kept to a few configurations (runtime).
  for (int m = 0; m < 2; ++m) {
    DecodeCase c;
    c.kv.lengths = {65537, 17};
    c.kv.num_kv_heads = 2;
    c.num_q_heads = 8;
    c.kv.head_dim = 128;
    c.kv.page_size = 16;
    c.kv.dtype = m == 0 ? DType::f16 : DType::bf16;
    c.kv.layout = m == 0 ? Layout::HND : Layout::NHD;
    c.kv.value_offset = 0.5f;
    c.mapping = m == 0 ? Mapping::softmax() : Mapping::entmax(1.5);
    c.chunk_pages = 64;
    c.q_sd = 3;
    check_decode(c);
  }
}

}  // namespace
}  // namespace masskv::test
