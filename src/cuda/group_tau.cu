// Gaussian-τ from pooled group moments on the GPU (group_tau.cuh). Every f64 operation is the
// CPU's (select/page_moments.cpp, select/gaussian_tau.cpp) in the same order where the order
// is defined: the moments' eight FMA chains and their horizontal sum bit for bit; the solver's
// sums over groups in a tree instead of in group order, so τ̂ agrees with the CPU's to the
// solver's tolerance (1e-10 of max(1, |τ|)), not bit for bit.
#include <algorithm>
#include <cmath>
#include <mutex>

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

// grid (ceil(max_groups * Hq * 8 / threads), B): an octet of lanes per (group gi, q head i),
// octet_moments (one thread per item looping over the channels waited on every load in turn).
template <int kD>
__global__ void __launch_bounds__(kMomentThreads) group_moments_kernel(TauParams p) {
  const int b = blockIdx.y;
  const int ng = seq_groups(p, b);
  const int Hq = p.num_q_heads;
  const int idx = (blockIdx.x * kMomentThreads + threadIdx.x) / 8, l = threadIdx.x % 8;
  const int gi = idx / Hq, i = idx % Hq;
  // Whole octets leave together (the shuffles below need all eight lanes).
  if (ng < 0 || gi >= ng) return;
  double* out = p.mv + ((static_cast<std::int64_t>(b) * Hq + i) * p.max_groups + gi) * 2;
  const int slot = p.indices[p.indptr[b] + gi];
  const bool ok = slot >= 0 && slot < p.slots;
  if (!ok && l == 0) atomicOr(p.err, p.bad_slot);
  const int h = i / (Hq / p.num_kv_heads);
  const std::int64_t row = (static_cast<std::int64_t>(ok ? slot : 0) * p.num_kv_heads + h) * kD;
  double m, v;
  octet_moments<kD>(p.mean + row, p.m2 + row, p.q + b * p.q_s0 + i * p.q_s1,
                    ok ? static_cast<double>(p.count[slot]) : 0.0, p.scale, m, v);
  if (l != 0) return;
  out[0] = ok ? m : 0.0;
  out[1] = ok ? v : 0.0;
}

