// CUDA causal prefill attention, softmax, dense or block-sparse (issue 10; docs/design.md §3
// Selection at prefill granularity, §4). A CTA owns a 64-token query tile of one
// sequence and kHeads q heads of one kv group (4 warps per head, 16 query rows per warp), and
// walks the key tiles (64 keys) it may attend — every causal tile (dense) or the causal tiles
// of its query block's listed key blocks (sparse) — so each key tile is read once for the
// kHeads heads. Per tile: K and V land in shared memory through cp.async, double-buffered
// (the next tile is in flight while this one is computed); S = Q·Kᵀ and O += P·V run on the
// tensor cores (mma.sync m16n8k16, bf16/f16 in, f32 accumulate; ldmatrix from padded rows, no
// bank conflicts); the online softmax (base 2, docs/design.md §2.6's (o, lse) state) lives in
// registers. Only tiles crossing the diagonal or the sequence end are masked element-wise.
// Kernels of that structure: prefill_kernel here (mma.sync m16n8k16; d = 64, and d = 128 on
// request), and the sm_90a warpgroup-MMA kernels of prefill_wgmma.cu (d = 128; wgmma.cuh); what
// they share is prefill_tile.cuh. This file also holds the host side (plan, checks, launch).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "device.cuh"
#include "masskv/cuda/prefill.hpp"
#include "masskv/error.hpp"
#include "prefill_common.cuh"
#include "prefill_tile.cuh"

namespace masskv::cuda {
namespace prefill_impl {
namespace {

// kPass: softmax, or one of entmax's passes (kHeads 1): the rows' max z (into p.tau, as
// τ0 = max z - 1), a Newton step on τ (p.tau updated in place), or the output.
// Register budget: 4 heads (16 warps) run one CTA per SM at 128 registers a thread; 2 heads
// (8 warps) one CTA with up to 255 (no spills; 8 warps per SM); 1 head (4 warps) two CTAs.
template <bool kBf16, int kD, int kHeads, int kPass = kSoftmax>
__global__ void __launch_bounds__(kHeads * 128, kHeads == 1 ? 2 : 1) prefill_kernel(Params p) {
  constexpr bool kReadV = kPass == kSoftmax || kPass == kEntmaxOut;
  constexpr int kThreads = kHeads * 128;
  constexpr int kRow = row_elems<kD>();
  constexpr int kPieces = kD / 8;  // 16-byte pieces per row
  constexpr int kRowsPerPass = kThreads / kPieces;
  extern __shared__ uint4 smem_raw[];
  std::uint16_t* sQ = reinterpret_cast<std::uint16_t*>(smem_raw);  // [kHeads * 64][kRow]
  std::uint16_t* sK = sQ + kHeads * kTile * kRow;                  // [2][64][kRow]
  std::uint16_t* sV = sK + 2 * kTile * kRow;                       // [2][64][kRow]

  const Cta cta = cta_of(p, kHeads);
  if (!cta.live) return;
  const SeqGeo& g = cta.g;
  const TileList& tl = cta.tl;
  const int kvh = cta.kvh, q_head0 = cta.q_head0, qtile = cta.qtile;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int piece = tid % kPieces;
  // Q tile: row hs * 64 + token, zeros past the sequence's queries.
  for (int r = tid / kPieces; r < kHeads * kTile; r += kRowsPerPass) {
    const int hs = r / kTile, i = qtile * kTile + r % kTile;
    const bool ok = i < g.nq;
    const std::uint16_t* src =
        p.q + (ok ? (g.q_begin + i) * p.q_s0 + (q_head0 + hs) * p.q_s1 + piece * 8 : 0);
    cp_async16(sQ + r * kRow + piece * 8, src, ok ? 16 : 0);
  }
  cp_async_commit();

  const auto issue = [&](int tile, int stage) {
#pragma unroll
    for (int j = 0; j < kTile / kRowsPerPass; ++j) {
      const int r = tid / kPieces + j * kRowsPerPass;
      const int pos = tile * kTile + r;
      const std::int64_t row = pos < g.length ? key_row(p.t, g, kvh, pos, p.err) : -1;
      const std::int64_t off = row < 0 ? 0 : row + piece * 8;
      const int bytes = row < 0 ? 0 : 16;
      cp_async16(sK + (stage * kTile + r) * kRow + piece * 8, p.k + off, bytes);
      if constexpr (kReadV) cp_async16(sV + (stage * kTile + r) * kRow + piece * 8, p.v + off, bytes);
    }
  };

  // The warp's 16 query rows: head slot hs, tokens t0 .. t0 + 15 of the tile.
  const int hs = warp / 4, t0 = (warp % 4) * 16;
  const int gq = lane / 4, tq = lane % 4;            // mma fragment row group and column pair
  const int qpos0 = g.first_q + qtile * kTile + t0;  // position of the warp's row 0
  const bool warp_live = qtile * kTile + t0 < g.nq;
  const std::uint16_t* qbase = sQ + (hs * kTile + t0) * kRow;

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[n][c] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // Entmax: the rows' τ (Newton and output passes), f(τ) and -f'(τ) (Newton).
  const int hq = q_head0 + hs;
  const auto row_of = [&](int r) { return qtile * kTile + t0 + gq + 8 * r; };
  float tau[2] = {NAN, NAN}, f[2] = {0.f, 0.f}, df[2] = {0.f, 0.f};
  if constexpr (kPass == kEntmaxNewton || kPass == kEntmaxOut) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row_of(r) < g.nq)
        tau[r] = p.tau[(static_cast<std::int64_t>(g.q_begin) + row_of(r)) * p.num_q_heads + hq];
  }

