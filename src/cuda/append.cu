// Decode-step append on the GPU (include/masskv/cuda/append.hpp): one CTA per (sequence, kv
// head), one thread per channel; and summarize_pages, the same stores rebuilt from a page's
// stored tokens. The arithmetic mirrors src/kv/cache.cpp (write_token) and
// src/select/page_bound.cpp (BoundStore::round_page) operation by operation, so the results
// are bit-equal to the CPU's: f64 Welford with explicit _rn intrinsics (no FMA contraction),
// the ‖v‖² sum in channel order by one thread, the same rounding helpers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "device.cuh"
#include "group_row.cuh"
#include "kv/page_codes_math.hpp"
#include "masskv/cuda/append.hpp"
#include "masskv/error.hpp"

namespace masskv::cuda {
namespace {

using detail::check_cuda;

enum AppendErr : unsigned {
  kBadPage = 1u, kBadSlot = 2u, kBadK = 4u, kBadV = 8u, kBadTokens = 16u, kBadGroups = 32u
};
constexpr int kMaxDim = 256;

struct Params {
  const float* k;
  const float* v;
  std::int64_t k_s0, k_s1, v_s0, v_s1;
  const std::int32_t* page;
  const std::int32_t* slot;
  void* k_pool;
  void* v_pool;
  std::int64_t stride_page, stride_head, stride_slot;
  int num_pages, num_kv_heads, page_size, head_dim;
  float *mn, *mx, *mean, *m2, *vnorm;
  std::int32_t* count;
  std::uint16_t *bmin, *bmax;
  float* wmax;
  unsigned* err;
  // GroupRefresh (gmn null: none)
  std::uint16_t *gmn, *gmx;
  const std::int32_t *g_indptr, *g_indices, *g_gindptr, *g_gindices;
  int g_slots, g_pages, g_nnz, g_gnnz;
};

// Stored value of x in the cache dtype (round to nearest even, as kv::from_f32) and back.
template <bool kBf16>
__device__ __forceinline__ std::uint16_t store_bits(float x) {
  if constexpr (kBf16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    return __bfloat16_as_ushort(h);
  } else {
    return __half_as_ushort(__float2half_rn(x));
  }
}
template <bool kBf16>
__device__ __forceinline__ float stored_value(std::uint16_t b) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<unsigned>(b) << 16);
  } else {
    return __half2float(__ushort_as_half(b));
  }
}

// dtype.cpp's f32_to_bf16_down: round to nearest, then one ulp toward -inf if that went up.
__device__ __forceinline__ std::uint16_t bf16_down(float f) {
  const std::uint16_t r = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  if (isnan(f) || __uint_as_float(static_cast<unsigned>(r) << 16) <= f) return r;
  if (r == 0) return 0x8001u;
  if (r & 0x8000u) return static_cast<std::uint16_t>(r + 1);
  return static_cast<std::uint16_t>(r - 1);
}
__device__ __forceinline__ std::uint16_t bf16_up(float f) {
  return static_cast<std::uint16_t>(bf16_down(-f) ^ 0x8000u);
}

// cache.cpp's round_up_to_f32.
__device__ __forceinline__ float round_up_to_f32(double x) {
  float f = __double2float_rn(x);
  if (static_cast<double>(f) < x) f = nextafterf(f, INFINITY);
  return f;
}

// One stored key x folded into a channel's running summaries (f32 state between tokens, the
// step in f64), as kv::welford_step: n the token's count in its page (1 for the first).
__device__ __forceinline__ void summary_step(float x, double n, float& mn, float& mx,
                                             float& mean, float& m2) {
  mn = x < mn ? x : mn;
  mx = x > mx ? x : mx;
  // delta = x - mean; new_mean = mean + delta / n; m2 += delta * (x - new_mean).
  const double delta = __dsub_rn(static_cast<double>(x), static_cast<double>(mean));
  const double new_mean = __dadd_rn(static_cast<double>(mean), __ddiv_rn(delta, n));
  const double m2n = __dadd_rn(static_cast<double>(m2),
                               __dmul_rn(delta, __dsub_rn(static_cast<double>(x), new_mean)));
  mean = __double2float_rn(new_mean);
  m2 = __double2float_rn(m2n);
}

