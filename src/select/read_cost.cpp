// Selector read accounting (select/read_cost.hpp).
#include "masskv/select/read_cost.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "masskv/kv/key_formats.hpp"
#include "masskv/kv/page_codes.hpp"
#include "select/kept.hpp"
#include "select/scorer.hpp"

namespace masskv::select {

double selector_read_bytes(const SelectorConfig& c, const kv::PageTable& t, const ReadShape& s,
                           std::span<const std::int32_t> code_pages) {
  const double d = s.head_dim, H = s.num_kv_heads;
  const double bounds = 4.0 * d, moments = 4.0 * d;  // per page and kv head
  // The page codes' ranges: 8-bit min and max codes per channel and their f32 grid (lo, step).
  const double ranges = 2.0 * d + 8.0;
  double bytes = 0;
  for (int b = 0; b < t.batch(); ++b) {
    const int pages = t.num_pages(b);
    const std::int64_t length = t.length(b, s.page_size);
    const double P = pages, L = static_cast<double>(length);
    // The token rules' cap: the budget, or the kept tokens when they are more (and its kept
    // count).
    const auto token_cap = [&] {
      const std::int64_t kept_n =
          kept_tokens(pages, length, s.page_size, c.sink_pages, c.window_tokens).count(length);
      return std::pair{kept_n, std::min(length, std::max(kept_n, c.budget.tokens))};
    };
    // The codes' second pass (token_codes in two passes, learned_codes): the candidates'
    // whole code rows and the whole ranges of the pages holding them: as counted by the
    // selector, else at most one page per candidate (an upper bound: the candidates share
    // pages).
    const auto second_pass = [&](int factor, bool grids_read) {
      const double cand =
          static_cast<double>(detail::code_candidate_count(factor, length, token_cap().second));
      double range_pages = H * std::min(P, cand);
      const auto at = static_cast<std::size_t>(b) * static_cast<std::size_t>(H);
      if (code_pages.size() >= at + static_cast<std::size_t>(H) && code_pages[at] >= 0) {
        range_pages = 0;
        for (std::size_t h = 0; h < static_cast<std::size_t>(H); ++h) {
          range_pages += code_pages[at + h];
        }
      }
      // Each candidate page's range: its 8-bit min and max codes, and its f32 grid unless the
      // first pass read every page's grid already.
      return H * cand * kv::page_code_bytes(s.head_dim) +
             range_pages * (2.0 * d + (grids_read ? 0.0 : 8.0));
    };
    switch (c.method) {
      case Method::dense:
      case Method::sink_recent:
        break;
      case Method::quest:
      case Method::entmax_support:
        bytes += H * P * bounds;
        break;
      case Method::top_p:
        bytes += H * P * bounds;
        if (c.mass_source == MassSource::quant_keys) {
          bytes += H * L * kv::row_bytes(kv::KeyFormat::int4, s.head_dim);
        } else {
          bytes += H * P * moments;
        }
        break;
      case Method::gaussian_tau:
        bytes += H * P * (bounds + moments);
        break;
      case Method::oracle:
        bytes += H * L * 2.0 * d;
        break;
      case Method::learned:
        bytes += L * s.learned_row_bytes;
        break;
      case Method::token_codes:
        if (c.code_channels < 1) {
          // Two passes: the chosen channels' codes and ranges of every page from the
          // channel-major copy, every page's grid; then the second pass.
          const int r = detail::code_channel_count(c, s.head_dim);
          const double word = (s.page_size + 3) / 4;
          bytes += H * (r * P * (word + 2.0) + P * 8.0) + second_pass(c.code_candidates, true);
          if (c.code_channel_spread) bytes += H * 4.0 * d;  // the last page's f32 spread row
        } else {  // every page's code range (8-bit), every code
          bytes += H * (P * ranges + L * kv::page_code_bytes(s.head_dim));
        }
        break;
      case Method::learned_codes:  // every token's learned key rows, then the second pass
        bytes += L * s.learned_row_bytes + second_pass(c.learned_candidates, false);
        break;
      case Method::two_stage: {
        // Stage 1 reads every page's bounds; stage 2 the code ranges of the candidate pages
        // and the codes of their tokens.
        const KeptRanges<int> kept =
            kept_pages(pages, length, s.page_size, c.sink_pages, c.window_tokens);
        const auto [kept_tokens_n, cap] = token_cap();
        const double cand = static_cast<double>(
            two_stage_candidates(pages, kept.count(pages), cap, s.page_size, c.candidate_factor));
        bytes += H * (P * bounds + std::max(0.0, cand) *
                                       (ranges + s.page_size * kv::page_code_bytes(s.head_dim)));
        // Rescoring reads the f16 keys of its shortlist (at most the candidates' tokens).
        if (c.rescore_factor > 0) {
          const double free_tokens =
              static_cast<double>(std::max<std::int64_t>(0, cap - kept_tokens_n));
          bytes += H * std::min(c.rescore_factor * free_tokens, std::max(0.0, cand) * s.page_size) *
                   2.0 * d;
        }
        break;
      }
    }
  }
  return bytes;
}

std::int64_t budget_beside_dense_layers(std::int64_t budget, int layers, int dense,
                                        std::int64_t length) {
  if (dense <= 0 || budget <= 0) return budget;
  if (dense >= layers) return 1;  // no layer selects: nothing to give
  const std::int64_t total = budget * layers - static_cast<std::int64_t>(dense) * length;
  return std::max<std::int64_t>(1, total / (layers - dense));
}

}  // namespace masskv::select
