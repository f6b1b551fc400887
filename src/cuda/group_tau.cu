// Gaussian-τ from pooled group moments on the GPU (group_tau.cuh). Every f64 operation is the
// CPU's (select/page_moments.cpp, select/gaussian_tau.cpp) in the same order where the order
// is defined: the moments' eight FMA chains and their horizontal sum bit for bit; the solver's
// sums over groups in a tree instead of in group order, so τ̂ agrees with the CPU's to the
// solver's tolerance (1e-10 of max(1, |τ|)), not bit for bit.
#include <cmath>

#include "device.cuh"
#include "group_tau.cuh"

namespace masskv::cuda::detail {
namespace {

constexpr int kMomentThreads = 128;
constexpr int kSolveThreads = 256;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// Sequence b's group count, checked (flags and returns -1 when bad).
__device__ int seq_groups(const TauParams& p, int b) {
  const int begin = p.indptr[b], end = p.indptr[b + 1];
  if (end < begin || begin < 0 || end > p.nnz || end - begin > p.max_groups) {
    atomicOr(p.err, p.bad_indptr);
    return -1;
  }
  return end - begin;
}

// grid (ceil(max_groups * Hq / threads), B): thread -> (group gi, q head i). m and v as
// all_page_moments: m = scale Σ_c q_c μ_c, v = scale² Σ_c q_c² max(M2_c, 0) / n, eight chains.
__global__ void __launch_bounds__(kMomentThreads) group_moments_kernel(TauParams p) {
  const int b = blockIdx.y;
  const int ng = seq_groups(p, b);
  const int Hq = p.num_q_heads, d = p.head_dim;
  const int idx = blockIdx.x * kMomentThreads + threadIdx.x;
  const int gi = idx / Hq, i = idx % Hq;
  if (ng < 0 || gi >= ng) return;
  double* out = p.mv + ((static_cast<std::int64_t>(b) * Hq + i) * p.max_groups + gi) * 2;
  const int slot = p.indices[p.indptr[b] + gi];
  if (slot < 0 || slot >= p.slots) {
    atomicOr(p.err, p.bad_slot);
    out[0] = out[1] = 0.0;
    return;
  }
  const int h = i / (Hq / p.num_kv_heads);
  const std::int64_t row = (static_cast<std::int64_t>(slot) * p.num_kv_heads + h) * d;
  const float* q = p.q + b * p.q_s0 + i * p.q_s1;
  double lm[8] = {}, lv[8] = {};
  for (int c0 = 0; c0 < d; c0 += 8) {
    const float4 mu0 = *reinterpret_cast<const float4*>(p.mean + row + c0);
    const float4 mu1 = *reinterpret_cast<const float4*>(p.mean + row + c0 + 4);
    const float4 s0 = *reinterpret_cast<const float4*>(p.m2 + row + c0);
    const float4 s1 = *reinterpret_cast<const float4*>(p.m2 + row + c0 + 4);
    const float mu[8] = {mu0.x, mu0.y, mu0.z, mu0.w, mu1.x, mu1.y, mu1.z, mu1.w};
    const float s2[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int l = 0; l < 8; ++l) {
      const double x = q[c0 + l];
      const double m2 = s2[l];
      lm[l] = __fma_rn(x, static_cast<double>(mu[l]), lm[l]);
      lv[l] = __fma_rn(__dmul_rn(x, x), m2 > 0 ? m2 : 0.0, lv[l]);
    }
  }
  const auto hsum = [](const double (&v)[8]) {
    return __dadd_rn(__dadd_rn(__dadd_rn(v[0], v[4]), __dadd_rn(v[2], v[6])),
                     __dadd_rn(__dadd_rn(v[1], v[5]), __dadd_rn(v[3], v[7])));
  };
  const double sm = hsum(lm), sv = hsum(lv);
  const double c = p.count[slot];
  out[0] = __dmul_rn(p.scale, sm);
  out[1] = c > 0 ? __dmul_rn(__dmul_rn(p.scale, p.scale), __ddiv_rn(sv, c)) : 0.0;
}

// Block-wide sum (fixed tree: the result does not depend on timing); every thread gets it.
__device__ double block_sum(double x, double* s_red) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // s_red's last use is over
  if (lane == 0) s_red[warp] = x;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < kSolveThreads / 32; ++w) t += s_red[w];
  return t;
}
__device__ double block_max(double x, double* s_red) {
  for (int o = 16; o > 0; o >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) s_red[warp] = x;
  __syncthreads();
  double t = s_red[0];
  for (int w = 1; w < kSolveThreads / 32; ++w) t = fmax(t, s_red[w]);
  return t;
}

