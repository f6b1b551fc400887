// token_codes in two passes on the GPU (select::SelectorConfig::code_channels < 1; the CPU rule:
// src/select/scorers/page_codes.cpp score_two_passes). two_stage.cu runs all_pages_kernel with the
// first pass's Params (every page, log_prob), then launch_first_pass, then its one-pass kernels
// (score_kernel on the candidates alone, the pooling or the round robin, the merge) as the
// second pass. The first pass, per (sequence b, kv head h):
//   1. chan_kernel (a CTA per (b, h)): each q head's int8 levels (kv::code_query, as score_kernel
//      makes them) and unit; the channels' weights Σ_i |q_ic| (f64, heads in order: the CPU's
//      sums; times the last page's spread row, codes.chan_spread, under code_channel_spread), the r = round(code_channels · d) largest (ties to the lower channel) in ascending
//      order, and each head's Q over them;
//   2. pass1_kernel (whole pages per CTA, a thread per token): the integer sums over the chosen
//      channels from the codes' channel-major copy (each chosen channel's word and range of the
//      CTA's pages staged in shared memory), then kv::code_score's four f64 operations with the
//      chosen channels' Q, as an ordered key per head, and each head's best key (lmax);
//   3. launch_log_prob_pool (two_stage_pool.cu): each head's LSE over every token, the pooled
//      log-probabilities (the kept tokens not ranked) and the best `need` = min(L, code_candidates
//      × cap) − kept of them as a set (plan_of with Params::pick); set_rank_kernel ranks a group
//      whose cut bin overflows (a radix select of the need-th key over the whole row; the ties
//      at it to the lower token, as the CPU's order_by);
//   4. cand_kernel (a CTA per (b, h)): the candidates' bitmap (the kept tokens and the chosen,
//      Params::cmask) and the pages holding them, ascending, as the second pass's candidate
//      pages (their count is the CPU's SelectOutput::code_pages).
// Everything is exact: integer sums, the CPU's f64 operations in its order, the shared LSE
// (select/log_prob.hpp), selections by ordered keys with the CPU's ties.
#include "cta_select.cuh"
#include "device.cuh"
#include "two_stage_common.cuh"

