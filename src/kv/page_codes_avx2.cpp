// AVX2 page codes (page_codes_kernels.hpp): the encoder eight channels at a time, and the
// integer scores eight rows at a time (kv/page_codes.hpp's definition; bit-equal to
// page_code_score).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kv/page_codes_kernels.hpp"

namespace masskv::kv::detail {

void encode_page_codes_avx2(const float* x, const float* lo, const float* hi, int d,
                            std::uint8_t* codes) {
  const __m256 zero = _mm256_setzero_ps(), three = _mm256_set1_ps(3.0f);
  const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  int c = 0;
  for (; c + 8 <= d; c += 8) {
    const __m256 l = _mm256_loadu_ps(lo + c), u = _mm256_loadu_ps(hi + c);
    const __m256 t = _mm256_round_ps(
        _mm256_mul_ps(three, _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), l),
                                           _mm256_sub_ps(u, l))),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // Clamped to [0, 3], and 0 where the range is empty (the quotient is then inf or NaN).
    const __m256 level = _mm256_and_ps(_mm256_cmp_ps(u, l, _CMP_GT_OQ),
                                       _mm256_min_ps(_mm256_max_ps(t, zero), three));
    // Four 2-bit fields a byte: shift each lane into place, then add (= or) lanes 0-3, 4-7.
    __m256i v = _mm256_sllv_epi32(_mm256_cvtps_epi32(level), shift);
    v = _mm256_hadd_epi32(v, v);
    v = _mm256_hadd_epi32(v, v);
    codes[c >> 2] = static_cast<std::uint8_t>(_mm256_extract_epi32(v, 0));
    codes[(c >> 2) + 1] = static_cast<std::uint8_t>(_mm256_extract_epi32(v, 4));
  }
  if (c < d) encode_page_codes_portable(x + c, lo + c, hi + c, d - c, codes + (c >> 2));
}

void page_code_scores_avx2(const CodeQuery* q, int nh, const PageRange8& r,
                           const std::uint8_t* rows, const std::int32_t* slots, int n, int d,
                           double* out, std::size_t out_stride) {
  constexpr int kRows = 8;
  const int bytes = page_code_bytes(d), chunks = d / 16;
  // The page's v_c = base3_c + code_c * diff_c, as 16-bit lanes in channel order.
  thread_local std::vector<std::int16_t> base3, diff;
  thread_local std::vector<std::uint8_t> zero;
  thread_local std::vector<std::int16_t> vbuf;  // 16 lanes a (chunk, row)
  vbuf.resize(static_cast<std::size_t>(chunks) * kRows * 16);
  base3.resize(static_cast<std::size_t>(d));
  diff.resize(static_cast<std::size_t>(d));
  zero.assign(static_cast<std::size_t>(bytes), 0);
  for (int c = 0; c < d; c += 16) {  // d % 16 == 0
    const __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.a + c)));
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.b + c)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(base3.data() + c),
                        _mm256_add_epi16(a, _mm256_add_epi16(a, a)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(diff.data() + c), _mm256_sub_epi16(b, a));
  }
  // Unpacking 16 channels (4 bytes): every 16-bit lane j takes byte j / 4, then field j % 4 is
  // brought to bits 6-7 by a multiply (x 4^(3 - j % 4)) and shifted down.
  const __m256i spread = _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1,
                                          2, -1, 2, -1, 2, -1, 2, -1, 3, -1, 3, -1, 3, -1, 3, -1);
  const __m256i field = _mm256_setr_epi16(64, 16, 4, 1, 64, 16, 4, 1, 64, 16, 4, 1, 64, 16, 4, 1);
  const __m256i three = _mm256_set1_epi16(3);
  const __m256d third = _mm256_set1_pd(static_cast<double>(r.step) / 3.0);
  for (int t0 = 0; t0 < n; t0 += kRows) {
    const int m = std::min(kRows, n - t0);
    const std::uint8_t* row[kRows];
    for (int t = 0; t < kRows; ++t) {
      row[t] = t < m ? rows + static_cast<std::size_t>(slots[t0 + t]) * bytes : zero.data();
    }
    // The rows' v_c, unpacked once for every query: vbuf[k * kRows + t], chunk k of row t.
    for (int k = 0; k < chunks; ++k) {
      const __m256i b3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base3.data() + 16 * k));
      const __m256i df = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(diff.data() + 16 * k));
      for (int t = 0; t < kRows; ++t) {
        std::int32_t word;
        std::memcpy(&word, row[t] + 4 * k, 4);
        const __m256i by = _mm256_shuffle_epi8(_mm256_set1_epi32(word), spread);
        const __m256i code =
            _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(by, field), 6), three);
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(vbuf.data() + (static_cast<std::size_t>(k) * kRows + t) * 16),
            _mm256_add_epi16(b3, _mm256_mullo_epi16(code, df)));
      }
    }
    for (int h = 0; h < nh; ++h) {
      const std::int16_t* q8 = q[h].q8;
      __m256i acc[kRows];
      for (int t = 0; t < kRows; ++t) acc[t] = _mm256_setzero_si256();
      for (int k = 0; k < chunks; ++k) {
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 16 * k));
        const __m256i* vk =
            reinterpret_cast<const __m256i*>(vbuf.data() + static_cast<std::size_t>(k) * kRows * 16);
        for (int t = 0; t < kRows; ++t) {
          acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_loadu_si256(vk + t), qv));
        }
      }
      // Horizontal sums of the eight rows: I[t] for t < 8.
      const __m256i s01 = _mm256_hadd_epi32(acc[0], acc[1]), s23 = _mm256_hadd_epi32(acc[2], acc[3]);
      const __m256i s45 = _mm256_hadd_epi32(acc[4], acc[5]), s67 = _mm256_hadd_epi32(acc[6], acc[7]);
      const __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
      const __m256i I = _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                                         _mm256_permute2x128_si256(s0123, s4567, 0x31));
      // score = unit * (lo * Q + (step / 3) * I), each operation rounded once.
      const __m256d base = _mm256_set1_pd(static_cast<double>(r.lo) * static_cast<double>(q[h].sum));
      const __m256d unit = _mm256_set1_pd(q[h].unit);
      alignas(32) double res[kRows];
      const __m256d i_lo = _mm256_cvtepi32_pd(_mm256_castsi256_si128(I));
      const __m256d i_hi = _mm256_cvtepi32_pd(_mm256_extracti128_si256(I, 1));
      _mm256_store_pd(res, _mm256_mul_pd(unit, _mm256_add_pd(base, _mm256_mul_pd(third, i_lo))));
      _mm256_store_pd(res + 4, _mm256_mul_pd(unit, _mm256_add_pd(base, _mm256_mul_pd(third, i_hi))));
      double* o = out + static_cast<std::size_t>(h) * out_stride + t0;
      for (int t = 0; t < m; ++t) o[t] = res[t];
    }
  }
}