// ‖v‖ of a token rounded up to f32, from its channels' squares (thread 0; in channel order, as
// the CPU sums).
__device__ __forceinline__ float vnorm_of(const double* s_v2, int d) {
  double v2 = 0;
  for (int i = 0; i < d; ++i) v2 = __dadd_rn(v2, s_v2[i]);
  return round_up_to_f32(__dsqrt_rn(v2));
}

// The bf16 bound store's row of channel c from its min/max (rounded outward); returns the
// channel's W term max(|lo|, |hi|).
__device__ __forceinline__ float write_bound(const Params& p, std::int64_t at, float mn,
                                            float mx) {
  const std::uint16_t lo = bf16_down(mn), hi = bf16_up(mx);
  p.bmin[at] = lo;
  p.bmax[at] = hi;
  const float a = fabsf(__uint_as_float(static_cast<unsigned>(lo) << 16));
  const float b = fabsf(__uint_as_float(static_cast<unsigned>(hi) << 16));
  return a > b ? a : b;
}

// Channel c's new summaries into the stores at `at` ((page, kv head) row + c), and its bound
// store row with its W term into s_w[c] (append_kernel and summarize_kernel).
__device__ __forceinline__ void store_channel(const Params& p, std::int64_t at, int c, float mn,
                                              float mx, float mean, float m2, float* s_w) {
  p.mn[at] = mn;
  p.mx[at] = mx;
  p.mean[at] = mean;
  p.m2[at] = m2;
  if (p.bmin != nullptr) s_w[c] = write_bound(p, at, mn, mx);
}

// Thread 0, after store_channel on every channel and a barrier: the (page, kv head)'s max ‖v‖,
// its bound store's W (max over the channels' terms) and, from kv head 0, the page's count.
__device__ __forceinline__ void store_head(const Params& p, std::int32_t page, int h, int d,
                                           float vmax, const float* s_w, std::int32_t count) {
  const std::int64_t ph = static_cast<std::int64_t>(page) * p.num_kv_heads + h;
  p.vnorm[ph] = vmax;
  if (p.bmin != nullptr) {
    float w = 0;
    for (int i = 0; i < d; ++i) w = s_w[i] > w ? s_w[i] : w;
    p.wmax[ph] = w;
  }
  if (h == 0) p.count[page] = count;
}

// Channel c of sequence b's last group, kv head h, from the bound store (the token's own page
// row written by this thread just before): GroupRefresh, update_groups' bits.
__device__ __forceinline__ void refresh_group(const Params& p, int b, int h, int c,
                                              std::int32_t page) {
  const int begin = p.g_indptr[b], end = p.g_indptr[b + 1];
  const int gbegin = p.g_gindptr[b], gend = p.g_gindptr[b + 1];
  const int n = end - begin, ng = (n + p.g_pages - 1) / p.g_pages;
  const bool ok = n >= 1 && begin >= 0 && end <= p.g_nnz && gbegin >= 0 && gend <= p.g_gnnz &&
                  gend - gbegin == ng && p.g_indices[end - 1] == page;
  const int slot = ok ? p.g_gindices[gend - 1] : -1;
  std::uint16_t lo, hi;
  if (slot < 0 || slot >= p.g_slots ||
      !detail::group_row(p.g_indices + begin, (ng - 1) * p.g_pages, n, p.num_pages,
                         p.num_kv_heads, p.head_dim, h, c, p.bmin, p.bmax, lo, hi)) {
    if (c == 0) atomicOr(p.err, kBadGroups);
    return;
  }
  const std::int64_t go = (static_cast<std::int64_t>(slot) * p.num_kv_heads + h) * p.head_dim + c;
  p.gmn[go] = lo;
  p.gmx[go] = hi;
}