namespace masskv::cuda::two_stage_impl {
namespace {

using detail::check_cuda;

// ---- 1. the channels --------------------------------------------------------------------------

template <int kD>
__global__ void __launch_bounds__(kThreads) chan_kernel(Params p) {
  __shared__ int s_q8[kMaxG][kD];
  __shared__ double s_w[kD];
  __shared__ int s_chosen[kD];
  __shared__ int s_warp[32];
  const int b = blockIdx.x / p.Hkv, h = blockIdx.x % p.Hkv, g = p.g;
  const std::int64_t pair = blockIdx.x;
  const std::int64_t seg0 = static_cast<std::int64_t>(b) * p.Hq + h * g;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The queries' integer form, as score_kernel (kv::code_query of q · scale).
  for (int i = warp; i < g; i += kThreads / 32) {
    const float* q = p.q + b * p.q_s0 + (h * g + i) * p.q_s1;
    float m = 0.f;
    for (int c = lane; c < kD; c += 32) m = fmaxf(m, fabsf(__fmul_rn(q[c], p.scale)));
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const bool zero = !(m > 0.f) || !isfinite(m);
    const float r = zero ? 0.f : __fdiv_rn(127.0f, m);
    for (int c = lane; c < kD; c += 32) {
      const float t = rintf(__fmul_rn(__fmul_rn(q[c], p.scale), r));
      const int v = zero ? 0 : static_cast<int>(fminf(fmaxf(t, -127.f), 127.f));
      s_q8[i][c] = v;
      p.q8[(seg0 + i) * kD + c] = v;
    }
    if (lane == 0) p.qunit[seg0 + i] = zero ? 0.0 : __ddiv_rn(static_cast<double>(m), 127.0);
  }
  // The weights: Σ over the heads, in head order, of |q_c| (the unscaled q, as the CPU), times
  // the channel's spread over the sequence's keys (its last page's row) when given.
  if (threadIdx.x < kD) {
    double w = 0.0;
    for (int i = 0; i < g; ++i)
      w = __dadd_rn(w, static_cast<double>(fabsf(p.q[b * p.q_s0 + (h * g + i) * p.q_s1 +
                                                     threadIdx.x])));
    if (p.chan_spread != nullptr) {
      const int end = p.indptr[b + 1];
      // A bad table is flagged by plan_of in the other kernels; the weights then do not matter.
      const int phys = end > p.indptr[b] ? checked_phys(p, end - 1, p.code_pages) : -1;
      if (phys >= 0) {
        w = __dmul_rn(w, static_cast<double>(
                             p.chan_spread[(static_cast<std::int64_t>(phys) * p.Hkv + h) * kD +
                                           threadIdx.x]));
      }
    }
    s_w[threadIdx.x] = w;
  }
  __syncthreads();
  // Channel c is chosen when fewer than r channels come before it (larger weight, or equal and
  // lower: select::detail::order_by's order).
  int chosen = 0;
  if (threadIdx.x < kD) {
    const int c = threadIdx.x;
    const double w = s_w[c];
    int before = 0;
    for (int x = 0; x < kD; ++x) {
      const double v = s_w[x];
      before += (v > w || (v == w && x < c)) ? 1 : 0;
    }
    chosen = before < p.r ? 1 : 0;
    s_chosen[c] = chosen;
  }
  int total = 0;
  const int at = block_exclusive_scan(chosen, s_warp, &total);  // synchronises
  if (chosen) p.ch[pair * kD + at] = static_cast<int>(threadIdx.x);
  // Q of the first pass: each head's levels summed over the chosen channels (exact).
  for (int i = warp; i < g; i += kThreads / 32) {
    int sum = 0;
    for (int c = lane; c < kD; c += 32) sum += s_chosen[c] ? s_q8[i][c] : 0;
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) p.q1[seg0 + i] = sum;
  }
}

// ---- 2. every token on the chosen channels ------------------------------------------------------

// A CTA's code bytes of one channel: its pages (at most kScorePages, at most kThreads tokens)
// times ceil(P / 4) bytes <= 64.
constexpr int kWordBytes = 64;

template <int kD>
__global__ void __launch_bounds__(kThreads) pass1_kernel(Params p) {
  __shared__ int s_qk[kD][kMaxG];                        // chosen channel k, head i: q8
  __shared__ int s_ch[kD];
  __shared__ std::uint32_t s_w[kD][kWordBytes / 4];      // chosen channel k: the pages' bytes
  __shared__ std::uint16_t s_rg[kD][kScorePages];        // chosen channel k, page t: a | b << 8
  __shared__ double s_base[kScorePages][kMaxG], s_third[kScorePages];
  __shared__ double s_unit[kMaxG];
  __shared__ int s_phys[kScorePages];
  __shared__ unsigned long long s_max[kMaxG];
  const int b = blockIdx.z, h = blockIdx.y, g = p.g, P = p.P, r = p.r;
  const std::int64_t pair = static_cast<std::int64_t>(b) * p.Hkv + h;
  const std::int64_t seg0 = static_cast<std::int64_t>(b) * p.Hq + h * g;
  const Plan s = plan_of(p, b, false);
  const int n_c = s.bad ? 0 : p.n_cand[pair];  // every page (all_pages_kernel)
  const int per = p.score_pages;                // pages per CTA: per * P <= kThreads
  const int c0 = static_cast<int>(blockIdx.x) * per;
  if (c0 >= n_c) return;  // the whole CTA
  const int n = min(per, n_c - c0);
  const int wb = (P + 3) / 4;  // kv::PageCodesView::chan_word_bytes
  for (int idx = threadIdx.x; idx < r * g; idx += blockDim.x) {
    const int k = idx / g, i = idx % g;
    const int c = p.ch[pair * kD + k];
    s_qk[k][i] = p.q8[(seg0 + i) * kD + c];
    if (i == 0) s_ch[k] = c;
  }
  if (static_cast<int>(threadIdx.x) < g) s_unit[threadIdx.x] = p.qunit[seg0 + threadIdx.x];
  if (threadIdx.x < kScorePages) {
    int phys = -1;
    if (static_cast<int>(threadIdx.x) < n) {
      phys = checked_phys(p, p.indptr[b] + p.cand[pair * p.cand_max + c0 + threadIdx.x],
                          p.code_pages);
    }
    s_phys[threadIdx.x] = phys;
  }
  if (threadIdx.x < kMaxG) s_max[threadIdx.x] = 0ull;
  __syncthreads();
  // The chosen channels' words and ranges of the CTA's pages: channel c of kv head h is the run
  // [h][c][page] of words (wb bytes) and of ranges (a, b).
  const std::int64_t npool = p.code_pages;
  if (wb % 4 == 0) {  // P >= 16: whole 32-bit words (the copy is 4-byte aligned)
    const int w4 = wb / 4, per_k = n * w4;
    for (int idx = threadIdx.x; idx < r * per_k; idx += blockDim.x) {
      const int k = idx / per_k, t = (idx % per_k) / w4, e = idx % w4;
      const int phys = s_phys[t];
      std::uint32_t v = 0u;
      if (phys >= 0) {
        const std::uint8_t* at =
            p.chan_codes + ((static_cast<std::int64_t>(h) * kD + s_ch[k]) * npool + phys) * wb;
        v = reinterpret_cast<const std::uint32_t*>(at)[e];
      }
      s_w[k][t * w4 + e] = v;
    }
  } else {
    const int per_k = n * wb;
    for (int idx = threadIdx.x; idx < r * per_k; idx += blockDim.x) {
      const int k = idx / per_k, t = (idx % per_k) / wb, e = idx % wb;
      const int phys = s_phys[t];
      std::uint8_t v = 0;
      if (phys >= 0)
        v = p.chan_codes[((static_cast<std::int64_t>(h) * kD + s_ch[k]) * npool + phys) * wb + e];
      reinterpret_cast<std::uint8_t*>(s_w[k])[t * wb + e] = v;
    }
  }
  for (int idx = threadIdx.x; idx < r * n; idx += blockDim.x) {
    const int k = idx / n, t = idx % n;
    const int phys = s_phys[t];
    std::uint16_t v = 0;
    if (phys >= 0)
      v = reinterpret_cast<const std::uint16_t*>(
          p.chan_ranges)[(static_cast<std::int64_t>(h) * kD + s_ch[k]) * npool + phys];
    s_rg[k][t] = v;
  }
  // Per page and head lo · Q (Q over the chosen channels); per page step / 3.
  for (int idx = threadIdx.x; idx < n * g; idx += blockDim.x) {
    const int t = idx / g, i = idx % g;
    const int phys = s_phys[t];
    float lo = 0.f, step = 0.f;
    if (phys >= 0) {
      const std::int64_t ph = static_cast<std::int64_t>(phys) * p.Hkv + h;
      lo = p.rgrid[2 * ph];
      step = p.rgrid[2 * ph + 1];
    }
    s_base[t][i] = __dmul_rn(static_cast<double>(lo), static_cast<double>(p.q1[seg0 + i]));
    if (i == 0) s_third[t] = __ddiv_rn(static_cast<double>(step), 3.0);
  }
  __syncthreads();
  const int j = threadIdx.x, t = j / P, slot = j % P;
  const bool mine = j < n * P;
  const int phys = mine ? s_phys[t] : -1;
  int I[kMaxG];
#pragma unroll
  for (int i = 0; i < kMaxG; ++i) I[i] = 0;
  if (phys >= 0) {
    const std::uint8_t* bytes = reinterpret_cast<const std::uint8_t*>(&s_w[0][0]);
    const int byte_at = t * wb + (slot >> 2), shift = 2 * (slot & 3);
    for (int k = 0; k < r; ++k) {
      const int code = (bytes[k * kWordBytes + byte_at] >> shift) & 3;
      const unsigned rg = s_rg[k][t];
      const int a = static_cast<int>(rg & 255u), bb = static_cast<int>(rg >> 8);
      const int v = 3 * a + code * (bb - a);  // the decoded level on the grid's thirds
#pragma unroll
      for (int i = 0; i < kMaxG; ++i)
        if (i < g) I[i] += s_qk[k][i] * v;
    }
  }
  const std::int64_t token =
      mine ? static_cast<std::int64_t>(p.cand[pair * p.cand_max + c0 + t]) * P + slot : -1;
  const bool ranked = mine && phys >= 0 && token < s.L;  // the kept tokens too: in the LSE
  const std::int64_t pos = static_cast<std::int64_t>(c0) * P + j;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kMaxG; ++i) {
    if (i >= g) break;
    unsigned long long key = 0ull;
    if (ranked) {
      // kv::code_score: unit · (lo · Q + (step / 3) · I), each operation rounded once.
      const double score = __dmul_rn(
          s_unit[i],
          __dadd_rn(s_base[t][i], __dmul_rn(s_third[t], static_cast<double>(I[i]))));
      key = ordered_key64(score);
    }
    if (mine) p.keys2[(seg0 + i) * p.kmax + pos] = key;
    unsigned long long m = key;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0 && m != 0ull) atomicMax(&s_max[i], m);
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < g && s_max[threadIdx.x] != 0ull)
    atomicMax(&p.lmax[seg0 + threadIdx.x], s_max[threadIdx.x]);
}

