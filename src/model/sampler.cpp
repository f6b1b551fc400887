// Sampler (model.hpp): greedy, or top-k -> top-p -> temperature -> draw, seeded.
#include <algorithm>
#include <cmath>

#include "masskv/error.hpp"
#include "masskv/model/model.hpp"

namespace masskv::model {

TokenId argmax(std::span<const float> logits) {
  require(!logits.empty(), ErrorCode::invalid_argument, "logits", "is empty");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<TokenId>(best);
}

Sampler::Sampler(SamplerConfig config) : config_(config), state_(config.seed) {
  require(std::isfinite(config.temperature), ErrorCode::invalid_argument, "temperature",
          "must be finite");
  require(config.top_p > 0 && config.top_p <= 1, ErrorCode::invalid_argument, "top_p",
          "must be in (0, 1], got ", config.top_p);
}

// splitmix64: a fixed generator, so a seed gives the same tokens on every platform.
double Sampler::uniform() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

TokenId Sampler::sample(std::span<const float> logits) {
  if (config_.temperature <= 0) return argmax(logits);
  auto& c = scratch_;
  c.clear();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    c.emplace_back(logits[i], static_cast<TokenId>(i));
  }
  // Descending logit, ascending id on ties: a total order, so the result is deterministic.
  const auto before = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::size_t k = c.size();
  if (config_.top_k > 0 && static_cast<std::size_t>(config_.top_k) < k) {
    k = static_cast<std::size_t>(config_.top_k);
    std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k), c.end(), before);
  } else {
    std::sort(c.begin(), c.end(), before);
  }
  c.resize(k);
  // Probabilities at temperature 1 for the top-p cut (llama.cpp applies top-p before temp).
  std::vector<double> p(k);
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i) sum += p[i] = std::exp(double(c[i].first) - c[0].first);
  std::size_t keep = k;
  if (config_.top_p < 1) {
    double acc = 0;
    for (std::size_t i = 0; i < k; ++i) {
      acc += p[i] / sum;
      if (acc >= config_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    total += p[i] = std::exp((double(c[i].first) - c[0].first) / config_.temperature);
  }
  const double r = uniform() * total;
  double acc = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (r < acc) return c[i].second;
  }
  return c[keep - 1].second;
}

}  // namespace masskv::model