template <bool kBf16>
__global__ void __launch_bounds__(kMaxDim) append_kernel(Params p) {
  __shared__ double s_v2[kMaxDim];
  __shared__ float s_w[kMaxDim];
  __shared__ int s_ok;
  const int b = blockIdx.x / p.num_kv_heads, h = blockIdx.x % p.num_kv_heads;
  const int c = threadIdx.x, d = p.head_dim;
  const std::int32_t page = p.page[b], slot = p.slot[b];
  if (page < 0 || page >= p.num_pages || slot < 0 || slot >= p.page_size) {
    if (c == 0) atomicOr(p.err, (page < 0 || page >= p.num_pages) ? kBadPage : kBadSlot);
    return;
  }
  // Inputs: finite, and finite once stored, on every head of the sequence's token (each CTA
  // checks them all: a token with a bad value is not written at all, like the CPU's append).
  if (c == 0) s_ok = 1;
  __syncthreads();
  unsigned bad = 0;
  for (int i = c; i < p.num_kv_heads * d; i += blockDim.x) {
    const int hh = i / d, cc = i % d;
    const float kv = p.k[b * p.k_s0 + hh * p.k_s1 + cc];
    const float vv = p.v[b * p.v_s0 + hh * p.v_s1 + cc];
    if (!isfinite(kv) || !isfinite(stored_value<kBf16>(store_bits<kBf16>(kv)))) bad |= kBadK;
    if (!isfinite(vv) || !isfinite(stored_value<kBf16>(store_bits<kBf16>(vv)))) bad |= kBadV;
  }
  if (bad != 0) {
    if (h == 0) atomicOr(p.err, bad);
    s_ok = 0;
  }
  __syncthreads();
  if (!s_ok) return;
  const float kin = c < d ? p.k[b * p.k_s0 + h * p.k_s1 + c] : 0.f;
  const float vin = c < d ? p.v[b * p.v_s0 + h * p.v_s1 + c] : 0.f;
  const std::uint16_t kb = store_bits<kBf16>(kin), vb = store_bits<kBf16>(vin);
  const float x = stored_value<kBf16>(kb), y = stored_value<kBf16>(vb);

  const std::int64_t kv_off = page * p.stride_page + h * p.stride_head + slot * p.stride_slot;
  const std::int64_t sum_off = (static_cast<std::int64_t>(page) * p.num_kv_heads + h) * d;
  const bool fresh = slot == 0;  // the CPU's take_page reset, then the first token
  const double n = static_cast<double>(slot) + 1.0;
  if (c < d) {
    static_cast<std::uint16_t*>(p.k_pool)[kv_off + c] = kb;
    static_cast<std::uint16_t*>(p.v_pool)[kv_off + c] = vb;
    float mn = fresh ? INFINITY : p.mn[sum_off + c];
    float mx = fresh ? -INFINITY : p.mx[sum_off + c];
    float mean = fresh ? 0.f : p.mean[sum_off + c];
    float m2 = fresh ? 0.f : p.m2[sum_off + c];
    summary_step(x, n, mn, mx, mean, m2);
    s_v2[c] = __dmul_rn(static_cast<double>(y), static_cast<double>(y));
    store_channel(p, sum_off + c, c, mn, mx, mean, m2, s_w);
    if (p.gmn != nullptr) refresh_group(p, b, h, c, page);
  }
  __syncthreads();
  if (c == 0) {
    const float r = vnorm_of(s_v2, d);
    const float old = fresh ? 0.f : p.vnorm[static_cast<std::int64_t>(page) * p.num_kv_heads + h];
    store_head(p, page, h, d, old > r ? old : r, s_w, slot + 1);  // std::max(old, r)
  }
}