// ---- 3. a group whose cut bin overflows: the best `need` pooled keys as a set ----------------

__global__ void __launch_bounds__(kRankThreads) set_rank_kernel(Params p) {
  __shared__ int s_hist[256];
  __shared__ int s_warp[32];
  __shared__ RadixState s_radix;
  __shared__ int s_n;
  const int seg = blockIdx.x;
  if ((seg % p.Hq) % p.g != 0 || p.thresh[seg] != 0ull) return;  // ranked by the bins
  const int b = seg / p.Hq, h = (seg % p.Hq) / p.g;
  const Plan s = plan_of(p, b, false);
  const int hi = stage2_items(p, s, b, h);
  const int depth = max(0, min(s.need, p.depth2));
  const unsigned long long* keys = p.keys2 + static_cast<std::int64_t>(seg) * p.kmax;
  std::int32_t* list = p.list2 + static_cast<std::int64_t>(seg) * p.depth2;
  int mine = 0;
  for (int i = threadIdx.x; i < hi; i += blockDim.x) mine += keys[i] != 0ull ? 1 : 0;
  int valid = 0;
  block_exclusive_scan(mine, s_warp, &valid);
  const bool all = valid <= depth;
  radix_select<64>([&](int i) { return keys[i]; }, 0, hi, all ? 0 : depth, s_hist, s_radix);
  const unsigned long long T = s_radix.prefix;
  const int need_eq = s_radix.remaining;
  if (threadIdx.x == 0) s_n = 0;
  __syncthreads();
  // Those above T and the first need_eq equal to T in token order (a scan per round).
  int eq_base = 0;
  for (int i0 = 0; i0 < hi && depth > 0; i0 += blockDim.x) {
    const int i = i0 + threadIdx.x;
    const unsigned long long k = i < hi ? keys[i] : 0ull;
    const bool eq = !all && k != 0ull && k == T;
    int eq_total = 0;
    const int eq_before = block_exclusive_scan(eq ? 1 : 0, s_warp, &eq_total);
    const bool take = k != 0ull && (all || k > T || (eq && eq_base + eq_before < need_eq));
    if (take) list[atomicAdd(&s_n, 1)] = i;
    eq_base += eq_total;
  }
  __syncthreads();
  if (threadIdx.x == 0) p.len2[seg] = min(s_n, depth);
}

