// CUDA decode attention, softmax, dense and sparse (issue 7; docs/design.md §2.6 split-K merge,
// §3 layout), and the host entry point for both mappings (entmax: decode_entmax.cu). One kernel
// skeleton (decode_common.cuh): a CTA owns one chunk of pages of one (sequence, kv head) and all
// q heads of that kv head (up to 8), so each selected page is read once per kv group. Dense
// takes the chunk's pages from the CSR page table, sparse from the Selection's logical ids. A
// second small kernel merges the chunks' (o, lse) partials.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "decode_common.cuh"
#include "decode_tokens.cuh"
#include "device.cuh"
#include "masskv/cuda/decode.hpp"
#include "masskv/error.hpp"

namespace masskv::cuda {
namespace decode_impl {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

using detail::check_cuda;
using detail::device_sms;

template <int kD, int kG, int kU>
struct ChunkSmem {
  static constexpr int kRowGroups = kWarps * (32 / (kD / 8));
  static constexpr std::size_t kList = kMaxChunkPages * (sizeof(int) + sizeof(std::uint16_t));
  static constexpr std::size_t kStage = std::size_t{kStages} * kU * 2 * kThreads * 16;
  static constexpr std::size_t kMerge = sizeof(float) * kRowGroups * kG * (kD + 2);
  static constexpr std::size_t kBytes = kList + (kStage > kMerge ? kStage : kMerge);
};

// One CTA per chunk (decode_common.cuh). Lanes are split into row groups of D/8 lanes, each
// lane holding 8 dims (16-byte accesses); a row group walks its own tokens with its own online
// softmax state (no cross-group traffic in the loop), the CTA merges the row groups at the end.
// Loads: each thread copies its own 16-byte pieces of K and V with cp.async into a private
// shared-memory ring of kStages tiles, so kStages-1 tiles per thread are in flight while one is
// computed, whatever the register budget (no barrier needed: a thread reads only what it copied).
// kG: q heads held per CTA (>= the heads of the group, extra ones are zero and not written);
// kU: tokens per row group per tile.
template <bool kBf16, int kD, int kG, int kU>
__global__ void __launch_bounds__(kThreads, kG <= 4 ? 4 : 2) decode_chunk_kernel(Params p) {
  using Smem = ChunkSmem<kD, kG, kU>;
  constexpr int kLanesPerRow = kD / 8;
  constexpr int kRowGroups = Smem::kRowGroups;
  constexpr int kTileTokens = kRowGroups * kU;
  extern __shared__ uint4 smem_raw[];
  int* s_phys = reinterpret_cast<int*>(smem_raw);
  std::uint16_t* s_len = reinterpret_cast<std::uint16_t*>(s_phys + kMaxChunkPages);
  uint4* s_stage = reinterpret_cast<uint4*>(reinterpret_cast<char*>(smem_raw) + Smem::kList);

  wait_for_predecessor();  // launched early after a selection (PdlLaunch): nothing read before
  // The merge may be scheduled now (it waits for this grid before reading partials): after the
  // wait, so the merge's early reads of the selection counts find the selection done.
  allow_dependents();
  const Chunk c = chunk_of(p);
  if (c.unit0 >= c.units && !(c.chunk == 0 && p.num_chunks == 1)) return;  // merge: empties
  const int n_pages = c.n_pages;
  stage_page_list(p, c, s_phys, s_len);

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
  const int rows = n_pages << p.log2_page;
  const int n_tiles = (rows + kTileTokens - 1) / kTileTokens;
  const auto issue = [&](int tile) {
    uint4* st = s_stage + (tile % kStages) * (kU * 2 * kThreads) + threadIdx.x;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int t = rg + tile * kTileTokens + u * kRowGroups;
      const bool ok = token_ok(p, s_len, n_pages, t);
      const std::int64_t off = ok ? row_offset(p, s_phys, t) : 0;
      cp_async16(st + (2 * u) * kThreads, kb + off, ok ? 16 : 0);
      cp_async16(st + (2 * u + 1) * kThreads, vb + off, ok ? 16 : 0);
    }
  };
  const auto compute = [&](int tile) {
    const uint4* st = s_stage + (tile % kStages) * (kU * 2 * kThreads) + threadIdx.x;
    bool ok[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      ok[u] = token_ok(p, s_len, n_pages, rg + tile * kTileTokens + u * kRowGroups);
    float s[kU][kG];
    score_rows<kBf16, kG, kU, kLanesPerRow>(st, 2 * kThreads, qf, s);
    state.template update<kBf16, kU>(st, kThreads, ok, s);
  };
  stream_tiles(n_tiles, issue, compute);

  // Merge the row groups (fixed order: deterministic). The merge area reuses the stage ring.
  __syncthreads();
  float* s_acc = reinterpret_cast<float*>(s_stage);  // [kRowGroups][kG][kD]
  float* s_m = s_acc + kRowGroups * kG * kD;         // [kRowGroups][kG]
  float* s_l = s_m + kRowGroups * kG;
  state.template store<kD>(rg, lane_dim, s_acc, s_m, s_l);
  __syncthreads();
  write_chunk_softmax<kG, kD>(p, c, kRowGroups, s_acc, s_m, s_l);
}

// The merge of up to 32 chunks, d <= kThreads (merge_kernel's path at B = 1, 4K-token budgets):
// lane c of every warp holds chunk c's lse; the max and the weight sum are warp reductions
// (tree order, fixed: same bits on every run) instead of a barrier tree and a serial sum, and
// thread `dim` loads its dimension of every chunk in one unrolled run of independent loads.
// Small code on purpose: the kernel runs once per step on a cold instruction cache (the
// shared-memory path was slower here: docs/gpu-results.md, "Where a B = 1 step's time goes").
__device__ __forceinline__ void merge_warp(const Params& p, int d, int b, int hq, int n_chunks,
                                           std::int64_t slot0) {
  const int lane = threadIdx.x % 32, dim = threadIdx.x;
  const float lw = lane < n_chunks ? p.part_w[slot0 + lane] : -INFINITY;
  const float* po = p.part_o + slot0 * d + dim;
  float x[32];
#pragma unroll
  for (int c = 0; c < 32; ++c)
    x[c] = c < n_chunks && dim < d ? po[static_cast<std::int64_t>(c) * d] : 0.f;
  float mx = lw;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  using Row = softmax::Row<softmax::BaseE>;  // the partials carry natural-log lse
  const float w = lane >= n_chunks ? 0.f : Row::merge_weight(lw, mx);
  float wsum = w;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < 32; ++c) {
    const float wc = __shfl_sync(0xffffffffu, w, c);
    acc = wc != 0.f ? fmaf(wc, x[c], acc) : acc;
  }
  if (dim < d) p.out[b * p.o_s0 + hq * p.o_s1 + dim] = wsum > 0.f ? acc / wsum : 0.f;
  if (threadIdx.x == 0 && p.lse) {
    p.lse[b * p.num_q_heads + hq] = Row::lse_of(mx, wsum);
  }
}

// Merge of the chunks of one (sequence, q head), §2.6: lse = logsumexp_c lse_c,
// o = sum_c e^{lse_c - lse} o_c, in chunk order (over 32 chunks; merge_warp's weight sum up to
// 32 is a fixed tree). Empty chunks (lse -inf) weigh 0; all empty gives o = 0, lse = -inf.
// It reads the selection's counts (seq_units) before its wait: the chunk kernel allows it to
// launch only after every chunk CTA's own wait, so the selection grid has completed by then.
__global__ void __launch_bounds__(kThreads) merge_kernel(Params p, int d) {
  const int b = blockIdx.x / p.num_q_heads, hq = blockIdx.x % p.num_q_heads;
  const int kvh = hq / p.group;
  int num_pages, last_len;
  const int units = seq_units(p, b, kvh, num_pages, last_len);
  const int n_chunks = min(p.num_chunks, (units + p.chunk_pages - 1) / p.chunk_pages);
  const std::int64_t slot0 = (static_cast<std::int64_t>(b) * p.num_q_heads + hq) * p.num_chunks;
  stamp(p.stamps, stamps::decode_merge, 0);
  wait_for_predecessor();  // the chunk kernel's partials
  stamp(p.stamps, stamps::decode_merge, 1);
  if (n_chunks <= 32 && d <= kThreads) {
    merge_warp(p, d, b, hq, n_chunks, slot0);
    stamp(p.stamps, stamps::decode_merge, stamps::kExit);
    return;
  }

  merge_chunks(p, d, b, hq, n_chunks, slot0);
  stamp(p.stamps, stamps::decode_merge, stamps::kExit);
}

struct MakeKernelInfo {
  template <bool kBf16, int kD, int kG, int kU>
  KernelInfo operator()() const {
    return {decode_chunk_kernel<kBf16, kD, kG, kU>, ChunkSmem<kD, kG, kU>::kBytes};
  }
};

// The softmax kernel for (dtype, d, group, kind), its shared-memory limit raised once, and its
// resident CTAs per SM (cached: the occupancy query costs host time on every step otherwise).
struct Prepared {
  KernelInfo k;
  int per_sm;
};
Prepared prepare_kernel(DType dtype, int d, int group, DecodeLaunch::Kernel kind) {
  const int g = kernel_group(group);
  KernelInfo tensor = tensor_softmax_kernel(dtype, d, g);
  require(kind != DecodeLaunch::Kernel::tensor || tensor.fn != nullptr, ErrorCode::unsupported,
          "kernel", "the tensor-core decode serves head_dim 64 and 128; got ", d);
  const bool use_tensor = tensor.fn != nullptr && kind != DecodeLaunch::Kernel::simt;
  const int key = variant_key(dtype, d, g) + (use_tensor ? 24 : 0);
  static std::mutex mu;
  static Prepared cache[48];
  static bool ready[48] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[key]) {
    Prepared pr;
    pr.k = use_tensor ? tensor : by_variant(dtype, d, g, MakeKernelInfo{});
    detail::set_dynamic_smem(pr.k.fn, pr.k.smem, "the decode chunk kernel");
    check_cuda(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&pr.per_sm, pr.k.fn, kThreads, pr.k.smem),
        "occupancy");
    cache[key] = pr;
    ready[key] = true;
  }
  return cache[key];
}

bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

// Whole waves of equal chunks: CTAs = SMs * resident CTAs per SM (times the waves the page-list
// cap needs), split evenly over the (sequence, kv head, head group) triples. Small chunks only
// cost partials (d floats each).
int plan_chunk_pages(int base_ctas, int units, int ctas_per_sm) {
  if (units <= 0) return 1;
  const int target = std::max(1, device_sms() * std::max(1, ctas_per_sm));
  const int per_wave = std::max(1, target / base_ctas);  // whole waves: no partial last wave
  int chunks = per_wave;
  int cp = (units + chunks - 1) / chunks;
  if (cp > kMaxChunkPages) {  // the page-list cap needs more chunks: still whole waves of them
    chunks = per_wave * ((cp + kMaxChunkPages - 1) / kMaxChunkPages);
    cp = (units + chunks - 1) / chunks;
  }
  cp = std::max(cp, 8);  // fewer partials: each costs (d + 1) floats written and read
  cp = std::max(cp, (units + kMaxChunks - 1) / kMaxChunks);
  return std::min(cp, kMaxChunkPages);
}

}  // namespace decode_impl

using namespace decode_impl;

DecodeWorkspace::DecodeWorkspace() : impl_(std::make_unique<Impl>()) {}

DecodeWorkspace::~DecodeWorkspace() = default;

