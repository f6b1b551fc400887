// Shared inputs of the selector and certificate tests: a PagedKVCache (pages + summaries)
// holding B sequences of given keys/values, and queries whose GQA heads share a direction.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "masskv/kv/cache.hpp"
#include "masskv/kv/key_rows.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::test {

// Runs a test body on one OpenMP thread and restores the count: the many tiny cases of these
// tests would otherwise spend their time in thread start-up and barriers (results do not
// depend on the thread count; Selectors.ResultsDoNotDependOnThreadCount checks that).
class OneThread {
 public:
  OneThread() : prev_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(prev_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int prev_;
};

struct SelCase {
  kv::PagedKVCache cache;
  std::vector<kv::SeqId> seqs;
  kv::PageTableStorage table;
  std::vector<float> q;  // [B][Hq][d]
  int B = 0, Hq = 0, Hkv = 0, d = 0, P = 0;

  kv::PagedKVView view() const { return cache.view(table); }
  View3<const float> qview() const { return View3<const float>::contiguous(q.data(), B, Hq, d); }
  select::SelectArgs args() const {
    select::SelectArgs a;
    a.q = qview();
    a.cache = view();
    a.summaries = cache.summaries();
    a.page_codes = cache.page_codes();  // empty unless the case keeps them
    return a;
  }
};

// A learned selector's key rows kept beside the KV (learned_codes' first pass): rows[b] is
// [length_b][groups][dim] f32, stored in `format`.
struct KeyRowsSpec {
  int groups = 1, dim = 32;
  kv::RowFormat format = kv::RowFormat::f32;
  std::vector<std::vector<float>> rows;
};

// keys[b] / values[b]: [length_b][Hkv][d] f32.
inline SelCase make_case(const std::vector<std::vector<float>>& keys,
                         const std::vector<std::vector<float>>& values, std::vector<float> q,
                         int Hq, int Hkv, int d, int P, DType dtype, bool page_codes = false,
                         const KeyRowsSpec* key_rows = nullptr) {
  kv::CacheConfig cfg;
  cfg.page_codes = page_codes;
  if (key_rows) {
    cfg.key_row_groups = key_rows->groups;
    cfg.key_row_dim = key_rows->dim;
    cfg.key_row_format = key_rows->format;
  }
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = d;
  cfg.page_size = P;
  cfg.dtype = dtype;
  int pages = 0;
  for (const auto& k : keys) {
    const int len = static_cast<int>(k.size() / (static_cast<std::size_t>(Hkv) * d));
    pages += (len + P - 1) / P;
  }
  cfg.capacity_pages = pages + 3;
  SelCase c{
      kv::PagedKVCache(cfg), {}, {}, std::move(q), static_cast<int>(keys.size()), Hq, Hkv, d, P};
  for (std::size_t b = 0; b < keys.size(); ++b) {
    const kv::SeqId s = c.cache.create();
    const int len = static_cast<int>(keys[b].size() / (static_cast<std::size_t>(Hkv) * d));
    if (key_rows) {
      c.cache.append(s, keys[b], values[b], len, key_rows->rows[b]);
    } else {
      c.cache.append(s, keys[b], values[b], len);
    }
    c.seqs.push_back(s);
  }
  c.table = c.cache.page_table(c.seqs);
  return c;
}

// Random case: N(0,1) keys with a per-page mean shift (so pages differ), N(0,1) values, q heads
// of a group = a shared direction + `disagree` x independent noise, times `sharp`.
inline SelCase random_case(std::mt19937& rng, const std::vector<int>& lengths, int Hq, int Hkv,
                           int d, int P, DType dtype, float sharp = 2.0f, float disagree = 0.5f,
                           float page_shift = 0.7f, bool page_codes = false,
                           const KeyRowsSpec* key_rows = nullptr) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<std::vector<float>> K, V;
  for (int len : lengths) {
    std::vector<float> k(static_cast<std::size_t>(len) * Hkv * d), v(k.size());
    std::vector<float> shift(static_cast<std::size_t>(Hkv) * d);
    for (int t = 0; t < len; ++t) {
      if (t % P == 0) {
        for (float& s : shift) s = page_shift * N(rng);
      }
      for (std::size_t x = 0; x < shift.size(); ++x) {
        k[static_cast<std::size_t>(t) * shift.size() + x] = N(rng) + shift[x];
        v[static_cast<std::size_t>(t) * shift.size() + x] = N(rng);
      }
    }
    K.push_back(std::move(k));
    V.push_back(std::move(v));
  }
  const int B = static_cast<int>(lengths.size()), g = Hq / Hkv;
  std::vector<float> q(static_cast<std::size_t>(B) * Hq * d);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < Hkv; ++h) {
      std::vector<float> base(static_cast<std::size_t>(d));
      for (float& x : base) x = N(rng);
      for (int i = 0; i < g; ++i) {
        for (int x = 0; x < d; ++x) {
          q[(static_cast<std::size_t>(b) * Hq + h * g + i) * d + x] =
              sharp * (base[x] + disagree * N(rng));
        }
      }
    }
  }
  return make_case(K, V, std::move(q), Hq, Hkv, d, P, dtype, page_codes, key_rows);
}

}  // namespace masskv::test
