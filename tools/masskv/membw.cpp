#include "membw.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace masskv::cli {
namespace {

// Kept alive across calls: page faults of a fresh buffer would otherwise be timed.
struct Buffer {
  std::unique_ptr<std::uint64_t[]> data;
  std::size_t words = 0;
};

Buffer& buffer_of(std::size_t bytes) {
  static Buffer buf;
  const std::size_t words = bytes / sizeof(std::uint64_t);
  if (buf.words != words) {
    buf.data = std::make_unique<std::uint64_t[]>(words);
    for (std::size_t i = 0; i < words; ++i) buf.data[i] = i * 0x9E3779B97F4A7C15ull;
    buf.words = words;
  }
  return buf;
}

std::uint64_t sum_words(const std::uint64_t* p, std::size_t n) {
  std::uint64_t acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += p[i + static_cast<std::size_t>(j)];
  for (; i < n; ++i) acc[0] += p[i];
  std::uint64_t s = 0;
  for (auto a : acc) s += a;
  return s;
}

}  // namespace

ReadBandwidth measure_read_bandwidth(std::size_t bytes, int threads, int reps) {
  Buffer& buf = buffer_of(bytes);
  std::vector<double> gbs;
  volatile std::uint64_t sink = 0;
  for (int r = 0; r < reps + 1; ++r) {  // first pass warms up
    std::uint64_t total = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const std::size_t nt = static_cast<std::size_t>(omp_get_num_threads());
      const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
      const std::size_t chunk = (buf.words + nt - 1) / nt;
      const std::size_t begin = std::min(buf.words, t * chunk);
      const std::size_t end = std::min(buf.words, begin + chunk);
      total += sum_words(buf.data.get() + begin, end - begin);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    if (r > 0) gbs.push_back(static_cast<double>(buf.words * sizeof(std::uint64_t)) / s / 1e9);
  }
  std::nth_element(gbs.begin(), gbs.begin() + static_cast<long>(gbs.size() / 2), gbs.end());
  return {gbs[gbs.size() / 2], buf.words * sizeof(std::uint64_t)};
}

}  // namespace masskv::cli
