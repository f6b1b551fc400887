// INT4 selector keys (DESIGN.md §2.9, kv/int4_keys.hpp): the format's error bound, scores on
// the nibbles against f64 sums of the decoded values, the cache's key store (append, fork),
// and top_p with MassSource::quant_keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "core/cpu_features.hpp"
#include "kv/int4_kernels.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/int4_keys.hpp"
#include "masskv/select/diagnostics.hpp"
#include "masskv/select/selector.hpp"
#include "selector_fixture.hpp"

namespace masskv {
namespace {

using kv::int4::kBlock;
using select::Budget;

std::vector<float> random_row(std::mt19937& rng, int d, float magnitude) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(d));
  for (int i = 0; i < d; ++i) x[i] = magnitude * N(rng);
  if (d >= 64) {
    std::fill_n(x.begin() + kBlock, kBlock, 0.0f);  // an all-zero block: scale 0
    x[5] = 40.0f * magnitude;                        // an outlier channel
  }
  return x;
}

TEST(Int4Keys, RoundTripIsWithinTheFormatBound) {
  std::mt19937 rng(1);
  int rows = 0;
  for (int d : {32, 64, 96, 128, 256}) {
    for (float mag : {1e-9f, 1e-3f, 1.0f, 300.0f, 9000.0f}) {
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> x = random_row(rng, d, mag);
        std::vector<std::uint8_t> packed(static_cast<std::size_t>(kv::int4::row_bytes(d)));
        std::vector<f16> scales(static_cast<std::size_t>(kv::int4::row_scales(d)));
        kv::int4::quantize_row(x.data(), d, packed.data(), scales.data());
        std::vector<float> y(static_cast<std::size_t>(d));
        kv::int4::dequantize_row(packed.data(), scales.data(), d, y.data());
        for (int b = 0; b < d / kBlock; ++b) {
          float mx = 0;
          for (int i = 0; i < kBlock; ++i) mx = std::max(mx, std::fabs(x[b * kBlock + i]));
          EXPECT_EQ(scales[b].bits, f32_to_f16(mx / 7.0f).bits);  // s = f16(max / 7)
          const double s = f16_to_f32(scales[b]);
          const double bound = s * (0.5 + 0x1p-20) + 7 * 0x1p-25;
          for (int i = 0; i < kBlock; ++i) {
            const int at = b * kBlock + i;
            EXPECT_LE(std::fabs(static_cast<double>(x[at]) - y[at]), bound) << d << " " << mag;
          }
        }
        for (std::uint8_t byte : packed) {  // symmetric: the nibble 0 (q = -8) never occurs
          EXPECT_NE(byte & 0x0f, 0);
          EXPECT_NE(byte >> 4, 0);
        }
        ++rows;
      }
    }
  }
  EXPECT_EQ(rows, 500);
}

TEST(Int4Keys, ScoresOnTheNibblesMatchF64OfTheDecodedKeys) {
  std::mt19937 rng(2);
  std::normal_distribution<float> N(0.0f, 1.0f);
  for (int d : {32, 64, 128, 256}) {
    for (int rep = 0; rep < 50; ++rep) {
      const std::vector<float> x = random_row(rng, d, rep % 2 ? 0.01f : 5.0f);
      std::vector<float> q(static_cast<std::size_t>(d));
      for (float& v : q) v = 3.0f * N(rng);
      std::vector<std::uint8_t> packed(static_cast<std::size_t>(d / 2));
      std::vector<f16> scales(static_cast<std::size_t>(d / kBlock));
      kv::int4::quantize_row(x.data(), d, packed.data(), scales.data());
      std::vector<float> y(static_cast<std::size_t>(d));
      kv::int4::dequantize_row(packed.data(), scales.data(), d, y.data());
      long double ref = 0, abs = 0;
      for (int i = 0; i < d; ++i) {
        ref += static_cast<long double>(q[i]) * y[i];
        abs += std::fabs(static_cast<long double>(q[i]) * y[i]);
      }
      // f32 sums of d terms (exact products of small integers and f32 q, then the scale).
      const double tol = (d + 4) * 0x1p-24 * static_cast<double>(abs);
      const auto* s16 = reinterpret_cast<const std::uint16_t*>(scales.data());
      EXPECT_NEAR(kv::int4::detail::dot_row_portable(q.data(), packed.data(), s16, d),
                  static_cast<double>(ref), tol);
      if (cpu::has_avx2()) {
        EXPECT_NEAR(kv::int4::detail::dot_row_avx2(q.data(), packed.data(), s16, d),
                    static_cast<double>(ref), tol);
      }
      EXPECT_NEAR(kv::int4::dot_row(q.data(), packed.data(), scales.data(), d),
                  static_cast<double>(ref), tol);
    }
  }
}

kv::CacheConfig int4_config(DType dt, int d) {
  kv::CacheConfig cfg;
  cfg.num_kv_heads = 2;
  cfg.head_dim = d;
  cfg.page_size = 4;
  cfg.dtype = dt;
  cfg.capacity_pages = 16;
  cfg.int4_selector_keys = true;
  return cfg;
}

