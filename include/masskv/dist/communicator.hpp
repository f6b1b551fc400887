// Collectives for context parallelism (docs/design.md §7, docs/dist.md): the small interface the
// distributed selection and decode are written against, with an in-process implementation
// (threads as ranks, for CPU tests) and an NCCL one (dist/nccl_comm.hpp, MASSKV_NCCL=ON).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

namespace masskv::dist {

enum class ReduceOp { sum, max };

// What a rank has exchanged since the last reset: every collective counts once, whatever
// its size; bytes are this rank's send buffer and what it receives.
struct CommStats {
  std::int64_t collectives = 0;
  std::int64_t all_gathers = 0;
  std::int64_t all_reduces = 0;
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
};

// Every rank must call the same collectives in the same order with the same sizes (as with
// NCCL). Buffers are host memory. The public calls check sizes, count, then run the
// implementation's collective.
class Communicator {
 public:
  enum class Elem { f32, f64 };

  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv holds size() blocks of send.size() values, rank r's block at r * send.size().
  // Throws Error(shape_mismatch, "recv") when recv.size() != size() * send.size().
  void all_gather(std::span<const float> send, std::span<float> recv);
  void all_gather(std::span<const double> send, std::span<double> recv);
  // In place: data becomes the element-wise sum / max over the ranks. Every rank receives
  // the same bits.
  void all_reduce(std::span<float> data, ReduceOp op);
  void all_reduce(std::span<double> data, ReduceOp op);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  // count: values per rank. recv has size() * count values.
  virtual void do_all_gather(const void* send, void* recv, std::size_t count, Elem elem) = 0;
  virtual void do_all_reduce(void* data, std::size_t count, Elem elem, ReduceOp op) = 0;

 private:
  void count_gather(std::size_t count, std::size_t elem_size);
  void count_reduce(std::size_t count, std::size_t elem_size);
  CommStats stats_;
};

// Threads as ranks. One InProcessGroup is shared by `size` threads; each thread talks through
// its own InProcessComm. A collective is: publish the send pointer, barrier, every rank reads
// all ranks' buffers in rank order (reductions too, so the result does not depend on thread
// scheduling and is identical on every rank), barrier. When a rank fails, `abort()` wakes
// the others with an Error instead of leaving them at the barrier.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const;
  void abort();

 private:
  friend class InProcessComm;
  struct State;
  std::unique_ptr<State> state_;
};

class InProcessComm final : public Communicator {
 public:
  InProcessComm(InProcessGroup& group, int rank);
  int rank() const override { return rank_; }
  int size() const override;

 protected:
  void do_all_gather(const void* send, void* recv, std::size_t count, Elem elem) override;
  void do_all_reduce(void* data, std::size_t count, Elem elem, ReduceOp op) override;

 private:
  InProcessGroup& group_;
  int rank_;
};

// Runs body(comm) on `ranks` threads, one InProcessComm each, and joins them. When a rank
// throws, the group is aborted (the other ranks leave their collectives with an Error) and
// the first failure's exception is rethrown (not the other ranks' abort errors).
void run_in_process(int ranks, const std::function<void(Communicator&)>& body);

}  // namespace masskv::dist