  const auto compute = [&](int tile, int stage) {
    const int kpos0 = tile * kTile;
    if (!warp_live || kpos0 > qpos0 + 15) return;  // every key after every row's query
    const std::uint16_t* kb = sK + stage * kTile * kRow;
    const std::uint16_t* vb = sV + stage * kTile * kRow;
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] = 0.f;
        // S = Q Kᵀ: A from the Q rows, B from K rows (key = column of S).
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      unsigned a[4];
      ldsm_x4(a, qbase + (lane % 16) * kRow + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        unsigned bk[4];
        ldsm_x4(bk, kb + (np * 16 + lane % 8 + (lane / 16) * 8) * kRow + kk * 16 +
                        ((lane / 8) % 2) * 8);
        mma16816<kBf16>(s[2 * np], a, bk[0], bk[1]);
        mma16816<kBf16>(s[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    if constexpr (kPass == kSoftmax) {
      float m_use[2];
      softmax_tile<kD>(s, o, m, l, m_use, kpos0, qpos0, g.length, gq, tq, p.scale_log2);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[n][c] = exp2_approx(fmaf(s[n][c], p.scale_log2, -m_use[c >> 1]));
          l[c >> 1] += s[n][c];
        }
    } else if constexpr (kPass == kEntmaxMax) {
      mask_tile(s, kpos0, qpos0, g.length, gq, tq);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) m[c >> 1] = fmaxf(m[c >> 1], s[n][c]);
    } else {
      mask_tile(s, kpos0, qpos0, g.length, gq, tq);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float t = fmaf(s[n][c], p.ent_za, -tau[c >> 1]);  // -inf - τ: no weight
          if constexpr (kPass == kEntmaxNewton) {
            if (t > 0.f) {
              f[c >> 1] += weight(t, p.ent_pow_int, p.ent_pow_exp);
              df[c >> 1] += p.ent_pow_int == 1   ? 1.f
                            : p.ent_pow_int == 2 ? 2.f * t
                                                 : p.ent_pow_exp * powf(t, p.ent_pow_exp - 1.f);
            }
          } else {
            s[n][c] = weight(t, p.ent_pow_int, p.ent_pow_exp);
            l[c >> 1] += s[n][c];
          }
        }
    }
    if constexpr (kReadV) {
      // O += P V: P's accumulator layout is the A layout of the next mma (keys 16kk ..
      // 16kk+15 are S's n-tiles 2kk and 2kk+1); V rows through ldmatrix.trans.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const unsigned a[4] = {pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]),
                               pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]),
                               pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < kD / 16; ++dp) {
          unsigned bv[4];
          ldsm_x4_trans(bv, vb + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kRow + dp * 16 +
                                (lane / 16) * 8);
          mma16816<kBf16>(o[2 * dp], a, bv[0], bv[1]);
          mma16816<kBf16>(o[2 * dp + 1], a, bv[2], bv[3]);
        }
      }
    }
  };

  // Double-buffered walk: tile `cur` is computed while tile `nxt` is in flight.
  int cur = tl.next(0), stage = 0;
  if (cur < tl.items) issue(tl.tile(cur), 0);
  cp_async_commit();
  while (cur < tl.items) {
    const int nxt = tl.next(cur + 1);
    if (nxt < tl.items) issue(tl.tile(nxt), stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    compute(tl.tile(cur), stage);
    __syncthreads();
    cur = nxt;
    stage ^= 1;
  }
  cp_async_wait<0>();

  if constexpr (kPass == kSoftmax) {
    store_rows<kBf16, kD>(p, g, qtile * kTile + t0, hq, gq, tq, o, m, l);
  } else if constexpr (kPass == kEntmaxOut) {
    store_rows<kBf16, kD, true>(p, g, qtile * kTile + t0, hq, gq, tq, o, tau, l);
  } else {
    entmax_rows_done<kPass>(p, g, row_of(0), hq, tq, m, f, df, tau);
  }
}

