// The two-stage / token_codes kernels' shared parameters and per-sequence plan (two_stage.cu,
// two_stage_pool.cu): one definition of the launch's device pointers, the counts each
// sequence's list needs (the CPU rule's, select/kept.hpp) and the ordered score keys.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "select/kept.hpp"

namespace masskv::cuda::two_stage_impl {

constexpr int kMaxG = 8;          // q heads per kv head
constexpr int kMaxDepth = 8192;   // ranked items per (q head, stage)
constexpr int kRankThreads = 1024;
constexpr int kTilePages = 32;    // bounds_kernel: pages per CTA
constexpr int kScorePages = 16;   // score_kernel: candidate pages per CTA, at most
constexpr int kThreads = 256;
constexpr int kMaxBitmapBytes = 224 * 1024;  // the merge kernels' bitmap (Hopper: 227 KB a CTA)
constexpr int kSampleMax = 8192;    // stage 2: keys sampled per segment for its threshold
constexpr int kCompactCap = 16384;  // stage 2: keys at or above the threshold ranked in smem
                                    // (at most: Params::compact_cap, compact_cap_of)
constexpr int kBins = 2048;         // log_prob: histogram bins of the pooled log-probabilities,
constexpr int kBinsPerNat = 32;     // 1/32 nat each from 0 down (the last: everything below)

enum ErrBit : unsigned {
  kBadPhysical = 1u,
  kBadIndptr = 2u,
  kBadLastLen = 4u,
  kBadCapacity = 8u,
};

struct Params {
  const float* q;
  std::int64_t q_s0, q_s1;
  const std::int32_t* indptr;
  const std::int32_t* indices;
  const std::int32_t* last_len;
  int B, Hq, Hkv, g, P;
  const std::uint16_t* bmin;  // bf16 bits [page][kv head][d]
  const std::uint16_t* bmax;
  int bound_pages;
  const std::uint8_t* codes;  // [page][kv head][slot][d / 4]
  const std::uint8_t* rmin;   // the codes' ranges: [page][kv head][d] 8-bit codes
  const std::uint8_t* rmax;
  const float* rgrid;         // [page][kv head][2]: lo, step
  int code_pages;
  float scale, slack_f;
  std::int64_t budget;
  int sinks, window, factor;
  int max_pages, cand_max, kmax;
  std::uint32_t* keys1;  // [B * Hq][max_pages]
  std::int32_t* list1;   // [B * Hq][cand_max]
  std::int32_t* len1;    // [B * Hq]
  std::int32_t* cand;    // [B * Hkv][cand_max]
  std::int32_t* n_cand;  // [B * Hkv]
  unsigned long long* keys2;  // [B * Hq][kmax]
  std::int32_t* list2;        // [B * Hq][depth2]
  std::int32_t* len2;         // [B * Hq]
  unsigned long long* thresh;  // [B * Hq]: stage 2's sampled threshold (0: none)
  int* ccount;                 // [B * Hq]: keys at or above it
  unsigned long long* ckeys;   // [B * Hq][kCompactCap]: those keys and their indices
  std::int32_t* cidx;
  int depth2;
  // Keys one CTA ranks in shared memory, 12 bytes each (key, index): kCompactCap where the
  // device leaves the ranking kernel room for them, less on the sm_80 paths (compact_cap_of).
  // Past it the segment is ranked by rank_kernel from all its keys: the lists are the same.
  int compact_cap;
  // GroupRule::log_prob (factor 0 only): every page is scored (the kept tokens too: they are in
  // each head's LSE), the heads' rows pooled into the group's first row, which alone is ranked.
  int log_prob;
  int score_pages;           // score_kernel: pages per CTA (a thread per token)
  int* hist;                 // [B * Hq][kBins]: the pooled keys' log-probability histogram
  int* bins;                 // [B * Hq][3]: its cut bin, the items above it, a counter
  unsigned long long* lmax;  // [B * Hq]: the head's best score as an ordered key (0: none)
  unsigned long long* lsum;  // [B * Hq]: sum of select::lse_term in units of 2^-40
  std::int32_t* out_ids;
  std::int32_t* out_count;
  int max_per_head;
  unsigned* err;
  // token_codes in two passes (two_stage_twopass.cu; select::SelectorConfig::code_channels < 1).
  // pick > 0 marks the first pass's Params: its ranking takes min(L, pick x cap) tokens in all
  // (the kept ones among them), code_candidates of the CPU rule; 0 everywhere else.
  int pick;
  int r;                          // the first pass's channels per kv group
  const std::uint8_t* chan_codes;  // the codes' channel-major copy (kv::PageCodesView)
  const std::uint8_t* chan_ranges;
  // The channels' spread rows [page][Hkv][d] (kv::PageCodesView::chan_spread): the weights are
  // Σ_h |q_hc| times the row of the sequence's last page; null: Σ_h |q_hc| alone.
  const float* chan_spread;
  std::int32_t* ch;        // [B * Hkv][d]: the chosen channels, ascending (r of them)
  int* q8;                 // [B * Hq][d]: each q head's int8 levels (kv::code_query)
  int* q1;                 // [B * Hq]: their sum over the chosen channels (Q of the first pass)
  double* qunit;           // [B * Hq]: max |q| / 127
  // The candidates of the second pass: a bit per token, [B * Hkv][mask_words] (null: one pass,
  // every token of the candidate pages is scored).
  unsigned* cmask;
  int mask_words;
};

// One (sequence)'s shape and the rule's counts (selectors.cpp run_selector / two_stage_group).
struct Plan {
  int pages = 0;
  std::int64_t L = 0;
  std::int64_t tok_first_end = 0, tok_last_begin = 0;  // kept tokens [0, fe) and [lb, L)
  int pg_first_end = 0, pg_last_begin = 0;             // eligible pages [fe, lb)
  int kept_pages = 0;
  std::int64_t count0 = 0;  // kept tokens
  std::int64_t cap = 0;     // tokens of the list
  int m1 = 0;               // candidate pages stage 1 takes
  int need = 0;             // tokens stage 2 takes
  bool bad = false;
};

// The physical page of page-table entry `at`; -1 (kBadPhysical flagged) when it is not a page
// of a pool of `pool` pages.
__device__ inline int checked_phys(const Params& p, int at, int pool) {
  const int id = p.indices[at];
  if (id >= 0 && id < pool) return id;
  atomicOr(p.err, kBadPhysical);
  return -1;
}

__device__ inline Plan plan_of(const Params& p, int b, bool flag) {
  Plan s;
  const int beg = p.indptr[b], end = p.indptr[b + 1];
  const int pages = end - beg;
  if (pages < 0 || pages > p.max_pages) {
    if (flag) atomicOr(p.err, kBadIndptr);
    s.bad = true;
    return s;
  }
  if (pages == 0) return s;
  const int last = p.last_len[b];
  if (last < 1 || last > p.P) {
    if (flag) atomicOr(p.err, kBadLastLen);
    s.bad = true;
    return s;
  }
  s.pages = pages;
  s.L = static_cast<std::int64_t>(pages - 1) * p.P + last;
  const select::KeptRanges<std::int64_t> kt =
      select::kept_tokens(pages, s.L, p.P, p.sinks, p.window);
  s.tok_first_end = kt.first_end;
  s.tok_last_begin = kt.last_begin;
  s.count0 = kt.count(s.L);
  const select::KeptRanges<int> kp = select::kept_pages(pages, s.L, p.P, p.sinks, p.window);
  s.pg_first_end = kp.first_end;
  s.pg_last_begin = kp.last_begin;
  s.kept_pages = kp.count(pages);
  s.cap = min(s.L, max(s.count0, p.budget));
  if (p.factor == 0 && p.log_prob) {
    s.m1 = pages;  // every page: the LSE is over every token
  } else if (p.factor == 0) {
    // token_codes: every page holding a token that is not kept (the window's partial page too).
    const std::int64_t first = s.tok_first_end / p.P;
    const std::int64_t end = (s.tok_last_begin + p.P - 1) / p.P;
    s.m1 = end > first ? static_cast<int>(end - first) : 0;
  } else {
    // The CPU rule's count (select/kept.hpp), so the lists can agree.
    s.m1 = static_cast<int>(
        select::two_stage_candidates(pages, s.kept_pages, s.cap, p.P, p.factor));
  }
  // The first of two passes takes min(L, pick x cap) tokens with the kept ones
  // (select::detail::code_candidate_count): those beyond the kept.
  s.need = p.pick > 0 ? static_cast<int>(max(std::int64_t{0},
                                             min(s.L, static_cast<std::int64_t>(p.pick) * s.cap) -
                                                 s.count0))
                      : static_cast<int>(s.cap - s.count0);
  return s;
}

__device__ __forceinline__ std::uint32_t ordered_key(float x) {
  const std::uint32_t u = __float_as_uint(__fadd_rn(x, 0.0f));  // -0 as +0 (a tie, as the CPU)
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ unsigned long long ordered_key64(double x) {
  const unsigned long long u =
      static_cast<unsigned long long>(__double_as_longlong(__dadd_rn(x, 0.0)));
  return (u >> 63) ? ~u : (u | (1ull << 63));
}
// ordered_key64's inverse (a zero comes back as +0).
__device__ __forceinline__ double key_value64(unsigned long long k) {
  const unsigned long long u = (k >> 63) ? (k & ~(1ull << 63)) : ~k;
  return __longlong_as_double(static_cast<long long>(u));
}

// Stage 2's items of (sequence b, kv head h): the candidate pages' tokens.
__device__ __forceinline__ int stage2_items(const Params& p, const Plan& s, int b, int h) {
  return s.bad ? 0 : p.n_cand[b * p.Hkv + h] * p.P;
}

// The log-prob pooling (two_stage_pool.cu). clear_log_prob before the score kernel (which
// takes each head's max); launch_log_prob_pool after it: each head's LSE, then the group's
// pooled keys into its first head's row of keys2. segs = B * Hq, pairs = B * Hkv.
void clear_log_prob(const Params& p, int segs, cudaStream_t stream);
// The largest power of two <= kCompactCap whose 12-byte entries fit `room` bytes of dynamic
// shared memory (Hopper: kCompactCap; the sm_80 paths' 163 KB: 8192); 1024 at least, which
// set_dynamic_smem then refuses with its own message if even that does not fit.
inline int compact_cap_of(std::size_t room) {
  int cap = kCompactCap;
  while (cap > 1024 && static_cast<std::size_t>(cap) * 12 > room) cap /= 2;
  return cap;
}
// The merge of stage 1 (candidate pages) or 2 (the output list), two_stage_merge.cu: pairs =
// B * Hkv CTAs, smem their bitmap's bytes.
void launch_merge(int stage, const Params& p, int pairs, std::size_t smem, cudaStream_t stream);
// launch_log_prob_pool also ranks: the histogram's cut bin, the items above it into the list,
// the cut bin's items sorted in shared memory (rank_kernel ranks a group where that bin
// overflows Params::compact_cap: thresh 0). Sets the cap itself (p's is the caller's).
void launch_log_prob_pool(const Params& p, int segs, int pairs, cudaStream_t stream);
// token_codes' first pass (two_stage_twopass.cu), after all_pages_kernel with p1 (every page,
// log_prob): the channels, every token's score on them, the log-prob pooling and its best
// p1.pick x cap tokens, then the candidates: p1.cmask (with the kept tokens) and p1.cand /
// n_cand (the pages holding them, ascending) for the second pass. d: 64 or 128.
void launch_first_pass(const Params& p1, int d, int segs, int pairs, cudaStream_t stream);

}  // namespace masskv::cuda::two_stage_impl
