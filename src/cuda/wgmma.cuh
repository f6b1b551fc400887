// Hopper warpgroup MMA (wgmma, sm_90a) for the prefill kernel: shared-memory matrix
// descriptors over the unswizzled "core matrix" layout, and the two products of an attention
// tile, S = Q·Kᵀ (64 × 64 × 128) and O += P·V (64 × 128 × 64, in two halves of 32 keys), issued,
// committed and waited for in asm statements that list the accumulators (the compiler then never
// reads an accumulator register between the asynchronous write and the wait; the first P·V half
// is waited for by the second).
//
// Layout of a [rows][128] 16-bit tile in shared memory (Q, K and V alike): core matrices of
// 8 rows × 16 bytes stored as 128 contiguous bytes; along a row the 16 core matrices of a
// row group are 128 bytes apart, row groups 2048 bytes apart. For Q·Kᵀ (both K-major: the
// reduction dimension d is contiguous) the leading byte offset (between core matrices along
// the reduction) is 128 and the stride byte offset (along M or N) 2048; for P·V, V is
// MN-major (d, the N dimension, contiguous; transposed operand), its core matrices are 2048
// bytes apart along the reduction (keys) and 128 along N.
#pragma once

#include <cstdint>

namespace masskv::cuda::wgmma {

constexpr int kRowGroupElems = 1024;  // 8 rows × 128 elements: one row group, 2048 bytes
constexpr int kCoreElems = 64;        // one core matrix, 128 bytes

// Element offset of (row, 16-byte piece) of a [rows][128] tile in the core-matrix layout.
__device__ __forceinline__ int tile_offset(int row, int piece) {
  return (row / 8) * kRowGroupElems + piece * kCoreElems + (row % 8) * 8;
}

// Matrix descriptor: start address, leading and stride byte offsets (all >> 4), no swizzle.
__device__ __forceinline__ std::uint64_t desc(const void* smem, unsigned lbo, unsigned sbo) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  return static_cast<std::uint64_t>((addr >> 4) & 0x3fff) |
         (static_cast<std::uint64_t>((lbo >> 4) & 0x3fff) << 16) |
         (static_cast<std::uint64_t>((sbo >> 4) & 0x3fff) << 32);
}
__device__ __forceinline__ std::uint64_t desc_k_major(const void* smem) {
  return desc(smem, 128, 2048);
}
__device__ __forceinline__ std::uint64_t desc_mn_major(const void* smem) {
  return desc(smem, 2048, 128);
}

// Writes by threads (cp.async, st.shared) become visible to wgmma's reads of shared memory
// (the async proxy) after this fence and a barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define MASSKV_WG_S32(x)                                                                        \
  "+f"(x[0][0]), "+f"(x[0][1]), "+f"(x[0][2]), "+f"(x[0][3]), "+f"(x[1][0]), "+f"(x[1][1]),     \
      "+f"(x[1][2]), "+f"(x[1][3]), "+f"(x[2][0]), "+f"(x[2][1]), "+f"(x[2][2]), "+f"(x[2][3]), \
      "+f"(x[3][0]), "+f"(x[3][1]), "+f"(x[3][2]), "+f"(x[3][3]), "+f"(x[4][0]), "+f"(x[4][1]), \
      "+f"(x[4][2]), "+f"(x[4][3]), "+f"(x[5][0]), "+f"(x[5][1]), "+f"(x[5][2]), "+f"(x[5][3]), \
      "+f"(x[6][0]), "+f"(x[6][1]), "+f"(x[6][2]), "+f"(x[6][3]), "+f"(x[7][0]), "+f"(x[7][1]), \
      "+f"(x[7][2]), "+f"(x[7][3])