// Every selector key row is the format's encoding of the stored (converted) key.
void expect_rows_match(const kv::PagedKVCache& c, kv::SeqId s) {
  const kv::PageTableStorage t = c.page_table(std::span<const kv::SeqId>(&s, 1));
  const kv::PagedKVView v = c.view(t);
  const kv::SelectorKeysView K = c.selector_keys();
  const int d = v.head_dim;
  for (std::int64_t tok = 0; tok < c.length(s); ++tok) {
    const std::int32_t page = t.indices[static_cast<std::size_t>(tok / v.page_size)];
    const int slot = static_cast<int>(tok % v.page_size);
    for (int h = 0; h < v.num_kv_heads; ++h) {
      std::vector<float> key(static_cast<std::size_t>(d));
      const f16* k = v.key<f16>(page, h, slot);
      for (int i = 0; i < d; ++i) key[i] = f16_to_f32(k[i]);
      std::vector<std::uint8_t> packed(static_cast<std::size_t>(d / 2));
      std::vector<f16> scales(static_cast<std::size_t>(d / kBlock));
      kv::int4::quantize_row(key.data(), d, packed.data(), scales.data());
      EXPECT_TRUE(std::equal(packed.begin(), packed.end(), K.row(page, h, slot)));
      for (int b = 0; b < d / kBlock; ++b) EXPECT_EQ(K.row_scales(page, h, slot)[b].bits, scales[b].bits);
    }
  }
}

TEST(Int4Keys, CacheQuantisesStoredKeysOnAppendAndCopiesThemOnFork) {
  std::mt19937 rng(3);
  std::normal_distribution<float> N(0.0f, 1.0f);
  kv::PagedKVCache c(int4_config(DType::f16, 64));
  auto tokens = [&](int n) {
    std::vector<float> x(static_cast<std::size_t>(n) * 2 * 64);
    for (float& v : x) v = 2.0f * N(rng);
    return x;
  };
  const kv::SeqId a = c.create();
  auto k = tokens(6), v = tokens(6);
  c.append(a, k, v, 6);  // 1.5 pages: the last one partial
  const kv::SeqId b = c.fork(a);
  k = tokens(3);
  v = tokens(3);
  c.append(b, k, v, 3);  // copy-on-write of the shared partial page
  k = tokens(1);
  v = tokens(1);
  c.append(a, k, v, 1);
  expect_rows_match(c, a);
  expect_rows_match(c, b);
  EXPECT_DOUBLE_EQ(c.selector_key_bytes_per_token(), 2 * (32 + 4));
}

TEST(Int4Keys, RejectsKeysBeyondTheRangeAndHeadDimsOffTheBlock) {
  kv::PagedKVCache c(int4_config(DType::f32, 32));
  const kv::SeqId s = c.create();
  std::vector<float> k(64, 1.0f), v(64, 1.0f);
  k[40] = 7.0f * 70000.0f;
  try {
    c.append(s, k, v, 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "k");
  }
  EXPECT_EQ(c.length(s), 0);  // nothing appended
  try {
    kv::PagedKVCache bad(int4_config(DType::f16, 24));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "int4_selector_keys");
  }
}

// Random case with INT4 selector keys (the fixture's keys, appended to a cache that keeps them).
test::SelCase quant_case(std::mt19937& rng, const std::vector<int>& lengths, int Hq, int Hkv,
                         int d, int P) {
  test::SelCase c = test::random_case(rng, lengths, Hq, Hkv, d, P, DType::bf16, 1.5f);
  kv::CacheConfig cfg = c.cache.config();
  cfg.int4_selector_keys = true;
  kv::PagedKVCache cache(cfg);
  std::vector<kv::SeqId> seqs;
  for (kv::SeqId s : c.seqs) {
    const kv::PageTableStorage t = c.cache.page_table(std::span<const kv::SeqId>(&s, 1));
    const kv::PagedKVView v = c.cache.view(t);
    const std::int64_t L = c.cache.length(s);
    std::vector<float> k(static_cast<std::size_t>(L) * Hkv * d), val(k.size());
    for (std::int64_t tok = 0; tok < L; ++tok) {
      for (int h = 0; h < Hkv; ++h) {
        const std::int32_t page = t.indices[static_cast<std::size_t>(tok / P)];
        const bf16* kr = v.key<bf16>(page, h, static_cast<int>(tok % P));
        const bf16* vr = v.value<bf16>(page, h, static_cast<int>(tok % P));
        for (int x = 0; x < d; ++x) {
          k[(static_cast<std::size_t>(tok) * Hkv + h) * d + x] = bf16_to_f32(kr[x]);
          val[(static_cast<std::size_t>(tok) * Hkv + h) * d + x] = bf16_to_f32(vr[x]);
        }
      }
    }
    seqs.push_back(cache.create());
    cache.append(seqs.back(), k, val, static_cast<int>(L));
  }
  c.cache = std::move(cache);
  c.seqs = seqs;
  c.table = c.cache.page_table(c.seqs);
  return c;
}

