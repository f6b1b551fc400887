// The prefill matmul (quant.hpp): the f32 GEMM of core/gemm.hpp with the type's dequantiser
// as its row loader.
#include "core/gemm.hpp"
#include "masskv/error.hpp"
#include "masskv/model/quant.hpp"
#include "model/quant_kernels.hpp"

namespace masskv::model {

void matmul(GgmlType type, const void* w, std::size_t rows, std::size_t cols, const float* x,
            std::size_t n, float* y) {
  const TypeTraits& t = type_traits(type);
  require(t.compute, ErrorCode::unsupported, "type", "tensor type ", t.name,
          " has no dequantisation kernel");
  const std::size_t stride = row_bytes(type, cols, "cols");
  linalg::gemm_with(linalg::best_kernels(kernels::best_dequant(type)), w, stride, rows, cols, x, n,
                    y);
}

}  // namespace masskv::model