// summarize_pages: one CTA per (listed page, kv head), one thread per channel: the page's
// stored tokens folded in slot order by append_kernel's arithmetic (summary_step, vnorm_of,
// write_bound), from a fresh page, so the stores get the bits of appending them one by one.
template <bool kBf16>
__global__ void __launch_bounds__(kMaxDim) summarize_kernel(Params p) {
  __shared__ double s_v2[kMaxDim];
  __shared__ float s_w[kMaxDim];
  __shared__ int s_ok;
  const int i = blockIdx.x / p.num_kv_heads, h = blockIdx.x % p.num_kv_heads;
  const int c = threadIdx.x, d = p.head_dim;
  const std::int32_t page = p.page[i], len = p.slot[i];  // slot: the page's token count here
  if (page < 0 || page >= p.num_pages || len < 1 || len > p.page_size) {
    if (c == 0) atomicOr(p.err, (page < 0 || page >= p.num_pages) ? kBadPage : kBadTokens);
    return;
  }
  const auto* kp = static_cast<const std::uint16_t*>(p.k_pool);
  const auto* vp = static_cast<const std::uint16_t*>(p.v_pool);
  // Stored values finite on every head of the page (each CTA checks them all, so a page with a
  // bad value keeps its old stores on every head).
  if (c == 0) s_ok = 1;
  __syncthreads();
  unsigned bad = 0;
  for (int j = c; j < p.num_kv_heads * len * d; j += blockDim.x) {
    const int hh = j / (len * d), t = (j / d) % len, cc = j % d;
    const std::int64_t at = page * p.stride_page + hh * p.stride_head + t * p.stride_slot + cc;
    if (!isfinite(stored_value<kBf16>(kp[at]))) bad |= kBadK;
    if (!isfinite(stored_value<kBf16>(vp[at]))) bad |= kBadV;
  }
  if (bad != 0) {
    if (h == 0) atomicOr(p.err, bad);
    s_ok = 0;
  }
  __syncthreads();
  if (!s_ok) return;
  const std::int64_t kv_off = page * p.stride_page + h * p.stride_head;
  const std::int64_t sum_off = (static_cast<std::int64_t>(page) * p.num_kv_heads + h) * d;
  float mn = INFINITY, mx = -INFINITY, mean = 0.f, m2 = 0.f, vmax = 0.f;
  for (int t = 0; t < len; ++t) {
    if (c < d) {
      const float x = stored_value<kBf16>(kp[kv_off + t * p.stride_slot + c]);
      const float y = stored_value<kBf16>(vp[kv_off + t * p.stride_slot + c]);
      summary_step(x, static_cast<double>(t) + 1.0, mn, mx, mean, m2);
      s_v2[c] = __dmul_rn(static_cast<double>(y), static_cast<double>(y));
    }
    __syncthreads();
    if (c == 0) {
      const float r = vnorm_of(s_v2, d);
      vmax = vmax > r ? vmax : r;
    }
    __syncthreads();  // s_v2 is rewritten by the next token
  }
  if (c < d) store_channel(p, sum_off + c, c, mn, mx, mean, m2, s_w);
  __syncthreads();
  if (c == 0) store_head(p, page, h, d, vmax, s_w, len);
}

