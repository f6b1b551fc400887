#include "select/learned.hpp"

#include <algorithm>
#include <limits>

#include "select/vec_math.hpp"

namespace masskv::select::detail {

void learned_page_masses(const kv::KeyRowsView& keys, const kv::PageTable& table, int b,
                         int group, const float* q, std::vector<double>& scores,
                         std::span<double> out) {
  const int pages = table.num_pages(b), P = keys.page_size;
  const std::int64_t L = table.length(b, P);
  scores.resize(static_cast<std::size_t>(L));
  // A group's page is contiguous: one score_rows call per page.
  const auto stride = static_cast<std::int64_t>(keys.row_bytes());
  for (int j = 0; j < pages; ++j) {
    const int len = table.page_len(b, j, P);
    kv::score_rows(keys.format, q, keys.row(table.page(b, j), group, 0), stride, len, keys.dim,
                   scores.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(P));
  }
  double mx = -std::numeric_limits<double>::infinity();
  for (const double s : scores) mx = std::max(mx, s);
  for (double& s : scores) s -= mx;
  exp_inplace(scores.data(), scores.size());
  double total = 0;
  for (int j = 0; j < pages; ++j) {
    const std::size_t from = static_cast<std::size_t>(j) * static_cast<std::size_t>(P);
    const std::size_t to = from + static_cast<std::size_t>(table.page_len(b, j, P));
    double m = 0;
    for (std::size_t t = from; t < to; ++t) m += scores[t];
    out[static_cast<std::size_t>(j)] = m;
    total += m;
  }
  for (int j = 0; j < pages; ++j) out[static_cast<std::size_t>(j)] /= total;
}

}  // namespace masskv::select::detail