#define MASSKV_WG_D32                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// S = Q·Kᵀ for one warpgroup: 64 query rows (A, K-major in shared memory) × 64 keys (B,
// K-major), d = 128 as 8 steps of k16 (each step 2 core matrices = 256 bytes further along
// both operands: +16 in the descriptors' address field). s[n][c] is the m16n8 accumulator
// layout of the warp's 16 rows (n-th 8-key column block).
// S is waited for: issuing it without the wait, the next tile's loads in its shadow, made the
// 4-head kernel spill and no faster (docs/gpu-results.md, tuning notes).
// kWait = false returns with the MMAs committed, not waited for (wait_s waits).
template <bool kBf16, bool kWait = true>
__device__ __forceinline__ void qk(float (&s)[8][4], std::uint64_t da, std::uint64_t db) {
#define MASSKV_WG_QK_STEP(T, P)                                                                \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " " MASSKV_WG_D32 ", a, b, " P         \
  ", 1, 1, 0, 0;\n"
#define MASSKV_WG_QK_NEXT "add.s64 a, a, 16;\nadd.s64 b, b, 16;\n"
#define MASSKV_WG_QK(T, WAIT)                                                                  \
  asm volatile("{\n.reg .pred pz, po;\n.reg .b64 a, b;\n"                                       \
               "setp.ne.b32 pz, %34, 0;\nsetp.eq.b32 po, %34, 0;\n"                             \
               "mov.b64 a, %32;\nmov.b64 b, %33;\n"                                             \
               "wgmma.fence.sync.aligned;\n" MASSKV_WG_QK_STEP(T, "pz")                         \
               MASSKV_WG_QK_NEXT MASSKV_WG_QK_STEP(T, "po")                                      \
               MASSKV_WG_QK_NEXT MASSKV_WG_QK_STEP(T, "po")                                      \
               MASSKV_WG_QK_NEXT MASSKV_WG_QK_STEP(T, "po")                                      \
               MASSKV_WG_QK_NEXT MASSKV_WG_QK_STEP(T, "po")                                      \
               MASSKV_WG_QK_NEXT MASSKV_WG_QK_STEP(T, "po")                                      \
               MASSKV_WG_QK_NEXT MASSKV_WG_QK_STEP(T, "po")                                      \
               MASSKV_WG_QK_NEXT MASSKV_WG_QK_STEP(T, "po")                                      \
               "wgmma.commit_group.sync.aligned;\n" WAIT "}\n"                                 \
               : MASSKV_WG_S32(s)                                                                \
               : "l"(da), "l"(db), "r"(0)                                                        \
               : "memory")
#define MASSKV_WG_QK_WAIT "wgmma.wait_group.sync.aligned 0;\n"
  if constexpr (kBf16 && kWait) {
    MASSKV_WG_QK("bf16", MASSKV_WG_QK_WAIT);
  } else if constexpr (kBf16) {
    MASSKV_WG_QK("bf16", "");
  } else if constexpr (kWait) {
    MASSKV_WG_QK("f16", MASSKV_WG_QK_WAIT);
  } else {
    MASSKV_WG_QK("f16", "");
  }
#undef MASSKV_WG_QK_WAIT
#undef MASSKV_WG_QK
#undef MASSKV_WG_QK_NEXT
#undef MASSKV_WG_QK_STEP
}

#define MASSKV_WG_O64(x)                                                                       \
  MASSKV_WG_S32(x), "+f"(x[8][0]), "+f"(x[8][1]), "+f"(x[8][2]), "+f"(x[8][3]), "+f"(x[9][0]), \
      "+f"(x[9][1]), "+f"(x[9][2]), "+f"(x[9][3]), "+f"(x[10][0]), "+f"(x[10][1]),             \
      "+f"(x[10][2]), "+f"(x[10][3]), "+f"(x[11][0]), "+f"(x[11][1]), "+f"(x[11][2]),          \
      "+f"(x[11][3]), "+f"(x[12][0]), "+f"(x[12][1]), "+f"(x[12][2]), "+f"(x[12][3]),          \
      "+f"(x[13][0]), "+f"(x[13][1]), "+f"(x[13][2]), "+f"(x[13][3]), "+f"(x[14][0]),          \
      "+f"(x[14][1]), "+f"(x[14][2]), "+f"(x[14][3]), "+f"(x[15][0]), "+f"(x[15][1]),          \
      "+f"(x[15][2]), "+f"(x[15][3])

#define MASSKV_WG_D64                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "     \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, " \
  "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, " \
  "%55, %56, %57, %58, %59, %60, %61, %62, %63}"