// encode_page_codes: one CTA per (listed page, kv head). Thread 0 rounds the page's f32 min/max
// onto its 8-bit grid (kv/page_codes_math.hpp, the CPU's function); then every thread encodes
// bytes: the token-major rows (4 channels a byte) and the channel-major words (4 slots a byte).
template <bool kBf16>
__global__ void __launch_bounds__(kMaxDim) encode_codes_kernel(Params p, PageCodesStores out) {
  __shared__ std::uint8_t s_a[kMaxDim], s_b[kMaxDim];
  __shared__ float s_lo[kMaxDim], s_hi[kMaxDim], s_grid[2];
  const int i = blockIdx.x / p.num_kv_heads, h = blockIdx.x % p.num_kv_heads;
  const int d = p.head_dim, P = p.page_size;
  const std::int32_t page = p.page[i], len = p.slot[i];  // slot: the page's token count here
  if (page < 0 || page >= p.num_pages || len < 1 || len > P) {
    if (threadIdx.x == 0)
      atomicOr(p.err, (page < 0 || page >= p.num_pages) ? kBadPage : kBadTokens);
    return;
  }
  const std::int64_t ph = static_cast<std::int64_t>(page) * p.num_kv_heads + h;
  // The grid is one serial pass over the channels (thread 0); each channel's codes, with their
  // f64 quotients and correction loops, are independent (a thread each; thread 0 alone took
  // tens of µs a page, the whole step's append for token_codes).
  __shared__ bool s_ok;
  if (threadIdx.x == 0) s_ok = kv::codes_math::range8_grid(p.mn + ph * d, p.mx + ph * d, d, s_grid);
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    if (s_ok) {
      kv::codes_math::range8_channel(p.mn[ph * d + c], p.mx[ph * d + c], s_grid[0], s_grid[1],
                                     s_a[c], s_b[c]);
    } else {
      s_a[c] = s_b[c] = 0;
    }
  }
  __syncthreads();
  const std::int64_t chan0 = static_cast<std::int64_t>(h) * d;  // [kv head][channel][page]
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    s_lo[c] = kv::codes_math::dequant8(s_a[c], s_grid[0], s_grid[1]);
    s_hi[c] = kv::codes_math::dequant8(s_b[c], s_grid[0], s_grid[1]);
    out.range_min[ph * d + c] = s_a[c];
    out.range_max[ph * d + c] = s_b[c];
    const std::int64_t at = (chan0 + c) * p.num_pages + page;
    out.chan_ranges[2 * at] = s_a[c];
    out.chan_ranges[2 * at + 1] = s_b[c];
  }
  if (threadIdx.x == 0) {
    out.grid[2 * ph] = s_grid[0];
    out.grid[2 * ph + 1] = s_grid[1];
  }
  __syncthreads();
  const auto* kp = static_cast<const std::uint16_t*>(p.k_pool);
  const std::int64_t kv_off = page * p.stride_page + h * p.stride_head;
  const auto level = [&](int t, int c) -> unsigned {
    const float x = stored_value<kBf16>(kp[kv_off + t * p.stride_slot + c]);
    return kv::codes_math::level(x, s_lo[c], s_hi[c]);
  };
  const int cb = (d + 3) / 4, wb = (P + 3) / 4;
  for (int j = threadIdx.x; j < len * cb; j += blockDim.x) {  // token-major: row t, byte k
    const int t = j / cb, k = j % cb;
    unsigned byte = 0;
    for (int q = 0; q < 4 && 4 * k + q < d; ++q) byte |= level(t, 4 * k + q) << (2 * q);
    out.codes[(ph * P + t) * cb + k] = static_cast<std::uint8_t>(byte);
  }
  for (int j = threadIdx.x; j < d * wb; j += blockDim.x) {  // channel-major: channel c, word w
    const int c = j / wb, w = j % wb;
    unsigned byte = 0;
    for (int q = 0; q < 4 && 4 * w + q < len; ++q) byte |= level(4 * w + q, c) << (2 * q);
    out.chan_codes[((chan0 + c) * p.num_pages + page) * wb + w] = static_cast<std::uint8_t>(byte);
  }
}