template <bool kBf16, int kD, int kHeads, int kPass = kSoftmax>
KernelInfo info() {
  return {prefill_kernel<kBf16, kD, kHeads, kPass>, smem_bytes<kD, kHeads>(), kHeads * 128};
}
// An entmax pass (one q head per CTA).
template <int kPass>
KernelInfo entmax_info(bool bf, int d) {
  return bf ? (d == 64 ? info<true, 64, 1, kPass>() : info<true, 128, 1, kPass>())
            : (d == 64 ? info<false, 64, 1, kPass>() : info<false, 128, 1, kPass>());
}
template <bool kBf16, int kD>
KernelInfo info_by_heads(int heads) {
  return heads == 4   ? info<kBf16, kD, 4>()
         : heads == 2 ? info<kBf16, kD, 2>()
                      : info<kBf16, kD, 1>();
}

// Which kernel runs a launch (see kernel_kind).
enum class Kind { mma, wgmma, ws };

// The kernel for (dtype, d, q heads per CTA, kind) or for an entmax pass (pass != kSoftmax:
// the mma.sync kernel, one head per CTA), its shared-memory limit raised once.
KernelInfo prepare(DType dtype, int d, int heads, Kind kind, int pass = kSoftmax) {
  const bool bf = dtype == DType::bf16;
  KernelInfo k;
  int key;
  if (pass != kSoftmax) {
    k = pass == kEntmaxMax      ? entmax_info<kEntmaxMax>(bf, d)
        : pass == kEntmaxNewton ? entmax_info<kEntmaxNewton>(bf, d)
                                : entmax_info<kEntmaxOut>(bf, d);
    key = 20 + (pass - 1) * 4 + (bf ? 0 : 2) + (d == 64 ? 0 : 1);
  } else if (kind == Kind::ws) {
    k = ws_kernel(bf);
    key = 18 + (bf ? 0 : 1);
  } else if (kind == Kind::wgmma) {
    k = wgmma_kernel(bf, heads);
    key = 12 + (bf ? 0 : 3) + (heads == 4 ? 2 : heads == 2 ? 1 : 0);
  } else {
    k = bf ? (d == 64 ? info_by_heads<true, 64>(heads) : info_by_heads<true, 128>(heads))
           : (d == 64 ? info_by_heads<false, 64>(heads) : info_by_heads<false, 128>(heads));
    key = (bf ? 0 : 6) + (d == 64 ? 0 : 3) + (heads == 4 ? 2 : heads == 2 ? 1 : 0);
  }
  static std::mutex mu;
  static bool ready[32] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[key]) {
    detail::set_dynamic_smem(k.fn, k.smem, "the prefill kernel");
    ready[key] = true;
  }
  return k;
}

bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

