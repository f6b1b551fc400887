// The selector read accounting (select/read_cost.hpp): the bytes each rule reads, against
// hand counts of the formats it names.
#include <gtest/gtest.h>

#include "masskv/select/read_cost.hpp"

namespace masskv::select {
namespace {

TEST(ReadCost, CountsTheFormatsEachSelectorReads) {
  // Two sequences: 100 tokens (7 pages of 16) and 16 tokens (1 page); 2 kv heads, d 64.
  const std::vector<std::int32_t> indptr{0, 7, 8}, indices{0, 1, 2, 3, 4, 5, 6, 7},
      last{4, 16};
  const kv::PageTable t{indptr, indices, last};
  const ReadShape s{2, 64, 16, 96.0};
  const double H = 2, d = 64, pages = 8, tokens = 116;
  SelectorConfig c;
  c.method = Method::dense;
  EXPECT_EQ(selector_read_bytes(c, t, s), 0);
  c.method = Method::sink_recent;
  EXPECT_EQ(selector_read_bytes(c, t, s), 0);
  c.method = Method::quest;
  EXPECT_EQ(selector_read_bytes(c, t, s), H * pages * 4 * d);  // bf16 min + max
  c.method = Method::gaussian_tau;
  EXPECT_EQ(selector_read_bytes(c, t, s), H * pages * 8 * d);  // + bf16 mean + variance
  c.method = Method::oracle;
  EXPECT_EQ(selector_read_bytes(c, t, s), H * tokens * 2 * d);  // every f16 key
  c.method = Method::learned;
  EXPECT_EQ(selector_read_bytes(c, t, s), tokens * 96.0);
  c.method = Method::top_p;
  c.mass_source = MassSource::quant_keys;
  EXPECT_EQ(selector_read_bytes(c, t, s), H * pages * 4 * d + H * tokens * (d / 2 + d / 16));
  // token_codes: every page's code range (8-bit min + max codes, f32 lo + step) and every
  // token's codes (d / 4 bytes).
  c.method = Method::token_codes;
  EXPECT_EQ(selector_read_bytes(c, t, s), H * pages * (2 * d + 8) + H * tokens * (d / 4));
  // two_stage: every bound, the candidate pages' code ranges and their tokens' codes: sequence 0
  // has 7 pages, 2 kept (sink, last), 5 eligible; sequence 1's one page is kept (no candidate).
  // A 32-token budget is 2 budget pages: factor 2 wants 4 of the 5 eligible pages.
  c.method = Method::two_stage;
  c.budget = {Budget::Kind::fixed, 32, 0.9};
  c.candidate_factor = 2;
  EXPECT_EQ(selector_read_bytes(c, t, s), H * pages * 4 * d + H * 4 * (2 * d + 8 + 16 * (d / 4)));
  c.candidate_factor = 8;  // capped by the 5 eligible pages
  EXPECT_EQ(selector_read_bytes(c, t, s), H * pages * 4 * d + H * 5 * (2 * d + 8 + 16 * (d / 4)));
  // A 16-token budget: the 20 kept tokens of sequence 0 (16 sink + 4 of the last page) are the
  // rule's cap, 2 pages of it, so factor 2 still wants 4 pages, not 2.
  c.budget.tokens = 16;
  c.candidate_factor = 2;
  EXPECT_EQ(selector_read_bytes(c, t, s), H * pages * 4 * d + H * 4 * (2 * d + 8 + 16 * (d / 4)));
  // Rescoring reads the f16 keys (2 d bytes) of its shortlist: r × the free budget of
  // sequence 0 (32 - 20 kept = 12 tokens), at most the candidates' tokens; sequence 1 has none.
  c.budget.tokens = 32;
  c.rescore_factor = 2;
  EXPECT_EQ(selector_read_bytes(c, t, s),
            H * pages * 4 * d + H * 4 * (2 * d + 8 + 16 * (d / 4)) + H * 24 * 2 * d);
  c.rescore_factor = 100;  // capped by the 4 candidate pages' 64 tokens
  EXPECT_EQ(selector_read_bytes(c, t, s),
            H * pages * 4 * d + H * 4 * (2 * d + 8 + 16 * (d / 4)) + H * 64 * 2 * d);
  EXPECT_EQ(dense_row_bytes(64), 256.0);
}

}  // namespace
}  // namespace masskv::select
