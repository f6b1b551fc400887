// NcclComm: host arrays staged through one device buffer per rank (docs/dist.md "NCCL").
#include "masskv/dist/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "masskv/error.hpp"

namespace masskv::dist {
namespace {

void check(cudaError_t e, const char* what) {
  require(e == cudaSuccess, ErrorCode::unsupported, "nccl", what, ": ", cudaGetErrorString(e));
}
void check(ncclResult_t e, const char* what) {
  require(e == ncclSuccess, ErrorCode::unsupported, "nccl", what, ": ", ncclGetErrorString(e));
}

ncclDataType_t nccl_type(Communicator::Elem e) {
  return e == Communicator::Elem::f32 ? ncclFloat32 : ncclFloat64;
}
std::size_t elem_bytes(Communicator::Elem e) { return e == Communicator::Elem::f32 ? 4 : 8; }

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NCCL_UNIQUE_ID_BYTES changed");

}  // namespace

NcclId nccl_unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclId out;
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

struct NcclComm::Impl {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* buf = nullptr;  // device staging buffer, grows
  std::size_t capacity = 0;

  void* staging(std::size_t bytes) {
    if (bytes > capacity) {
      if (buf) check(cudaFree(buf), "cudaFree");
      buf = nullptr;
      check(cudaMalloc(&buf, bytes), "cudaMalloc");
      capacity = bytes;
    }
    return buf;
  }
};

NcclComm::NcclComm(const NcclId& id, int size, int rank, int device)
    : impl_(std::make_unique<Impl>()), size_(size), rank_(rank) {
  require(size >= 1, ErrorCode::invalid_argument, "size", "must be >= 1, got ", size);
  require(rank >= 0 && rank < size, ErrorCode::out_of_range, "rank", rank,
          " is outside [0, size = ", size, ")");
  impl_->device = device;
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ncclUniqueId uid;
  std::memcpy(&uid, id.bytes.data(), sizeof(uid));
  check(ncclCommInitRank(&impl_->comm, size, uid, rank), "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  // Errors here cannot be reported (destructor); the resources are released either way.
  cudaSetDevice(impl_->device);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
  if (impl_->buf) cudaFree(impl_->buf);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void NcclComm::do_all_gather(const void* send, void* recv, std::size_t count, Elem elem) {
  const std::size_t bytes = count * elem_bytes(elem);
  if (bytes == 0) return;
  check(cudaSetDevice(impl_->device), "cudaSetDevice");
  // Layout of the staging buffer: [size][count] received blocks; the send block is copied
  // into this rank's own slot (NCCL's in-place all-gather).
  char* d = static_cast<char*>(impl_->staging(bytes * size_));
  char* mine = d + bytes * rank_;
  check(cudaMemcpyAsync(mine, send, bytes, cudaMemcpyHostToDevice, impl_->stream), "cudaMemcpy");
  check(ncclAllGather(mine, d, count, nccl_type(elem), impl_->comm, impl_->stream),
        "ncclAllGather");
  check(cudaMemcpyAsync(recv, d, bytes * size_, cudaMemcpyDeviceToHost, impl_->stream),
        "cudaMemcpy");
  check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
}

void NcclComm::do_all_reduce(void* data, std::size_t count, Elem elem, ReduceOp op) {
  const std::size_t bytes = count * elem_bytes(elem);
  if (bytes == 0) return;
  check(cudaSetDevice(impl_->device), "cudaSetDevice");
  void* d = impl_->staging(bytes);
  check(cudaMemcpyAsync(d, data, bytes, cudaMemcpyHostToDevice, impl_->stream), "cudaMemcpy");
  check(ncclAllReduce(d, d, count, nccl_type(elem), op == ReduceOp::sum ? ncclSum : ncclMax,
                      impl_->comm, impl_->stream),
        "ncclAllReduce");
  check(cudaMemcpyAsync(data, d, bytes, cudaMemcpyDeviceToHost, impl_->stream), "cudaMemcpy");
  check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
}

}  // namespace masskv::dist
