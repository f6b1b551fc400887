// AVX2 + FMA inner loops of the Quest page bound (see quest_kernels.hpp). Pointer kernels
// only: this file is compiled with -mavx2 -mfma and entered after a runtime CPU check.
#include <immintrin.h>

#include "select/quest_kernels.hpp"

namespace masskv::select::detail {

namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const std::uint16_t* p) {
  // bf16 -> f32 is a 16-bit shift: exact.
  const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// One page of one kv head for four q heads: the page's min/max are loaded once for all of
// them, and the eight independent FMA chains hide the FMA latency. Every head's sum is
// hsum(q+·M lanes + q-·m lanes) in the same order whatever the caller (page_upper_bounds and
// the fused scan below must give the same bits). kW: also return W = max_c max(|m_c|, |M_c|).
template <class T, bool kW>
__attribute__((always_inline)) inline void page4(const T* lo, const T* hi, int d, const float* qpos,
                                                 const float* qneg, float* s0, float* s1, float* s2,
                                                 float* s3, float* w) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 ap0 = _mm256_setzero_ps(), ap1 = ap0, ap2 = ap0, ap3 = ap0;
  __m256 an0 = ap0, an1 = ap0, an2 = ap0, an3 = ap0, wv = ap0;
  for (int c = 0; c < d; c += 8) {
    const __m256 M = load8(hi + c), m = load8(lo + c);
    if constexpr (kW) {
      wv = _mm256_max_ps(wv, _mm256_max_ps(_mm256_and_ps(M, absmask), _mm256_and_ps(m, absmask)));
    }
    ap0 = _mm256_fmadd_ps(_mm256_loadu_ps(qpos + c), M, ap0);
    an0 = _mm256_fmadd_ps(_mm256_loadu_ps(qneg + c), m, an0);
    ap1 = _mm256_fmadd_ps(_mm256_loadu_ps(qpos + d + c), M, ap1);
    an1 = _mm256_fmadd_ps(_mm256_loadu_ps(qneg + d + c), m, an1);
    ap2 = _mm256_fmadd_ps(_mm256_loadu_ps(qpos + 2 * d + c), M, ap2);
    an2 = _mm256_fmadd_ps(_mm256_loadu_ps(qneg + 2 * d + c), m, an2);
    ap3 = _mm256_fmadd_ps(_mm256_loadu_ps(qpos + 3 * d + c), M, ap3);
    an3 = _mm256_fmadd_ps(_mm256_loadu_ps(qneg + 3 * d + c), m, an3);
  }
  *s0 = hsum(_mm256_add_ps(ap0, an0));
  *s1 = hsum(_mm256_add_ps(ap1, an1));
  *s2 = hsum(_mm256_add_ps(ap2, an2));
  *s3 = hsum(_mm256_add_ps(ap3, an3));
  if constexpr (kW) *w = hmax(wv);
}

template <class T, bool kW>
__attribute__((always_inline)) inline void page1(const T* lo, const T* hi, int d, const float* qpos,
                                                 const float* qneg, float* s, float* w) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 ap = _mm256_setzero_ps(), an = ap, wv = ap;
  for (int c = 0; c < d; c += 8) {
    const __m256 M = load8(hi + c), m = load8(lo + c);
    if constexpr (kW) {
      wv = _mm256_max_ps(wv, _mm256_max_ps(_mm256_and_ps(M, absmask), _mm256_and_ps(m, absmask)));
    }
    ap = _mm256_fmadd_ps(_mm256_loadu_ps(qpos + c), M, ap);
    an = _mm256_fmadd_ps(_mm256_loadu_ps(qneg + c), m, an);
  }
  *s = hsum(_mm256_add_ps(ap, an));
  if constexpr (kW) *w = hmax(wv);
}

template <class T>
void sums4(const T* mn, const T* mx, std::int64_t page_stride, const std::int32_t* pages, int n,
           int d, const float* qpos, const float* qneg, float* sums, float* w) {
  for (int j = 0; j < n; ++j) {
    page4<T, true>(mn + pages[j] * page_stride, mx + pages[j] * page_stride, d, qpos, qneg,
                   sums + j, sums + n + j, sums + 2 * n + j, sums + 3 * n + j, w + j);
  }
}

template <class T>
void sums1(const T* mn, const T* mx, std::int64_t page_stride, const std::int32_t* pages, int n,
           int d, const float* qpos, const float* qneg, float* sums, float* w) {
  for (int j = 0; j < n; ++j) {
    page1<T, true>(mn + pages[j] * page_stride, mx + pages[j] * page_stride, d, qpos, qneg,
                   sums + j, w + j);
  }
}

