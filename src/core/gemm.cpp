// The f32 GEMM driver and scalar panel kernel (see gemm.hpp). Tokens go in blocks of at most
// kTokenBlock; per block the activations are transposed once to [cols][tokens] (zero padded to
// a multiple of 8 tokens), then each thread takes whole 8-row panels: it loads (dequantises)
// the panel's rows once and runs the micro-kernel over all tokens of the block. An output is
// computed by one panel call in a fixed order, so the thread count cannot change it.
#include "core/gemm.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/cpu_features.hpp"

namespace masskv::linalg {

// The transposed block stays in L2 (128 tokens x 576 cols = 288 KiB) and amortises each
// panel's dequantisation over enough tokens.
constexpr std::size_t kTokenBlock = 128;
constexpr std::size_t kPackCols = 64;

void panel_scalar(const float* w, std::size_t ldw, std::size_t K, const float* xt, std::size_t ldx,
                  std::size_t nt, float* c, std::size_t ldc) {
  for (std::size_t t0 = 0; t0 < nt; t0 += 8) {
    for (std::size_t i = 0; i < kPanelRows; ++i) {
      float acc[8] = {};
      const float* wi = w + i * ldw;
      for (std::size_t k = 0; k < K; ++k) {
        const float* xk = xt + k * ldx + t0;
        for (std::size_t t = 0; t < 8; ++t) acc[t] += wi[k] * xk[t];
      }
      std::copy(acc, acc + 8, c + i * ldc + t0);
    }
  }
}

void transpose_scalar(const float* src, std::size_t lds, std::size_t rows, std::size_t cols,
                      float* dst, std::size_t ldd) {
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
  }
}

void gemm_with(const GemmKernels& kern, const void* w, std::size_t stride, std::size_t rows,
               std::size_t cols, const float* x, std::size_t n, float* y) {
  const auto* base = static_cast<const std::uint8_t*>(w);
  const auto panels = static_cast<std::int64_t>((rows + kPanelRows - 1) / kPanelRows);
  // Panel rows one cache line apart from a multiple of 4 KiB, so the 8 rows a kernel streams
  // do not share L1 sets (K = 2048 would put them all in one).
  const std::size_t ldw = (cols + 15) / 16 * 16 + 16;
  static thread_local std::vector<float> xt;
  for (std::size_t t0 = 0; t0 < n; t0 += kTokenBlock) {
    const std::size_t nb = std::min(kTokenBlock, n - t0);
    const std::size_t ldx = (nb + 7) / 8 * 8;
    xt.resize(cols * ldx);
    float* xtp = xt.data();
    const auto kblocks = static_cast<std::int64_t>((cols + kPackCols - 1) / kPackCols);
#pragma omp parallel
    {
      // Transpose in blocks of 64 columns: the 64 destination rows stay in L1 while every
      // token of the block is read once.
#pragma omp for schedule(static)
      for (std::int64_t kb = 0; kb < kblocks; ++kb) {
        const std::size_t k0 = static_cast<std::size_t>(kb) * kPackCols;
        const std::size_t k1 = std::min(cols, k0 + kPackCols);
        kern.transpose(x + t0 * cols + k0, cols, nb, k1 - k0, xtp + k0 * ldx, ldx);
        for (std::size_t k = k0; k < k1; ++k) {
          std::fill(xtp + k * ldx + nb, xtp + (k + 1) * ldx, 0.0f);
        }
      }
#pragma omp for schedule(static)
      for (std::int64_t p = 0; p < panels; ++p) {
        static thread_local std::vector<float> wp, c;
        wp.resize(kPanelRows * ldw);
        c.resize(kPanelRows * ldx);
        const std::size_t r0 = static_cast<std::size_t>(p) * kPanelRows;
        const std::size_t nr = std::min(kPanelRows, rows - r0);
        for (std::size_t i = 0; i < nr; ++i) {
          kern.load(base + (r0 + i) * stride, &wp[i * ldw], cols);
        }
        std::fill(wp.begin() + static_cast<std::ptrdiff_t>(nr * ldw), wp.end(), 0.0f);
        kern.panel(wp.data(), ldw, cols, xtp, ldx, ldx, c.data(), ldx);
        kern.transpose(c.data(), ldx, nr, nb, y + t0 * rows + r0, rows);
      }
    }
  }
}

GemmKernels best_kernels(RowLoadFn load) noexcept {
  const bool simd = cpu::has_avx2() && cpu::simd_allowed();
  return {load, simd ? panel_avx2 : panel_scalar, simd ? transpose_avx2 : transpose_scalar};
}

void matmul_f32(const float* w, std::size_t rows, std::size_t cols, const float* x, std::size_t n,
                float* y) {
  // A copy, as the model's f32 "dequantiser" is: the same bits as model::matmul of an f32 W.
  const RowLoadFn copy = [](const void* src, float* dst, std::size_t m) {
    std::memcpy(dst, src, m * sizeof(float));
  };
  gemm_with(best_kernels(copy), w, cols * sizeof(float), rows, cols, x, n, y);
}

}  // namespace masskv::linalg
