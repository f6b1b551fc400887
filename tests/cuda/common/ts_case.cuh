// Host caches and their device copies for the two-stage / token-codes checks
// (tests/cuda/two_stage_check.cu) and profile-two-stage (tools/gpu_bench/two_stage_bench.cu).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpu_util.cuh"
#include "masskv/dtype.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/page_codes.hpp"
#include "masskv/select/page_bound.hpp"

namespace {


double normal(Rng& rng) {
  const double u1 = std::max(rng.uniform(), 1e-300), u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A host cache of B sequences of the given lengths, appended in interleaved pieces (so the
// sequences' physical pages interleave). tie_keys: keys and values in {-1, 0, 1} (many equal
// bounds and code scores: the tie rules run).
struct HostCache {
  std::unique_ptr<masskv::kv::PagedKVCache> cache;
  std::vector<masskv::kv::SeqId> seqs;
  masskv::kv::PageTableStorage table;
};
HostCache make_cache(Rng& rng, const std::vector<int>& lengths, int Hkv, int d, int P, masskv::DType dt,
                     bool codes, bool tie_keys) {
  HostCache h;
  masskv::kv::CacheConfig cfg;
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = d;
  cfg.page_size = P;
  cfg.dtype = dt;
  cfg.layout = masskv::kv::Layout::HND;
  cfg.page_codes = codes;
  int pages = 0;
  for (int L : lengths) pages += (L + P - 1) / P + 1;
  cfg.capacity_pages = pages + 1;
  h.cache = std::make_unique<masskv::kv::PagedKVCache>(cfg);
  for (std::size_t b = 0; b < lengths.size(); ++b) h.seqs.push_back(h.cache->create());
  std::vector<int> have(lengths.size(), 0);
  // Channel scales: some channels wide, some narrow (ranges differ across channels).
  std::vector<double> cs(static_cast<std::size_t>(d));
  for (double& x : cs) x = 0.3 + 2.0 * rng.uniform();
  bool more = true;
  while (more) {
    more = false;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const int left = lengths[b] - have[b];
      if (left <= 0) continue;
      const int n = std::min(left, 1 + rng.below(3 * P));
      std::vector<float> k(static_cast<std::size_t>(n) * Hkv * d), v(k.size());
      for (std::size_t i = 0; i < k.size(); ++i) {
        if (tie_keys) {
          k[i] = static_cast<float>(rng.below(3) - 1);
          v[i] = static_cast<float>(rng.below(3) - 1);
        } else {
          k[i] = static_cast<float>(normal(rng) * cs[i % d] + 0.2 * cs[(i + 7) % d]);
          v[i] = static_cast<float>(normal(rng));
        }
      }
      h.cache->append(h.seqs[b], k, v, n);
      have[b] += n;
      more = more || have[b] < lengths[b];
    }
  }
  h.table = h.cache->page_table(h.seqs);
  return h;
}

std::vector<float> random_q(Rng& rng, std::size_t n, bool ties) {
  std::vector<float> q(n);
  for (float& x : q) x = ties ? static_cast<float>(rng.below(3) - 1) : static_cast<float>(normal(rng) * 1.5);
  return q;
}

struct DevTable {
  DevBuf<std::int32_t> indptr, indices, last;
  explicit DevTable(const masskv::kv::PageTableStorage& t)
      : indptr(to_device(t.indptr)), indices(to_device(t.indices)), last(to_device(t.last_page_len)) {}
  masskv::kv::PageTable view() const {
    return {{indptr.p, indptr.n}, {indices.p, indices.n}, {last.p, last.n}};
  }
};

// The device copies of a host cache's selector inputs.
struct TsGpu {
  DevBuf<std::uint16_t> bmin, bmax;
  DevBuf<std::uint8_t> codes, rmin, rmax, chan_codes, chan_ranges;
  DevBuf<float> grid, chan_spread;
  masskv::select::BoundStoreView store;
  masskv::kv::PageCodesView pc;
  TsGpu(const masskv::select::BoundStoreView& hs, const masskv::kv::PageCodesView& hpc) {
    const std::size_t n = static_cast<std::size_t>(hs.num_pages) * hs.num_kv_heads * hs.head_dim;
    bmin = DevBuf<std::uint16_t>(n);
    bmax = DevBuf<std::uint16_t>(n);
    bmin.upload(reinterpret_cast<const std::uint16_t*>(hs.min), n);
    bmax.upload(reinterpret_cast<const std::uint16_t*>(hs.max), n);
    store = hs;
    store.min = reinterpret_cast<const masskv::bf16*>(bmin.p);
    store.max = reinterpret_cast<const masskv::bf16*>(bmax.p);
    store.wmax = nullptr;
    const std::size_t nc = static_cast<std::size_t>(hpc.num_pages) * hpc.num_kv_heads *
                           hpc.page_size * masskv::kv::page_code_bytes(hpc.head_dim);
    const std::size_t nr = static_cast<std::size_t>(hpc.num_pages) * hpc.num_kv_heads * hpc.head_dim;
    const std::size_t ng = static_cast<std::size_t>(hpc.num_pages) * hpc.num_kv_heads * 2;
    codes = DevBuf<std::uint8_t>(nc);
    codes.upload(hpc.codes, nc);
    rmin = DevBuf<std::uint8_t>(nr);
    rmin.upload(hpc.range_min, nr);
    rmax = DevBuf<std::uint8_t>(nr);
    rmax.upload(hpc.range_max, nr);
    grid = DevBuf<float>(ng);
    grid.upload(hpc.grid, ng);
    pc = hpc;
    pc.codes = codes.p;
    pc.range_min = rmin.p;
    pc.range_max = rmax.p;
    pc.grid = grid.p;
    // The channel-major copy (token_codes' first pass), where the cache keeps one.
    pc.chan_codes = nullptr;
    pc.chan_ranges = nullptr;
    if (hpc.chan_codes != nullptr && hpc.chan_ranges != nullptr) {
      const std::size_t per = static_cast<std::size_t>(hpc.num_kv_heads) * hpc.head_dim *
                              static_cast<std::size_t>(hpc.num_pages);
      const std::size_t ncc = per * static_cast<std::size_t>(hpc.chan_word_bytes());
      chan_codes = DevBuf<std::uint8_t>(ncc);
      chan_codes.upload(hpc.chan_codes, ncc);
      chan_ranges = DevBuf<std::uint8_t>(2 * per);
      chan_ranges.upload(hpc.chan_ranges, 2 * per);
      pc.chan_codes = chan_codes.p;
      pc.chan_ranges = chan_ranges.p;
    }
    pc.chan_spread = nullptr;
    if (hpc.chan_spread != nullptr) {  // the spread rows the first pass weighs channels by
      chan_spread = DevBuf<float>(nr);
      chan_spread.upload(hpc.chan_spread, nr);
      pc.chan_spread = chan_spread.p;
    }
  }
};

}  // namespace
