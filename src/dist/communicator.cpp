// Communicator: size checks and counting in one place; InProcessComm: threads as ranks.
#include "masskv/dist/communicator.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "masskv/error.hpp"

namespace masskv::dist {

// ---- Communicator ---------------------------------------------------------------------------

namespace {

void check_gather(std::size_t send, std::size_t recv, int size) {
  require(recv == send * static_cast<std::size_t>(size), ErrorCode::shape_mismatch, "recv", "has ",
          recv, " values, expected size() * send = ", size, " * ", send);
}

}  // namespace

void Communicator::count_gather(std::size_t count, std::size_t elem_size) {
  ++stats_.collectives;
  ++stats_.all_gathers;
  stats_.bytes_sent += static_cast<std::int64_t>(count * elem_size);
  stats_.bytes_received += static_cast<std::int64_t>(count * elem_size) * size();
}

void Communicator::count_reduce(std::size_t count, std::size_t elem_size) {
  ++stats_.collectives;
  ++stats_.all_reduces;
  stats_.bytes_sent += static_cast<std::int64_t>(count * elem_size);
  stats_.bytes_received += static_cast<std::int64_t>(count * elem_size);
}

void Communicator::all_gather(std::span<const float> send, std::span<float> recv) {
  check_gather(send.size(), recv.size(), size());
  count_gather(send.size(), sizeof(float));
  do_all_gather(send.data(), recv.data(), send.size(), Elem::f32);
}

void Communicator::all_gather(std::span<const double> send, std::span<double> recv) {
  check_gather(send.size(), recv.size(), size());
  count_gather(send.size(), sizeof(double));
  do_all_gather(send.data(), recv.data(), send.size(), Elem::f64);
}

void Communicator::all_reduce(std::span<float> data, ReduceOp op) {
  count_reduce(data.size(), sizeof(float));
  do_all_reduce(data.data(), data.size(), Elem::f32, op);
}

void Communicator::all_reduce(std::span<double> data, ReduceOp op) {
  count_reduce(data.size(), sizeof(double));
  do_all_reduce(data.data(), data.size(), Elem::f64, op);
}

// ---- InProcessGroup -------------------------------------------------------------------------

struct InProcessGroup::State {
  int size = 0;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t generation = 0;
  bool aborted = false;
  // Published by each rank for the collective in progress.
  std::vector<const void*> buf;
  std::vector<std::size_t> count;
  std::vector<int> elem;

  [[noreturn]] static void fail_aborted() {
    fail(ErrorCode::invalid_argument, "group", "aborted: another rank failed");
  }

  // Generation barrier that an abort releases with an Error.
  void barrier() {
    std::unique_lock lock(m);
    if (aborted) fail_aborted();
    const std::uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (generation == gen) fail_aborted();
  }

  void publish(int rank, const void* p, std::size_t n, Communicator::Elem e) {
    buf[rank] = p;
    count[rank] = n;
    elem[rank] = static_cast<int>(e);
  }

  // Every rank runs the same check on the same published values, so all ranks throw together.
  void check_matching() const {
    for (int r = 1; r < size; ++r) {
      require(count[r] == count[0] && elem[r] == elem[0], ErrorCode::shape_mismatch, "send",
              "rank ", r, " passed ", count[r], " values of type ", elem[r], ", rank 0 passed ",
              count[0], " of type ", elem[0]);
    }
  }
};

InProcessGroup::InProcessGroup(int size) : state_(std::make_unique<State>()) {
  require(size >= 1, ErrorCode::invalid_argument, "size", "must be >= 1, got ", size);
  state_->size = size;
  state_->buf.assign(static_cast<std::size_t>(size), nullptr);
  state_->count.assign(static_cast<std::size_t>(size), 0);
  state_->elem.assign(static_cast<std::size_t>(size), 0);
}

InProcessGroup::~InProcessGroup() = default;

int InProcessGroup::size() const { return state_->size; }

void InProcessGroup::abort() {
  std::lock_guard lock(state_->m);
  state_->aborted = true;
  state_->cv.notify_all();
}

// ---- InProcessComm --------------------------------------------------------------------------

InProcessComm::InProcessComm(InProcessGroup& group, int rank) : group_(group), rank_(rank) {
  require(rank >= 0 && rank < group.size(), ErrorCode::out_of_range, "rank", rank,
          " is outside [0, size = ", group.size(), ")");
}

int InProcessComm::size() const { return group_.size(); }

namespace {

std::size_t elem_size(Communicator::Elem e) { return e == Communicator::Elem::f32 ? 4 : 8; }

template <class T>
void reduce_in_rank_order(const std::vector<const void*>& bufs, std::size_t n, ReduceOp op,
                          std::vector<unsigned char>& out) {
  out.resize(n * sizeof(T));
  T* acc = reinterpret_cast<T*>(out.data());
  std::memcpy(acc, bufs[0], n * sizeof(T));
  for (std::size_t r = 1; r < bufs.size(); ++r) {
    const T* x = static_cast<const T*>(bufs[r]);
    for (std::size_t i = 0; i < n; ++i)
      acc[i] = op == ReduceOp::sum ? acc[i] + x[i] : std::max(acc[i], x[i]);
  }
}

}  // namespace

void InProcessComm::do_all_gather(const void* send, void* recv, std::size_t count, Elem elem) {
  InProcessGroup::State& st = *group_.state_;
  st.publish(rank_, send, count, elem);
  st.barrier();
  st.check_matching();
  const std::size_t bytes = count * elem_size(elem);
  for (int r = 0; r < st.size; ++r) {
    if (bytes > 0) std::memcpy(static_cast<unsigned char*>(recv) + r * bytes, st.buf[r], bytes);
  }
  st.barrier();  // the other ranks' send buffers stay valid until everyone has copied
}

void InProcessComm::do_all_reduce(void* data, std::size_t count, Elem elem, ReduceOp op) {
  InProcessGroup::State& st = *group_.state_;
  st.publish(rank_, data, count, elem);
  st.barrier();
  st.check_matching();
  thread_local std::vector<unsigned char> result;
  if (elem == Elem::f32) {
    reduce_in_rank_order<float>(st.buf, count, op, result);
  } else {
    reduce_in_rank_order<double>(st.buf, count, op, result);
  }
  st.barrier();  // everyone has read every input before anyone writes its result in place
  if (count > 0) std::memcpy(data, result.data(), count * elem_size(elem));
}

// ---- run_in_process -------------------------------------------------------------------------

void run_in_process(int ranks, const std::function<void(Communicator&)>& body) {
  InProcessGroup group(ranks);
  std::mutex m;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        InProcessComm comm(group, r);
        body(comm);
      } catch (...) {
        {
          std::lock_guard lock(m);
          if (!first) first = std::current_exception();  // later ones are the abort's echoes
        }
        group.abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace masskv::dist
