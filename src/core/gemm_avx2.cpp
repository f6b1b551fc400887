// AVX2+FMA panel kernel of the f32 GEMM (gemm.hpp): tiles of 4 weight rows x 3
// vectors of 8 tokens keep 12 accumulators in registers; per k it loads 3 token vectors and
// broadcasts 4 weights for 12 FMAs. Pointer kernel only: entered after cpu::has_avx2().
#include <immintrin.h>

#include <cstddef>

#include "core/gemm.hpp"

namespace masskv::linalg {
namespace {

// Named accumulators, not an array: GCC keeps an array of __m256 mirrored on the stack.
template <int NV>
inline void fma_row(__m256 b, __m256 x0, __m256 x1, __m256 x2, __m256& a0, __m256& a1, __m256& a2) {
  a0 = _mm256_fmadd_ps(b, x0, a0);
  if constexpr (NV > 1) a1 = _mm256_fmadd_ps(b, x1, a1);
  if constexpr (NV > 2) a2 = _mm256_fmadd_ps(b, x2, a2);
}

template <int NV>
inline void load_row(const float* c, __m256& a0, __m256& a1, __m256& a2) {
  a0 = _mm256_loadu_ps(c);
  if constexpr (NV > 1) a1 = _mm256_loadu_ps(c + 8);
  if constexpr (NV > 2) a2 = _mm256_loadu_ps(c + 16);
}

template <int NV>
inline void store_row(float* c, __m256 a0, __m256 a1, __m256 a2) {
  _mm256_storeu_ps(c, a0);
  if constexpr (NV > 1) _mm256_storeu_ps(c + 8, a1);
  if constexpr (NV > 2) _mm256_storeu_ps(c + 16, a2);
}

// Rows w[0..3] (stride ldw) over k in [k0, k1); continues the sums in c unless k0 == 0, so
// splitting k into chunks keeps each output the same single chain.
template <int NV>
void tile4(const float* w, std::size_t ldw, std::size_t k0, std::size_t k1, const float* xt,
           std::size_t ldx, float* c, std::size_t ldc) {
  const __m256 z = _mm256_setzero_ps();
  __m256 a00 = z, a01 = z, a02 = z, a10 = z, a11 = z, a12 = z;
  __m256 a20 = z, a21 = z, a22 = z, a30 = z, a31 = z, a32 = z;
  if (k0 > 0) {
    load_row<NV>(c, a00, a01, a02);
    load_row<NV>(c + ldc, a10, a11, a12);
    load_row<NV>(c + 2 * ldc, a20, a21, a22);
    load_row<NV>(c + 3 * ldc, a30, a31, a32);
  }
  const float* w0 = w;
  const float* w1 = w + ldw;
  const float* w2 = w + 2 * ldw;
  const float* w3 = w + 3 * ldw;
  for (std::size_t k = k0; k < k1; ++k) {
    const float* xk = xt + k * ldx;
    const __m256 x0 = _mm256_loadu_ps(xk);
    const __m256 x1 = NV > 1 ? _mm256_loadu_ps(xk + 8) : z;
    const __m256 x2 = NV > 2 ? _mm256_loadu_ps(xk + 16) : z;
    fma_row<NV>(_mm256_broadcast_ss(w0 + k), x0, x1, x2, a00, a01, a02);
    fma_row<NV>(_mm256_broadcast_ss(w1 + k), x0, x1, x2, a10, a11, a12);
    fma_row<NV>(_mm256_broadcast_ss(w2 + k), x0, x1, x2, a20, a21, a22);
    fma_row<NV>(_mm256_broadcast_ss(w3 + k), x0, x1, x2, a30, a31, a32);
  }
  store_row<NV>(c, a00, a01, a02);
  store_row<NV>(c + ldc, a10, a11, a12);
  store_row<NV>(c + 2 * ldc, a20, a21, a22);
  store_row<NV>(c + 3 * ldc, a30, a31, a32);
}

template <int NV>
void rows8(const float* w, std::size_t ldw, std::size_t k0, std::size_t k1, const float* xt,
           std::size_t ldx, float* c, std::size_t ldc) {
  tile4<NV>(w, ldw, k0, k1, xt, ldx, c, ldc);
  tile4<NV>(w + 4 * ldw, ldw, k0, k1, xt, ldx, c + 4 * ldc, ldc);
}

// k in chunks of 64: the chunk's rows of the transposed block (64 tokens: 16 KiB) and of the
// panel (2 KiB) stay in L1 across the token tiles and both row halves (the chunk sweep:
// docs/model.md, "Prefill and decode speed").
constexpr std::size_t kChunk = 64;

}  // namespace

void panel_avx2(const float* w, std::size_t ldw, std::size_t K, const float* xt, std::size_t ldx,
                std::size_t nt, float* c, std::size_t ldc) {
  for (std::size_t k0 = 0; k0 < K; k0 += kChunk) {
    const std::size_t k1 = k0 + kChunk < K ? k0 + kChunk : K;
    std::size_t t = 0;
    for (; t + 24 <= nt; t += 24) rows8<3>(w, ldw, k0, k1, xt + t, ldx, c + t, ldc);
    if (nt - t == 16) rows8<2>(w, ldw, k0, k1, xt + t, ldx, c + t, ldc);
    if (nt - t == 8) rows8<1>(w, ldw, k0, k1, xt + t, ldx, c + t, ldc);
  }
}

void transpose_avx2(const float* src, std::size_t lds, std::size_t rows, std::size_t cols,
                    float* dst, std::size_t ldd) {
  std::size_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    std::size_t j = 0;
    for (; j + 8 <= cols; j += 8) {
      const float* s0 = src + i * lds + j;
      __m256 r[8], t[8];
      for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(s0 + k * lds);
      for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
      }
      // r[0..3]: columns {0,4}, {1,5}, {2,6}, {3,7} of rows 0-3; r[4..7] the same of rows 4-7.
      for (int h = 0; h < 2; ++h) {
        r[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        r[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        r[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        r[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
      }
      float* d0 = dst + j * ldd + i;
      for (int k = 0; k < 4; ++k) {
        _mm256_storeu_ps(d0 + k * ldd, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
        _mm256_storeu_ps(d0 + (k + 4) * ldd, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
      }
    }
    for (std::size_t ii = i; ii < i + 8; ++ii) {
      for (std::size_t jj = j; jj < cols; ++jj) dst[jj * ldd + ii] = src[ii * lds + jj];
    }
  }
  for (; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
  }
}

}  // namespace masskv::linalg