// grid (Hq, B): GaussianPages::assign + solve for q head blockIdx.x of sequence blockIdx.y.
// Groups are (a, b, n) = ((α-1) m, (α-1) sqrt(v), count), only those with n > 0; b == 0 is a
// point mass.
__global__ void __launch_bounds__(kSolveThreads) tau_solve_kernel(TauParams p) {
  __shared__ double s_red[kSolveThreads / 32];
  const int i = blockIdx.x, b = blockIdx.y, Hq = p.num_q_heads;
  const int ng = seq_groups(p, b);
  double* tau = p.tau + static_cast<std::int64_t>(b) * Hq + i;
  if (ng < 0) {
    if (threadIdx.x == 0) *tau = NAN;
    return;
  }
  const double* mv = p.mv + (static_cast<std::int64_t>(b) * Hq + i) * p.max_groups * 2;
  const double am1 = p.alpha - 1.0, r = 1.0 / am1;
  const bool quad = p.alpha == 1.5;  // else alpha == 2
  const auto item = [&](int gi, double& a, double& sd, double& n) {
    const int slot = p.indices[p.indptr[b] + gi];
    n = slot >= 0 && slot < p.slots ? static_cast<double>(p.count[slot]) : 0.0;
    a = am1 * mv[2 * gi];
    const double v = mv[2 * gi + 1];
    sd = am1 * sqrt(v > 0 ? v : 0.0);
  };
  double lo = -INFINITY, hi = -INFINITY;
  for (int gi = threadIdx.x; gi < ng; gi += kSolveThreads) {
    double a, sd, n;
    item(gi, a, sd, n);
    if (!(n > 0)) continue;
    lo = fmax(lo, a - 1.0);
    hi = fmax(hi, a + 40.0 * sd + 1.0);
  }
  lo = block_max(lo, s_red);
  hi = block_max(hi, s_red);
  if (!isfinite(lo) || !isfinite(hi)) {  // no tokens, or non-finite moments
    if (threadIdx.x == 0) *tau = NAN;
    return;
  }
  const auto tol = [](double at) { return 1e-10 * fmax(1.0, fabs(at)); };
  double x = lo;
  for (int it = 0; it < 200; ++it) {
    double f = 0, df = 0;
    for (int gi = threadIdx.x; gi < ng; gi += kSolveThreads) {
      double a, sd, n;
      item(gi, a, sd, n);
      if (!(n > 0)) continue;
      const double dd = a - x;
      if (sd > 0) {
        const double t = dd / sd;
        const double P = 0.5 * erfc(-t * kInvSqrt2), ph = kInvSqrt2Pi * exp(-0.5 * t * t);
        const double first = dd * P + sd * ph;
        if (quad) {
          f += n * ((dd * dd + sd * sd) * P + dd * sd * ph);
          df -= n * 2.0 * first;
        } else {
          f += n * first;
          df -= n * P;
        }
      } else if (dd > 0) {
        f += n * (quad ? dd * dd : dd);
        df -= n * r * (quad ? dd : 1.0);
      }
    }
    f = block_sum(f, s_red);
    df = block_sum(df, s_red);
    // Every thread holds the same f, df, x, lo, hi: the steps below agree without a broadcast.
    if (f >= 1.0) {
      lo = x;
    } else {
      hi = x;
    }
    if (f == 1.0) break;
    double step = NAN;
    if (f > 0 && df < 0) {
      const double hh = r == 1.0 ? f : pow(f, 1.0 / r);
      step = -(hh - 1.0) / (hh / (r * f) * df);
    }
    if (fabs(step) <= tol(x)) {
      x += step;
      break;
    }
    double next = x + step;
    if (!(next > lo && next < hi)) next = 0.5 * (lo + hi);
    if (hi - lo <= tol(lo)) {
      x = next;
      break;
    }
    x = next;
    if (it == 199) x = 0.5 * (lo + hi);
  }
  if (threadIdx.x == 0) *tau = x;
}

}  // namespace

void launch_group_tau(const TauParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  const long pairs = static_cast<long>(p.max_groups) * p.num_q_heads;
  const dim3 mgrid(static_cast<unsigned>((pairs + kMomentThreads - 1) / kMomentThreads),
                   static_cast<unsigned>(p.batch));
  group_moments_kernel<<<mgrid, kMomentThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "group moments kernel launch");
  tau_solve_kernel<<<dim3(p.num_q_heads, p.batch), kSolveThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "tau solve kernel launch");
}

}  // namespace masskv::cuda::detail