void code_scores_avx2(double unit, std::int32_t Q, const PageRange8& r, const std::int32_t* I,
                      int n, double* out) {
  // code_score's operations in its order: unit · (lo · Q + (step / 3) · I).
  const __m256d base = _mm256_set1_pd(static_cast<double>(r.lo) * static_cast<double>(Q));
  const __m256d third = _mm256_set1_pd(static_cast<double>(r.step) / 3.0);
  const __m256d u = _mm256_set1_pd(unit);
  int t = 0;
  for (; t + 4 <= n; t += 4) {
    const __m256d i = _mm256_cvtepi32_pd(_mm_loadu_si128(reinterpret_cast<const __m128i*>(I + t)));
    _mm256_storeu_pd(out + t, _mm256_mul_pd(u, _mm256_add_pd(base, _mm256_mul_pd(third, i))));
  }
  for (; t < n; ++t) out[t] = code_score(unit, Q, r, I[t]);
}

namespace {

// The first pass's sums I = Σ_k q_k (3 a_k + code_k (b_k − a_k)) split into the page's base
// Σ_k 3 a_k q_k (one integer per head) and Σ_k code_k w_k, w_k = q_k (b_k − a_k). |w_k| <=
// 127 · 255 < 2^15, so two channels' codes and weights share the halves of a 32-bit lane and one
// madd gives a token both products (exact int32, as the portable sums).
struct PageSumsScratch {
  std::vector<std::int16_t> a, width;  // the page's a_k and b_k − a_k, padded to whole vectors
  std::vector<std::int16_t> w;         // [head][rpad]: w_k
  std::vector<std::int32_t> base;      // [head]
  std::vector<std::uint32_t> bits;     // [vector][pair]: two channels' 16 code bits
};

// HB heads' sums of one page: NV vectors of 8 slots (page_size = 8 NV), accumulators held in
// registers across the channel pairs.
template <int NV, int HB>
void page_block(const PageSumsScratch& S, int pairs, int rpad, int h0, std::int32_t* I,
                std::int64_t n, std::int64_t first) {
  const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i mask = _mm256_set1_epi32(0x00030003);
  const std::int64_t slots = std::min<std::int64_t>(8 * NV, n - first);
  for (int v = 0; v < NV; ++v) {
    __m256i acc[HB];
    for (int h = 0; h < HB; ++h) acc[h] = _mm256_set1_epi32(S.base[static_cast<std::size_t>(h0 + h)]);
    const std::uint32_t* bits = S.bits.data() + static_cast<std::size_t>(v) * pairs;
    for (int m = 0; m < pairs; ++m) {
      // Lane t: channel 2m's code of slot 8v + t in the low half, channel 2m + 1's in the high.
      const __m256i codes = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(bits[m])), shift), mask);
      for (int h = 0; h < HB; ++h) {
        std::int32_t wp;
        std::memcpy(&wp, S.w.data() + static_cast<std::size_t>(h0 + h) * rpad + 2 * m, 4);
        acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(codes, _mm256_set1_epi32(wp)));
      }
    }
    for (int h = 0; h < HB; ++h) {
      std::int32_t* out = I + static_cast<std::int64_t>(h0 + h) * n + first + 8 * v;
      const std::int64_t left = slots - 8 * v;
      if (left >= 8) {
        __m256i* o = reinterpret_cast<__m256i*>(out);
        _mm256_storeu_si256(o, _mm256_add_epi32(_mm256_loadu_si256(o), acc[h]));
      } else {  // the partial last page
        alignas(32) std::int32_t tmp[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), acc[h]);
        for (std::int64_t t = 0; t < left; ++t) out[t] += tmp[t];
      }
    }
  }
}

