// The selectors' fast paths (page-major scans, AVX2 row kernels, the Newton tau_hat, merged
// growth lists) against plain references: the pre-optimisation selectors
// (selector_reference.hpp) and f64 sums in index order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "core/cpu_features.hpp"
#include "kv/row_scores.hpp"
#include "masskv/select/selector.hpp"
#include "select/gaussian_model.hpp"
#include "select/page_scan.hpp"
#include "select/row_kernels.hpp"
#include "selector_fixture.hpp"
#include "selector_reference.hpp"

namespace masskv::select {
namespace {

using test::random_case;
using test::SelCase;

bool needs_entmax(Method m) { return m == Method::entmax_support || m == Method::gaussian_tau; }

// Selections must be identical. Estimates: bound/page masses and tau(S) agree to rounding;
// tau_hat to the reference bisection's tolerance (1e-8 of max(1, |tau|)): the Newton solve
// is more precise than the bisection it replaced; top_p's entmax page masses at tau_hat move
// with it (measured up to 1.4e-8).
TEST(SelectorCost, FastSelectorsReproduceTheReference) {
  test::OneThread one;
  std::mt19937 rng(17);
  int compared = 0;
  for (int P : {4, 16}) {
    for (int g : {1, 3, 4}) {
      for (int d : {16, 24, 64}) {
        SelCase c = random_case(rng, {1, 19, 150, 333}, 2 * g, 2, d, P, DType::f16);
        for (Method m : {Method::dense, Method::sink_recent, Method::quest, Method::top_p,
                         Method::entmax_support, Method::gaussian_tau, Method::oracle}) {
          for (auto kind : {Budget::Kind::fixed, Budget::Kind::top_p, Budget::Kind::adaptive}) {
            if (m == Method::sink_recent && kind == Budget::Kind::top_p) continue;
            if (m == Method::dense && kind != Budget::Kind::fixed) continue;
            for (auto rule : {GroupRule::union_heads, GroupRule::aggregate}) {
              for (int map = 0; map < 3; ++map) {
                if (map == 0 && needs_entmax(m)) continue;
                SelectorConfig cfg;
                cfg.method = m;
                cfg.mapping = map == 0   ? Mapping::softmax()
                              : map == 1 ? Mapping::entmax(1.5)
                                         : Mapping::entmax(2.0);
                cfg.budget = {kind, compared % 5 == 0 ? 0 : 48, 0.85};
                if (kind == Budget::Kind::fixed && cfg.budget.tokens == 0) cfg.budget.tokens = 32;
                cfg.sink_pages = compared % 3;
                cfg.window_tokens = (compared % 4) * 7;
                cfg.group = rule;
                cfg.mass_source = compared % 2 ? MassSource::page_mean : MassSource::page_gaussian;
                cfg.seed_pages = 1 + compared % 5;
                SelectOutput fast, ref;
                if (m == Method::sink_recent && kind == Budget::Kind::adaptive &&
                    cfg.budget.tokens == 0) {
                  // No mass estimate, no rule of its own, no cap: refused (it kept every page).
                  EXPECT_THROW(run_selector(c.args(), cfg, fast), Error);
                  ++compared;
                  continue;
                }
                run_selector(c.args(), cfg, fast);
                reference::run_selector(c.args(), cfg, ref);
                const std::string what = std::string(to_string(m)) + " kind " +
                                         std::to_string(static_cast<int>(kind)) + " map " +
                                         std::to_string(map) + " P " + std::to_string(P) +
                                         " g " + std::to_string(g) + " d " + std::to_string(d);
                ASSERT_EQ(fast.selection.count, ref.selection.count) << what;
                ASSERT_EQ(fast.selection.ids, ref.selection.ids) << what;
                ASSERT_EQ(fast.certified, ref.certified) << what;
                ASSERT_EQ(fast.estimate.size(), ref.estimate.size());
                for (std::size_t i = 0; i < ref.estimate.size(); ++i) {
                  const double x = fast.estimate[i], y = ref.estimate[i];
                  if (std::isnan(y)) {
                    EXPECT_TRUE(std::isnan(x)) << what;
                    continue;
                  }
                  // top_p under entmax: page masses at tau_hat, which moves by <= 1e-8.
                  const double tol = m == Method::gaussian_tau
                                         ? 2e-8 * std::max(1.0, std::fabs(y))
                                         : (m == Method::top_p && map > 0 ? 1e-6 : 1e-9);
                  EXPECT_NEAR(x, y, tol) << what;
                }
                ++compared;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
}

// The reference's growth scans every page each round; on keys with page structure the
// uncapped growth runs many rounds, which is where the merged lists must agree with it.
TEST(SelectorCost, EntmaxSupportGrowthMatchesTheReferenceOnStructuredKeys) {
  test::OneThread one;
  std::mt19937 rng(5);
  for (double alpha : {1.5, 2.0}) {
    for (int cap : {0, 96, 400}) {
      SelCase c = random_case(rng, {700, 129, 2000}, 8, 2, 32, 16, DType::bf16, 1.0f, 0.5f, 4.0f);
      SelectorConfig cfg;
      cfg.method = Method::entmax_support;
      cfg.mapping = Mapping::entmax(alpha);
      cfg.budget = {Budget::Kind::adaptive, cap, 1};
      SelectOutput fast, ref;
      run_selector(c.args(), cfg, fast);
      reference::run_selector(c.args(), cfg, ref);
      EXPECT_EQ(fast.selection.ids, ref.selection.ids) << alpha << " " << cap;
      EXPECT_EQ(fast.certified, ref.certified) << alpha << " " << cap;
    }
  }
}

// f64 sums in index order, the plain reference of the row kernels.
TEST(SelectorCost, RowKernelsMatchF64AndAgreeAcrossIsas) {
  std::mt19937 rng(3);
  std::normal_distribution<float> N(0.0f, 1.0f);
  const bool avx2 = cpu::has_avx2();
  for (int d : {8, 16, 64, 128, 256}) {
    for (int nh : {1, 3, 4, 7}) {
      std::vector<float> mean(d), m2(d);
      std::vector<double> qd(static_cast<std::size_t>(nh) * d), q2d(qd.size());
      for (int c = 0; c < d; ++c) {
        mean[c] = 3.0f * N(rng);
        m2[c] = c % 7 == 0 ? -0.0f : (c % 11 == 0 ? -1e-3f : std::fabs(5.0f * N(rng)));
      }
      for (std::size_t i = 0; i < qd.size(); ++i) {
        const float x = 2.0f * N(rng);
        qd[i] = x;
        q2d[i] = static_cast<double>(x) * x;
      }
      std::vector<double> pm(nh), pv(nh), am(nh), av(nh);
      detail::moments_row_portable(mean.data(), m2.data(), d, qd.data(), q2d.data(), nh,
                                   pm.data(), pv.data());
      if (avx2) {
        detail::moments_row_avx2(mean.data(), m2.data(), d, qd.data(), q2d.data(), nh, am.data(),
                                 av.data());
      }
      for (int i = 0; i < nh; ++i) {
        long double rm = 0, rv = 0, absm = 0, absv = 0;
        for (int c = 0; c < d; ++c) {
          const long double a = qd[i * d + c] * static_cast<long double>(mean[c]);
          const long double b = q2d[i * d + c] * static_cast<long double>(std::max(m2[c], 0.0f));
          rm += a;
          rv += b;
          absm += std::fabs(a);
          absv += b;
        }
        // 8-lane f64 sums: |error| <= d * 2^-52 * sum |terms|.
        EXPECT_NEAR(pm[i], static_cast<double>(rm), d * 0x1p-52 * static_cast<double>(absm));
        EXPECT_NEAR(pv[i], static_cast<double>(rv), d * 0x1p-52 * static_cast<double>(absv));
        if (avx2) {
          EXPECT_EQ(pm[i], am[i]) << d << " " << nh;
          EXPECT_EQ(pv[i], av[i]) << d << " " << nh;
        }
      }
    }
  }
  for (int d : {8, 24, 64, 128}) {
    const int rows = 5;
    const std::int64_t stride = d + 8;
    std::vector<float> q(d), kf(static_cast<std::size_t>(rows) * stride);
    std::vector<std::uint16_t> kh(kf.size()), kb(kf.size());
    for (float& x : q) x = N(rng);
    for (std::size_t i = 0; i < kf.size(); ++i) {
      kh[i] = f32_to_f16(4.0f * N(rng)).bits;
      kb[i] = f32_to_bf16(4.0f * N(rng)).bits;
      kf[i] = 4.0f * N(rng);
    }
    const double scale = 0.3;
    for (int dt = 0; dt < 3; ++dt) {
      std::vector<double> p(rows), a(rows);
      auto key = [&](std::size_t i) -> double {
        return dt == 0 ? kf[i] : dt == 1 ? f16_to_f32(f16{kh[i]}) : bf16_to_f32(bf16{kb[i]});
      };
      if (dt == 0) kv::detail::score_rows_portable_f32(kf.data(), stride, rows, d, q.data(), scale, p.data());
      if (dt == 1) kv::detail::score_rows_portable_f16(kh.data(), stride, rows, d, q.data(), scale, p.data());
      if (dt == 2) kv::detail::score_rows_portable_bf16(kb.data(), stride, rows, d, q.data(), scale, p.data());
      if (avx2 && d % 8 == 0) {
        if (dt == 0) kv::detail::score_rows_avx2_f32(kf.data(), stride, rows, d, q.data(), scale, a.data());
        if (dt == 1) kv::detail::score_rows_avx2_f16(kh.data(), stride, rows, d, q.data(), scale, a.data());
        if (dt == 2) kv::detail::score_rows_avx2_bf16(kb.data(), stride, rows, d, q.data(), scale, a.data());
      }
      for (int r = 0; r < rows; ++r) {
        long double s = 0, abs = 0;
        for (int c = 0; c < d; ++c) {
          const long double t = q[c] * static_cast<long double>(key(r * stride + c));
          s += t;
          abs += std::fabs(t);
        }
        EXPECT_NEAR(p[r], scale * static_cast<double>(s), (d + 2) * 0x1p-52 * scale * static_cast<double>(abs));
        if (avx2 && d % 8 == 0) {
          EXPECT_EQ(p[r], a[r]) << d << " " << dt;
        }
      }
    }
  }
}

TEST(SelectorCost, PageScansMatchPerHeadBoundsAndTheF64PageModel) {
  std::mt19937 rng(8);
  for (int d : {13, 64}) {
    for (int g : {1, 4}) {
      SelCase c = random_case(rng, {77, 300, 16}, 2 * g, 2, d, 16, DType::f16, 1.0f);
      const auto t = c.table.table();
      const kv::SummariesView s = c.cache.summaries();
      const std::size_t nnz = t.indices.size();
      const int Hq = 2 * g;
      const float scale = 0.2f;
      std::vector<float> bounds(nnz * Hq), w(nnz * 2);
      std::vector<double> m(nnz * Hq), v(nnz * Hq);
      detail::all_page_bounds(&s, nullptr, t, c.qview(), scale, bounds.data(), w.data());
      detail::all_page_moments(s, t, c.qview(), scale, m.data(), v.data());
      for (int b = 0; b < 3; ++b) {
        const int n = t.num_pages(b);
        std::vector<std::int32_t> phys(t.indices.begin() + t.indptr[b],
                                       t.indices.begin() + t.indptr[b + 1]);
        for (int h = 0; h < 2; ++h) {
          std::vector<float> U(static_cast<std::size_t>(g) * n);
          page_upper_bounds(s, phys, h, c.qview().row(b, h * g), g, c.qview().s1, scale, U);
          for (int i = 0; i < g; ++i) {
            const std::size_t row = t.indptr[b] * static_cast<std::size_t>(Hq) +
                                    static_cast<std::size_t>(h * g + i) * n;
            const float* q = c.qview().row(b, h * g + i);
            for (int j = 0; j < n; ++j) {
              EXPECT_EQ(bounds[row + j], U[static_cast<std::size_t>(i) * n + j]);
              const std::int64_t at = s.at(phys[j], h);
              double rm = 0, rv = 0, wr = 0, am = 0;
              for (int x = 0; x < d; ++x) {
                rm += static_cast<double>(q[x]) * s.mean[at + x];
                am += std::fabs(static_cast<double>(q[x]) * s.mean[at + x]);
                rv += static_cast<double>(q[x]) * q[x] * std::max(0.0f, s.m2[at + x]) / s.count[phys[j]];
                wr = std::max({wr, std::fabs(static_cast<double>(s.min[at + x])),
                               std::fabs(static_cast<double>(s.max[at + x]))});
              }
              EXPECT_NEAR(m[row + j], scale * rm, 1e-13 * scale * am);
              EXPECT_NEAR(v[row + j], static_cast<double>(scale) * scale * rv, 1e-13 * std::fabs(rv));
              EXPECT_EQ(static_cast<double>(w[(t.indptr[b] + j) * 2 + h]), wr);
            }
          }
        }
      }
    }
  }
}

// The Newton tau_hat against the bisection on random page models (zero counts, zero
// variances, broad and peaked), and the per-page masses against the scalar model.
TEST(SelectorCost, NewtonTauHatMatchesBisectionAndMassesMatchTheScalarModel) {
  std::mt19937 rng(23);
  std::normal_distribution<double> N(0.0, 1.0);
  int solves = 0;
  for (double alpha : {1.5, 2.0, 1.25, 1.8}) {
    for (int n : {1, 3, 17, 400, 3000}) {
      if (alpha != 1.5 && alpha != 2.0 && n > 400) continue;  // quadrature: slow reference
      for (double spread : {0.1, 2.0, 8.0}) {
        std::vector<double> m(n), v(n), cnt(n);
        for (int j = 0; j < n; ++j) {
          m[j] = spread * N(rng);
          v[j] = j % 9 == 4 ? 0.0 : std::fabs(N(rng)) * spread;
          cnt[j] = j % 13 == 5 && n > 1 ? 0.0 : (j % 5 == 0 ? 3.0 : 16.0);
        }
        detail::GaussianPages pages;
        pages.assign(m, v, cnt, alpha);
        const double tau = pages.solve();
        const double ref = reference::tau_hat_bisection(m, v, cnt, alpha);
        EXPECT_NEAR(tau, ref, 2e-8 * std::max(1.0, std::fabs(ref))) << alpha << " " << n;
        EXPECT_EQ(tau, gaussian_tau_hat(m, v, cnt, alpha));
        std::vector<double> w(n);
        pages.masses(tau, w);
        double total = 0;
        for (int j = 0; j < n; ++j) {
          const double e = cnt[j] > 0 ? cnt[j] * gaussian_entmax_mass(m[j], v[j], alpha, tau) : 0.0;
          // The closed forms cancel for t << 0 (relative error grows like t²), and the vector
          // erfc is not the scalar one to the last bit: 1e-9 relative, 1e-15 of the total.
          EXPECT_NEAR(w[j], e, 1e-9 * e + 1e-15) << alpha << " " << j;
          total += e;
        }
        // The root: sum_j n_j E_j(tau_hat) = 1, to the solve's step tolerance (1e-10 of
        // max(1, |tau|)) times |f'|.
        EXPECT_NEAR(total, 1.0, 1e-6) << alpha << " " << n << " " << spread;
        EXPECT_LT(pages.evaluations(), 40);
        ++solves;
      }
    }
  }
  EXPECT_GT(solves, 40);
}

}  // namespace
}  // namespace masskv::select
