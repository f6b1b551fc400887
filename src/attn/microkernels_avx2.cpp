// AVX2 + FMA + F16C micro-kernels (see microkernels.hpp). Compiled with -mavx2 -mfma -mf16c
// and entered only after cpu::has_avx2(): pointer kernels and internal-linkage helpers only,
// so no inline function compiled for AVX2 can be picked by the linker for other code.
//
// Register tiling: a tile of `ht` heads x `rb` rows keeps ht*rb <= 8 independent 8-lane
// accumulators (scores) or ht heads x cw column chunks (accumulate), so FMA latency is hidden
// and each converted row vector feeds every head of the tile. The helpers are always_inline
// and called with literal tile sizes, so the loops unroll into straight register code.
#include <immintrin.h>

#include <cstdint>

#include "attn/microkernels.hpp"
#include "core/exp_avx2.hpp"

#define MASSKV_AI inline __attribute__((always_inline))

namespace masskv::attn::mk {
namespace {

constexpr int kF32 = 0, kF16 = 1, kBF16 = 2;

MASSKV_AI __m256 load8(int dtype, const void* row, int c) {
  if (dtype == kF16) {
    const auto* p = static_cast<const std::uint16_t*>(row) + c;
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  if (dtype == kBF16) {
    const auto* p = static_cast<const std::uint16_t*>(row) + c;
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(row) + c);
}

// Pages sit anywhere in the pool, so the hardware prefetcher (which stops at 4 KiB
// boundaries) cannot run ahead across them: prefetch whole rows a fixed distance ahead.
constexpr int kPrefetchRows = 32;

MASSKV_AI void prefetch_row(const void* row, int bytes) {
  const char* p = static_cast<const char*>(row);
  for (int off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

MASSKV_AI int row_bytes(int dtype, int d) { return dtype == kF32 ? 4 * d : 2 * d; }

// Prefetches pf[begin, end) clipped to [0, npf).
MASSKV_AI void prefetch_some(const void* const* pf, int npf, int begin, int end, int bytes) {
  for (int j = begin < 0 ? 0 : begin; j < end && j < npf; ++j) prefetch_row(pf[j], bytes);
}

// Horizontal sums of 8 vectors in one vector (lane i = sum of v[i]).
MASSKV_AI __m256 reduce8(const __m256* v) {
  const __m256 a01 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 a23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a45 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 a67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 b0 = _mm256_hadd_ps(a01, a23);  // lanes: v0 v1 v2 v3 | v0 v1 v2 v3 (halves)
  const __m256 b1 = _mm256_hadd_ps(a45, a67);
  const __m256 lo = _mm256_permute2f128_ps(b0, b1, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(b0, b1, 0x31);
  return _mm256_add_ps(lo, hi);
}

// Scores of ht heads x rb rows (ht * rb <= 12: with rb key vectors and one q vector that is
// at most the 16 ymm registers). Per column step: rb conversions + ht q loads feed ht * rb
// FMAs, so the loop is FMA-bound rather than load-bound.
MASSKV_AI void score_tile(int dtype, const float* q, int d, int ht, int rb, const void* const* rows,
                          float scale, float* s, std::int64_t ls) {
  __m256 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm256_setzero_ps();
  for (int c = 0; c < d; c += 8) {
    __m256 k[8];
#pragma GCC unroll 8
    for (int r = 0; r < rb; ++r) k[r] = load8(dtype, rows[r], c);
#pragma GCC unroll 8
    for (int h = 0; h < ht; ++h) {
      const __m256 qv = _mm256_loadu_ps(q + h * d + c);
#pragma GCC unroll 8
      for (int r = 0; r < rb; ++r) acc[h * rb + r] = _mm256_fmadd_ps(qv, k[r], acc[h * rb + r]);
    }
  }
  alignas(32) float out[16];
  _mm256_store_ps(out, _mm256_mul_ps(reduce8(acc), _mm256_set1_ps(scale)));
  if (ht * rb > 8) _mm256_store_ps(out + 8, _mm256_mul_ps(reduce8(acc + 8), _mm256_set1_ps(scale)));
#pragma GCC unroll 8
  for (int h = 0; h < ht; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < rb; ++r) s[h * ls + r] = out[h * rb + r];
  }
}

// All rows for one head tile of ht <= 4 heads: blocks of rb rows, then single rows; tile t
// also prefetches the matching rows of pf.
MASSKV_AI void score_rows(int dtype, const float* q, int d, int ht, const void* const* rows, int n,
                          float scale, float* s, std::int64_t ls, const void* const* pf, int npf) {
  const int rb = ht == 1 ? 8 : ht == 2 ? 4 : 3;
  const int bytes = row_bytes(dtype, d);
  int r = 0;
  for (; r + rb <= n; r += rb) {
    prefetch_some(pf, npf, r, r + rb, bytes);
    score_tile(dtype, q, d, ht, rb, rows + r, scale, s + r, ls);
  }
  for (; r < n; ++r) {
    prefetch_some(pf, npf, r, r + 1, bytes);
    score_tile(dtype, q, d, ht, 1, rows + r, scale, s + r, ls);
  }
}

void score_rows_dispatch(int dtype, const float* q, int d, int ht, const void* const* rows, int n,
                         float scale, float* s, std::int64_t ls, const void* const* pf, int npf) {
#define MASSKV_CASE(DT, HT) score_rows(DT, q, d, HT, rows, n, scale, s, ls, pf, npf)
#define MASSKV_DT(DT)     \
  switch (ht) {           \
    case 1:               \
      MASSKV_CASE(DT, 1); \
      return;             \
    case 2:               \
      MASSKV_CASE(DT, 2); \
      return;             \
    case 3:               \
      MASSKV_CASE(DT, 3); \
      return;             \
    default:              \
      MASSKV_CASE(DT, 4); \
      return;             \
  }
  if (dtype == kF16) MASSKV_DT(kF16)
  if (dtype == kBF16) MASSKV_DT(kBF16)
  MASSKV_DT(kF32)
#undef MASSKV_DT
#undef MASSKV_CASE
}

void convert_rows(int dtype, const void* const* rows, int n, int d, float* out,
                  const void** out_rows) {
  for (int r = 0; r < n; ++r) {
    float* o = out + r * d;
    if (dtype == kF16) {
      for (int c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, load8(kF16, rows[r], c));
    } else {
      for (int c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, load8(kBF16, rows[r], c));
    }
    out_rows[r] = o;
  }
}

// Transposed scores for more than 4 heads (prefill packs query tile x group): 16 keys sit in
// the lanes of two vectors (kt is [d][16], converted and transposed once), each head is a
// broadcast, so ht heads x 2 vectors of accumulators need no horizontal sums and their
// results are stored straight into the score rows. ht <= 6 keeps 12 accumulators.
MASSKV_AI void score_tile_t(const float* q, int d, int ht, const float* kt, float scale, float* s,
                            std::int64_t ls, int nk) {
  __m256 a[12];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) a[i] = _mm256_setzero_ps();
  for (int c = 0; c < d; ++c) {
    const __m256 k0 = _mm256_load_ps(kt + 16 * c);
    const __m256 k1 = _mm256_load_ps(kt + 16 * c + 8);
#pragma GCC unroll 6
    for (int h = 0; h < ht; ++h) {
      const __m256 qv = _mm256_broadcast_ss(q + h * d + c);
      a[2 * h] = _mm256_fmadd_ps(qv, k0, a[2 * h]);
      a[2 * h + 1] = _mm256_fmadd_ps(qv, k1, a[2 * h + 1]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 6
  for (int h = 0; h < ht; ++h) {
    float* out = s + h * ls;
    if (nk == 16) {
      _mm256_storeu_ps(out, _mm256_mul_ps(a[2 * h], sc));
      _mm256_storeu_ps(out + 8, _mm256_mul_ps(a[2 * h + 1], sc));
    } else {
      alignas(32) float tmp[16];
      _mm256_store_ps(tmp, _mm256_mul_ps(a[2 * h], sc));
      _mm256_store_ps(tmp + 8, _mm256_mul_ps(a[2 * h + 1], sc));
      for (int r = 0; r < nk; ++r) out[r] = tmp[r];
    }
  }
}

template <int HT>
void score_tile_t_n(const float* q, int d, const float* kt, float scale, float* s, std::int64_t ls,
                    int nk) {
  score_tile_t(q, d, HT, kt, scale, s, ls, nk);
}

using ScoreTileT = void (*)(const float*, int, const float*, float, float*, std::int64_t, int);
// Indexed by the head count of the tile (1-6).
constexpr ScoreTileT kScoreTileT[] = {nullptr,           score_tile_t_n<1>, score_tile_t_n<2>,
                                      score_tile_t_n<3>, score_tile_t_n<4>, score_tile_t_n<5>,
                                      score_tile_t_n<6>};

// Accumulation tile: ht heads x cw column chunks of 8 (ht * cw <= 12), over n rows. Each
// accumulator is updated once per row, so ht * cw >= 8 independent chains hide FMA latency.
MASSKV_AI void acc_tile(int dtype, const float* w, std::int64_t lw, int ht, int cw, int d, int c0,
                        const void* const* rows, int n, float* acc) {
  __m256 a[16];
#pragma GCC unroll 8
  for (int h = 0; h < ht; ++h) {
#pragma GCC unroll 8
    for (int j = 0; j < cw; ++j) a[h * cw + j] = _mm256_loadu_ps(acc + h * d + c0 + 8 * j);
  }
  for (int r = 0; r < n; ++r) {
    __m256 v[8];
#pragma GCC unroll 8
    for (int j = 0; j < cw; ++j) v[j] = load8(dtype, rows[r], c0 + 8 * j);
#pragma GCC unroll 8
    for (int h = 0; h < ht; ++h) {
      const __m256 wv = _mm256_broadcast_ss(w + h * lw + r);
#pragma GCC unroll 8
      for (int j = 0; j < cw; ++j) a[h * cw + j] = _mm256_fmadd_ps(wv, v[j], a[h * cw + j]);
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < ht; ++h) {
#pragma GCC unroll 8
    for (int j = 0; j < cw; ++j) _mm256_storeu_ps(acc + h * d + c0 + 8 * j, a[h * cw + j]);
  }
}

// One head tile (ht <= 8) over a block of rows that stays in L1 while the column chunks are
// swept; each element is converted once per head tile. The prefetches of pf are spread over
// the column sweeps.
MASSKV_AI void acc_rows(int dtype, const float* w, std::int64_t lw, int ht, int d,
                        const void* const* rows, int n, float* acc, const void* const* pf,
                        int npf) {
  const int cw = ht == 1 ? 8 : ht == 2 ? 4 : ht <= 4 ? 3 : 1;
  const int bytes = row_bytes(dtype, d);
  const int sweeps = (d + 8 * cw - 1) / (8 * cw);
  const int per = (npf + sweeps - 1) / sweeps;
  int c = 0, k = 0;
  for (; c + 8 * cw <= d; c += 8 * cw, ++k) {
    prefetch_some(pf, npf, k * per, (k + 1) * per, bytes);
    acc_tile(dtype, w, lw, ht, cw, d, c, rows, n, acc);
  }
  prefetch_some(pf, npf, k * per, npf, bytes);
  if (ht <= 4 && c + 16 <= d) {
    acc_tile(dtype, w, lw, ht, 2, d, c, rows, n, acc);
    c += 16;
  }
  for (; c < d; c += 8) acc_tile(dtype, w, lw, ht, 1, d, c, rows, n, acc);
}

void acc_rows_dispatch(int dtype, const float* w, std::int64_t lw, int ht, int d,
                       const void* const* rows, int n, float* acc, const void* const* pf, int npf) {
#define MASSKV_CASE(DT, HT) acc_rows(DT, w, lw, HT, d, rows, n, acc, pf, npf)
#define MASSKV_DT(DT)     \
  switch (ht) {           \
    case 1:               \
      MASSKV_CASE(DT, 1); \
      return;             \
    case 2:               \
      MASSKV_CASE(DT, 2); \
      return;             \
    case 3:               \
      MASSKV_CASE(DT, 3); \
      return;             \
    case 4:               \
      MASSKV_CASE(DT, 4); \
      return;             \
    case 5:               \
      MASSKV_CASE(DT, 5); \
      return;             \
    case 6:               \
      MASSKV_CASE(DT, 6); \
      return;             \
    case 7:               \
      MASSKV_CASE(DT, 7); \
      return;             \
    default:              \
      MASSKV_CASE(DT, 8); \
      return;             \
  }
  if (dtype == kF16) MASSKV_DT(kF16)
  if (dtype == kBF16) MASSKV_DT(kBF16)
  MASSKV_DT(kF32)
#undef MASSKV_DT
#undef MASSKV_CASE
}

// exp on [-87.3, 0] (simd::exp_in_range, ~1 ulp); smaller -> 0.
MASSKV_AI __m256 exp_nonpos(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(simd::kExpMin), _CMP_LT_OQ);
  return _mm256_andnot_ps(underflow,
                          simd::exp_in_range(_mm256_max_ps(x, _mm256_set1_ps(simd::kExpMin))));
}

void scores_transposed(int dtype, const float* q, int g, int d, const void* const* rows, int n,
                       float scale, float* s, std::int64_t ls, const void* const* pf, int npf) {
  constexpr int kKeys = 16;
  alignas(32) float buf[kKeys * kMaxHeadDim];
  alignas(32) float kt[kKeys * kMaxHeadDim];
  const void* conv[kKeys];
  const int bytes = row_bytes(dtype, d);
  for (int r0 = 0; r0 < n; r0 += kKeys) {
    const int nb = n - r0 < kKeys ? n - r0 : kKeys;
    prefetch_some(pf, npf, r0, r0 + nb, bytes);
    if (dtype == kF32) {
      for (int r = 0; r < nb; ++r) conv[r] = rows[r0 + r];
    } else {
      convert_rows(dtype, rows + r0, nb, d, buf, conv);
    }
    for (int c = 0; c < d; ++c) {
      for (int r = 0; r < nb; ++r) kt[kKeys * c + r] = static_cast<const float*>(conv[r])[c];
      for (int r = nb; r < kKeys; ++r) kt[kKeys * c + r] = 0.0f;
    }
    for (int h0 = 0; h0 < g; h0 += 6) {
      const int ht = g - h0 < 6 ? g - h0 : 6;
      kScoreTileT[ht](q + h0 * d, d, kt, scale, s + h0 * ls + r0, ls, nb);
    }
  }
}

}  // namespace

void scores_avx2(int dtype, const float* q, int g, int d, const void* const* rows, int n,
                 float scale, float* s, std::int64_t ls, const void* const* pf, int npf) {
  if (pf == nullptr) {  // look ahead in our own rows
    pf = rows + kPrefetchRows;
    npf = n - kPrefetchRows;
  }
  if (g > 4) {  // more heads than one register tile
    scores_transposed(dtype, q, g, d, rows, n, scale, s, ls, pf, npf);
    return;
  }
  for (int h0 = 0; h0 < g; h0 += 4) {
    const int ht = g - h0 < 4 ? g - h0 : 4;
    score_rows_dispatch(dtype, q + h0 * d, d, ht, rows, n, scale, s + h0 * ls, ls, pf, npf);
  }
}

void accumulate_avx2(int dtype, const float* w, std::int64_t lw, int g, int d,
                     const void* const* rows, int n, float* acc, const void* const* pf, int npf) {
  constexpr int kBlock = 16;       // rows per L1-resident block
  const bool own = pf == nullptr;  // look ahead in our own rows, block by block
  if (own) {
    pf = rows + kPrefetchRows;
    npf = n - kPrefetchRows;
  }
  const int bytes = row_bytes(dtype, d);
  if (g <= 8 || dtype == kF32) {
    for (int r0 = 0; r0 < n; r0 += kBlock) {
      const int nb = n - r0 < kBlock ? n - r0 : kBlock;
      // The rows to prefetch during this block: the matching slice of pf.
      const int p0 = own ? r0 : (npf * r0) / n;
      const int p1 = own ? r0 + nb : (npf * (r0 + nb)) / n;
      for (int h0 = 0; h0 < g; h0 += 8) {
        const int ht = g - h0 < 8 ? g - h0 : 8;
        const int m = h0 == 0 ? (p1 < npf ? p1 : npf) - p0 : 0;
        acc_rows_dispatch(dtype, w + h0 * lw + r0, lw, ht, d, rows + r0, nb, acc + h0 * d, pf + p0,
                          m > 0 ? m : 0);
      }
    }
    return;
  }
  alignas(32) float buf[kBlock * kMaxHeadDim];
  const void* conv[kBlock];
  for (int r0 = 0; r0 < n; r0 += kBlock) {
    const int nb = n - r0 < kBlock ? n - r0 : kBlock;
    prefetch_some(pf, npf, own ? r0 : (npf * r0) / n, own ? r0 + nb : (npf * (r0 + nb)) / n, bytes);
    convert_rows(dtype, rows + r0, nb, d, buf, conv);
    // Tiles of 4 heads x 3 column vectors (12 accumulators, 3 loads + 4 broadcasts per 12
    // FMAs) rather than 8 x 1 (9 loads per 8 FMAs): the converted block is in L1 either way.
    for (int h0 = 0; h0 < g; h0 += 4) {
      const int ht = g - h0 < 4 ? g - h0 : 4;
      acc_rows_dispatch(kF32, w + h0 * lw + r0, lw, ht, d, conv, nb, acc + h0 * d, nullptr, 0);
    }
  }
}

float exp_sum_avx2(float* x, int n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    const __m256 b = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv));
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(s0, s1));
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) {
    alignas(32) float one[8] = {x[i] - m, 0, 0, 0, 0, 0, 0, 0};
    _mm256_store_ps(one, exp_nonpos(_mm256_load_ps(one)));
    x[i] = one[0];
    sum += one[0];
  }
  return sum;
}

// Four independent vector maxima (max is exact, so their order does not matter).
float max_avx2(const float* x, int n) {
  const float first = x[0];
  __m256 m0 = _mm256_set1_ps(first), m1 = m0, m2 = m0, m3 = m0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + i + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + i + 24));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  float m = lanes[0];
  for (int j = 1; j < 8; ++j) m = lanes[j] > m ? lanes[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace masskv::attn::mk