// Block-wide sums of two values (fixed tree: the result does not depend on timing); every
// thread gets them. One warp: shuffles only; more: one pair of barriers.
__device__ void block_sum2(double& x, double& y, double2* s_red) {
  for (int o = 16; o > 0; o >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, o);
    y += __shfl_xor_sync(0xffffffffu, y, o);
  }
  const int warps = blockDim.x / 32;
  if (warps == 1) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // s_red's last use is over
  if (lane == 0) s_red[warp] = make_double2(x, y);
  __syncthreads();
  x = y = 0;
  for (int w = 0; w < warps; ++w) {
    x += s_red[w].x;
    y += s_red[w].y;
  }
}
__device__ double block_max(double x, double2* s_red) {
  for (int o = 16; o > 0; o >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // also orders the staging before it for one warp
  if (warps == 1) return x;
  if (lane == 0) s_red[warp].x = x;
  __syncthreads();
  double t = s_red[0].x;
  for (int w = 1; w < warps; ++w) t = fmax(t, s_red[w].x);
  return t;
}

// One group of the model: Y ~ N(a, sd²) with weight n (n = 0: not in the model).
template <class T>
struct Item {
  T a, sd, n;
};

// n E[(Y - x)_+^r] and its derivative in x, added to f and df (GaussianPages::evaluate's
// terms: closed forms, r = 2 for alpha 1.5 (quad) and r = 1 for alpha 2; sd = 0: a point).
template <class T>
__device__ __forceinline__ void add_term(const Item<T>& it, T x, bool quad, T& f, T& df) {
  if (!(it.n > 0)) return;
  const T dd = it.a - x;
  if (it.sd > 0) {
    const T t = dd / it.sd;
    T P, ph;
    if constexpr (sizeof(T) == 4) {
      P = 0.5f * erfcf(-t * static_cast<float>(kInvSqrt2));
      ph = static_cast<float>(kInvSqrt2Pi) * expf(-0.5f * t * t);
    } else {
      P = 0.5 * erfc(-t * kInvSqrt2);
      ph = kInvSqrt2Pi * exp(-0.5 * t * t);
    }
    const T first = dd * P + it.sd * ph;
    if (quad) {
      f += it.n * ((dd * dd + it.sd * it.sd) * P + dd * it.sd * ph);
      df -= it.n * T(2) * first;
    } else {
      f += it.n * first;
      df -= it.n * P;
    }
  } else if (dd > 0) {
    f += it.n * (quad ? dd * dd : dd);
    df -= it.n * (quad ? T(2) * dd : T(1));
  }
}

// grid (Hq, B): GaussianPages::assign + solve for q head blockIdx.x of sequence blockIdx.y.
// Groups are (a, b, n) = ((α-1) m, (α-1) sqrt(v), count), only those with n > 0; b == 0 is a
// point mass. The first kSolveCache groups are staged in shared memory (f64 and f32 copies);
// the rest, if any, are re-read every evaluation.
//
// Two phases. f32 evaluations (erfcf, expf; sums in f64) run the Newton iteration until the
// step is below 1e-5 of max(1, |x|): an f64 evaluation costs ~16x (the SM's f64 rate and the
// f64 erfc), and most steps only need the direction. Then f64 evaluations from that point, in
// the original bracket, to GaussianPages::solve's tolerance (1e-10): Newton on the convex,
// decreasing h converges to the root from either side (a step from the right lands left of
// it), so the f32 phase's result is only a starting point and τ̂ has the CPU's precision.
constexpr int kSolveCache = 2048;
__global__ void __launch_bounds__(kSolveThreads) tau_solve_kernel(TauParams p, int cache) {
  extern __shared__ double2 s_dyn[];
  __shared__ double2 s_red[kSolveThreads / 32];
  Item<double>* s_item = reinterpret_cast<Item<double>*>(s_dyn);
  Item<float>* s_itemf = reinterpret_cast<Item<float>*>(s_item + cache);
  const int i = blockIdx.x, b = blockIdx.y, Hq = p.num_q_heads;
  const int ng = seq_groups(p, b);
  double* tau = p.tau + static_cast<std::int64_t>(b) * Hq + i;
  if (ng < 0) {
    if (threadIdx.x == 0) *tau = NAN;  // the moments kernel does not read tau
    // Every exit waits: this grid must not complete before its predecessor (a later launch
    // relies on both being done).
    wait_for_predecessor();
    return;
  }
  wait_for_predecessor();  // the moments
  const double* mv = p.mv + (static_cast<std::int64_t>(b) * Hq + i) * p.max_groups * 2;
  const double am1 = p.alpha - 1.0, r = 1.0 / am1;
  const bool quad = p.alpha == 1.5;  // else alpha == 2
  const auto load = [&](int gi) {
    const int slot = p.indices[p.indptr[b] + gi];
    const double v = mv[2 * gi + 1];
    return Item<double>{am1 * mv[2 * gi], am1 * sqrt(v > 0 ? v : 0.0),
                        slot >= 0 && slot < p.slots ? static_cast<double>(p.count[slot]) : 0.0};
  };
  const int cached = min(ng, cache);
  double lo = -INFINITY, hi = -INFINITY;
  for (int gi = threadIdx.x; gi < ng; gi += blockDim.x) {
    const Item<double> it = load(gi);
    if (gi < cached) {
      s_item[gi] = it;
      s_itemf[gi] = {static_cast<float>(it.a), static_cast<float>(it.sd), static_cast<float>(it.n)};
    }
    if (!(it.n > 0)) continue;
    lo = fmax(lo, it.a - 1.0);
    hi = fmax(hi, it.a + 40.0 * it.sd + 1.0);
  }
  lo = block_max(lo, s_red);  // also the barrier after the staging
  hi = block_max(hi, s_red);
  if (!isfinite(lo) || !isfinite(hi)) {  // no tokens, or non-finite moments
    if (threadIdx.x == 0) *tau = NAN;
    return;
  }
  const double lo0 = lo, hi0 = hi;
  // f, df at x: f32 terms summed per thread in f32, then in f64 across threads; or all f64.
  const auto evaluate = [&](double x, bool f64, double& f, double& df) {
    f = df = 0;
    if (f64) {
      for (int gi = threadIdx.x; gi < ng; gi += blockDim.x)
        add_term(gi < cached ? s_item[gi] : load(gi), x, quad, f, df);
    } else {
      float ff = 0.f, dff = 0.f;
      const float xf = static_cast<float>(x);
      for (int gi = threadIdx.x; gi < ng; gi += blockDim.x) {
        Item<float> it;
        if (gi < cached) {
          it = s_itemf[gi];
        } else {
          const Item<double> d = load(gi);
          it = {static_cast<float>(d.a), static_cast<float>(d.sd), static_cast<float>(d.n)};
        }
        add_term(it, xf, quad, ff, dff);
      }
      f = ff;
      df = dff;
    }
    block_sum2(f, df, s_red);
  };
  double x = lo;
  for (int phase = 0; phase < 2; ++phase) {
    const bool f64 = phase == 1;
    const double rel = f64 ? 1e-10 : 1e-5;
    const auto tol = [rel](double at) { return rel * fmax(1.0, fabs(at)); };
    if (f64) {
      lo = lo0;
      hi = hi0;
    }
    // Every thread holds the same f, df, x, lo, hi: the steps below agree without a broadcast.
    for (int it = 0; it < 200; ++it) {
      double f, df;
      evaluate(x, f64, f, df);
      if (f >= 1.0) {
        lo = x;
      } else {
        hi = x;
      }
      if (f == 1.0) break;
      double step = NAN;
      if (f > 0 && df < 0) {
        const double hh = quad ? sqrt(f) : f;  // f^(1/r), r = 2 or 1
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
  }
  if (threadIdx.x == 0) *tau = x;
}

// grid (groups or 1, kv heads, batch), blockDim = head_dim (<= 256): thread c pools channel c
// of one group as MomentStore's constructor does (N = Σ max(0, n_j); mean = Σ n_j μ_j / N;
// M2 = Σ (max(0, M2_j) + (n_j dev) dev), dev = μ_j - mean; every operation rounded on its own:
// the CPU code is compiled without FMA).
__global__ void moment_update_kernel(MomentUpdateParams p) {
  const int h = blockIdx.y, b = blockIdx.z, c = threadIdx.x;
  const int begin = p.indptr[b], end = p.indptr[b + 1];
  const int gbegin = p.mindptr[b], gend = p.mindptr[b + 1];
  const int n = end - begin;
  const int ng = (n + p.group_pages - 1) / p.group_pages;
  if (n < 0 || begin < 0 || end > p.nnz || gbegin < 0 || gend > p.mnnz || gend - gbegin != ng) {
    if (c == 0 && blockIdx.x == 0 && h == 0) atomicOr(p.err, p.bad_indptr);
    return;
  }
  const int gi = p.last_only ? ng - 1 : static_cast<int>(blockIdx.x);
  if (gi < 0 || gi >= ng) return;
  const int slot = p.mindices[gbegin + gi];
  if (slot < 0 || slot >= p.slots) {
    if (c == 0) atomicOr(p.err, p.bad_slot);
    return;
  }
  const int j0 = gi * p.group_pages, j1 = min(n, j0 + p.group_pages);
  long total = 0;
  for (int j = j0; j < j1; ++j) {
    const int phys = p.indices[begin + j];
    if (phys < 0 || phys >= p.pool_pages) {
      if (c == 0) atomicOr(p.err, p.bad_page);
      return;
    }
    total += max(0, p.count[phys]);
  }
  const std::int64_t go = (static_cast<std::int64_t>(slot) * p.num_kv_heads + h) * p.head_dim + c;
  if (c == 0 && h == 0) p.gcount[slot] = static_cast<std::int32_t>(total);
  if (total == 0) {
    p.gmean[go] = 0.f;
    p.gm2[go] = 0.f;
    return;
  }
  const auto at = [&](int j) {
    return (static_cast<std::int64_t>(p.indices[begin + j]) * p.num_kv_heads + h) * p.head_dim + c;
  };
  double mu = 0;
  for (int j = j0; j < j1; ++j) {
    const double nj = max(0, p.count[p.indices[begin + j]]);
    if (nj > 0) mu = __dadd_rn(mu, __dmul_rn(nj, static_cast<double>(p.mean[at(j)])));
  }
  mu = __ddiv_rn(mu, static_cast<double>(total));
  double m2 = 0;
  for (int j = j0; j < j1; ++j) {
    const double nj = max(0, p.count[p.indices[begin + j]]);
    if (nj == 0) continue;
    const double dev = __dsub_rn(static_cast<double>(p.mean[at(j)]), mu);
    const double s = static_cast<double>(p.m2[at(j)]);
    m2 = __dadd_rn(m2, __dadd_rn(s > 0.0 ? s : 0.0, __dmul_rn(__dmul_rn(nj, dev), dev)));
  }
  p.gmean[go] = __double2float_rn(mu);
  p.gm2[go] = __double2float_rn(m2);
}

}  // namespace

void launch_moment_update(const MomentUpdateParams& p, int batch, int max_groups,
                          cudaStream_t stream) {
  if (batch == 0) return;
  const int groups = p.last_only ? 1 : std::max(1, max_groups);
  moment_update_kernel<<<dim3(groups, p.num_kv_heads, batch), p.head_dim, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "moment update kernel launch");
}

void launch_group_moments(const TauParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  const long lanes = static_cast<long>(p.max_groups) * p.num_q_heads * 8;
  const dim3 mgrid(static_cast<unsigned>((lanes + kMomentThreads - 1) / kMomentThreads),
                   static_cast<unsigned>(p.batch));
  switch (p.head_dim) {
    case 64:
      group_moments_kernel<64><<<mgrid, kMomentThreads, 0, stream>>>(p);
      break;
    case 128:
      group_moments_kernel<128><<<mgrid, kMomentThreads, 0, stream>>>(p);
      break;
    default:
      group_moments_kernel<256><<<mgrid, kMomentThreads, 0, stream>>>(p);
      break;
  }
  check_cuda(cudaGetLastError(), "group moments kernel launch");
}

void launch_group_tau(const TauParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  launch_group_moments(p, stream);
  const int cache = std::min(p.max_groups, kSolveCache);
  const std::size_t smem = static_cast<std::size_t>(cache) * (sizeof(Item<double>) + sizeof(Item<float>));
  static std::once_flag once;
  std::call_once(once, [] {
    set_dynamic_smem(tau_solve_kernel, kSolveCache * (sizeof(Item<double>) + sizeof(Item<float>)),
                     "the tau solve kernel");
  });
  // Warps by groups (one group a lane, at most 8 warps): the solve is latency-bound
  // (docs/gpu-results.md, tuning notes), so the evaluations are spread over as many lanes as
  // there are groups; the cost is a pair of barriers per evaluation.
  const int warps = std::clamp((p.max_groups + 31) / 32, 1, kSolveThreads / 32);
  PdlLaunch l(stream, dim3(p.num_q_heads, p.batch), dim3(32 * warps), smem);
  check_cuda(cudaLaunchKernelEx(&l.cfg, tau_solve_kernel, p, cache), "tau solve kernel launch");
}

}  // namespace masskv::cuda::detail
