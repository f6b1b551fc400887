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
  c.code_channels = 1;  // one pass
  EXPECT_EQ(selector_read_bytes(c, t, s), H * pages * (2 * d + 8) + H * tokens * (d / 4));
  // token_codes in two passes (24 of 64 channels, 2 x the cap): per page the chosen channels'
  // codes (a 4-byte word of 16 slots) and range codes (2 bytes) and the f32 grid (8 bytes);
  // the candidates' code rows; the full ranges (2 d bytes) of the pages holding them; the last
  // page's f32 spread row (4 d bytes), per sequence and kv head. Sequence 0 keeps 20 tokens,
  // cap 32: 64 candidates; sequence 1's 16 tokens are all kept: 16.
  c.code_channels = 0.375;
  c.code_candidates = 2;
  c.budget = {Budget::Kind::fixed, 32, 0.9};
  const double pass1 = H * (24 * 8 * (4 + 2) + 8 * 8) + 2 * H * 4 * d, rows = H * (64 + 16) * (d / 4);
  // Without the selector's count: one page per candidate, at most every page (7 + 1 a head).
  EXPECT_EQ(selector_read_bytes(c, t, s), pass1 + rows + H * 8 * 2 * d);
  // As counted ([B][Hkv]): 3 + 4 pages of sequence 0, 1 + 1 of sequence 1.
  const std::vector<std::int32_t> counted{3, 4, 1, 1};
  EXPECT_EQ(selector_read_bytes(c, t, s, counted), pass1 + rows + 9 * 2 * d);
  // Another selector's -1 counts the bound.
  const std::vector<std::int32_t> none{-1, -1, -1, -1};
  EXPECT_EQ(selector_read_bytes(c, t, s, none), pass1 + rows + H * 8 * 2 * d);
  c.code_channel_spread = false;  // the |q| rule reads no spread row
  EXPECT_EQ(selector_read_bytes(c, t, s, counted), pass1 - 2 * H * 4 * d + rows + 9 * 2 * d);
  c.code_channel_spread = true;
  // learned_codes: every token's key rows (96 bytes: all groups), then the second pass as
  // above at its own factor (4 x the cap: sequence 0's 128 candidates of 100, so all 100;
  // sequence 1's 16), and each candidate page's grid too (no first pass read the grids).
  c.method = Method::learned_codes;
  c.learned_candidates = 4;
  const double learned_rows = H * (100 + 16) * (d / 4);
  EXPECT_EQ(selector_read_bytes(c, t, s, counted),
            tokens * 96.0 + learned_rows + 9 * (2 * d + 8));
  EXPECT_EQ(selector_read_bytes(c, t, s),
            tokens * 96.0 + learned_rows + H * 8 * (2 * d + 8));
  c.learned_candidates = 1;  // 32 + 16 candidates: the code_candidates factor is not read
  EXPECT_EQ(selector_read_bytes(c, t, s, counted),
            tokens * 96.0 + H * (32 + 16) * (d / 4) + 9 * (2 * d + 8));
  c.method = Method::token_codes;
  c.code_channels = 1;
  c.budget = {};
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

namespace masskv::select {
namespace {

// The selecting layers' budget beside dense ones: all layers together read budget x layers.
TEST(ReadCost, BudgetBesideDenseLayersKeepsTheTotal) {
  EXPECT_EQ(budget_beside_dense_layers(256, 30, 0, 4096), 256);   // no dense layer
  EXPECT_EQ(budget_beside_dense_layers(0, 30, 1, 4096), 0);       // no cap stays none
  // 30 layers at 256 of 4096 tokens = 7680 rows; one dense layer reads 4096, the other 29
  // share 3584: 123 each (rounded down).
  EXPECT_EQ(budget_beside_dense_layers(256, 30, 1, 4096), 3584 / 29);
  for (int dense = 1; dense < 4; ++dense) {
    for (std::int64_t len : {1000, 4096, 8000}) {
      const std::int64_t b = len / 8, t = budget_beside_dense_layers(b, 30, dense, len);
      EXPECT_LE(t * (30 - dense) + dense * len, b * 30) << dense << " " << len;
      EXPECT_GE(t, 1);
    }
  }
  // More than the budget in the dense layers alone: the others keep 1 (their kept tokens).
  EXPECT_EQ(budget_beside_dense_layers(256, 30, 2, 4096), 1);
  EXPECT_EQ(budget_beside_dense_layers(256, 4, 4, 4096), 1);
}

}  // namespace
}  // namespace masskv::select