template <int NV>
void page_heads(const PageSumsScratch& S, int pairs, int rpad, int nh, std::int32_t* I,
                std::int64_t n, std::int64_t first) {
  for (int h0 = 0; h0 < nh; h0 += 4) {
    switch (std::min(4, nh - h0)) {
      case 1: page_block<NV, 1>(S, pairs, rpad, h0, I, n, first); break;
      case 2: page_block<NV, 2>(S, pairs, rpad, h0, I, n, first); break;
      case 3: page_block<NV, 3>(S, pairs, rpad, h0, I, n, first); break;
      default: page_block<NV, 4>(S, pairs, rpad, h0, I, n, first); break;
    }
  }
}

// Horizontal sum of eight int32 lanes.
std::int32_t hsum(__m256i x) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

void channel_code_sums_avx2(const PageCodesView& pc, int head, const std::int32_t* phys,
                            std::int64_t n, const std::int32_t* ch, int r, const CodeQuery* q,
                            int nh, std::int32_t* I) {
  const int P = pc.page_size, wb = pc.chan_word_bytes();
  if (P != 8 && P != 16 && P != 32 && P != 64) {
    channel_code_sums_portable(pc, head, phys, n, ch, r, q, nh, I);
    return;
  }
  const int NV = P / 8, pairs = (r + 1) / 2, rpad = (r + 15) / 16 * 16;
  // Each chosen channel's rows and each head's levels on them, gathered once (zero padded: a
  // zero weight adds nothing).
  thread_local std::vector<const std::uint8_t*> words, ranges;
  thread_local std::vector<std::int16_t> q8;
  thread_local PageSumsScratch S;
  words.resize(static_cast<std::size_t>(r));
  ranges.resize(static_cast<std::size_t>(r));
  q8.assign(static_cast<std::size_t>(rpad) * static_cast<std::size_t>(nh), 0);
  for (int k = 0; k < r; ++k) {
    words[static_cast<std::size_t>(k)] = pc.chan_row(head, ch[k]);
    ranges[static_cast<std::size_t>(k)] = pc.chan_range_row(head, ch[k]);
    for (int i = 0; i < nh; ++i) q8[static_cast<std::size_t>(i) * rpad + k] = q[i].q8[ch[k]];
  }
  S.a.assign(static_cast<std::size_t>(rpad), 0);
  S.width.assign(static_cast<std::size_t>(rpad), 0);
  S.w.assign(static_cast<std::size_t>(rpad) * static_cast<std::size_t>(nh), 0);
  S.base.assign(static_cast<std::size_t>(nh), 0);
  S.bits.assign(static_cast<std::size_t>(NV) * pairs, 0);
  const auto heads = P == 8 ? page_heads<1> : P == 16 ? page_heads<2> : P == 32 ? page_heads<4>
                                                                         : page_heads<8>;
  const std::int64_t pages = (n + P - 1) / P;
  for (std::int64_t j = 0; j < pages; ++j) {
    const std::int64_t at = phys[j];
    for (int k = 0; k < r; ++k) {
      const std::uint8_t* rg = ranges[static_cast<std::size_t>(k)] + 2 * at;
      S.a[static_cast<std::size_t>(k)] = rg[0];
      S.width[static_cast<std::size_t>(k)] = static_cast<std::int16_t>(rg[1] - rg[0]);
    }
    for (int i = 0; i < nh; ++i) {
      __m256i base = _mm256_setzero_si256();
      for (int k = 0; k < rpad; k += 16) {
        const __m256i qv = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(q8.data() + static_cast<std::size_t>(i) * rpad + k));
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(S.a.data() + k));
        const __m256i dv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(S.width.data() + k));
        base = _mm256_add_epi32(base, _mm256_madd_epi16(av, qv));
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(S.w.data() + static_cast<std::size_t>(i) * rpad + k),
            _mm256_mullo_epi16(dv, qv));
      }
      S.base[static_cast<std::size_t>(i)] = 3 * hsum(base);
    }
    for (int m = 0; m < pairs; ++m) {
      const std::uint8_t* lo = words[static_cast<std::size_t>(2 * m)] + at * wb;
      const std::uint8_t* hi =
          2 * m + 1 < r ? words[static_cast<std::size_t>(2 * m + 1)] + at * wb : nullptr;
      for (int v = 0; v < NV; ++v) {
        std::uint16_t b0 = 0, b1 = 0;
        std::memcpy(&b0, lo + 2 * v, 2);
        if (hi) std::memcpy(&b1, hi + 2 * v, 2);
        S.bits[static_cast<std::size_t>(v) * pairs + m] =
            static_cast<std::uint32_t>(b0) | (static_cast<std::uint32_t>(b1) << 16);
      }
    }
    heads(S, pairs, rpad, nh, I, n, j * P);
  }
}

}  // namespace masskv::kv::detail