// update_spread: one CTA per (sequence, kv head), one thread per channel, the step's tokens in
// position order (the CPU cache's write_token / write_spread).
template <bool kBf16>
__global__ void __launch_bounds__(kMaxDim) spread_kernel(Params p, const std::int32_t* indptr,
                                                         const std::int32_t* indices,
                                                         const std::int32_t* last_page_len,
                                                         int all_tokens,
                                                         const std::int32_t* counts,
                                                         double* mean, double* m2,
                                                         float* spread) {
  const int b = blockIdx.x / p.num_kv_heads, h = blockIdx.x % p.num_kv_heads;
  const int c = threadIdx.x, d = p.head_dim, P = p.page_size;
  const int tokens = counts != nullptr ? counts[b] : all_tokens;
  if (tokens == 0) return;  // a row with no new token this step (a padded batch)
  const std::int32_t first = indptr[b], pages = indptr[b + 1] - first;
  const std::int64_t len =
      pages > 0 ? static_cast<std::int64_t>(pages - 1) * P + last_page_len[b] : 0;
  if (tokens < 0 || pages < 1 || last_page_len[b] < 1 || last_page_len[b] > P || len < tokens) {
    if (c == 0 && h == 0) atomicOr(p.err, kBadTokens);
    return;
  }
  if (c >= d) return;
  const auto* kp = static_cast<const std::uint16_t*>(p.k_pool);
  const std::int64_t mi = (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * d + c;
  double mu = mean[mi], s2 = m2[mi];
  for (std::int64_t pos = len - tokens; pos < len; ++pos) {
    const std::int32_t page = indices[first + pos / P];
    const int slot = static_cast<int>(pos % P);
    if (page < 0 || page >= p.num_pages) {
      if (c == 0) atomicOr(p.err, kBadPage);
      return;
    }
    const float x =
        stored_value<kBf16>(kp[page * p.stride_page + h * p.stride_head + slot * p.stride_slot + c]);
    const double n = static_cast<double>(pos + 1);
    kv::codes_math::welford_step(static_cast<double>(x), n, mu, s2);
    if (slot == P - 1 || pos == len - 1) {
      spread[(static_cast<std::int64_t>(page) * p.num_kv_heads + h) * d + c] =
          __double2float_rn(__dsqrt_rn(__ddiv_rn(s2, n)));
    }
  }
  mean[mi] = mu;
  m2[mi] = s2;
}

// The stores' host checks and their kernel parameters (append and summarize_pages).
Params store_params(const SummaryStores& a, unsigned* err) {
  using enum ErrorCode;
  require(a.dtype == DType::bf16 || a.dtype == DType::f16, unsupported, "dtype",
          "the GPU append writes f16 or bf16 pools");
  const int H = a.num_kv_heads, d = a.head_dim;
  require(d > 0 && d <= kMaxDim, unsupported, "head_dim", "must be in [1, ", kMaxDim, "], got ", d);
  require(H > 0 && a.num_pages > 0 && a.page_size > 0, invalid_argument, "cache",
          "needs kv heads, pages and a page size");
  require(a.k_pool && a.v_pool && a.min && a.max && a.mean && a.m2 && a.count && a.max_vnorm,
          invalid_argument, "cache", "pool and summary pointers are required");
  require((a.bound_min == nullptr) == (a.bound_max == nullptr) &&
              (a.bound_min == nullptr) == (a.bound_wmax == nullptr),
          invalid_argument, "bound_min", "the bf16 store needs min, max and wmax together");
  require(a.stride_slot >= d && a.stride_page > 0 && a.stride_head > 0, invalid_argument,
          "stride", "pool strides must be positive, stride_slot >= head_dim");
  Params p{};
  p.k_pool = a.k_pool;
  p.v_pool = a.v_pool;
  p.stride_page = a.stride_page;
  p.stride_head = a.stride_head;
  p.stride_slot = a.stride_slot;
  p.num_pages = a.num_pages;
  p.num_kv_heads = H;
  p.page_size = a.page_size;
  p.head_dim = d;
  p.mn = a.min;
  p.mx = a.max;
  p.mean = a.mean;
  p.m2 = a.m2;
  p.vnorm = a.max_vnorm;
  p.count = a.count;
  p.bmin = reinterpret_cast<std::uint16_t*>(a.bound_min);
  p.bmax = reinterpret_cast<std::uint16_t*>(a.bound_max);
  p.wmax = a.bound_wmax;
  p.err = err;
  return p;
}

}  // namespace

struct AppendWorkspace::Impl {
  detail::ErrorFlag err;
};

AppendWorkspace::AppendWorkspace() : impl_(std::make_unique<Impl>()) {}
AppendWorkspace::~AppendWorkspace() = default;