// q heads per CTA of the mma.sync and wgmma kernels: 4 when the group allows (each key tile read
// once per 4 heads), else 2 or 1; at most cap (PrefillLaunch::max_heads_per_cta: 1, 2 or 4).
int heads_per_cta(int group, int cap) {
  for (int h = cap; h > 1; h /= 2)
    if (group % h == 0) return h;
  return 1;
}
// d = 128 runs the warp-specialised kernel (4 q heads per CTA) when 4 divides the group, else
// the wgmma kernel with heads_per_cta's q heads per CTA (one warpgroup each: 4 when the group
// allows, else 2 or 1); d = 64 the mma.sync kernel. PrefillLaunch::kernel may select the older
// kernels for d = 128 (wgmma or mma), for comparing them on a device. Before sm_90
// (hopper_paths): the mma.sync kernel for every d. More q heads per CTA is faster, and every
// wgmma form beats mma.sync except 1 head (docs/gpu-results.md, tuning notes).
Kind kernel_kind(int d, int group, PrefillLaunch::Kernel forced) {
  using enum PrefillLaunch::Kernel;
  if (d != 128 || forced == mma) return Kind::mma;
  require(forced != wgmma || detail::hopper_paths(), ErrorCode::unsupported, "kernel",
          "the wgmma kernels need sm_90a");
  if (!detail::hopper_paths()) return Kind::mma;
  if (forced == wgmma || group % 4 != 0) return Kind::wgmma;
  return Kind::ws;
}
bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

}  // namespace

SeqTables seq_tables(const kv::PagedKVView& c, std::span<const std::int32_t> q_indptr, int total_q,
                     int max_q) {
  SeqTables t{};
  t.indptr = c.table.indptr.data();
  t.indices = c.table.indices.data();
  t.last_len = c.table.last_page_len.data();
  t.q_indptr = q_indptr.data();
  t.pool_pages = c.num_pages;
  int lg = 0;
  while ((1 << lg) < c.page_size) ++lg;
  t.log2_page = lg;
  t.max_q = max_q;
  t.total_q = total_q;
  t.stride_page = c.stride_page;
  t.stride_head = c.stride_head;
  t.stride_slot = c.stride_slot;
  return t;
}

int validate_common(const View3<const std::uint16_t>& q, std::span<const std::int32_t> q_indptr,
                    const kv::PagedKVView& c, const PrefillLaunch& launch) {
  require(launch.workspace != nullptr, ErrorCode::invalid_argument, "workspace", "is required");
  require(c.dtype == DType::bf16 || c.dtype == DType::f16, ErrorCode::unsupported, "dtype",
          "the CUDA prefill reads f16 or bf16 Q, K and V");
  const int d = c.head_dim;
  require(d == 64 || d == 128, ErrorCode::unsupported, "head_dim",
          "the CUDA prefill serves head_dim 64 and 128; got ", d);
  require(c.num_kv_heads > 0, ErrorCode::invalid_argument, "num_kv_heads", "must be > 0");
  require(is_pow2(c.page_size) && c.page_size <= 256, ErrorCode::invalid_argument, "page_size",
          "must be a power of two in [1, 256]");
  require(c.num_pages > 0 && c.k && c.v && aligned16(c.k) && aligned16(c.v),
          ErrorCode::invalid_argument, "cache", "empty pool, or K/V null or not 16-byte aligned");
  require(c.stride_page % 8 == 0 && c.stride_head % 8 == 0 && c.stride_slot % 8 == 0 &&
              c.stride_slot >= d,
          ErrorCode::invalid_argument, "stride",
          "strides must be multiples of 8 elements (16-byte rows), stride_slot >= head_dim");
  const std::size_t B1 = c.table.indptr.size();
  require(B1 >= 1 && c.table.last_page_len.size() == B1 - 1, ErrorCode::shape_mismatch,
          "last_page_len", "needs batch entries (batch = indptr entries - 1)");
  require(q_indptr.size() == B1, ErrorCode::shape_mismatch, "q_indptr",
          "needs batch + 1 entries (as the cache's indptr)");
  require(q.data != nullptr && q.n2 == d && q.n0 >= 0 && q.n1 > 0 && q.n1 % c.num_kv_heads == 0,
          ErrorCode::shape_mismatch, "q",
          "must be [total_q][q heads][head_dim], q heads a multiple of the kv heads");
  require(aligned16(q.data) && q.s0 % 8 == 0 && q.s1 % 8 == 0 && q.s1 >= d,
          ErrorCode::invalid_argument, "q",
          "rows must be 16-byte aligned (strides multiples of 8 elements, s1 >= head_dim)");
  require(launch.max_q_per_seq > 0, ErrorCode::invalid_argument, "max_q_per_seq",
          "the host's bound on new tokens per sequence is required");
  require(B1 - 1 <= 65535 && q.n1 <= 65535 * 4, ErrorCode::invalid_argument, "q",
          "at most 65535 sequences");
  return static_cast<int>(B1 - 1);
}

}  // namespace prefill_impl

