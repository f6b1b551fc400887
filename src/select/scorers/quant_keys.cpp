// Scorer "quant_keys": page masses from scores on the selector keys of every token (§2.9,
// docs/design.md; kv/key_formats.hpp, any format): softmax or entmax of the approximate scores,
// summed per page. The scores are computed on the codes (kv::dot_row_kernel); no dequantised
// key is stored. Its ranking is its mass. top_p with MassSource::quant_keys.
#include <algorithm>

#include "masskv/error.hpp"
#include "select/scorer.hpp"
#include "select/scores.hpp"

namespace masskv::select::detail {
namespace {

void check(const SelectArgs& a, const SelectorConfig&) {
  using enum ErrorCode;
  const kv::SelectorKeysView& k = a.selector_keys;
  require(!k.empty(), invalid_argument, "selector_keys",
          "MassSource::quant_keys needs the cache's selector keys");
  require(k.format == kv::KeyFormat::bf16 || k.scales != nullptr, invalid_argument,
          "selector_keys", "the ", kv::to_string(k.format), " selector keys have no scales");
  kv::check_key_dim(k.format, k.head_dim, "selector_keys");
  require(k.num_pages == a.cache.num_pages && k.num_kv_heads == a.cache.num_kv_heads &&
              k.head_dim == a.cache.head_dim && k.page_size == a.cache.page_size,
          shape_mismatch, "selector_keys", "shape differs from the cache's");
}

// Page masses of q head i into w.
void quant_key_masses(const Context& X, const Group& G, int i, double* w) {
  thread_local std::vector<double> qs, qp;  // token scores and probabilities
  qs.clear();
  append_selector_key_scores(X.a.selector_keys, X.a.cache.table, G.b, G.h,
                             qrow(X, G.b, G.h * X.gsize + i), X.scale, qs);
  qp.resize(qs.size());
  if (X.c.mapping.is_entmax()) {
    entmax(std::span<const double>(qs), X.c.mapping.alpha, std::span<double>(qp));
  } else {
    softmax(std::span<const double>(qs), std::span<double>(qp));
  }
  std::fill(w, w + G.pages, 0.0);
  for (std::size_t t = 0; t < qp.size(); ++t) w[t / static_cast<std::size_t>(G.page_size)] += qp[t];
}

void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  const int n = G.n, g = G.g;
  const std::size_t ng = static_cast<std::size_t>(g) * static_cast<std::size_t>(n);
  S.mass.resize(ng);
  if (want.rank) S.rank.resize(ng);
  for (int i = 0; i < g; ++i) {
    quant_key_masses(X, G, i, mass_row(S, n, i));
    if (want.rank) std::copy_n(mass_row(S, n, i), n, rank_row(S, n, i));
  }
}

}  // namespace

extern const Scorer scorer_quant_keys;
const Scorer scorer_quant_keys{
    .name = "quant_keys",
    .provides = kRank | kHeads | kMass,
    .rank_is_mass = true,
    .check = check,
    .score = score,
};

}  // namespace masskv::select::detail
