// Non-owning strided views passed across stage boundaries (docs/design.md §4: every stage is a
// plain function over views, so CPU and CUDA versions share one signature).
#pragma once

#include <cstdint>

namespace masskv {

// [n0][n1][n2] with strides (elements) s0, s1 and unit stride on the last axis.
// Used for q / o of shape [tokens][heads][head_dim].
template <class T>
struct View3 {
  T* data = nullptr;
  int n0 = 0, n1 = 0, n2 = 0;
  std::int64_t s0 = 0, s1 = 0;

  static View3 contiguous(T* p, int a, int b, int c) {
    return {p, a, b, c, static_cast<std::int64_t>(b) * c, c};
  }
  T* row(int i, int j) const { return data + i * s0 + j * s1; }
  std::int64_t min_size() const {  // elements spanned, for bounds checks
    return n0 == 0 || n1 == 0 ? 0 : (n0 - 1) * s0 + (n1 - 1) * s1 + n2;
  }
  operator View3<const T>() const { return {data, n0, n1, n2, s0, s1}; }
};

}  // namespace masskv