using namespace prefill_impl;

PrefillWorkspace::PrefillWorkspace() : impl_(std::make_unique<Impl>()) {}
PrefillWorkspace::~PrefillWorkspace() = default;

void PrefillWorkspace::check(CUstream_st* stream) const {
  const unsigned flag = impl_->err.take(stream, "prefill step");
  if (flag == 0) return;
  if (flag & kBadPhysical)
    fail(ErrorCode::out_of_range, "indices", "a page id outside [0, num_pages) was met on the GPU");
  if (flag & kBadLastLen)
    fail(ErrorCode::out_of_range, "last_page_len", "a value outside [1, page_size] on the GPU");
  if (flag & kBadIndptr) fail(ErrorCode::out_of_range, "indptr", "decreasing (met on the GPU)");
  if (flag & kBadQIndptr)
    fail(ErrorCode::out_of_range, "q_indptr",
         "decreasing, past the queries, or a sequence with more new tokens than its length or "
         "PrefillLaunch::max_q_per_seq");
  if (flag & kBadCapacity)
    fail(ErrorCode::shape_mismatch, "max_per_row",
         "a selected list is longer than max_per_row (size it with prefill_index_capacity)");
  fail(ErrorCode::out_of_range, "block_selection",
       "a count outside [0, max_per_row], a key-block id outside the sequence or not strictly "
       "ascending, or q_block_indptr not matching the query blocks");
}

