// Scorer "page_codes": tokens ranked per q head by q·x̂ on the page codes (kv/page_codes.hpp:
// each key, per channel, as one of four levels of its page's range on an 8-bit grid; the score
// in integers), page by page with every q head at once. It ranks the tokens of a given list
// (two_stage's candidates) or every token (token_codes), reading their codes and the ranges.
#include "masskv/error.hpp"
#include "masskv/kv/page_codes.hpp"
#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

void check(const SelectArgs& a, const SelectorConfig&) {
  using enum ErrorCode;
  const kv::PageCodesView& pc = a.page_codes;
  require(!pc.empty(), invalid_argument, "page_codes",
          "this method scores on the cache's page codes (CacheConfig::page_codes)");
  require(pc.num_pages == a.cache.num_pages && pc.num_kv_heads == a.cache.num_kv_heads &&
              pc.head_dim == a.cache.head_dim && pc.page_size == a.cache.page_size,
          shape_mismatch, "page_codes", "shape differs from the cache's");
  require(pc.range_min != nullptr && pc.range_max != nullptr && pc.grid != nullptr,
          invalid_argument, "page_codes", "the ranges (range_min, range_max, grid) are missing");
}

void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  thread_local std::vector<float> qs;
  thread_local std::vector<std::int16_t> q8;
  thread_local std::vector<kv::CodeQuery> cq;
  thread_local std::vector<std::int32_t> slots;
  S.mass.clear();
  if (!want.rank) return;
  const int P = G.page_size, g = G.g, d = X.d;
  const std::span<const std::int32_t> items = want.items;
  const int K = items.empty() ? G.n : static_cast<int>(items.size());
  auto item = [&](int k) { return items.empty() ? k : items[static_cast<std::size_t>(k)]; };
  S.rank.resize(static_cast<std::size_t>(g) * static_cast<std::size_t>(K));
  qs.resize(static_cast<std::size_t>(d));
  q8.resize(static_cast<std::size_t>(g) * static_cast<std::size_t>(d));
  cq.resize(static_cast<std::size_t>(g));
  slots.resize(static_cast<std::size_t>(P));
  for (int i = 0; i < g; ++i) {  // each q head's integer form, once per group
    const float* q = qrow(X, G.b, G.h * X.gsize + i);
    for (int x = 0; x < d; ++x) qs[static_cast<std::size_t>(x)] = q[x] * X.scale;
    cq[static_cast<std::size_t>(i)] =
        kv::code_query(qs.data(), d, q8.data() + static_cast<std::size_t>(i) * d);
  }
  const kv::PageCodesView& pc = X.a.page_codes;
  for (int k = 0; k < K;) {  // page by page, every head at once
    const int j = item(k) / P;
    const std::int32_t phys = G.phys[static_cast<std::size_t>(j)];
    int n = 0;
    for (; n < P && k + n < K && item(k + n) / P == j; ++n) {
      slots[static_cast<std::size_t>(n)] = item(k + n) - j * P;
    }
    kv::page_code_scores(cq.data(), g, pc.range(phys, G.h), pc.row(phys, G.h, 0), slots.data(), n,
                         d, rank_row(S, K, 0) + k, static_cast<std::size_t>(K));
    k += n;
  }
}

}  // namespace

extern const Scorer scorer_page_codes;
const Scorer scorer_page_codes{
    .name = "page_codes",
    .provides = kRank | kHeads | kListed,
    .tokens = [](const SelectorConfig&) { return true; },
    .check = check,
    .score = score,
};

}  // namespace masskv::select::detail
