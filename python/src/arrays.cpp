#include "arrays.hpp"

#include <climits>
#include <sstream>

namespace masskv::py {

namespace {
using Code = nb::dlpack::dtype_code;

nb::dlpack::dtype make(Code c, int bits) {
  return {static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(bits), 1};
}

bool same(nb::dlpack::dtype a, nb::dlpack::dtype b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

const char* device_name(int type) {
  switch (type) {
    case nb::device::cuda::value:
      return "cuda";
    case nb::device::cuda_host::value:
      return "cuda_host (pinned)";
    case nb::device::cuda_managed::value:
      return "cuda_managed";
    case nb::device::rocm::value:
      return "rocm";
    case nb::device::metal::value:
      return "metal";
    default:
      return "a non-CPU device";
  }
}
}  // namespace

nb::dlpack::dtype dlpack_dtype(Elem e) {
  switch (e) {
    case Elem::f32:
      return make(Code::Float, 32);
    case Elem::f64:
      return make(Code::Float, 64);
    case Elem::f16:
      return make(Code::Float, 16);
    case Elem::bf16:
      return make(Code::Bfloat, 16);
    case Elem::i32:
      return make(Code::Int, 32);
    case Elem::i64:
      return make(Code::Int, 64);
    case Elem::u8:
      return make(Code::UInt, 8);
  }
  return make(Code::Float, 32);
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::f32:
      return "float32";
    case Elem::f64:
      return "float64";
    case Elem::f16:
      return "float16";
    case Elem::bf16:
      return "bfloat16";
    case Elem::i32:
      return "int32";
    case Elem::i64:
      return "int64";
    case Elem::u8:
      return "uint8";
  }
  return "?";
}

std::string dtype_name(nb::dlpack::dtype t) {
  std::ostringstream os;
  switch (static_cast<Code>(t.code)) {
    case Code::Int:
      os << "int";
      break;
    case Code::UInt:
      os << "uint";
      break;
    case Code::Float:
      os << "float";
      break;
    case Code::Bfloat:
      os << "bfloat";
      break;
    case Code::Complex:
      os << "complex";
      break;
    case Code::Bool:
      return "bool";
    default:
      os << "code" << int(t.code) << "_";
      break;
  }
  os << int(t.bits);
  if (t.lanes != 1) os << "x" << t.lanes;
  return os.str();
}

std::string shape_string(const InArray& a) {
  std::ostringstream os;
  os << "(";
  for (std::size_t i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  if (a.ndim() == 1) os << ",";
  os << ")";
  return os.str();
}

Device device_of(const InArray& a, const char* name) {
  if (a.device_type() == nb::device::cpu::value) return kCpu;
#if MASSKV_PY_CUDA
  if (a.device_type() == nb::device::cuda::value) return a.device_id();
#endif
  std::ostringstream os;
  os << name << ": array is on " << device_name(a.device_type()) << ":" << a.device_id();
#if MASSKV_PY_CUDA
  os << "; masskv's kernels read CPU memory or CUDA device memory";
#else
  os << "; this masskv build has CPU kernels only (move it with .cpu(), or use a CUDA build)";
#endif
  throw nb::value_error(os.str().c_str());
}

std::string device_string(Device d) {
  return d == kCpu ? std::string("the CPU") : "cuda:" + std::to_string(d);
}

void require_device(const InArray& a, Device device, const char* name) {
  const Device got = device_of(a, name);
  if (got == device) return;
  std::ostringstream os;
  os << name << ": array is on " << device_string(got) << ", expected " << device_string(device)
     << (device == kCpu ? " (this function runs on the CPU: move it with .cpu())"
                        : " (every array of a CUDA call lives on the KV pool's device)");
  throw nb::value_error(os.str().c_str());
}

void require_dtype(const InArray& a, Elem e, const char* name) {
  if (same(a.dtype(), dlpack_dtype(e))) return;
  std::ostringstream os;
  os << name << ": expected dtype " << elem_name(e) << ", got " << dtype_name(a.dtype())
     << " (masskv never converts inputs implicitly)";
  throw nb::type_error(os.str().c_str());
}

void require_ndim(const InArray& a, std::size_t ndim, const char* name) {
  if (a.ndim() == ndim) return;
  std::ostringstream os;
  os << name << ": expected a " << ndim << "-d array, got shape " << shape_string(a);
  throw nb::value_error(os.str().c_str());
}

void require_c_contiguous(const InArray& a, const char* name) {
  std::int64_t expect = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) {
      std::ostringstream os;
      os << name << ": array of shape " << shape_string(a)
         << " is not C-contiguous (strides in elements:";
      for (std::size_t j = 0; j < a.ndim(); ++j) os << " " << a.stride(j);
      os << "); pass a contiguous copy (numpy.ascontiguousarray / tensor.contiguous())";
      throw nb::value_error(os.str().c_str());
    }
    expect *= static_cast<std::int64_t>(a.shape(i));
  }
}

