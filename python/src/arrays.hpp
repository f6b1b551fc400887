// Array import/export for the bindings: every array crosses the boundary through nanobind's
// ndarray (DLPack or the buffer protocol) without a copy. Inputs are checked here before any
// kernel sees them: CPU memory, exact dtype (TypeError otherwise), shape, and strides the C++
// view can express (ValueError otherwise). Nothing is converted or copied silently.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "masskv/dtype.hpp"
#include "masskv/tensor.hpp"

namespace masskv::py {

namespace nb = nanobind;

// Any dtype, shape, strides, device; read-only arrays accepted (inputs).
using InArray = nb::ndarray<nb::ro>;
// Any dtype, shape, strides, device; must be writable (outputs).
using OutArray = nb::ndarray<>;

// Element types the bindings accept.
enum class Elem { f32, f64, f16, bf16, i32, i64, u8 };
nb::dlpack::dtype dlpack_dtype(Elem e);
const char* elem_name(Elem e);
std::string dtype_name(nb::dlpack::dtype t);  // "float32", "bfloat16", "int64", ...
std::string shape_string(const InArray& a);

// Where an array lives: kCpu, or the CUDA device ordinal (CUDA builds only).
using Device = int;
inline constexpr Device kCpu = -1;
// The device of `a`. Raises ValueError for memory no kernel here can read: CUDA memory in a
// CPU-only build, pinned / managed / other devices' memory.
Device device_of(const InArray& a, const char* name);
std::string device_string(Device d);  // "the CPU", "cuda:1"
// Raises ValueError unless `a` lives on `device`.
void require_device(const InArray& a, Device device, const char* name);
inline void require_cpu(const InArray& a, const char* name) { require_device(a, kCpu, name); }
// Raises TypeError unless a's dtype is `e`.
void require_dtype(const InArray& a, Elem e, const char* name);
// Raises ValueError unless a.ndim() == ndim.
void require_ndim(const InArray& a, std::size_t ndim, const char* name);
// Raises ValueError unless `a` is C-contiguous (row-major, no gaps).
void require_c_contiguous(const InArray& a, const char* name);
// Raises ValueError unless shape(i) fits an int.
int dim_int(const InArray& a, std::size_t i, const char* name);

// On `device`, dtype e, C-contiguous: the checks of every flat (span) argument.
void require_flat(const InArray& a, Elem e, const char* name, Device device = kCpu);

template <class T>
std::span<const T> flat_span(const InArray& a, Elem e, const char* name, Device device = kCpu) {
  require_flat(a, e, name, device);
  return {static_cast<const T*>(a.data()), a.size()};
}

// [n0][n1][n2] array with any non-negative row strides and a unit last stride: the shapes
// View3 expresses. Raises ValueError otherwise.
View3<const float> view3_f32(const InArray& a, const char* name, Device device = kCpu);

// Writable array from a Python object (raises TypeError when it is not an array, ValueError
// when it is read-only), then the input checks.
OutArray as_output(nb::handle obj, const char* name);
inline InArray as_input(const OutArray& a) { return InArray(a); }
// Read-only array from a Python object (TypeError when it is not an array; no conversion).
InArray as_array(nb::handle obj, const char* name);
View3<float> out_view3_f32(nb::handle obj, const char* name, OutArray& keep,
                           Device device = kCpu);
std::span<float> out_span_f32(nb::handle obj, const char* name, std::size_t expected,
                              OutArray& keep, Device device = kCpu);

// Moves a vector into a NumPy array of `shape` (no copy of the elements); the array owns it.
template <class T>
nb::object numpy_from_vector(std::vector<T>&& v, std::vector<std::size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.data(), owner).cast();
}

// A new zero-filled NumPy array of `shape`; `data` receives its pointer.
template <class T>
nb::object new_numpy(std::vector<std::size_t> shape, T** data) {
  std::size_t n = 1;
  for (std::size_t s : shape) n *= s;
  std::vector<T> v(n);
  *data = v.data();  // the vector's buffer moves with it
  return numpy_from_vector(std::move(v), std::move(shape));
}

// A read-only NumPy view of memory owned by the C++ object bound to `owner` (kept alive by
// the returned array).
nb::object numpy_view(const void* data, std::vector<std::size_t> shape, nb::dlpack::dtype dtype,
                      nb::handle owner);

// For tests: the data pointer the bindings see for `a` (equal to the caller's pointer when no
// copy was made).
std::uintptr_t data_ptr(const InArray& a);

nb::dlpack::dtype storage_dtype(DType t);  // f32 -> float32, f16 -> float16, bf16 -> bfloat16

}  // namespace masskv::py
