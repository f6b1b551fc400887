// The arrays masskv.engine_pages returns, made once for the CPU path (NumPy, bind_select.cpp)
// and the CUDA one (torch, cuda_calls.cpp): ids (L, K) and count (L,), and with csr
// FlashInfer's table of the selection, indptr (L + 1,), indices (L * K,), last_page_len (L,).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "arrays.hpp"
#include "masskv/kv/engine_pages.hpp"

namespace masskv::py {

// alloc(name, shape) -> {the array object, its int32 data}: a fresh C-contiguous int32 array.
// Fills `out`'s spans (and max_per_list = K) and returns the dict of the arrays.
template <class Alloc>
nb::dict engine_outputs(std::size_t L, std::size_t K, bool csr, kv::EnginePagesOut& out,
                        Alloc&& alloc) {
  nb::dict d;
  const auto add = [&](const char* name, std::vector<std::size_t> shape) {
    std::size_t n = 1;
    for (std::size_t s : shape) n *= s;
    auto [obj, data] = alloc(name, std::move(shape));
    d[name] = obj;
    return std::span<std::int32_t>(data, n);
  };
  out.max_per_list = static_cast<int>(K);
  out.ids = add("ids", {L, K});
  out.count = add("count", {L});
  if (csr) {
    out.indptr = add("indptr", {L + 1});
    out.indices = add("indices", {L * K});
    out.last_page_len = add("last_page_len", {L});
  }
  return d;
}

}  // namespace masskv::py
