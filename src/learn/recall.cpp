#include "masskv/learn/recall.hpp"

#include <algorithm>
#include <vector>

#include "masskv/error.hpp"
#include "masskv/select/page_bound.hpp"

namespace masskv::learn {

int budget_pages(std::int64_t length, int page_size, int budget_den) {
  const std::int64_t pages = (length + page_size - 1) / page_size;
  return static_cast<int>(std::max<std::int64_t>(1, (pages + budget_den - 1) / budget_den));
}

double covered_mass(std::span<const float> scores, int num_q, std::span<const float> p,
                    int page_size, int budget_den) {
  const auto length = static_cast<std::int64_t>(p.size());
  require(length >= 1 && page_size >= 1 && budget_den >= 1, ErrorCode::invalid_argument, "p",
          "empty distribution or bad page size / budget");
  const int pages = static_cast<int>((length + page_size - 1) / page_size);
  require(num_q >= 1 && scores.size() == static_cast<std::size_t>(num_q) * pages,
          ErrorCode::shape_mismatch, "scores", scores.size(), " values for ", num_q, " x ", pages,
          " pages");
  select::TopkPolicy policy;
  policy.budget_pages = budget_pages(length, page_size, budget_den);
  policy.sink_pages = 0;
  policy.window_tokens = 0;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(pages));
  const int last_len = static_cast<int>(length - static_cast<std::int64_t>(pages - 1) * page_size);
  const int n = select::select_topk_pages(scores, num_q, pages, last_len, page_size, policy, ids);
  double mass = 0;
  for (int i = 0; i < n; ++i) {
    const std::int64_t start = static_cast<std::int64_t>(ids[static_cast<std::size_t>(i)]) * page_size;
    const std::int64_t stop = std::min(length, start + page_size);
    for (std::int64_t t = start; t < stop; ++t) mass += p[static_cast<std::size_t>(t)];
  }
  return mass;
}

}  // namespace masskv::learn