void prefill(const PrefillArgs& a, const PrefillLaunch& launch) {
  const kv::PagedKVView& c = a.cache;
  const int B = validate_common(a.q, a.q_indptr, c, launch);
  const int d = c.head_dim, Hq = a.q.n1, Hkv = c.num_kv_heads, total_q = a.q.n0;
  const PrefillOut& out = a.out;
  require(out.data != nullptr && (out.dtype == DType::f32 || out.dtype == c.dtype),
          ErrorCode::unsupported, "out", "f32 or the input dtype");
  const bool out_f32 = out.dtype == DType::f32;
  require(out.s1 >= d && out.s0 >= out.s1 * (Hq - 1) + d && out.s0 % 2 == 0 && out.s1 % 2 == 0 &&
              reinterpret_cast<std::uintptr_t>(out.data) % (out_f32 ? 8 : 4) == 0,
          ErrorCode::invalid_argument, "out",
          "[total_q][q heads][head_dim] with even strides and 2-element aligned rows");
  require(a.lse.empty() || a.lse.size() == static_cast<std::size_t>(total_q) * Hq,
          ErrorCode::shape_mismatch, "lse", "needs 0 or total_q * q heads entries");
  require(a.scale >= 0 && std::isfinite(a.scale), ErrorCode::invalid_argument, "scale",
          "must be finite and >= 0 (0: 1/sqrt(d))");
  if (a.mapping.is_entmax()) a.mapping.validate();  // throws naming "alpha"
  require(launch.max_heads_per_cta == 1 || launch.max_heads_per_cta == 2 ||
              launch.max_heads_per_cta == 4,
          ErrorCode::invalid_argument, "max_heads_per_cta", "must be 1, 2 or 4, got ",
          launch.max_heads_per_cta);

  Params p{};
  const PrefillBlockSelection* sel = a.selection;
  if (sel) {
    require(
        (sel->q_block == 64 || sel->q_block == 128) && (sel->k_block == 64 || sel->k_block == 128),
        ErrorCode::unsupported, "block_selection", "q_block and k_block must be 64 or 128");
    require(sel->num_heads == 1 || sel->num_heads == Hkv, ErrorCode::shape_mismatch,
            "block_selection", "num_heads must be 1 or the kv heads");
    require(sel->max_per_row >= 0 && sel->q_block_indptr.size() == static_cast<std::size_t>(B) + 1,
            ErrorCode::shape_mismatch, "block_selection",
            "max_per_row >= 0 and q_block_indptr of batch + 1 entries");
    const std::size_t rows = sel->count.size() / sel->num_heads;
    require(sel->count.size() % sel->num_heads == 0 &&
                sel->ids.size() == rows * sel->num_heads * sel->max_per_row && rows <= INT32_MAX,
            ErrorCode::shape_mismatch, "block_selection",
            "ids must be [rows][num_heads][max_per_row] and count [rows][num_heads]");
    p.sparse = 1;
    p.q_block = sel->q_block;
    p.k_block = sel->k_block;
    p.sel_heads = sel->num_heads;
    p.sel_max = sel->max_per_row;
    p.sel_rows = static_cast<int>(rows);
    p.qb_indptr = sel->q_block_indptr.data();
    p.sel_ids = sel->ids.data();
    p.sel_count = sel->count.data();
  }
  if (B == 0 || total_q == 0) return;

  const bool entmax = a.mapping.is_entmax();
  const int group = Hq / Hkv;
  const Kind kind = entmax ? Kind::mma : kernel_kind(d, group, launch.kernel);
  const int heads =
      entmax ? 1 : kind == Kind::ws ? 4 : heads_per_cta(group, launch.max_heads_per_cta);
  p.t = seq_tables(c, a.q_indptr, total_q, launch.max_q_per_seq);
  p.q = a.q.data;
  p.q_s0 = a.q.s0;
  p.q_s1 = a.q.s1;
  p.k = static_cast<const std::uint16_t*>(c.k);
  p.v = static_cast<const std::uint16_t*>(c.v);
  p.out = out.data;
  p.out_f32 = out_f32 ? 1 : 0;
  p.o_s0 = out.s0;
  p.o_s1 = out.s1;
  p.lse = a.lse.empty() ? nullptr : a.lse.data();
  p.num_kv_heads = Hkv;
  p.num_q_heads = Hq;
  p.group = group;
  p.head_groups = group / heads;
  const float scale = a.scale > 0 ? a.scale : 1.0f / std::sqrt(static_cast<float>(d));
  p.scale_log2 = scale * kLog2e;
  PrefillWorkspace::Impl& ws = launch.workspace->impl();
  p.err = ws.err.get();

  const dim3 grid((launch.max_q_per_seq + kTile - 1) / kTile, Hkv * p.head_groups, B);
  require(grid.y <= 65535, ErrorCode::invalid_argument, "q", "too many q head groups");
  const auto run = [&](int pass) {
    const KernelInfo k = prepare(c.dtype, d, heads, kind, pass);
    k.fn<<<grid, k.threads, k.smem, launch.stream>>>(p);
    check_cuda(cudaGetLastError(), "prefill kernel launch");
  };
  if (entmax) {
    const double alpha = a.mapping.alpha, e = 1.0 / (alpha - 1.0);
    p.ent_za = static_cast<float>((alpha - 1.0) * scale);
    p.ent_pow_exp = static_cast<float>(e);
    p.ent_pow_int = e == 1.0 ? 1 : e == 2.0 ? 2 : 0;
    ws.tau.reserve(static_cast<std::size_t>(total_q) * Hq, "cudaMalloc(prefill tau)");
    p.tau = ws.tau.data();
    p.newton = ws.newton.get();
    run(kEntmaxMax);
    // Newton from below converges in a handful of steps (quadratically near the root); the
    // cap only guards against a flag that never clears.
    constexpr int kMaxNewton = 100;
    bool converged = false;
    for (int it = 0; it < kMaxNewton && !converged; ++it) {
      run(kEntmaxNewton);
      converged = ws.newton.take(launch.stream, "prefill entmax step") == 0;
    }
    require(converged, ErrorCode::non_finite, "q",
            "the entmax threshold did not converge in 100 Newton steps (scores out of range?)");
    run(kEntmaxOut);
  } else {
    run(kSoftmax);
  }
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

}  // namespace masskv::cuda
