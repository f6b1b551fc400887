// The §2.4 page model's moments for every q head of a batch (see page_scan.hpp).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/cpu_features.hpp"
#include "select/page_scan.hpp"

namespace masskv::select::detail {

void moments_row_portable(const float* mean, const float* m2, int d, const double* qd,
                          const double* q2d, int nh, double* sm, double* sv) {
  for (int i = 0; i < nh; ++i) {
    const double* a = qd + static_cast<std::ptrdiff_t>(i) * d;
    const double* b = q2d + static_cast<std::ptrdiff_t>(i) * d;
    double lm[8] = {}, lv[8] = {};
    for (int c = 0; c < d; ++c) {
      const double x = m2[c];
      lm[c % 8] = std::fma(a[c], static_cast<double>(mean[c]), lm[c % 8]);
      lv[c % 8] = std::fma(b[c], x > 0 ? x : 0.0, lv[c % 8]);
    }
    sm[i] = ((lm[0] + lm[4]) + (lm[2] + lm[6])) + ((lm[1] + lm[5]) + (lm[3] + lm[7]));
    sv[i] = ((lv[0] + lv[4]) + (lv[2] + lv[6])) + ((lv[1] + lv[5]) + (lv[3] + lv[7]));
  }
}

namespace {

void moments_row(const float* mean, const float* m2, int d, const double* qd, const double* q2d,
                 int nh, double* sm, double* sv) {
  if (d % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed()) {
    moments_row_avx2(mean, m2, d, qd, q2d, nh, sm, sv);
  } else {
    moments_row_portable(mean, m2, d, qd, q2d, nh, sm, sv);
  }
}

}  // namespace

void all_page_moments(const kv::SummariesView& s, const kv::PageTable& table,
                      const View3<const float>& q, double scale, double* m, double* v) {
  const int B = table.batch(), Hq = q.n1, Hkv = s.num_kv_heads, d = s.head_dim;
  const int g = Hq / Hkv;
  constexpr int kChunk = 32;  // pages per task, as in all_page_bounds
  thread_local std::vector<std::pair<int, int>> chunks;
  chunks.clear();
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < table.num_pages(b); j += kChunk) chunks.emplace_back(b, j);
  }
  const std::vector<std::pair<int, int>>& work = chunks;
  const int num_chunks = static_cast<int>(work.size());
  const double scale2 = scale * scale;
#pragma omp parallel if (num_chunks > 1)
  {
    thread_local std::vector<double> qd, q2d, sm, sv;
    qd.resize(static_cast<std::size_t>(Hq) * d);
    q2d.resize(qd.size());
    sm.resize(static_cast<std::size_t>(g));
    sv.resize(sm.size());
    int split_b = -1;
#pragma omp for schedule(static)
    for (int t = 0; t < num_chunks; ++t) {
      const auto [b, j0] = work[static_cast<std::size_t>(t)];
      if (b != split_b) {
        for (int i = 0; i < Hq; ++i) {
          for (int c = 0; c < d; ++c) {
            const double x = q.row(b, i)[c];
            qd[static_cast<std::size_t>(i) * d + c] = x;
            q2d[static_cast<std::size_t>(i) * d + c] = x * x;  // exact: a float squared
          }
        }
        split_b = b;
      }
      const int nb = table.num_pages(b);
      const int n = std::min(kChunk, nb - j0);
      const std::size_t base = static_cast<std::size_t>(table.indptr[b]) * Hq;
      for (int j = j0; j < j0 + n; ++j) {
        const std::int32_t p = table.page(b, j);
        const double c = s.count[p];
        for (int h = 0; h < Hkv; ++h) {
          const std::int64_t at = s.at(p, h);
          const std::size_t q0 = static_cast<std::size_t>(h) * g * d;
          moments_row(s.mean + at, s.m2 + at, d, qd.data() + q0, q2d.data() + q0, g, sm.data(),
                      sv.data());
          for (int i = 0; i < g; ++i) {
            const std::size_t o = base + static_cast<std::size_t>(h * g + i) * nb + j;
            m[o] = scale * sm[static_cast<std::size_t>(i)];
            v[o] = c > 0 ? scale2 * (sv[static_cast<std::size_t>(i)] / c) : 0.0;
          }
        }
      }
    }
  }
}

}  // namespace masskv::select::detail
