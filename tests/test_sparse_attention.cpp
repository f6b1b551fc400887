// The decode counters of the sparse-attention room (src/model/sparse_attention.hpp, docs/design.md
// §3): over steps that select and steps that reuse a selection (SessionOptions::reselect_every),
// DecodeStats counts the selector layers, the fresh selections, the selector's reads
// (select::selector_read_bytes, nothing for a reused selection) and the KV rows of the lists
// attention used, each against a count by hand from the lists on_selection saw. And the
// selection timings (SessionOptions::selection_timing): a step attends the selection made one
// step earlier (previous), or that and its own (union_previous), each compared with the fresh
// selections a fork of the same state makes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "installed_model.hpp"
#include "masskv/error.hpp"
#include "masskv/model/model.hpp"
#include "masskv/select/read_cost.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::model {
namespace {

// The sequence's page table at length len as the selector saw it: pages 0.., the last partial.
struct OneSequenceTable {
  std::vector<std::int32_t> indptr, indices, last;
  OneSequenceTable(std::int64_t len, int ps) {
    const auto pages = static_cast<std::int32_t>((len + ps - 1) / ps);
    indptr = {0, pages};
    for (std::int32_t i = 0; i < pages; ++i) indices.push_back(i);
    last = {static_cast<std::int32_t>(len - std::int64_t{pages - 1} * ps)};
  }
  kv::PageTable table() const { return {indptr, indices, last}; }
};

TEST(SparseAttention, ReuseCountsTheListsRowsAndNoSelectorReads) {
  REQUIRE_MODEL(m, "smollm2");
  const ModelConfig& c = m->config();
  const int ps = 16, every = 3;
  SessionOptions so;
  so.max_tokens = 256;
  so.page_size = ps;
  so.reselect_every = every;
  so.selector = select::SelectorConfig{};
  so.selector->method = select::Method::quest;
  so.selector->budget.tokens = 48;
  so.selector->window_tokens = 16;
  using Lists = std::vector<std::vector<std::int32_t>>;  // [layer][kv head]: the step's lists
  Lists lists;
  so.on_selection = [&](int layer, const SelectionView& sv) {
    EXPECT_EQ(layer * c.n_head_kv, static_cast<int>(lists.size()));
    for (int h = 0; h < sv.num_kv_heads; ++h) lists.emplace_back(sv.list(0, h).begin(), sv.list(0, h).end());
  };
  std::vector<TokenId> prompt;
  for (int i = 0; i < 100; ++i) prompt.push_back((i * 7919 + 13) % 5000 + 10);
  Session s(*m, so);
  std::vector<float> logits(static_cast<std::size_t>(c.n_vocab));
  s.prefill(prompt, logits);
  Lists made;  // the lists of the last fresh selection
  for (int step = 0; step < 2 * every + 1; ++step) {
    lists.clear();
    s.decode(argmax(logits), logits);
    const DecodeStats& st = s.last_decode_stats();
    const std::int64_t len = s.position();
    const bool fresh = step % every == 0;
    SCOPED_TRACE(testing::Message() << "step " << step << " length " << len);
    ASSERT_EQ(lists.size(), static_cast<std::size_t>(c.n_layer * c.n_head_kv));
    EXPECT_EQ(st.selector_layers, c.n_layer);
    EXPECT_EQ(st.fresh_selections, fresh ? c.n_layer : 0);
    EXPECT_EQ(st.kv_tokens_total, static_cast<double>(c.n_layer) * static_cast<double>(len) * c.n_head_kv);
    const OneSequenceTable one(len, ps);
    const kv::PageTable table = one.table();
    const double per_layer =
        select::selector_read_bytes(*so.selector, table, {c.n_head_kv, c.head_dim, ps, 0}) /
        select::dense_row_bytes(c.head_dim);
    double rows = 0, read = 0;
    for (int l = 0; l < c.n_layer; ++l) rows += fresh ? per_layer : 0;
    for (const auto& list : lists) {
      for (const std::int32_t id : list) read += table.page_len(0, id, ps);
    }
    EXPECT_GT(per_layer, 0);
    EXPECT_EQ(st.selector_rows, rows);
    EXPECT_EQ(st.kv_tokens_read, read);
    if (fresh) {
      made = lists;
    } else {  // a reused list keeps every page of the selection it extends (select::extend_kept)
      for (std::size_t i = 0; i < lists.size(); ++i) {
        for (const std::int32_t id : made[i]) {
          EXPECT_NE(std::find(lists[i].begin(), lists[i].end(), id), lists[i].end()) << "list " << i;
        }
      }
    }
  }
}

// Per step t a fork of the session (same caches, same reusable state) selects fresh; at layer
// 0, whose queries and keys come from the tokens alone (so the fork's choice is the session's
// own), the session must attend extend_kept(the choice at t - 1) (previous), or that ∪ the
// choice at t (union_previous); the first step after the prefill attends fresh. Deeper layers'
// queries depend on what the layers below attended, so there only the reads are checked.
// Quest and the oracle; the selector still runs every step.
TEST(SparseAttention, SelectionTimingAttendsThePreviousStepsChoice) {
  REQUIRE_MODEL(m, "smollm2");
  const ModelConfig& c = m->config();
  const int ps = 4;  // small pages: the copied span's page changes every few steps
  for (const SelectionTiming timing : {SelectionTiming::previous, SelectionTiming::union_previous}) {
    for (const select::Method method : {select::Method::quest, select::Method::oracle}) {
      SCOPED_TRACE(testing::Message() << to_string(timing) << " " << select::to_string(method));
      SessionOptions so;
      so.max_tokens = 256;
      so.page_size = ps;
      so.selection_timing = timing;
      so.selector = select::SelectorConfig{};
      so.selector->method = method;
      so.selector->budget.tokens = 24;  // 6 of ~50 pages
      so.selector->window_tokens = 0;
      std::vector<SelectionStorage>* into = nullptr;  // [layer]: the step's lists
      so.on_selection = [&](int layer, const SelectionView& sv) {
        ASSERT_EQ(layer, static_cast<int>(into->size()));
        into->emplace_back().assign(sv);
      };
      std::vector<TokenId> prompt;
      // A random span twice, then decoding: the model copies on, and the heads that find the
      // token after the span's earlier copy move through its pages as it does.
      for (int i = 0; i < 100; ++i) prompt.push_back((i * 7919 + 13) % 5000 + 10);
      for (int i = 0; i < 90; ++i) prompt.push_back(prompt[static_cast<std::size_t>(i)]);
      Session s(*m, so);
      std::vector<float> logits(static_cast<std::size_t>(c.n_vocab)), fork_logits = logits;
      int moved = 0;  // lists where the previous step's choice differs from this step's
      s.prefill(prompt, logits);
      std::vector<SelectionStorage> fresh_before, fresh, attended;
      for (int step = 0; step < 8; ++step) {
        SCOPED_TRACE(testing::Message() << "step " << step);
        const TokenId token = argmax(logits);
        Session f = s.fork();
        f.set_reselect(1, -1, SelectionTiming::fresh);
        fresh.clear();
        into = &fresh;
        f.decode(token, fork_logits);
        attended.clear();
        into = &attended;
        s.decode(token, logits);
        ASSERT_EQ(fresh.size(), static_cast<std::size_t>(c.n_layer));
        ASSERT_EQ(attended.size(), fresh.size());
        EXPECT_EQ(s.last_decode_stats().fresh_selections, c.n_layer);
        const OneSequenceTable t(s.position(), ps);
        double read = 0;
        for (int l = 0; l < c.n_layer; ++l) {
          const auto L = static_cast<std::size_t>(l);
          SelectionStorage want = fresh[L];
          if (step > 0 && l == 0) {
            select::extend_kept(fresh_before[L].view(), t.table(), ps, *so.selector, want);
            if (timing == SelectionTiming::union_previous) {
              SelectionStorage joined;
              select::union_selections(want.view(), fresh[L].view(), joined);
              want = joined;
            }
          }
          for (int h = 0; h < c.n_head_kv; ++h) {
            const auto got = attended[L].view().list(0, h);
            for (const std::int32_t id : got) read += t.table().page_len(0, id, ps);
            if (l > 0) continue;
            const auto exp = want.view().list(0, h), now = fresh[L].view().list(0, h);
            moved += !std::equal(exp.begin(), exp.end(), now.begin(), now.end());
            EXPECT_EQ(std::vector<std::int32_t>(got.begin(), got.end()),
                      std::vector<std::int32_t>(exp.begin(), exp.end()))
                << "kv head " << h;
          }
        }
        EXPECT_EQ(s.last_decode_stats().kv_tokens_read, read);
        fresh_before = fresh;
      }
      // Else the comparison could not tell the timings apart.
      EXPECT_GT(moved, 0);
    }
  }
}

TEST(SparseAttention, SelectionTimingRefusesReuse) {
  REQUIRE_MODEL(m, "smollm2");
  SessionOptions so;
  so.max_tokens = 64;
  so.reselect_every = 4;
  so.selection_timing = SelectionTiming::previous;
  try {
    Session s(*m, so);
    ADD_FAILURE() << "a previous-step timing with reselect_every 4 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("selection_timing"), std::string::npos) << e.what();
  }
  so.reselect_every = 1;
  Session s(*m, so);
  EXPECT_THROW(s.set_reselect(2, -1, SelectionTiming::union_previous), Error);
}

}  // namespace
}  // namespace masskv::model
