// Random inputs of engine_pages (masskv/kv/engine_pages.hpp), shared by the CPU test
// (tests/test_engine_pages.cpp: kv::engine_pages against a set-union reference) and the GPU test
// (tests/cuda/engine_pages_check.cu: cuda::engine_pages against kv::engine_pages). Plain C++.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "masskv/kv/cache.hpp"
#include "masskv/selection.hpp"

namespace masskv::test {

struct EngineCase {
  int batch, kv_heads, page_size, max_pages;
  double density;  // each page's chance to be in a kv head's list
};

struct EngineData {
  kv::PageTableStorage table;  // physical pages shuffled over a pool of 2x the pages
  SelectionStorage selection;  // ascending logical ids; the last page in most lists
  int pool_pages = 0;
};

// Sequences of 0..max_pages pages (0 only when `empty_sequences`), random last_page_len, and per
// (sequence, kv head) a random ascending subset of the sequence's pages, its last page added
// with probability 0.8, in lists of max_per_head = max_pages + 2 slots.
inline EngineData make_engine_data(const EngineCase& c, std::mt19937_64& rng,
                                   bool empty_sequences = false) {
  EngineData d;
  std::vector<int> pages(static_cast<std::size_t>(c.batch));
  std::uniform_int_distribution<int> npages(empty_sequences ? 0 : 1, c.max_pages);
  for (int& n : pages) n = npages(rng);
  const int total = std::accumulate(pages.begin(), pages.end(), 0);
  d.pool_pages = 2 * total + 1;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(d.pool_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::uniform_int_distribution<int> len(1, c.page_size);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  d.table.indptr.push_back(0);
  for (int b = 0; b < c.batch; ++b) {
    for (int j = 0; j < pages[b]; ++j)
      d.table.indices.push_back(pool[d.table.indices.size()]);
    d.table.indptr.push_back(static_cast<std::int32_t>(d.table.indices.size()));
    d.table.last_page_len.push_back(len(rng));
  }
  d.selection.reset(SelectionView::Unit::page, c.batch, c.kv_heads, c.max_pages + 2);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.kv_heads; ++h) {
      int n = 0;
      const auto slots = d.selection.slots(b, h);
      const bool with_last = u(rng) < 0.8;
      for (int j = 0; j < pages[b]; ++j)
        if (u(rng) < c.density || (with_last && j + 1 == pages[b])) slots[n++] = j;
      d.selection.count[static_cast<std::size_t>(b) * c.kv_heads + h] = n;
    }
  return d;
}

}  // namespace masskv::test