// Software prefetch of `bytes` bytes from p, one request per cache line.
inline void prefetch_bytes(const void* p, std::int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (std::int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

// The fused scan (see quest_kernels.hpp): page by page, every kv head of a page in turn.
// kD > 0 fixes head_dim at compile time: the q rows are then one base pointer plus constant
// offsets (no spilled pointers in the hot loop) and the channel loop unrolls.
template <class T, bool kW, int kD>
void scan(const T* mn, const T* mx, const std::int32_t* pages, int n, int prefetch_n, int nkv,
          int d_arg, const float* qpos, const float* qneg, int g, const float* wpre, float* sums,
          float* w) {
  const int d = kD > 0 ? kD : d_arg;
  const std::int64_t page_stride = static_cast<std::int64_t>(nkv) * d;
  // Pages ahead to prefetch (the hardware prefetcher stops at 4 KiB boundaries, and pages lie
  // anywhere in the pool); one head's rows per head step, so the requests are spread out.
  constexpr int kAhead = 8;
  const std::int64_t row_bytes = static_cast<std::int64_t>(d) * sizeof(T);
  for (int j = 0; j < n; ++j) {
    const T* lo = mn + pages[j] * page_stride;
    const T* hi = mx + pages[j] * page_stride;
    const bool pf = j + kAhead < prefetch_n;
    const T* plo = pf ? mn + pages[j + kAhead] * page_stride : nullptr;
    const T* phi = pf ? mx + pages[j + kAhead] * page_stride : nullptr;
    for (int h = 0; h < nkv; ++h, lo += d, hi += d) {
      if (pf) {
        prefetch_bytes(plo + static_cast<std::int64_t>(h) * d, row_bytes);
        prefetch_bytes(phi + static_cast<std::int64_t>(h) * d, row_bytes);
      }
      const std::int64_t q0 = static_cast<std::int64_t>(h) * g * d;
      float* s = sums + static_cast<std::int64_t>(h) * g * n + j;
      float* wj = w + static_cast<std::int64_t>(h) * n + j;
      int i = 0;
      for (; i + 4 <= g; i += 4) {
        const std::int64_t qi = q0 + static_cast<std::int64_t>(i) * d;
        page4<T, kW>(lo, hi, d, qpos + qi, qneg + qi, s + i * n, s + (i + 1) * n, s + (i + 2) * n,
                     s + (i + 3) * n, wj);
      }
      for (; i < g; ++i) {
        const std::int64_t qi = q0 + static_cast<std::int64_t>(i) * d;
        page1<T, kW>(lo, hi, d, qpos + qi, qneg + qi, s + i * n, wj);
      }
      if constexpr (!kW) *wj = wpre[static_cast<std::int64_t>(pages[j]) * nkv + h];
    }
  }
}

template <class T, bool kW>
void scan_d(const T* mn, const T* mx, const std::int32_t* pages, int n, int prefetch_n, int nkv,
            int d, const float* qpos, const float* qneg, int g, const float* wpre, float* sums,
            float* w) {
  if (d == 128) {
    scan<T, kW, 128>(mn, mx, pages, n, prefetch_n, nkv, d, qpos, qneg, g, wpre, sums, w);
  } else if (d == 64) {
    scan<T, kW, 64>(mn, mx, pages, n, prefetch_n, nkv, d, qpos, qneg, g, wpre, sums, w);
  } else {
    scan<T, kW, 0>(mn, mx, pages, n, prefetch_n, nkv, d, qpos, qneg, g, wpre, sums, w);
  }
}

template <class T>
void sums_any(const T* mn, const T* mx, std::int64_t page_stride, const std::int32_t* pages, int n,
              int d, const float* qpos, const float* qneg, int nh, float* sums, float* w) {
  int h = 0;
  for (; h + 4 <= nh; h += 4) {
    sums4(mn, mx, page_stride, pages, n, d, qpos + h * d, qneg + h * d,
          sums + static_cast<std::int64_t>(h) * n, w);
  }
  for (; h < nh; ++h) {
    sums1(mn, mx, page_stride, pages, n, d, qpos + h * d, qneg + h * d,
          sums + static_cast<std::int64_t>(h) * n, w);
  }
}

}  // namespace

void quest_scan_avx2_f32(const float* mn, const float* mx, const std::int32_t* pages, int n,
                         int prefetch_n, int nkv, int d, const float* qpos, const float* qneg,
                         int g, float* sums, float* w) {
  scan_d<float, true>(mn, mx, pages, n, prefetch_n, nkv, d, qpos, qneg, g, nullptr, sums, w);
}

void quest_scan_avx2_bf16(const std::uint16_t* mn, const std::uint16_t* mx,
                          const std::int32_t* pages, int n, int prefetch_n, int nkv, int d,
                          const float* qpos, const float* qneg, int g, const float* wpre,
                          float* sums, float* w) {
  if (wpre != nullptr) {
    scan_d<std::uint16_t, false>(mn, mx, pages, n, prefetch_n, nkv, d, qpos, qneg, g, wpre, sums,
                                 w);
  } else {
    scan_d<std::uint16_t, true>(mn, mx, pages, n, prefetch_n, nkv, d, qpos, qneg, g, nullptr, sums,
                                w);
  }
}

void quest_sums_avx2_f32(const float* mn, const float* mx, std::int64_t page_stride,
                         const std::int32_t* pages, int n, int d, const float* qpos,
                         const float* qneg, int nh, float* sums, float* w) {
  sums_any(mn, mx, page_stride, pages, n, d, qpos, qneg, nh, sums, w);
}

void quest_sums_avx2_bf16(const std::uint16_t* mn, const std::uint16_t* mx,
                          std::int64_t page_stride, const std::int32_t* pages, int n, int d,
                          const float* qpos, const float* qneg, int nh, float* sums, float* w) {
  sums_any(mn, mx, page_stride, pages, n, d, qpos, qneg, nh, sums, w);
}

}  // namespace masskv::select::detail
