// The Gaussian-τ estimate of the entmax threshold on the GPU (docs/design.md §2.4), from pooled
// group moments (select::MomentStore's arrays): the device twin of select::group_tau_hat, used
// by hier_select's entmax-aware ranking. Two kernels: group_moments_kernel (m, v of every
// (moment group, q head), select::detail::all_page_moments' arithmetic in f64) and
// tau_solve_kernel (one CTA per (sequence, q head): GaussianPages::solve's Newton iteration,
// f64, the closed forms of alpha 1.5 and 2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace masskv::cuda::detail {

struct TauParams {
  const float* q;
  std::int64_t q_s0, q_s1;
  int batch, num_q_heads, num_kv_heads, head_dim;
  // Moment store [slot][kv head][d] f32 mean and M2, count per slot; the group table.
  const float* mean;
  const float* m2;
  const std::int32_t* count;
  int slots;
  const std::int32_t* indptr;  // [B + 1] of groups
  const std::int32_t* indices;  // slots
  int nnz;
  int max_groups;  // groups per sequence the workspace holds (longer: flagged)
  double scale, alpha;
  double* mv;   // workspace [B][Hq][max_groups][2]: m, v
  double* tau;  // [B][Hq]: τ̂ (NaN for a sequence without tokens)
  unsigned* err;
  unsigned bad_slot, bad_indptr;  // the caller's error bits
};

// select::MomentStore's pooling on the device (cuda::update_moments): every group of every
// sequence, or each sequence's last group; same f64 operations in the same order, so the f32
// results have the CPU's bits.
struct MomentUpdateParams {
  const std::int32_t *indptr, *indices, *mindptr, *mindices;
  const float *mean, *m2;     // page summaries [page][kv head][d]
  const std::int32_t* count;  // [page]
  float *gmean, *gm2;         // moment store [slot][kv head][d]
  std::int32_t* gcount;       // [slot]
  int pool_pages, slots, num_kv_heads, head_dim, group_pages, nnz, mnnz;
  bool last_only;
  unsigned* err;
  unsigned bad_page, bad_slot, bad_indptr;
};
void launch_moment_update(const MomentUpdateParams& p, int batch, int max_groups,
                          cudaStream_t stream);

// Both kernels on `stream`; alpha must be 1.5 or 2 and head_dim 64, 128 or 256 (host-checked).
void launch_group_tau(const TauParams& p, cudaStream_t stream);
// The moments kernel alone (mv of every (group, q head); the top-p selection's normaliser).
void launch_group_moments(const TauParams& p, cudaStream_t stream);

#ifdef __CUDACC__
// §2.4 m and v of one summary row (mean, M2 of kD channels, count c) for q, by the 8 lanes of an
// aligned octet (lane l = threadIdx.x % 8: the FMA chain of channels ≡ l mod 8, as
// select::detail::all_page_moments; its loads independent), then the horizontal sum
// ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) by three shuffles: every lane of the octet gets
// m = scale Σ q_c μ_c and v = scale² Σ q_c² max(M2_c, 0) / c (0 when c <= 0), the CPU's bits.
// Lanes of other octets may have left.
template <int kD>
__device__ __forceinline__ void octet_moments(const float* mean, const float* m2, const float* q,
                                              double count, double scale, double& m, double& v) {
  const int l = threadIdx.x % 8;
  float mu[kD / 8], s2[kD / 8], qc[kD / 8];
#pragma unroll
  for (int k = 0; k < kD / 8; ++k) {
    mu[k] = mean[8 * k + l];
    s2[k] = m2[8 * k + l];
    qc[k] = q[8 * k + l];
  }
  double lm = 0, lv = 0;
#pragma unroll
  for (int k = 0; k < kD / 8; ++k) {
    const double x = qc[k], y = s2[k];
    lm = __fma_rn(x, static_cast<double>(mu[k]), lm);
    lv = __fma_rn(__dmul_rn(x, x), y > 0 ? y : 0.0, lv);
  }
  const unsigned octet = 0xffu << (threadIdx.x % 32 & ~7u);
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) {
    lm = __dadd_rn(lm, __shfl_xor_sync(octet, lm, o));
    lv = __dadd_rn(lv, __shfl_xor_sync(octet, lv, o));
  }
  m = __dmul_rn(scale, lm);
  v = count > 0 ? __dmul_rn(__dmul_rn(scale, scale), __ddiv_rn(lv, count)) : 0.0;
}
#endif

}  // namespace masskv::cuda::detail