void DecodeWorkspace::check(CUstream_st* stream) const {
  const unsigned flag = impl_->err.take(stream, "decode step");
  if (flag == 0) return;
  if (flag & kBadPhysical)
    fail(ErrorCode::out_of_range, "indices", "a page id outside [0, num_pages) was met on the GPU");
  if (flag & kBadSelection)
    fail(ErrorCode::out_of_range, "selection",
         "a selected page outside its sequence (or a count outside [0, max_per_head])");
  if (flag & kBadLastLen)
    fail(ErrorCode::out_of_range, "last_page_len", "a value outside [1, page_size] on the GPU");
  fail(ErrorCode::out_of_range, "indptr",
       "decreasing, or a sequence longer than DecodeLaunch::max_pages_per_seq");
}

int planned_chunk_pages(DType dtype, int head_dim, int batch, int num_kv_heads, int num_q_heads,
                        int pages_per_head, DecodeLaunch::Kernel kernel) {
  const int group = num_q_heads / num_kv_heads;
  const int head_groups = (group + kMaxGroup - 1) / kMaxGroup;
  return plan_chunk_pages(batch * num_kv_heads * head_groups, pages_per_head,
                          prepare_kernel(dtype, head_dim, group, kernel).per_sm);
}

namespace {

// The softmax launch: split-K chunk kernel, then the merge when there is more than one chunk.
void launch_softmax(Params p, DType dtype, int d, int batch, int units_max, float scale,
                    const DecodeLaunch& launch, DecodeWorkspace::Impl& ws) {
  const Prepared kernel = prepare_kernel(dtype, d, p.group, launch.kernel);
  const int base = batch * p.num_kv_heads * p.head_groups;
  const int cp = launch.chunk_pages > 0 ? launch.chunk_pages
                                        : plan_chunk_pages(base, units_max, kernel.per_sm);
  const int chunks = std::max(1, (std::max(units_max, 1) + cp - 1) / cp);
  require(chunks <= kMaxChunks, ErrorCode::invalid_argument, "chunk_pages",
          "too small for this many pages (more than ", kMaxChunks, " chunks)");
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
  // Programmatic dependent launch: the chunk kernel waits on the device for its predecessor
  // before it reads anything, so a predecessor that allows dependents early (the selection's
  // top-k kernels after their wait, the one-kernel hierarchical selection at entry) overlaps
  // this launch; after any other kernel it is a plain launch.
  PdlLaunch chunk(stream, grid, dim3(kThreads), kernel.k.smem);
  check_cuda(cudaLaunchKernelEx(&chunk.cfg, kernel.k.fn, p), "decode kernel launch");
  if (chunks > 1) {
    // Launched while the chunk kernel runs (programmatic dependent launch): its launch
    // latency overlaps the chunks' tail instead of following it.
    PdlLaunch merge(stream, dim3(batch * Hq), dim3(kThreads));
    check_cuda(cudaLaunchKernelEx(&merge.cfg, merge_kernel, p, d), "merge kernel launch");
  }
}

}  // namespace

