// CUDA softmax decode over token selections (SelectionView::Unit::token): the split-K chunk
// skeleton of decode.cu (decode_common.cuh: a CTA owns a chunk of one (sequence, kv head)'s
// list and up to 8 q heads of that kv head; per-thread cp.async ring; online softmax per row
// group, merged in a fixed order; then the chunks' (o, lse) merged), with the chunk's units
// being tokens: each listed token id x is read at page x / page_size, slot x % page_size
// through the page table (a gather of single rows instead of whole pages). The page path is
// untouched. Every id is checked when the chunk's row list is staged: a token outside its
// sequence sets "selection", a physical page outside the pool "indices"; such rows are never
// read.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "decode_tokens.cuh"
#include "device.cuh"
#include "masskv/error.hpp"

namespace masskv::cuda::decode_impl {
namespace {

using detail::check_cuda;

constexpr int kMaxChunkTokens = kMaxChunkPages;  // the row list of a chunk, in shared memory

template <int kD, int kG, int kU>
struct TokenSmem {
  static constexpr int kRowGroups = kWarps * (32 / (kD / 8));
  static constexpr std::size_t kList = kMaxChunkTokens * sizeof(std::int64_t);
  static constexpr std::size_t kStage = std::size_t{kStages} * kU * 2 * kThreads * 16;
  static constexpr std::size_t kMerge = sizeof(float) * kRowGroups * kG * (kD + 2);
  static constexpr std::size_t kBytes = kList + (kStage > kMerge ? kStage : kMerge);
};

template <bool kBf16, int kD, int kG, int kU>
__global__ void __launch_bounds__(kThreads, kG <= 4 ? 4 : 2) token_chunk_kernel(Params p) {
  using Smem = TokenSmem<kD, kG, kU>;
  constexpr int kLanesPerRow = kD / 8;
  constexpr int kRowGroups = Smem::kRowGroups;
  constexpr int kTileTokens = kRowGroups * kU;
  extern __shared__ uint4 smem_raw[];
  std::int64_t* s_off = reinterpret_cast<std::int64_t*>(smem_raw);  // row offset, -1: skip
  uint4* s_stage = reinterpret_cast<uint4*>(reinterpret_cast<char*>(smem_raw) + Smem::kList);

  wait_for_predecessor();  // the selection that wrote the lists
  allow_dependents();
  const Chunk c = chunk_of(p);  // units: tokens of the list; n_pages: tokens of this chunk
  if (c.unit0 >= c.units && !(c.chunk == 0 && p.num_chunks == 1)) return;  // merge: empties
  const int n = c.n_pages;
  {
    const std::int64_t length =
        c.num_pages > 0 ? (static_cast<std::int64_t>(c.num_pages - 1) << p.log2_page) + c.last_len
                        : 0;
    const std::int32_t* sel =
        p.sel_ids + (static_cast<std::int64_t>(c.b) * p.num_kv_heads + c.kvh) * p.sel_max;
    const int seq_begin = c.num_pages > 0 ? p.indptr[c.b] : 0;
    const int slot_mask = (1 << p.log2_page) - 1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int id = sel[c.unit0 + i];
      std::int64_t off = -1;
      if (id < 0 || id >= length) {
        atomicOr(p.err, kBadSelection);
      } else {
        const int phys = p.indices[seq_begin + (id >> p.log2_page)];
        if (phys < 0 || phys >= p.pool_pages) {
          atomicOr(p.err, kBadPhysical);
        } else {
          off = static_cast<std::int64_t>(phys) * p.stride_page +
                static_cast<std::int64_t>(id & slot_mask) * p.stride_slot;
        }
      }
      s_off[i] = off;
    }
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp * (32 / kLanesPerRow) + lane / kLanesPerRow;
  const int lane_dim = (lane % kLanesPerRow) * 8;

  float qf[kG][8];  // base-2 logits
  load_q<kG>(p, c, lane_dim, qf);
  SoftmaxState<kG> state;
  state.init();
  __syncthreads();

  const std::int64_t head_off = c.kvh * p.stride_head + lane_dim;
  const std::uint16_t* kb = p.k + head_off;
  const std::uint16_t* vb = p.v + head_off;
  const int n_tiles = (n + kTileTokens - 1) / kTileTokens;
  const auto row_ok = [&](int t) { return t < n && s_off[t] >= 0; };
  const auto issue = [&](int tile) {
    uint4* st = s_stage + (tile % kStages) * (kU * 2 * kThreads) + threadIdx.x;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int t = rg + tile * kTileTokens + u * kRowGroups;
      const bool ok = row_ok(t);
      const std::int64_t off = ok ? s_off[t] : 0;
      cp_async16(st + (2 * u) * kThreads, kb + off, ok ? 16 : 0);
      cp_async16(st + (2 * u + 1) * kThreads, vb + off, ok ? 16 : 0);
    }
  };
  const auto compute = [&](int tile) {
    const uint4* st = s_stage + (tile % kStages) * (kU * 2 * kThreads) + threadIdx.x;
    bool ok[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) ok[u] = row_ok(rg + tile * kTileTokens + u * kRowGroups);
    float s[kU][kG];
    score_rows<kBf16, kG, kU, kLanesPerRow>(st, 2 * kThreads, qf, s);
    state.template update<kBf16, kU>(st, kThreads, ok, s);
  };
  stream_tiles(n_tiles, issue, compute);

