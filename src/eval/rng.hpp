// The eval's own PRNG: SplitMix64 (Steele, Lea & Flood 2014), so samples are identical across
// standard libraries (std:: distributions are not specified bit for bit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace masskv::eval {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) for n > 0, without modulo bias (rejection of the short last block).
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t limit = ~0ull - (~0ull % n);
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// FNV-1a, to mix a task name into a seed.
constexpr std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return h;
}

// Fisher-Yates with Rng.
template <class T>
void shuffle(T& items, Rng& rng) {
  for (std::size_t i = items.size(); i > 1; --i) {
    std::swap(items[i - 1], items[rng.below(i)]);
  }
}

}  // namespace masskv::eval