void AppendWorkspace::check(CUstream_st* stream) const {
  const unsigned flag = impl_->err.take(stream, "append step");
  if (flag == 0) return;
  if (flag & kBadPage)
    fail(ErrorCode::out_of_range, "page", "a page id outside [0, num_pages) was met on the GPU");
  if (flag & kBadSlot)
    fail(ErrorCode::out_of_range, "slot", "a slot outside [0, page_size) was met on the GPU");
  if (flag & kBadGroups)
    fail(ErrorCode::out_of_range, "group_indices",
         "the page or group table of the group refresh does not end at the appended page, or "
         "holds an id outside the pool / the group store (met on the GPU)");
  if (flag & kBadTokens)
    fail(ErrorCode::out_of_range, "tokens",
         "a page's token count outside [1, page_size] (summarize_pages, encode_page_codes), or "
         "a sequence shorter than the step's tokens or a bad last_page_len (update_spread), was "
         "met on the GPU");
  fail(ErrorCode::non_finite, flag & kBadK ? "k" : "v",
       "NaN or inf, or a value that overflows the cache dtype (the token was not appended, or "
       "the page's stores not rebuilt)");
}

void append(const AppendArgs& a, AppendWorkspace& ws, CUstream_st* stream, bool check_errors) {
  using enum ErrorCode;
  Params p = store_params(a, ws.impl().err.get());
  const int B = a.k.n0, H = a.num_kv_heads, d = a.head_dim;
  require(a.k.n1 == H && a.k.n2 == d && a.k.data, shape_mismatch, "k", "must be [B][kv heads][d]");
  require(a.v.n0 == B && a.v.n1 == H && a.v.n2 == d && a.v.data, shape_mismatch, "v",
          "must be k's shape");
  require(a.page.size() == static_cast<std::size_t>(B), shape_mismatch, "page",
          "needs one entry per sequence");
  require(a.slot.size() == static_cast<std::size_t>(B), shape_mismatch, "slot",
          "needs one entry per sequence");
  if (B == 0) return;
  p.k = a.k.data;
  p.v = a.v.data;
  p.k_s0 = a.k.s0;
  p.k_s1 = a.k.s1;
  p.v_s0 = a.v.s0;
  p.v_s1 = a.v.s1;
  p.page = a.page.data();
  p.slot = a.slot.data();
  if (const GroupRefresh& g = a.groups; g.min != nullptr || g.max != nullptr) {
    require(g.min != nullptr && g.max != nullptr && a.bound_min != nullptr, invalid_argument,
            "groups", "the group refresh needs both group stores and the bound store");
    require(g.slots > 0 && g.group_pages >= 1 && g.group_pages <= (1 << 20), invalid_argument,
            "groups", "needs slots > 0 and group_pages in [1, 2^20]");
    require(g.indptr.size() == static_cast<std::size_t>(B) + 1 &&
                g.group_indptr.size() == static_cast<std::size_t>(B) + 1,
            shape_mismatch, "groups", "indptr and group_indptr need batch + 1 entries");
    p.gmn = reinterpret_cast<std::uint16_t*>(g.min);
    p.gmx = reinterpret_cast<std::uint16_t*>(g.max);
    p.g_indptr = g.indptr.data();
    p.g_indices = g.indices.data();
    p.g_gindptr = g.group_indptr.data();
    p.g_gindices = g.group_indices.data();
    p.g_slots = g.slots;
    p.g_pages = g.group_pages;
    p.g_nnz = static_cast<int>(g.indices.size());
    p.g_gnnz = static_cast<int>(g.group_indices.size());
  }
  const int threads = (d + 31) / 32 * 32;
  if (a.dtype == DType::bf16) {
    append_kernel<true><<<B * H, threads, 0, stream>>>(p);
  } else {
    append_kernel<false><<<B * H, threads, 0, stream>>>(p);
  }
  check_cuda(cudaGetLastError(), "append kernel launch");
  if (check_errors) ws.check(stream);
}

