// Sparse prefill in the model (SessionOptions::sparse_prefill): with a budget of every key each
// method gives dense prefill's logits (f32 KV: within 2e-3, the tolerance of the model's other
// path-equality tests); with a real budget the selection is applied (fewer keys attended, the
// logits move), gemma3's local layers keep their window, and decode after it stays dense.
// The selection and its recomputed attention are checked against f64 references in
// test_prefill_select.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "installed_model.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/model/model.hpp"

namespace masskv::model {
namespace {

using select::PrefillMethod;

std::vector<TokenId> long_tokens(const Model& m) {
  std::string text;
  for (int i = 0; i < 8; ++i) {
    text += "Record " + std::to_string(i * 37 % 11) +
            ": the quick brown fox jumps over the lazy dog near the river bank. ";
  }
  return m.tokenizer().encode(text, m.tokenizer().add_bos_default());
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

struct Run {
  std::vector<float> logits;
  PrefillStats stats;
};

Run prefill(const Model& m, std::span<const TokenId> toks, SessionOptions so) {
  so.max_tokens = 256;
  so.kv_dtype = DType::f32;
  so.prefill_block = 48;  // several steps, the last partial; 3 query blocks of 16 per step
  if (m.config().arch == Arch::gemma3) so.sliding_window = 40;  // local layers cut the prefix
  Session s(m, so);
  Run r;
  s.prefill(toks, {}, &r.logits);
  r.stats = s.last_prefill_stats();
  return r;
}

SessionOptions sparse(PrefillMethod method, double fraction, std::int64_t tokens = 0) {
  SessionOptions so;
  so.sparse_prefill.method = method;
  so.sparse_prefill.q_block = 16;
  so.sparse_prefill.k_block = 16;
  so.sparse_prefill.budget.fraction = fraction;
  so.sparse_prefill.budget.tokens = tokens;
  return so;
}

void expect_whole_budget_is_dense_and_small_budget_moves(const char* name) {
  const Model* m = test::installed(name);
  if (m == nullptr) GTEST_SKIP() << name << " not installed";
  const auto toks = long_tokens(*m);
  ASSERT_GT(toks.size(), 120u);
  const Run dense = prefill(*m, toks, {});
  EXPECT_EQ(dense.stats.keys_attended, dense.stats.keys_dense);
  for (const PrefillMethod method :
       {PrefillMethod::token, PrefillMethod::block, PrefillMethod::shared, PrefillMethod::index}) {
    const Run all = prefill(*m, toks, sparse(method, 1.0));
    EXPECT_LE(max_abs_diff(all.logits, dense.logits), 2e-3) << name << " " << to_string(method);
    EXPECT_EQ(all.stats.keys_attended, dense.stats.keys_attended) << to_string(method);
    const Run few = prefill(*m, toks, sparse(method, 0.0, 32));
    // gemma3's local layers (5 of 6) keep their window: fewer keys, not 0.8 of them.
    EXPECT_LT(few.stats.keys_attended,
              (m->config().arch == Arch::llama ? 0.8 : 0.99) * dense.stats.keys_dense)
        << to_string(method);
    EXPECT_EQ(few.stats.keys_dense, dense.stats.keys_dense);
    // The first 32 positions see at most 32 keys (sinks + diagonal within them): unchanged.
    const std::size_t V = static_cast<std::size_t>(m->config().n_vocab);
    EXPECT_LE(max_abs_diff(std::span<const float>(few.logits).first(16 * V),
                           std::span<const float>(dense.logits).first(16 * V)),
              2e-3)
        << to_string(method);
    EXPECT_GT(max_abs_diff(few.logits, dense.logits), 0.05) << to_string(method);
    EXPECT_GT(few.stats.select_seconds, 0.0);
  }
}

TEST(SparsePrefill, SmolLM2WholeBudgetEqualsDenseAndSmallBudgetApplies) {
  expect_whole_budget_is_dense_and_small_budget_moves("smollm2");
}

TEST(SparsePrefill, Gemma3WholeBudgetEqualsDenseAndSmallBudgetApplies) {
  if (test::kSanitized) GTEST_SKIP() << "too slow under sanitizers; runs in the Release suite";
  expect_whole_budget_is_dense_and_small_budget_moves("gemma3");
}

// Decode after a sparse prefill reads the cache densely (the setting is prefill-only), and
// per-group supports run.
TEST(SparsePrefill, DecodeAfterSparsePrefillIsDenseAndPerGroupRuns) {
  REQUIRE_MODEL(m, "smollm2");
  const auto toks = long_tokens(*m);
  SessionOptions so = sparse(PrefillMethod::block, 0.25);
  so.sparse_prefill.head_collapsed = false;
  so.max_tokens = 256;
  Session s(*m, so);
  s.prefill(toks, {});
  std::vector<float> logits(static_cast<std::size_t>(m->config().n_vocab));
  s.decode(toks[1], logits);
  EXPECT_EQ(s.last_decode_stats().kv_tokens_read, s.last_decode_stats().kv_tokens_total);
  EXPECT_LT(s.last_prefill_stats().keys_attended, 0.6 * s.last_prefill_stats().keys_dense);
}

// The learned indexer with the committed distilled selector (docs/results/learned-smollm2):
// whole budget = dense; a small budget applies on the layers the selector lists.
TEST(SparsePrefill, SmolLM2LearnedIndexer) {
  REQUIRE_MODEL(m, "smollm2");
  const auto sel = std::make_shared<const learn::Selector>(learn::load(
      std::string(MASSKV_TEST_DATA) + "/../../docs/results/learned-smollm2/selector.gguf"));
  const auto toks = long_tokens(*m);
  const masskv::model::Run dense = prefill(*m, toks, {});
  SessionOptions all = sparse(PrefillMethod::learned, 1.0);
  all.learned_selector = sel;
  const masskv::model::Run whole = prefill(*m, toks, all);
  EXPECT_LE(max_abs_diff(whole.logits, dense.logits), 2e-3);
  EXPECT_EQ(whole.stats.keys_attended, dense.stats.keys_attended);
  SessionOptions few = sparse(PrefillMethod::learned, 0.0, 32);
  few.learned_selector = sel;
  const masskv::model::Run small = prefill(*m, toks, few);
  EXPECT_LT(small.stats.keys_attended, 0.8 * dense.stats.keys_dense);
  EXPECT_GT(max_abs_diff(small.logits, dense.logits), 0.05);
  EXPECT_THROW(Session(*m, sparse(PrefillMethod::learned, 1.0 / 16)), Error);  // no selector
}

TEST(SparsePrefill, BadOptionsThrowTypedErrors) {
  REQUIRE_MODEL(m, "smollm2");
  SessionOptions so = sparse(PrefillMethod::shared, 1.0 / 16);
  so.mapping = Mapping::entmax(1.5);
  EXPECT_THROW(Session(*m, so), Error);
  so = sparse(PrefillMethod::shared, 1.0 / 16);
  so.sparse_prefill.head_collapsed = false;
  EXPECT_THROW(Session(*m, so), Error);
  so = sparse(PrefillMethod::index, 2.0);
  EXPECT_THROW(Session(*m, so), Error);
}

}  // namespace
}  // namespace masskv::model

namespace masskv::model {
namespace {

// The indexer's key-block sums run across prefill steps (KeyBlockSums): steps of 16 and of 48
// tokens see the same query blocks (q_block 16) and budgets, so they must choose the same
// blocks and give the same logits; a step that missed or re-added keys would not.
TEST(SparsePrefill, IndexerRunningSumsDoNotDependOnTheStepSize) {
  REQUIRE_MODEL(m, "smollm2");
  const auto toks = long_tokens(*m);
  const auto run = [&](int step) {
    SessionOptions so = sparse(PrefillMethod::index, 0.0, 32);
    so.max_tokens = 256;
    so.kv_dtype = DType::f32;
    so.prefill_block = step;
    Session s(*m, so);
    std::vector<float> all;
    s.prefill(toks, {}, &all);
    return std::make_pair(all, s.last_prefill_stats().keys_attended);
  };
  const auto a = run(16), b = run(48);
  EXPECT_EQ(a.second, b.second);
  EXPECT_LE(max_abs_diff(a.first, b.first), 2e-3);
}

}  // namespace
}  // namespace masskv::model