// O += P·V for one warpgroup over 32 keys: P (64 rows × 32 keys) from registers, p[kk] the
// A fragment of keys 16kk .. 16kk + 15 (the m16n8k16 A layout); V (32 keys × 128) MN-major in
// shared memory, transposed operand; the second step is 16 keys = 2 row groups = 4096 bytes
// further (+256). Half a tile per call keeps P's registers to 8 (the 4-head kernel's budget).
// kWait = false returns with the MMAs in flight (committed, not waited for): the caller's next
// pv<.., true> waits for both groups, and nothing may touch o or p in between.
template <bool kBf16, bool kWait>
__device__ __forceinline__ void pv(float (&o)[16][4], const unsigned (&p)[2][4],
                                   std::uint64_t dv) {
#define MASSKV_WG_PV_STEP(T, A0, A1, A2, A3)                                                \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " " MASSKV_WG_D64 ", {%" A0 ", %" A1 \
  ", %" A2 ", %" A3 "}, b, po, 1, 1, 1;\n"
#define MASSKV_WG_PV(T, WAIT)                                                                \
  asm volatile("{\n.reg .b64 b;\n.reg .pred po;\nsetp.eq.b32 po, %73, 0;\nmov.b64 b, %72;\n" \
               "wgmma.fence.sync.aligned;\n" MASSKV_WG_PV_STEP(T, "64", "65", "66", "67")   \
               "add.s64 b, b, 256;\n" MASSKV_WG_PV_STEP(T, "68", "69", "70", "71")          \
               "wgmma.commit_group.sync.aligned;\n"                                          \
               WAIT "}\n"                                                                   \
               : MASSKV_WG_O64(o)                                                            \
               : "r"(p[0][0]), "r"(p[0][1]), "r"(p[0][2]), "r"(p[0][3]), "r"(p[1][0]),       \
                 "r"(p[1][1]), "r"(p[1][2]), "r"(p[1][3]), "l"(dv), "r"(0)                   \
               : "memory")
#define MASSKV_WG_WAIT "wgmma.wait_group.sync.aligned 0;\n"
  if constexpr (kBf16 && kWait) {
    MASSKV_WG_PV("bf16", MASSKV_WG_WAIT);
  } else if constexpr (kBf16) {
    MASSKV_WG_PV("bf16", "");
  } else if constexpr (kWait) {
    MASSKV_WG_PV("f16", MASSKV_WG_WAIT);
  } else {
    MASSKV_WG_PV("f16", "");
  }
#undef MASSKV_WG_WAIT
#undef MASSKV_WG_PV
#undef MASSKV_WG_PV_STEP
}

// The warp-specialised kernel's P·V: issued and committed, not waited for (wait_o below
// waits, listing the accumulators, so nothing reads them before).
// O += P·V over a whole 64-key tile: pa[kk] the A fragment of keys 16kk .. 16kk + 15, V
// MN-major (4 steps, +256 each: 2 row groups).
template <bool kBf16>
__device__ __forceinline__ void pv_issue(float (&o)[16][4], const unsigned (&pa)[4][4],
                                         std::uint64_t dv) {
#define MASSKV_WG_PVT_STEP(T, A)                                                                \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " " MASSKV_WG_D64 ", " A             \
  ", b, po, 1, 1, 1;\n"
#define MASSKV_WG_PVT(T)                                                                       \
  asm volatile("{\n.reg .b64 b;\n.reg .pred po;\nsetp.eq.b32 po, %81, 0;\nmov.b64 b, %80;\n"  \
               "wgmma.fence.sync.aligned;\n" MASSKV_WG_PVT_STEP(T, "{%64, %65, %66, %67}")    \
               "add.s64 b, b, 256;\n" MASSKV_WG_PVT_STEP(T, "{%68, %69, %70, %71}")           \
               "add.s64 b, b, 256;\n" MASSKV_WG_PVT_STEP(T, "{%72, %73, %74, %75}")           \
               "add.s64 b, b, 256;\n" MASSKV_WG_PVT_STEP(T, "{%76, %77, %78, %79}")           \
               "wgmma.commit_group.sync.aligned;\n}\n"                                         \
               : MASSKV_WG_O64(o)                                                              \
               : "r"(pa[0][0]), "r"(pa[0][1]), "r"(pa[0][2]), "r"(pa[0][3]), "r"(pa[1][0]),    \
                 "r"(pa[1][1]), "r"(pa[1][2]), "r"(pa[1][3]), "r"(pa[2][0]), "r"(pa[2][1]),    \
                 "r"(pa[2][2]), "r"(pa[2][3]), "r"(pa[3][0]), "r"(pa[3][1]), "r"(pa[3][2]),    \
                 "r"(pa[3][3]), "l"(dv), "r"(0)                                                \
               : "memory")
  if constexpr (kBf16) {
    MASSKV_WG_PVT("bf16");
  } else {
    MASSKV_WG_PVT("f16");
  }
#undef MASSKV_WG_PVT
#undef MASSKV_WG_PVT_STEP
}

// Wait until at most kPending committed groups are in flight (groups complete in order),
// listing the accumulators the caller reads next.
template <int kPending>
__device__ __forceinline__ void wait_s(float (&s)[8][4]) {
  asm volatile("wgmma.wait_group.sync.aligned %32;\n" : MASSKV_WG_S32(s) : "n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void wait_o(float (&o)[16][4]) {
  asm volatile("wgmma.wait_group.sync.aligned %64;\n" : MASSKV_WG_O64(o) : "n"(kPending) : "memory");
}

#undef MASSKV_WG_S32
#undef MASSKV_WG_D32
#undef MASSKV_WG_O64
#undef MASSKV_WG_D64

}  // namespace masskv::cuda::wgmma