// ---- 4. the candidates -------------------------------------------------------------------------

// Bits of the tokens [lo, hi) within the word of tokens [t0, t0 + 32).
__device__ __forceinline__ unsigned range_bits(std::int64_t t0, std::int64_t lo, std::int64_t hi) {
  const std::int64_t a = max(lo, t0), e = min(hi, t0 + 32);
  if (a >= e) return 0u;
  const int n = static_cast<int>(e - a), sh = static_cast<int>(a - t0);
  return (n == 32 ? 0xffffffffu : ((1u << n) - 1u)) << sh;
}

__global__ void __launch_bounds__(kThreads) cand_kernel(Params p) {
  __shared__ int s_warp[32];
  const int b = blockIdx.x / p.Hkv, h = blockIdx.x % p.Hkv, P = p.P;
  const std::int64_t pair = blockIdx.x;
  const Plan s = plan_of(p, b, false);
  unsigned* mask = p.cmask + pair * p.mask_words;
  std::int32_t* cand = p.cand + pair * p.cand_max;
  if (s.bad || s.pages == 0) {  // the whole CTA
    if (threadIdx.x == 0) p.n_cand[pair] = 0;
    return;
  }
  const int words = static_cast<int>((s.L + 31) / 32);
  for (int w = threadIdx.x; w < words; w += blockDim.x) {
    const std::int64_t t0 = static_cast<std::int64_t>(w) * 32;
    mask[w] = range_bits(t0, 0, s.tok_first_end) | range_bits(t0, s.tok_last_begin, s.L);
  }
  __syncthreads();
  // The first pass's choice: positions in its candidate order, which is every page in logical
  // order (all_pages_kernel), so a position is the token itself.
  const std::int64_t seg0 = static_cast<std::int64_t>(b) * p.Hq + h * p.g;
  const int n = p.len2[seg0];
  const std::int32_t* list = p.list2 + seg0 * p.depth2;
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    const int x = list[k];
    atomicOr(&mask[x >> 5], 1u << (x & 31));
  }
  __syncthreads();
  // The pages holding a candidate, ascending (read past L1: the bits were set by atomics).
  int base = 0;
  for (int j0 = 0; j0 < s.pages; j0 += blockDim.x) {
    const int j = j0 + static_cast<int>(threadIdx.x);
    bool has = false;
    if (j < s.pages) {
      const std::int64_t t0 = static_cast<std::int64_t>(j) * P;
      if (P >= 32) {  // whole words (P a power of two)
        const int w1 = static_cast<int>(min((t0 + P) / 32, static_cast<std::int64_t>(words)));
        for (int w = static_cast<int>(t0 / 32); w < w1 && !has; ++w) has = __ldcg(mask + w) != 0u;
      } else {
        has = ((__ldcg(mask + (t0 >> 5)) >> (t0 & 31)) & ((1u << P) - 1u)) != 0u;
      }
    }
    int total = 0;
    const int at = block_exclusive_scan(has ? 1 : 0, s_warp, &total);
    if (has) cand[base + at] = j;
    base += total;
  }
  if (threadIdx.x == 0) p.n_cand[pair] = base;
}

