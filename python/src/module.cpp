// The extension module masskv._masskv. Python code imports it through the `masskv` package
// (python/masskv/__init__.py), which re-exports everything here.
#include <nanobind/nanobind.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "masskv/error.hpp"
#if MASSKV_PY_CUDA
#include <cstdlib>
#include <string_view>

#include "masskv/cuda/arch.hpp"
#endif

namespace nb = nanobind;

namespace {

// masskv.Error subclasses ValueError and carries the C++ code and argument name, so callers
// can branch on e.code / e.argument without parsing the message. A raw (leaked) reference:
// the type lives as long as the interpreter.
PyObject* error_type = nullptr;

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const masskv::Error& e) {
    const std::string_view code = masskv::to_string(e.code());
    nb::object exc = nb::handle(error_type)(e.what());
    exc.attr("code") = nb::str(code.data(), code.size());
    exc.attr("argument") = nb::str(e.argument().c_str());
    PyErr_SetObject(error_type, exc.ptr());
  }
}

}  // namespace

NB_MODULE(_masskv, m) {
  m.doc() =
      "masskv: sparse long-context attention over a paged KV cache (C++ kernels, CPU build).\n\n"
      "Arrays cross through DLPack / the buffer protocol without copies: inputs must already\n"
      "have the documented dtype (TypeError otherwise) and live in CPU memory; outputs are\n"
      "NumPy arrays, or the caller's own arrays passed as out=... . Kernels release the GIL.";

  error_type = PyErr_NewExceptionWithDoc(
      "masskv.Error",
      "Raised for every error of the C++ library (masskv::Error): a ValueError whose message "
      "names the rejected argument. Attributes: code (str), argument (str).",
      PyExc_ValueError, nullptr);
  m.attr("Error") = nb::handle(error_type);
  nb::register_exception_translator(translate_error);

  masskv::py::bind_mapping(m);
  masskv::py::bind_cache(m);
  masskv::py::bind_attn(m);
  masskv::py::bind_select(m);
  masskv::py::bind_model(m);

  m.def(
      "_data_ptr", [](masskv::py::InArray a) { return masskv::py::data_ptr(a); },
      nb::arg("a").noconvert(),
      "The data pointer the bindings receive for `a` (tests use it to check for copies).");
  // True when built with the CUDA kernels (pip install . -C cmake.define.MASSKV_CUDA=ON):
  // decode then runs on CUDA tensors, and cuda_quest_select exists.
  m.attr("has_cuda") = MASSKV_PY_CUDA != 0;
#if MASSKV_PY_CUDA
  // MASSKV_CUDA_PATHS=sm80 forces the sm_80 paths (the library reads no environment: the module
  // passes it on before any CUDA call); unset, empty or auto: by the device. Another value fails
  // the import (masskv::Error naming MASSKV_CUDA_PATHS).
  if (const char* e = std::getenv("MASSKV_CUDA_PATHS");
      e != nullptr && *e != 0 && std::string_view(e) != "auto") {
    masskv::require(std::string_view(e) == "sm80", masskv::ErrorCode::invalid_argument,
                    "MASSKV_CUDA_PATHS", "must be auto or sm80, not '", e, "'");
    masskv::cuda::set_cuda_paths(masskv::cuda::CudaPaths::sm80);
  }
  m.def("cuda_hopper_paths", &masskv::cuda::hopper_paths,
        "Whether the CUDA kernels take their Hopper (sm_90) paths on the current device: "
        "False on an sm_80 GPU, for a build without sm_90 code, or under MASSKV_CUDA_PATHS=sm80 "
        "(docs/gpu.md, \"Architectures\"); the import fails for another MASSKV_CUDA_PATHS.");
  masskv::py::bind_cuda_stores(m);
  masskv::py::bind_cuda_prefill(m);
#endif
}
