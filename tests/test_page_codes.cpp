// 2-bit page codes (kv/page_codes.hpp): the codes' error bound, the SIMD encoding and scores
// against the portable ones, and the cache keeping them equal to an encoding of the stored keys
// through appends and forks. The selectors that read them: test_two_stage.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/cpu_features.hpp"
#include "kv/page_codes_kernels.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/page_codes.hpp"
#include "selector_fixture.hpp"

namespace masskv {
namespace {

int code_of(const std::uint8_t* codes, int c) { return (codes[c / 4] >> (2 * (c % 4))) & 3; }

// A page's range on its 8-bit grid holds every key; a key decodes to within a sixth of its
// channel's range (plus the grid's rounding); a score is q·x̂ up to q's int8 rounding.
TEST(PageCodes, RangesHoldTheKeysAndScoresMatchTheDotOfTheDecodedKeys) {
  std::mt19937 rng(11);
  std::normal_distribution<float> N(0.0f, 1.0f);
  int rows = 0;
  for (int d : {1, 3, 4, 16, 63, 64, 128}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> m(d), M(d), x(d), q(d), xh(d), l(d), u(d);
      for (int c = 0; c < d; ++c) {
        const float a = 3 * N(rng), b = 3 * N(rng);
        m[c] = std::min(a, b);
        M[c] = trial % 7 == 0 && c % 3 == 0 ? m[c] : std::max(a, b);  // some empty ranges
        std::uniform_real_distribution<float> U(m[c], M[c]);
        x[c] = M[c] > m[c] ? U(rng) : m[c];
        if (trial % 5 == 0) x[c] = (c % 2) ? m[c] : M[c];  // the range's ends
        q[c] = trial == 3 ? 0.0f : N(rng);                  // one zero query
      }
      std::vector<std::uint8_t> ra(d), rb(d);
      float grid[2];
      kv::round_range8(m.data(), M.data(), d, ra.data(), rb.data(), grid);
      const kv::PageRange8 r{grid[0], grid[1], ra.data(), rb.data()};
      kv::range_bounds(r, d, l.data(), u.data());
      for (int c = 0; c < d; ++c) {
        ASSERT_LE(l[c], m[c]) << "d " << d << " c " << c;
        ASSERT_GE(u[c], M[c]) << "d " << d << " c " << c;
      }
      std::vector<std::uint8_t> codes(kv::page_code_bytes(d), 0xff);
      kv::encode_page_codes(x.data(), l.data(), u.data(), d, codes.data());
      kv::decode_page_codes(codes.data(), r, d, xh.data());
      double dot = 0, l1 = 0;
      for (int c = 0; c < d; ++c) {
        const double range = static_cast<double>(u[c]) - l[c];
        EXPECT_LE(std::fabs(static_cast<double>(x[c]) - xh[c]),
                  range / 6 * (1 + 1e-5) + 1e-5 * (std::fabs(grid[0]) + 255.0 * grid[1]) + 1e-6)
            << "d " << d << " c " << c;
        if (rb[c] == ra[c]) {
          EXPECT_EQ(code_of(codes.data(), c), 0);
        }
        dot += static_cast<double>(q[c]) * xh[c];
        l1 += std::fabs(xh[c]);
      }
      // The padding bits of the last byte are zero.
      if (d % 4 != 0) {
        EXPECT_EQ(codes.back() >> (2 * (d % 4)), 0);
      }
      std::vector<std::int16_t> q8(d);
      const kv::CodeQuery cq = kv::code_query(q.data(), d, q8.data());
      float qmax = 0;
      for (int c = 0; c < d; ++c) qmax = std::max(qmax, std::fabs(q[c]));
      for (int c = 0; c < d; ++c) ASSERT_LE(std::abs(q8[c]), 127);
      // |q_c - unit q8_c| <= unit / 2 per channel (plus the f32 rounding of q_c 127 / max).
      const double unit = qmax / 127.0;
      EXPECT_NEAR(kv::page_code_score(cq, r, codes.data(), d), dot,
                  (unit / 2 + 1e-6 * qmax) * l1 + 1e-9 * (1 + std::fabs(dot)));
      ++rows;
    }
  }
  EXPECT_EQ(rows, 350);
}

// The AVX2 encoder is bit-equal to the portable one: keys inside the range, at its ends, just
// outside it (clamped), and empty ranges, for d with and without a tail of channels.
TEST(PageCodes, SimdEncodingIsBitEqualToThePortableOne) {
  if (!cpu::has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(13);
  std::normal_distribution<float> N(0.0f, 1.0f);
  int rows = 0;
  for (int d : {1, 7, 8, 9, 16, 63, 64, 128}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> lo(d), hi(d), x(d);
      for (int c = 0; c < d; ++c) {
        const float a = 3 * N(rng), b = 3 * N(rng);
        lo[c] = std::min(a, b);
        hi[c] = (trial + c) % 11 == 0 ? lo[c] : std::max(a, b);
        std::uniform_real_distribution<float> U(lo[c], std::max(hi[c], lo[c]));
        const int kind = static_cast<int>(rng() % 8);
        x[c] = kind == 0 ? lo[c] : kind == 1 ? hi[c] : kind == 2 ? hi[c] + 0.1f : U(rng);
        // Ties of the rounding: the quotient exactly at k/3 + 1/6 is rare; halves of the
        // step at least hit the rounding boundary region.
        if (kind == 3) x[c] = lo[c] + (hi[c] - lo[c]) * (static_cast<float>(rng() % 7) / 6.0f);
      }
      std::vector<std::uint8_t> a(kv::page_code_bytes(d), 0xff), b(a.size(), 0x55);
      kv::detail::encode_page_codes_portable(x.data(), lo.data(), hi.data(), d, a.data());
      kv::detail::encode_page_codes_avx2(x.data(), lo.data(), hi.data(), d, b.data());
      ASSERT_EQ(a, b) << "d " << d << " trial " << trial;
      ++rows;
    }
  }
  EXPECT_EQ(rows, 8 * 200);
}

// The batched scores (every query of a page at once; AVX2 where the CPU has it) are bit-equal
// to page_code_score row by row: the integers are exact, the last f64 operations in one order.
// The first pass's scores from its sums: code_score per row, the SIMD form bit-equal.
TEST(PageCodes, RowsOfScoresFromSumsAreBitEqualToCodeScore) {
  std::mt19937 rng(14);
  std::uniform_int_distribution<std::int32_t> sum(-4000000, 4000000);
  std::uniform_real_distribution<float> grid(-8.0f, 8.0f);
  int checked = 0;
  for (int n : {0, 1, 3, 4, 5, 8, 16, 37, 64}) {
    for (int trial = 0; trial < 20; ++trial) {
      const kv::PageRange8 r{.lo = grid(rng), .step = std::fabs(grid(rng)) / 100.0f};
      const double unit = std::fabs(grid(rng)) / 127.0;
      const std::int32_t Q = sum(rng) / 1000;
      std::vector<std::int32_t> I(static_cast<std::size_t>(n));
      for (auto& x : I) x = sum(rng);
      std::vector<double> got(I.size()), want(I.size());
      for (int t = 0; t < n; ++t) want[t] = kv::code_score(unit, Q, r, I[t]);
      kv::code_scores(unit, Q, r, I.data(), n, got.data());
      EXPECT_EQ(got, want) << "n " << n;
      if (cpu::has_avx2()) {
        std::fill(got.begin(), got.end(), 0.0);
        kv::detail::code_scores_avx2(unit, Q, r, I.data(), n, got.data());
        EXPECT_EQ(got, want) << "n " << n;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9 * 20);
}

TEST(PageCodes, BatchedScoresAreBitEqualToTheRowScore) {
  std::mt19937 rng(12);
  std::normal_distribution<float> N(0.0f, 1.0f);
  int checked = 0;
  for (int d : {1, 5, 16, 32, 63, 64, 128}) {
    for (int nh : {1, 3, 4}) {
      for (int n : {1, 7, 8, 9, 16, 40}) {
        const int rows = n + 3, bytes = kv::page_code_bytes(d);
        std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows) * bytes);
        for (auto& c : codes) c = static_cast<std::uint8_t>(rng());
        for (int r = 0; r < rows && d % 4 != 0; ++r) {  // padding bits are zero in the cache
          codes[static_cast<std::size_t>(r) * bytes + bytes - 1] &=
              static_cast<std::uint8_t>((1u << (2 * (d % 4))) - 1);
        }
        std::vector<std::int32_t> slots(static_cast<std::size_t>(n));
        for (auto& s : slots) s = static_cast<std::int32_t>(rng() % rows);  // any order, repeats
        std::vector<float> m(d), M(d), q(static_cast<std::size_t>(nh) * d);
        for (int c = 0; c < d; ++c) {
          const float a = 3 * N(rng), b = 3 * N(rng);
          m[c] = std::min(a, b);
          M[c] = c % 5 == 0 ? m[c] : std::max(a, b);
        }
        for (auto& x : q) x = N(rng);
        std::vector<std::uint8_t> ra(d), rb(d);
        float grid[2];
        kv::round_range8(m.data(), M.data(), d, ra.data(), rb.data(), grid);
        const kv::PageRange8 r{grid[0], grid[1], ra.data(), rb.data()};
        std::vector<std::int16_t> q8(static_cast<std::size_t>(nh) * d);
        std::vector<kv::CodeQuery> cq(static_cast<std::size_t>(nh));
        for (int h = 0; h < nh; ++h) cq[h] = kv::code_query(q.data() + h * d, d, q8.data() + h * d);
        const std::size_t stride = static_cast<std::size_t>(n) + 2;
        std::vector<double> got(stride * nh, -1.0), portable(stride * nh, -1.0);
        kv::page_code_scores(cq.data(), nh, r, codes.data(), slots.data(), n, d, got.data(), stride);
        kv::detail::page_code_scores_portable(cq.data(), nh, r, codes.data(), slots.data(), n, d,
                                              portable.data(), stride);
        std::vector<double> simd = portable;
        if (cpu::has_avx2() && d % 16 == 0) {
          std::fill(simd.begin(), simd.end(), -1.0);
          kv::detail::page_code_scores_avx2(cq.data(), nh, r, codes.data(), slots.data(), n, d,
                                            simd.data(), stride);
        }
        for (int h = 0; h < nh; ++h) {
          for (std::size_t t = 0; t < stride; ++t) {
            const std::size_t o = h * stride + t;
            if (t >= static_cast<std::size_t>(n)) {  // past n: untouched
              EXPECT_EQ(got[o], -1.0);
              EXPECT_EQ(simd[o], -1.0);
              continue;
            }
            const double want = kv::page_code_score(
                cq[h], r, codes.data() + static_cast<std::size_t>(slots[t]) * bytes, d);
            ASSERT_EQ(portable[o], want) << "d " << d << " h " << h << " t " << t;
            ASSERT_EQ(simd[o], want) << "d " << d << " h " << h << " t " << t;
            ASSERT_EQ(got[o], want) << "d " << d << " h " << h << " t " << t;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 7 * 8 * (1 + 7 + 8 + 9 + 16 + 40));
}

// The first pass's channel sums (portable, AVX2 where the CPU has it, and the dispatcher) equal
// the sums decoded from the token-major rows, for page sizes with and without the AVX2 path
// (8 to 64; 128 falls back to the portable loop),
// partial last pages, any channel subset and zero query levels.
TEST(PageCodes, ChannelSumsEqualTheSumsOfTheTokenMajorRows) {
  std::mt19937 rng(41);
  int checked = 0;
  for (int P : {4, 8, 16, 32, 64, 128}) {
    for (int d : {16, 32}) {
      test::SelCase c = test::random_case(rng, {5, 33, 130}, 4, 2, d, P, DType::f16, 2.0f, 0.5f,
                                          0.7f, /*page_codes=*/true);
      const kv::PageTable t = c.table.table();
      const kv::PageCodesView pc = c.cache.page_codes();
      // 1-9 heads: the SIMD sums take heads four at a time.
      const int nh = 1 + static_cast<int>(rng() % 9);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> qs(static_cast<std::size_t>(nh) * d);
      for (float& x : qs) x = normal(rng);
      qs[static_cast<std::size_t>(d) - 1] = 40.0f;  // one level at the extreme, 127
      std::vector<std::int16_t> q8(static_cast<std::size_t>(nh) * d);
      std::vector<kv::CodeQuery> cq(static_cast<std::size_t>(nh));
      for (int i = 0; i < nh; ++i) {
        cq[i] = kv::code_query(qs.data() + static_cast<std::size_t>(i) * d, d, q8.data() + i * d);
      }
      q8[3] = 0;  // a zero level adds nothing
      for (int b = 0; b < c.B; ++b) {
        const std::int64_t n = t.length(b, P);
        const std::int32_t* phys = t.indices.data() + t.indptr[b];
        for (int h = 0; h < 2; ++h) {
          std::vector<std::int32_t> ch;
          for (int x = 0; x < d; ++x) {
            if (rng() % 3 != 0 || x == 3) ch.push_back(x);
          }
          const int r = static_cast<int>(ch.size());
          std::vector<std::int32_t> want(static_cast<std::size_t>(nh * n), 0);
          for (int i = 0; i < nh; ++i) {
            for (std::int64_t x = 0; x < n; ++x) {
              const kv::PageRange8 rg = pc.range(phys[x / P], h);
              const std::uint8_t* row = pc.row(phys[x / P], h, static_cast<int>(x % P));
              for (const std::int32_t cc : ch) {
                want[i * n + x] += q8[i * d + cc] * (3 * rg.a[cc] + kv::code_of(row, cc) * (rg.b[cc] - rg.a[cc]));
              }
            }
          }
          std::vector<std::int32_t> got(want.size(), 0), portable(want.size(), 0), simd;
          kv::channel_code_sums(pc, h, phys, n, ch.data(), r, cq.data(), nh, got.data());
          kv::detail::channel_code_sums_portable(pc, h, phys, n, ch.data(), r, cq.data(), nh,
                                                 portable.data());
          EXPECT_EQ(got, want) << "P " << P << " d " << d << " b " << b << " h " << h;
          EXPECT_EQ(portable, want) << "P " << P << " d " << d << " b " << b << " h " << h;
          if (cpu::has_avx2() && P % 8 == 0) {
            simd.assign(want.size(), 0);
            kv::detail::channel_code_sums_avx2(pc, h, phys, n, ch.data(), r, cq.data(), nh,
                                               simd.data());
            EXPECT_EQ(simd, want) << "P " << P << " d " << d << " b " << b << " h " << h;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 6 * 2 * 3 * 2);
}

// Every (page, head, slot) of every live sequence holds the encoding of its stored key under
// the page's current summary range on its 8-bit grid.
template <class T>
void expect_codes_current(const kv::PagedKVCache& cache, std::span<const kv::SeqId> seqs) {
  const kv::PageTableStorage t = cache.page_table(seqs);
  const kv::PagedKVView v = cache.view(t);
  const kv::SummariesView s = cache.summaries();
  const kv::PageCodesView pc = cache.page_codes();
  ASSERT_FALSE(pc.empty());
  const int d = v.head_dim, P = v.page_size;
  std::vector<float> key(d), lo(d), hi(d);
  std::vector<std::uint8_t> want(kv::page_code_bytes(d)), ra(d), rb(d);
  float grid[2];
  for (int b = 0; b < t.table().batch(); ++b) {
    const int pages = t.table().num_pages(b);
    for (int j = 0; j < pages; ++j) {
      const std::int32_t phys = t.indices[static_cast<std::size_t>(t.indptr[b] + j)];
      const int n = t.table().page_len(b, j, P);
      for (int h = 0; h < v.num_kv_heads; ++h) {
        // The range: the page summary's, on its 8-bit grid.
        kv::round_range8(s.min + s.at(phys, h), s.max + s.at(phys, h), d, ra.data(), rb.data(),
                         grid);
        const kv::PageRange8 r = pc.range(phys, h);
        ASSERT_EQ(r.lo, grid[0]);
        ASSERT_EQ(r.step, grid[1]);
        ASSERT_TRUE(std::equal(ra.begin(), ra.end(), r.a) && std::equal(rb.begin(), rb.end(), r.b))
            << "seq " << b << " page " << j << " head " << h;
        kv::range_bounds(r, d, lo.data(), hi.data());
        for (int slot = 0; slot < n; ++slot) {
          const T* k = v.key<T>(phys, h, slot);
          for (int c = 0; c < d; ++c) key[c] = to_f32(k[c]);
          kv::encode_page_codes(key.data(), lo.data(), hi.data(), d, want.data());
          const std::uint8_t* got = pc.row(phys, h, slot);
          ASSERT_TRUE(std::equal(want.begin(), want.end(), got))
              << "seq " << b << " page " << j << " head " << h << " slot " << slot;
          // The channel-major copy holds the same codes.
          for (int c = 0; c < d; ++c) {
            const std::uint8_t* w = pc.chan_row(h, c) + static_cast<std::int64_t>(phys) * pc.chan_word_bytes();
            ASSERT_EQ((w[slot >> 2] >> (2 * (slot & 3))) & 3, (got[c >> 2] >> (2 * (c & 3))) & 3)
                << "channel-major copy: page " << j << " head " << h << " slot " << slot << " c " << c;
          }
        }
        for (int c = 0; c < d; ++c) {
          const std::uint8_t* rr = pc.chan_range_row(h, c) + 2 * static_cast<std::int64_t>(phys);
          ASSERT_EQ(rr[0], r.a[c]);
          ASSERT_EQ(rr[1], r.b[c]);
        }
      }
    }
  }
}

template <class T>
void codes_through_appends_and_forks(DType dtype) {
  std::mt19937 rng(5);
  std::normal_distribution<float> N(0.0f, 1.0f);
  for (int P : {1, 4, 16}) {
    for (int d : {8, 20}) {
      kv::CacheConfig cfg;
      cfg.num_kv_heads = 2;
      cfg.head_dim = d;
      cfg.page_size = P;
      cfg.dtype = dtype;
      cfg.capacity_pages = 400 / P + 40;
      cfg.page_codes = true;
      kv::PagedKVCache cache(cfg);
      std::vector<kv::SeqId> seqs{cache.create()};
      auto append = [&](kv::SeqId s, int n) {
        std::vector<float> k(static_cast<std::size_t>(n) * 2 * d), v(k.size());
        // Keys that drift upward: the ranges keep moving as pages fill.
        for (std::size_t i = 0; i < k.size(); ++i) {
          k[i] = N(rng) * (1.0f + 0.1f * static_cast<float>(i % 7));
          v[i] = N(rng);
        }
        cache.append(s, k, v, n);
      };
      append(seqs[0], 37);
      for (int step = 0; step < 20; ++step) append(seqs[0], 1);
      seqs.push_back(cache.fork(seqs[0]));  // shares the partial page: copy on write
      append(seqs[1], 3);
      append(seqs[0], 1);
      for (int step = 0; step < 5; ++step) append(seqs[step % 2], 1 + step);
      expect_codes_current<T>(cache, seqs);
    }
  }
}

TEST(PageCodes, CacheKeepsTheEncodingOfTheStoredKeysThroughAppendsAndForks) {
  codes_through_appends_and_forks<float>(DType::f32);
  codes_through_appends_and_forks<f16>(DType::f16);
  codes_through_appends_and_forks<bf16>(DType::bf16);
}

TEST(PageCodes, OffUnlessConfigured) {
  kv::CacheConfig cfg;
  cfg.num_kv_heads = 1;
  cfg.head_dim = 8;
  cfg.capacity_pages = 4;
  kv::PagedKVCache cache(cfg);
  EXPECT_TRUE(cache.page_codes().empty());
}

}  // namespace
}  // namespace masskv