template <class Kernel>
void go(Kernel k, dim3 grid, dim3 block, cudaStream_t st, const Params& p, const char* what) {
  k<<<grid, block, 0, st>>>(p);
  check_cuda(cudaGetLastError(), what);
}

}  // namespace

void launch_first_pass(const Params& p1, int d, int segs, int pairs, cudaStream_t st) {
  const dim3 per_pair(static_cast<unsigned>(pairs));
  if (d == 64) {
    go(chan_kernel<64>, per_pair, dim3(kThreads), st, p1, "token_codes channel kernel");
  } else {
    go(chan_kernel<128>, per_pair, dim3(kThreads), st, p1, "token_codes channel kernel");
  }
  clear_log_prob(p1, segs, st);  // the first pass's max, sum and histogram
  const dim3 grid(static_cast<unsigned>((p1.cand_max + p1.score_pages - 1) / p1.score_pages),
                  static_cast<unsigned>(p1.Hkv), static_cast<unsigned>(p1.B));
  if (d == 64) {
    go(pass1_kernel<64>, grid, dim3(kThreads), st, p1, "token_codes first-pass kernel");
  } else {
    go(pass1_kernel<128>, grid, dim3(kThreads), st, p1, "token_codes first-pass kernel");
  }
  launch_log_prob_pool(p1, segs, pairs, st);
  go(set_rank_kernel, dim3(static_cast<unsigned>(segs)), dim3(kRankThreads), st, p1,
     "token_codes first-pass rank kernel");
  go(cand_kernel, per_pair, dim3(kThreads), st, p1, "token_codes candidate kernel");
}

}  // namespace masskv::cuda::two_stage_impl
