// The pieces every CUDA binding shares (CUDA builds only): the current device, torch-allocated
// outputs, the stream a call runs on, and one workspace per (device, stream) of each kind.
#pragma once

#if MASSKV_PY_CUDA

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "masskv/error.hpp"

namespace masskv::py {

// Makes `device` current for this thread (kernels launch on the current device).
inline void set_device(Device device) {
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    fail(ErrorCode::invalid_argument, "kv", "cudaSetDevice(", device,
         ") failed: ", cudaGetErrorString(e));
  }
}

// A new torch tensor on `device`: the CUDA path's default outputs (the C++ side cannot own
// device memory that Python code then holds).
inline nb::object torch_empty(const std::vector<std::size_t>& shape, const char* dtype,
                              Device device, const char* name) {
  nb::object torch;
  try {
    torch = nb::module_::import_("torch");
  } catch (nb::python_error&) {
    throw nb::value_error((std::string(name) +
                           ": torch is not importable to allocate the CUDA output; pass " +
                           name + "= an array on " + device_string(device))
                              .c_str());
  }
  nb::list dims;
  for (std::size_t s : shape) dims.append(s);
  using namespace nb::literals;
  return torch.attr("empty")(nb::tuple(dims), "dtype"_a = torch.attr(dtype),
                             "device"_a = "cuda:" + std::to_string(device));
}

// A fresh C-contiguous int32 torch tensor on `device` and its data (the lists and counts the
// CUDA selections write): nothing to check beyond the allocation.
inline std::pair<nb::object, std::int32_t*> torch_int32(const std::vector<std::size_t>& shape,
                                                        Device device, const char* name) {
  nb::object o = torch_empty(shape, "int32", device, name);
  OutArray arr = as_output(o, name);
  return {o, static_cast<std::int32_t*>(arr.data())};
}

// The stream a call runs on: the caller's, else torch's current stream on `device` when torch is
// loaded (so the step orders after the torch work that filled q), else the default stream.
inline CUstream_st* resolve_stream(nb::handle stream, Device device) {
  if (!stream.is_none()) return reinterpret_cast<CUstream_st*>(nb::cast<std::uintptr_t>(stream));
  nb::dict modules = nb::borrow<nb::dict>(nb::module_::import_("sys").attr("modules"));
  if (!modules.contains("torch")) return nullptr;
  nb::object s = modules["torch"].attr("cuda").attr("current_stream")(device);
  return reinterpret_cast<CUstream_st*>(nb::cast<std::uintptr_t>(s.attr("cuda_stream")));
}

// One workspace per (device, stream), as the kernels' contract asks; its mutex serialises the
// Python threads that share it (the GIL is released during the step). Never destroyed: at
// interpreter exit the CUDA runtime may already be unloaded, and freeing then would fail.
template <class W>
struct Slot {
  std::mutex mutex;
  W workspace;
};

template <class W>
Slot<W>& workspace_for(Device device, CUstream_st* stream) {
  static std::mutex registry_mutex;
  static auto* registry = new std::map<std::pair<Device, CUstream_st*>, Slot<W>*>();
  std::lock_guard lock(registry_mutex);
  Slot<W>*& slot = (*registry)[{device, stream}];
  if (slot == nullptr) slot = new Slot<W>();
  return *slot;
}

// Runs `step(workspace)` on `device` without the GIL, holding the (device, stream) workspace
// of kind W.
template <class W, class Step>
void on_device(Device device, CUstream_st* stream, Step&& step) {
  nb::gil_scoped_release nogil;
  Slot<W>& slot = workspace_for<W>(device, stream);
  std::lock_guard lock(slot.mutex);
  set_device(device);
  step(slot.workspace);
}

// The same for the kernels that take their workspace in a launch struct.
template <class W, class Launch, class Step>
void run_on_device(Device device, Launch& launch, Step&& step) {
  on_device<W>(device, launch.stream, [&](W& w) {
    launch.workspace = &w;
    step();
  });
}

// Waits for `stream` and reads (and clears) the error flags of every workspace kind of
// (device, stream): the deferred check of calls made with check=False (masskv.cuda_check).
void check_device_errors(Device device, CUstream_st* stream);

}  // namespace masskv::py

#endif