void decode(const attn::DecodeArgs& a, const DecodeLaunch& launch) {
  const kv::PagedKVView& c = a.cache;
  require(launch.workspace != nullptr, ErrorCode::invalid_argument, "workspace", "is required");
  if (a.mapping.is_entmax()) a.mapping.validate();  // alpha in (1, 2]
  require(c.dtype == DType::bf16 || c.dtype == DType::f16, ErrorCode::unsupported, "dtype",
          "the CUDA decode reads f16 or bf16 KV");
  const int d = c.head_dim;
  require(d == 64 || d == 128 || d == 256, ErrorCode::unsupported, "head_dim",
          "the CUDA decode serves head_dim 64, 128, 256; got ", d);
  require(c.num_kv_heads > 0, ErrorCode::invalid_argument, "num_kv_heads", "must be > 0");
  require(is_pow2(c.page_size) && c.page_size <= 256, ErrorCode::invalid_argument, "page_size",
          "must be a power of two in [1, 256]");
  require(c.num_pages > 0 && c.k && c.v, ErrorCode::invalid_argument, "cache",
          "empty pool or null K/V");
  const auto aligned16 = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
  };
  require(aligned16(c.k) && aligned16(c.v), ErrorCode::invalid_argument, "cache",
          "K and V must be 16-byte aligned");
  require(c.stride_page % 8 == 0 && c.stride_head % 8 == 0 && c.stride_slot % 8 == 0 &&
              c.stride_slot >= d,
          ErrorCode::invalid_argument, "stride",
          "strides must be multiples of 8 elements (16-byte rows), stride_slot >= head_dim");
  const int B = a.q.n0, Hq = a.q.n1;
  require(B >= 0 && c.table.indptr.size() == static_cast<std::size_t>(B) + 1,
          ErrorCode::shape_mismatch, "indptr", "needs batch + 1 entries (batch from q)");
  require(c.table.last_page_len.size() == static_cast<std::size_t>(B), ErrorCode::shape_mismatch,
          "last_page_len", "needs batch entries");
  require(a.q.n2 == d && a.q.data != nullptr, ErrorCode::shape_mismatch, "q",
          "must be [batch][q heads][head_dim]");
  require(Hq > 0 && Hq % c.num_kv_heads == 0, ErrorCode::shape_mismatch, "q",
          "q heads must be a multiple of the kv heads");
  require(a.out.n0 == B && a.out.n1 == Hq && a.out.n2 == d && a.out.data != nullptr,
          ErrorCode::shape_mismatch, "out", "must have q's shape");
  require(a.lse_or_tau.empty() || a.lse_or_tau.size() == static_cast<std::size_t>(B) * Hq,
          ErrorCode::shape_mismatch, "lse_or_tau", "needs 0 or batch * q heads entries");
  require(a.scale >= 0 && std::isfinite(a.scale), ErrorCode::invalid_argument, "scale",
          "must be finite and >= 0 (0: 1/sqrt(d))");
  if (B == 0) return;

  const SelectionView* sel = a.selection;
  int units_max = launch.max_pages_per_seq;
  if (sel) {
    // Token selections: softmax only (decode_tokens.cu); entmax reads page selections.
    require(sel->unit == SelectionView::Unit::page || !a.mapping.is_entmax(),
            ErrorCode::unsupported, "selection",
            "the CUDA entmax decode takes page selections only (token selections: softmax)");
    require(
        sel->batch == B && sel->num_kv_heads == c.num_kv_heads && sel->max_per_head >= 0 &&
            sel->ids.size() == static_cast<std::size_t>(B) * c.num_kv_heads * sel->max_per_head &&
            sel->count.size() == static_cast<std::size_t>(B) * c.num_kv_heads,
        ErrorCode::shape_mismatch, "selection", "shape does not match q and the cache");
    units_max = sel->max_per_head;
  } else {
    require(units_max > 0, ErrorCode::invalid_argument, "max_pages_per_seq",
            "dense decode needs the host's bound on pages per sequence");
  }

  const int group = Hq / c.num_kv_heads;
  const int head_groups = (group + kMaxGroup - 1) / kMaxGroup;
  require(launch.chunk_pages <= kMaxChunkPages, ErrorCode::invalid_argument, "chunk_pages",
          "at most ", kMaxChunkPages);
  DecodeWorkspace::Impl& ws = launch.workspace->impl();
  Params p{};
  p.q = a.q.data;
  p.q_s0 = a.q.s0;
  p.q_s1 = a.q.s1;
  p.out = a.out.data;
  p.o_s0 = a.out.s0;
  p.o_s1 = a.out.s1;
  p.lse = a.lse_or_tau.empty() ? nullptr : a.lse_or_tau.data();
  p.k = static_cast<const std::uint16_t*>(c.k);
  p.v = static_cast<const std::uint16_t*>(c.v);
  p.stride_page = c.stride_page;
  p.stride_head = c.stride_head;
  p.stride_slot = c.stride_slot;
  p.pool_pages = c.num_pages;
  p.num_kv_heads = c.num_kv_heads;
  p.num_q_heads = Hq;
  p.group = group;
  p.head_groups = head_groups;
  int lg = 0;
  while ((1 << lg) < c.page_size) ++lg;
  p.log2_page = lg;
  p.indptr = c.table.indptr.data();
  p.indices = c.table.indices.data();
  p.last_len = c.table.last_page_len.data();
  p.sparse = sel ? 1 : 0;
  p.sel_ids = sel ? sel->ids.data() : nullptr;
  p.sel_count = sel ? sel->count.data() : nullptr;
  p.sel_max = sel ? sel->max_per_head : 0;
  p.max_pages = launch.max_pages_per_seq;
  p.err = ws.err.get();
  p.stamps = launch.phase_stamps;
  const float scale = a.scale > 0 ? a.scale : 1.0f / std::sqrt(static_cast<float>(d));

  if (sel && sel->unit == SelectionView::Unit::token) {
    launch_softmax_tokens(p, c.dtype, d, B, units_max, scale, launch, ws);
  } else if (a.mapping.is_entmax()) {
    launch_entmax(p, EntmaxShape{c.dtype, d, B, units_max, a.mapping.alpha, scale}, launch, ws);
  } else {
    launch_softmax(p, c.dtype, d, B, units_max, scale, launch, ws);
  }
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

}  // namespace masskv::cuda