int dim_int(const InArray& a, std::size_t i, const char* name) {
  if (a.shape(i) > static_cast<std::size_t>(INT_MAX)) {
    std::ostringstream os;
    os << name << ": dimension " << i << " (" << a.shape(i) << ") exceeds INT_MAX";
    throw nb::value_error(os.str().c_str());
  }
  return static_cast<int>(a.shape(i));
}

void require_flat(const InArray& a, Elem e, const char* name, Device device) {
  require_device(a, device, name);
  require_dtype(a, e, name);
  require_c_contiguous(a, name);
}

View3<const float> view3_f32(const InArray& a, const char* name, Device device) {
  require_device(a, device, name);
  require_dtype(a, Elem::f32, name);
  require_ndim(a, 3, name);
  View3<const float> v;
  v.data = static_cast<const float*>(a.data());
  v.n0 = dim_int(a, 0, name);
  v.n1 = dim_int(a, 1, name);
  v.n2 = dim_int(a, 2, name);
  // A size-1 axis may carry any stride; give it the contiguous one so the C++ overlap check
  // sees sensible values.
  v.s1 = v.n1 <= 1 ? v.n2 : a.stride(1);
  v.s0 = v.n0 <= 1 ? static_cast<std::int64_t>(v.n1) * v.s1 : a.stride(0);
  const bool unit_last = v.n2 <= 1 || a.stride(2) == 1;
  if (!unit_last || v.s0 < 0 || v.s1 < 0) {
    std::ostringstream os;
    os << name << ": strides (" << a.stride(0) << ", " << a.stride(1) << ", " << a.stride(2)
       << ") elements are not supported: the last axis must be contiguous and the others "
          "non-negative";
    throw nb::value_error(os.str().c_str());
  }
  return v;
}

InArray as_array(nb::handle obj, const char* name) {
  InArray a;
  if (!nb::try_cast<InArray>(obj, a, false)) {
    std::ostringstream os;
    os << name << ": expected an array (NumPy, PyTorch or another DLPack producer), got "
       << nb::inst_name(obj).c_str();
    throw nb::type_error(os.str().c_str());
  }
  return a;
}

OutArray as_output(nb::handle obj, const char* name) {
  if (!nb::isinstance<InArray>(obj)) {
    std::ostringstream os;
    os << name << ": expected an array (NumPy, PyTorch or another DLPack producer), got "
       << nb::inst_name(obj).c_str();
    throw nb::type_error(os.str().c_str());
  }
  OutArray out;
  if (!nb::try_cast<OutArray>(obj, out, false)) {
    std::ostringstream os;
    os << name << ": output array is read-only";
    throw nb::value_error(os.str().c_str());
  }
  return out;
}

View3<float> out_view3_f32(nb::handle obj, const char* name, OutArray& keep, Device device) {
  keep = as_output(obj, name);
  const View3<const float> v = view3_f32(InArray(keep), name, device);
  return {const_cast<float*>(v.data), v.n0, v.n1, v.n2, v.s0, v.s1};
}

std::span<float> out_span_f32(nb::handle obj, const char* name, std::size_t expected,
                              OutArray& keep, Device device) {
  keep = as_output(obj, name);
  require_flat(InArray(keep), Elem::f32, name, device);
  if (keep.size() != expected) {
    std::ostringstream os;
    os << name << ": expected " << expected << " elements, got shape "
       << shape_string(InArray(keep));
    throw nb::value_error(os.str().c_str());
  }
  return {static_cast<float*>(keep.data()), keep.size()};
}

nb::object numpy_view(const void* data, std::vector<std::size_t> shape, nb::dlpack::dtype dtype,
                      nb::handle owner) {
  return nb::ndarray<nb::numpy, nb::ro>(data, shape.size(), shape.data(), owner, nullptr, dtype)
      .cast();
}

std::uintptr_t data_ptr(const InArray& a) { return reinterpret_cast<std::uintptr_t>(a.data()); }

nb::dlpack::dtype storage_dtype(DType t) {
  switch (t) {
    case DType::f16:
      return dlpack_dtype(Elem::f16);
    case DType::bf16:
      return dlpack_dtype(Elem::bf16);
    case DType::f32:
      break;
  }
  return dlpack_dtype(Elem::f32);
}

}  // namespace masskv::py
