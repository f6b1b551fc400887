// NCCL implementation of the Communicator (docs/dist.md "NCCL"). Built only with
// -DMASSKV_NCCL=ON when nccl.h and the CUDA runtime are found (target masskv_nccl, which
// defines MASSKV_HAVE_NCCL). The distributed selection and decode run on the CPU over host
// arrays, so each collective stages its host buffers through a device buffer on the rank's
// GPU; kernels that keep their partials on the GPU would hand device pointers to NCCL
// directly (not written yet).
#pragma once

#include <array>
#include <memory>

#include "masskv/dist/communicator.hpp"

namespace masskv::dist {

// ncclUniqueId's bytes: made once (rank 0) and handed to every rank by the caller.
struct NcclId {
  std::array<char, 128> bytes{};
};
NcclId nccl_unique_id();

class NcclComm final : public Communicator {
 public:
  // Joins the `size`-rank communicator of `id` as `rank`, on CUDA device `device`. Blocks
  // until every rank has joined. Throws Error(unsupported, "nccl") on any NCCL/CUDA error.
  NcclComm(const NcclId& id, int size, int rank, int device);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

 protected:
  void do_all_gather(const void* send, void* recv, std::size_t count, Elem elem) override;
  void do_all_reduce(void* data, std::size_t count, Elem elem, ReduceOp op) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int size_, rank_;
};

}  // namespace masskv::dist
