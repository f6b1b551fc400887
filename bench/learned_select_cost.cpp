// One layer's selector call at 4096 tokens in SmolLM2's geometry (docs/learned.md, "Cost"):
// learned (d_s = 32, head-collapsed, f32 key rows; fixed 1/16 and p0.9:1/8) against Quest
// 1/16, token_codes 1/16 (the default: two passes, and one pass) and learned_codes 1/16 (a
// 32-dim selector per kv group on int4 key rows, or a 16-dim one on nvfp4 rows, its best 4 ×
// the budget rescored on the codes: the lab's proj32 / proj16 cascades), the calls interleaved
// 600 times so a loaded machine slows them alike. Not part of the CMake build:
//   g++ -O2 -std=c++20 -fopenmp -Iinclude bench/learned_select_cost.cpp build/libmasskv.a \
//       -o /tmp/learned_select_cost -lmvec && OMP_NUM_THREADS=1 /tmp/learned_select_cost [TOKENS]
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <random>
#include "masskv/kv/cache.hpp"
#include "masskv/select/selector.hpp"
using namespace masskv;
int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 4096;  // context tokens (default 4096)
  // Two caches of the same K/V: one with head-collapsed f32 key rows (learned), one with a row
  // per kv group in int4 (learned_codes).
  auto config = [&](int groups, kv::RowFormat f, int dim = 32) {
    kv::CacheConfig cc; cc.num_kv_heads = 3; cc.head_dim = 64; cc.page_size = 16; cc.dtype = DType::f16;
    cc.capacity_pages = tokens / 16 + 44; cc.key_row_groups = groups; cc.key_row_dim = dim; cc.page_codes = true;
    cc.key_row_format = f;
    return cc;
  };
  kv::PagedKVCache cache(config(1, kv::RowFormat::f32)), cache3(config(3, kv::RowFormat::int4)),
      cache16(config(3, kv::RowFormat::nvfp4, 16));
  auto s = cache.create(), s3 = cache3.create(), s16 = cache16.create();
  std::mt19937 rng(1); std::normal_distribution<float> nd(0, 1);
  std::vector<float> k(192), v(192), r(32), r3(96), r16(48);
  for (int t = 0; t < tokens; ++t) {
    for (auto& x : k) x = nd(rng); for (auto& x : v) x = nd(rng); for (auto& x : r) x = nd(rng) * 3;
    for (auto& x : r3) x = nd(rng); for (auto& x : r16) x = nd(rng);
    cache.append(s, k, v, 1, r); cache3.append(s3, k, v, 1, r3); cache16.append(s16, k, v, 1, r16);
  }
  auto table = cache.page_table(std::span<const kv::SeqId>(&s, 1));
  auto table3 = cache3.page_table(std::span<const kv::SeqId>(&s3, 1));
  auto table16 = cache16.page_table(std::span<const kv::SeqId>(&s16, 1));
  std::vector<float> q(9 * 64, 0.3f), lq(32), lq3(96), lq16(48);
  for (auto& x : lq) x = nd(rng); for (auto& x : lq3) x = nd(rng); for (auto& x : lq16) x = nd(rng);
  select::SelectArgs sa; sa.q = View3<const float>::contiguous(q.data(), 1, 9, 64); sa.cache = cache.view(table);
  sa.summaries = cache.summaries(); sa.learned_q = View3<const float>::contiguous(lq.data(), 1, 1, 32); sa.learned_keys = cache.key_rows();
  sa.page_codes = cache.page_codes();
  select::SelectArgs sa3 = sa; sa3.cache = cache3.view(table3); sa3.summaries = cache3.summaries();
  sa3.learned_q = View3<const float>::contiguous(lq3.data(), 1, 3, 32); sa3.learned_keys = cache3.key_rows();
  sa3.page_codes = cache3.page_codes();
  select::SelectArgs sa16 = sa; sa16.cache = cache16.view(table16); sa16.summaries = cache16.summaries();
  sa16.learned_q = View3<const float>::contiguous(lq16.data(), 1, 3, 16); sa16.learned_keys = cache16.key_rows();
  sa16.page_codes = cache16.page_codes();
  constexpr int kModes = 7;  // learned 1/16, learned p0.9:1/8, Quest, token_codes, one pass, learned_codes x2
  double tot[kModes] = {}; int pages[kModes] = {};
  for (int i = 0; i < 600; ++i) for (int mode = 0; mode < kModes; ++mode) {
    select::SelectorConfig c;
    c.method = mode == 2 ? select::Method::quest
             : mode >= 5 ? select::Method::learned_codes
             : mode >= 3 ? select::Method::token_codes : select::Method::learned;
    c.budget.tokens = (mode == 1 ? 2 : 1) * (tokens / 16 + 2);
    if (mode >= 3) c.budget.tokens = tokens / 16;  // tokens, not pages: 1/16
    if (mode == 4) c.code_channels = 1.0;
    if (mode == 1) { c.budget.kind = select::Budget::Kind::top_p; c.budget.p = 0.9; }
    select::SelectOutput out;
    auto t0 = std::chrono::steady_clock::now();
    select::run_selector(mode == 5 ? sa3 : mode == 6 ? sa16 : sa, c, out);
    tot[mode] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    pages[mode] = out.selection.count[0];
  }
  const char* names[kModes] = {"learned 1/16", "learned p0.9:1/8", "quest 1/16", "token_codes 1/16 (two passes)",
                               "token_codes 1/16 (one pass)", "learned_codes 1/16 (int4, 4x)",
                               "learned_codes 1/16 (nvfp4 16, 4x)"};
  for (int mode = 0; mode < kModes; ++mode) std::printf("%-30s %.1f us per call, %d items\n", names[mode], tot[mode] / 600 * 1e6, pages[mode]);
}
