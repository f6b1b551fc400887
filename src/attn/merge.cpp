// Split-K / distributed merge (docs/design.md §2.6).
#include "masskv/attn/merge.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "masskv/error.hpp"

namespace masskv::attn {
namespace {

void check_output(int d, const float* o) {
  require(d > 0, ErrorCode::invalid_argument, "d", "must be positive, got ", d);
  require(o != nullptr, ErrorCode::invalid_argument, "o", "must not be null");
}

thread_local std::vector<double> tls_acc;

std::vector<double>& zeroed_accumulator(int d) {
  tls_acc.assign(static_cast<std::size_t>(d), 0.0);
  return tls_acc;
}

}  // namespace

float merge_softmax(std::span<const SoftmaxPartialView> parts, int d, float* o) {
  check_output(d, o);
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  double m = kNegInf;
  for (const SoftmaxPartialView& part : parts) {
    require(!std::isnan(part.lse) && part.lse != std::numeric_limits<float>::infinity(),
            ErrorCode::non_finite, "parts", "lse must be finite or -inf, got ", part.lse);
    require(part.lse == -std::numeric_limits<float>::infinity() || part.o != nullptr,
            ErrorCode::invalid_argument, "parts", "a non-empty partial has o == nullptr");
    m = std::max(m, static_cast<double>(part.lse));
  }
  if (m == kNegInf) {  // every chunk empty: skip exp(-inf - -inf) = NaN
    std::fill(o, o + d, 0.0f);
    return -std::numeric_limits<float>::infinity();
  }
  double total = 0;
  for (const SoftmaxPartialView& part : parts) total += std::exp(part.lse - m);
  std::vector<double>& acc = zeroed_accumulator(d);
  for (const SoftmaxPartialView& part : parts) {
    if (part.lse == -std::numeric_limits<float>::infinity()) continue;
    const double w = std::exp(part.lse - m) / total;
    for (int j = 0; j < d; ++j) acc[j] += w * static_cast<double>(part.o[j]);
  }
  for (int j = 0; j < d; ++j) o[j] = static_cast<float>(acc[j]);
  return static_cast<float>(m + std::log(total));
}

void merge_entmax(std::span<const EntmaxPartialView> parts, int d, float* o) {
  check_output(d, o);
  double total = 0;
  for (const EntmaxPartialView& part : parts) {
    require(std::isfinite(part.p_sum) && part.p_sum >= 0, ErrorCode::invalid_argument, "parts",
            "p_sum must be finite and >= 0, got ", part.p_sum);
    require(part.p_sum == 0 || part.o_sum != nullptr, ErrorCode::invalid_argument, "parts",
            "a partial with p_sum > 0 has o_sum == nullptr");
    total += part.p_sum;
  }
  std::vector<double>& acc = zeroed_accumulator(d);
  if (total > 0) {
    for (const EntmaxPartialView& part : parts) {
      if (part.p_sum == 0) continue;
      for (int j = 0; j < d; ++j) acc[j] += static_cast<double>(part.o_sum[j]);
    }
    for (double& x : acc) x /= total;
  }
  for (int j = 0; j < d; ++j) o[j] = static_cast<float>(acc[j]);
}

void append_local_candidates(std::span<const float> chunk, double alpha, std::vector<double>& out) {
  if (chunk.empty()) return;
  const EntmaxThreshold local = entmax_threshold(chunk, alpha);
  const double alpha_minus_1 = alpha - 1.0;
  for (const float s : chunk) {
    if (alpha_minus_1 * static_cast<double>(s) > local.tau_lo) out.push_back(s);
  }
}

EntmaxThreshold entmax_threshold_split(std::span<const std::span<const float>> chunks,
                                       double alpha) {
  Mapping::entmax(alpha).validate();
  thread_local std::vector<double> candidates;
  candidates.clear();
  for (const std::span<const float> chunk : chunks)
    append_local_candidates(chunk, alpha, candidates);
  require(!candidates.empty(), ErrorCode::invalid_argument, "chunks",
          "all chunks are empty: entmax over an empty set is undefined");
  return entmax_threshold(std::span<const double>(candidates), alpha);
}

}  // namespace masskv::attn