  __syncthreads();
  float* s_acc = reinterpret_cast<float*>(s_stage);  // [kRowGroups][kG][kD]
  float* s_m = s_acc + kRowGroups * kG * kD;         // [kRowGroups][kG]
  float* s_l = s_m + kRowGroups * kG;
  state.template store<kD>(rg, lane_dim, s_acc, s_m, s_l);
  __syncthreads();
  write_chunk_softmax<kG, kD>(p, c, kRowGroups, s_acc, s_m, s_l);
}

// The chunks of one (sequence, q head) merged (§2.6), in chunk order: lse = logsumexp_c lse_c,
// o = sum_c e^{lse_c - lse} o_c / sum_c e^{lse_c - lse}; no chunk with tokens: o = 0, lse -inf.
__global__ void __launch_bounds__(kThreads) token_merge_kernel(Params p, int d) {
  const int b = blockIdx.x / p.num_q_heads, hq = blockIdx.x % p.num_q_heads;
  const int kvh = hq / p.group;
  int num_pages, last_len;
  const int units = seq_units(p, b, kvh, num_pages, last_len);
  const int n_chunks = min(p.num_chunks, (units + p.chunk_pages - 1) / p.chunk_pages);
  const std::int64_t slot0 = (static_cast<std::int64_t>(b) * p.num_q_heads + hq) * p.num_chunks;
  wait_for_predecessor();  // the chunk kernel's partials
  merge_chunks(p, d, b, hq, n_chunks, slot0);
}

struct MakeTokenKernel {
  template <bool kBf16, int kD, int kG, int kU>
  KernelInfo operator()() const {
    return {token_chunk_kernel<kBf16, kD, kG, kU>, TokenSmem<kD, kG, kU>::kBytes};
  }
};

struct Prepared {
  KernelInfo k;
  int per_sm;
};
Prepared prepare_token_kernel(DType dtype, int d, int group) {
  const int g = kernel_group(group);
  const int key = variant_key(dtype, d, g);
  static std::mutex mu;
  static Prepared cache[24];
  static bool ready[24] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[key]) {
    Prepared pr;
    pr.k = by_variant(dtype, d, g, MakeTokenKernel{});
    detail::set_dynamic_smem(pr.k.fn, pr.k.smem, "the token decode chunk kernel");
    check_cuda(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&pr.per_sm, pr.k.fn, kThreads, pr.k.smem),
        "occupancy");
    cache[key] = pr;
    ready[key] = true;
  }
  return cache[key];
}

}  // namespace

void launch_softmax_tokens(Params p, DType dtype, int d, int batch, int units_max, float scale,
                           const DecodeLaunch& launch, DecodeWorkspace::Impl& ws) {
  constexpr float kLog2e = 1.4426950408889634f;
  const Prepared kernel = prepare_token_kernel(dtype, d, p.group);
  const int base = batch * p.num_kv_heads * p.head_groups;
  // Planned as the page path's chunks (whole waves), but at least 32 tokens a chunk: a row is
  // 1/16 of a page's bytes, so smaller chunks would mostly cost partials.
  const int cp = launch.chunk_pages > 0
                     ? launch.chunk_pages
                     : std::min(kMaxChunkTokens,
                                std::max(32, plan_chunk_pages(base, units_max, kernel.per_sm)));
  const int chunks = std::max(1, (std::max(units_max, 1) + cp - 1) / cp);
  require(chunks <= kMaxChunks, ErrorCode::invalid_argument, "chunk_pages",
          "too small for this many tokens (more than ", kMaxChunks, " chunks)");
  p.chunk_pages = cp;
  p.num_chunks = chunks;
  p.q_mult = scale * kLog2e;
  const int Hq = p.num_q_heads;
  if (chunks > 1) {
    const std::size_t slots = static_cast<std::size_t>(batch) * Hq * chunks;
    ws.part.reserve(slots * (d + 1), "cudaMalloc(partials)");
    p.part_o = ws.part.data();
    p.part_w = ws.part.data() + slots * d;
  }
  cudaStream_t stream = launch.stream;
  const dim3 grid(chunks, p.num_kv_heads * p.head_groups, batch);
  PdlLaunch chunk(stream, grid, dim3(kThreads), kernel.k.smem);
  check_cuda(cudaLaunchKernelEx(&chunk.cfg, kernel.k.fn, p), "token decode kernel launch");
  if (chunks > 1) {
    PdlLaunch merge(stream, dim3(batch * Hq), dim3(kThreads));
    check_cuda(cudaLaunchKernelEx(&merge.cfg, token_merge_kernel, p, d),
               "token decode merge kernel launch");
  }
}

}  // namespace masskv::cuda::decode_impl