void summarize_pages(const SummaryStores& stores, std::span<const std::int32_t> pages,
                     std::span<const std::int32_t> tokens, AppendWorkspace& ws,
                     CUstream_st* stream, bool check_errors) {
  using enum ErrorCode;
  Params p = store_params(stores, ws.impl().err.get());
  require(tokens.size() == pages.size(), shape_mismatch, "tokens", "needs one entry per page (",
          pages.size(), "), got ", tokens.size());
  const std::size_t blocks = pages.size() * static_cast<std::size_t>(stores.num_kv_heads);
  require(blocks <= 0x7fffffffu, unsupported, "pages", "too many pages for one launch");
  if (pages.empty()) return;
  p.page = pages.data();
  p.slot = tokens.data();
  const int threads = (stores.head_dim + 31) / 32 * 32;
  if (stores.dtype == DType::bf16) {
    summarize_kernel<true><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p);
  } else {
    summarize_kernel<false><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(p);
  }
  check_cuda(cudaGetLastError(), "summarize_pages kernel launch");
  if (check_errors) ws.check(stream);
}

void encode_page_codes(const SummaryStores& stores, const PageCodesStores& codes,
                       std::span<const std::int32_t> pages, std::span<const std::int32_t> tokens,
                       AppendWorkspace& ws, CUstream_st* stream, bool check_errors) {
  using enum ErrorCode;
  Params p = store_params(stores, ws.impl().err.get());
  require(tokens.size() == pages.size(), shape_mismatch, "tokens", "needs one entry per page (",
          pages.size(), "), got ", tokens.size());
  require(codes.codes && codes.range_min && codes.range_max && codes.grid && codes.chan_codes &&
              codes.chan_ranges,
          invalid_argument, "codes", "every page-code store is required");
  const std::size_t blocks = pages.size() * static_cast<std::size_t>(stores.num_kv_heads);
  require(blocks <= 0x7fffffffu, unsupported, "pages", "too many pages for one launch");
  if (pages.empty()) return;
  p.page = pages.data();
  p.slot = tokens.data();
  if (stores.dtype == DType::bf16) {
    encode_codes_kernel<true><<<static_cast<unsigned>(blocks), 128, 0, stream>>>(p, codes);
  } else {
    encode_codes_kernel<false><<<static_cast<unsigned>(blocks), 128, 0, stream>>>(p, codes);
  }
  check_cuda(cudaGetLastError(), "encode_page_codes kernel launch");
  if (check_errors) ws.check(stream);
}

void update_spread(const SummaryStores& stores, std::span<const std::int32_t> indptr,
                   std::span<const std::int32_t> indices,
                   std::span<const std::int32_t> last_page_len, int tokens, double* mean,
                   double* m2, float* spread, AppendWorkspace& ws, CUstream_st* stream,
                   bool check_errors, std::span<const std::int32_t> counts) {
  using enum ErrorCode;
  Params p = store_params(stores, ws.impl().err.get());
  require(!indptr.empty() && last_page_len.size() + 1 == indptr.size(), shape_mismatch,
          "last_page_len", "needs one entry per sequence (indptr has B + 1)");
  require(!counts.empty() || tokens >= 1, invalid_argument, "tokens", "must be >= 1, got ",
          tokens);
  require(counts.empty() || counts.size() == last_page_len.size(), shape_mismatch, "counts",
          "needs one entry per sequence");
  require(mean && m2 && spread, invalid_argument, "spread", "mean, m2 and spread are required");
  const std::size_t blocks =
      last_page_len.size() * static_cast<std::size_t>(stores.num_kv_heads);
  require(blocks <= 0x7fffffffu, unsupported, "indptr", "too many sequences for one launch");
  if (blocks == 0) return;
  const int threads = (stores.head_dim + 31) / 32 * 32;
  if (stores.dtype == DType::bf16) {
    spread_kernel<true><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        p, indptr.data(), indices.data(), last_page_len.data(), tokens,
        counts.empty() ? nullptr : counts.data(), mean, m2, spread);
  } else {
    spread_kernel<false><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        p, indptr.data(), indices.data(), last_page_len.data(), tokens,
        counts.empty() ? nullptr : counts.data(), mean, m2, spread);
  }
  check_cuda(cudaGetLastError(), "update_spread kernel launch");
  if (check_errors) ws.check(stream);
}

}  // namespace masskv::cuda