// f64 page masses of the mapping on scores of the decoded INT4 keys: the reference of
// MassSource::quant_keys.
std::vector<double> reference_page_mass(const test::SelCase& c, int b, int qh, const Mapping& map) {
  const auto t = c.table.table();
  const kv::SelectorKeysView K = c.cache.selector_keys();
  const int g = c.Hq / c.Hkv, h = qh / g, n = t.num_pages(b);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<double> s;
  std::vector<int> page_of;
  for (int j = 0; j < n; ++j) {
    for (int slot = 0; slot < t.page_len(b, j, c.P); ++slot) {
      std::vector<float> y(static_cast<std::size_t>(c.d));
      kv::int4::dequantize_row(K.row(t.page(b, j), h, slot), K.row_scales(t.page(b, j), h, slot),
                               c.d, y.data());
      double dot = 0;
      for (int x = 0; x < c.d; ++x) dot += static_cast<double>(c.qview().row(b, qh)[x]) * y[x];
      s.push_back(scale * dot);
      page_of.push_back(j);
    }
  }
  std::vector<double> p(s.size()), mass(static_cast<std::size_t>(n), 0.0);
  if (map.is_entmax()) {
    entmax(std::span<const double>(s), map.alpha, std::span<double>(p));
  } else {
    softmax(std::span<const double>(s), std::span<double>(p));
  }
  for (std::size_t i = 0; i < p.size(); ++i) mass[page_of[i]] += p[i];
  return mass;
}

TEST(TopPQuantKeys, ValidSelectionsWithinBudgetsAndTheMassOfTheDecodedKeys) {
  test::OneThread one;
  std::mt19937 rng(4);
  int checked = 0;
  for (int P : {4, 16}) {
    for (int g : {1, 4}) {
      for (int d : {32, 64}) {
        test::SelCase c = quant_case(rng, {1, 37, 300}, 2 * g, 2, d, P);
        for (auto kind : {Budget::Kind::fixed, Budget::Kind::top_p, Budget::Kind::adaptive}) {
          for (Mapping map : {Mapping::softmax(), Mapping::entmax(1.5)}) {
            select::SelectorConfig cfg;
            cfg.method = select::Method::top_p;
            cfg.mass_source = select::MassSource::quant_keys;
            cfg.mapping = map;
            cfg.budget = {kind, kind == Budget::Kind::top_p ? 0 : 64, 0.8};
            cfg.sink_pages = 1;
            cfg.window_tokens = 8;
            select::SelectArgs a = c.args();
            a.selector_keys = c.cache.selector_keys();
            select::SelectOutput out;
            select::run_selector(a, cfg, out);
            const SelectionView sel = out.selection.view();
            ASSERT_NO_THROW(select::check_selection(sel, c.table.table(), P, 2));
            for (int b = 0; b < c.B; ++b) {
              const int n = c.table.table().num_pages(b);
              for (int h = 0; h < 2; ++h) {
                const auto ids = sel.list(b, h);
                const std::set<int> have(ids.begin(), ids.end());
                EXPECT_TRUE(have.count(0) && have.count(n - 1));  // sink and last page
                // The kept pages (sink, 8-token window, last page) fit in 64 tokens here.
                const int cap = std::min(n, (64 + P - 1) / P);
                if (kind != Budget::Kind::top_p) {
                  EXPECT_LE(static_cast<int>(ids.size()), cap);
                }
                if (kind == Budget::Kind::fixed) {
                  EXPECT_EQ(static_cast<int>(ids.size()), cap);
                }
                for (int i = 0; i < g; ++i) {
                  const int qh = h * g + i;
                  const std::vector<double> ref = reference_page_mass(c, b, qh, map);
                  double held = 0;
                  for (int j : ids) held += ref[static_cast<std::size_t>(j)];
                  // The estimate is the selected mass of the same model in f32 scores.
                  EXPECT_NEAR(out.estimate[static_cast<std::size_t>(b) * c.Hq + qh], held, 1e-3);
                  if (kind == Budget::Kind::top_p) {
                    EXPECT_GE(held, 0.8 - 1e-3);
                  }
                }
              }
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 48);
}

TEST(TopPQuantKeys, NeedsTheSelectorKeys) {
  std::mt19937 rng(5);
  test::SelCase c = test::random_case(rng, {40}, 2, 1, 32, 4, DType::f32);
  select::SelectorConfig cfg;
  cfg.method = select::Method::top_p;
  cfg.mass_source = select::MassSource::quant_keys;
  cfg.budget = {Budget::Kind::adaptive, 16, 0.9};
  select::SelectOutput out;
  try {
    select::run_selector(c.args(), cfg, out);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "selector_keys");
  }
}

}  // namespace
}  // namespace masskv
