// The decode counters of the sparse-attention room (src/model/sparse_attention.hpp, docs/design.md
// §3): over steps that select and steps that reuse a selection (SessionOptions::reselect_every),
// DecodeStats counts the selector layers, the fresh selections, the selector's reads
// (select::selector_read_bytes, nothing for a reused selection) and the KV rows of the lists
// attention used, each against a count by hand from the lists on_selection saw.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "installed_model.hpp"
#include "masskv/model/model.hpp"
#include "masskv/select/read_cost.hpp"

namespace masskv::model {
namespace {

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
    // The sequence's page table as the selector saw it: pages 0.., the last one partial.
    const auto pages = static_cast<std::int32_t>((len + ps - 1) / ps);
    std::vector<std::int32_t> indptr{0, pages}, indices(static_cast<std::size_t>(pages));
    for (std::int32_t i = 0; i < pages; ++i) indices[static_cast<std::size_t>(i)] = i;
    std::vector<std::int32_t> last{static_cast<std::int32_t>(len - std::int64_t{pages - 1} * ps)};
    const kv::PageTable table{indptr, indices, last};
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

}  // namespace
}  // namespace masskv::model
