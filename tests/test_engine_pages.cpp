// kv::engine_pages (masskv/kv/engine_pages.hpp): a page selection mapped into an engine's
// physical page lists, per kv head and per sequence (head union), padded and as a FlashInfer page
// table, against a plain reference (a set union per list, then the table's physical ids); the
// CSR form enumerates exactly the selected tokens; bad input is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda/common/engine_case.hpp"
#include "expect_error.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/engine_pages.hpp"

namespace masskv::kv {
namespace {

using masskv::test::EngineCase;
using masskv::test::EngineData;
using masskv::test::expect_error;
using masskv::test::make_engine_data;

struct Out {
  std::vector<std::int32_t> ids, count, indptr, indices, last;
  EnginePagesOut view(bool csr) {
    EnginePagesOut o;
    o.max_per_list = max_per_list;
    o.ids = ids;
    o.count = count;
    if (csr) {
      o.indptr = indptr;
      o.indices = indices;
      o.last_page_len = last;
    }
    return o;
  }
  int max_per_list = 0;
};

Out make_out(int lists, int max_per_list) {
  Out o;
  o.max_per_list = max_per_list;
  // Poisoned: every entry must be written.
  o.ids.assign(static_cast<std::size_t>(lists) * max_per_list, 12345);
  o.count.assign(lists, 12345);
  o.indptr.assign(lists + 1, 12345);
  o.indices.assign(o.ids.size(), 12345);
  o.last.assign(lists, 12345);
  return o;
}

// The reference: each list's logical pages as a set, then mapped.
std::vector<std::set<int>> reference_lists(const EngineData& d, EngineLists lists) {
  const SelectionView s = d.selection.view();
  std::vector<std::set<int>> out;
  for (int b = 0; b < s.batch; ++b)
    if (lists == EngineLists::head_union) {
      std::set<int> u;
      for (int h = 0; h < s.num_kv_heads; ++h)
        for (int id : s.list(b, h)) u.insert(id);
      out.push_back(u);
    } else {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        const auto l = s.list(b, h);
        out.emplace_back(l.begin(), l.end());
      }
    }
  return out;
}

TEST(EnginePages, MatchesSetReferenceOnRandomCases) {
  std::mt19937_64 rng(2026);
  int cases = 0;
  for (const int page_size : {1, 16})
    for (const int B : {1, 3, 7})
      for (const int Hkv : {1, 2, 8})
        for (const double density : {0.0, 0.1, 0.6})
          for (const EngineLists lists : {EngineLists::per_kv_head, EngineLists::head_union})
            for (const bool csr : {false, true}) {
              const EngineCase c{B, Hkv, page_size, 40, density};
              const EngineData d = make_engine_data(c, rng, /*empty_sequences=*/true);
              const auto ref = reference_lists(d, lists);
              const int L = engine_list_count(lists, B, Hkv);
              ASSERT_EQ(static_cast<int>(ref.size()), L);
              Out o = make_out(L, c.max_pages + 3);
              const PageTable t = d.table.table();
              engine_pages(d.selection.view(), t, page_size, lists, o.view(csr));
              int offset = 0;
              for (int l = 0; l < L; ++l) {
                const int b = lists == EngineLists::per_kv_head ? l / Hkv : l;
                const std::vector<int> want(ref[l].begin(), ref[l].end());
                ASSERT_EQ(o.count[l], static_cast<int>(want.size())) << "list " << l;
                for (int i = 0; i < o.max_per_list; ++i) {
                  const int expect = i < o.count[l] ? t.page(b, want[i]) : -1;
                  ASSERT_EQ(o.ids[static_cast<std::size_t>(l) * o.max_per_list + i], expect)
                      << "list " << l << " slot " << i;
                }
                if (!csr) continue;
                ASSERT_EQ(o.indptr[l], offset);
                for (int i = 0; i < o.count[l]; ++i)
                  ASSERT_EQ(o.indices[offset + i], t.page(b, want[i]));
                // FlashInfer's reading of the list: full pages, then last_page_len tokens. It
                // must count exactly the selected pages' tokens.
                std::int64_t tokens = 0;
                for (int id : want) tokens += t.page_len(b, id, page_size);
                const std::int64_t read =
                    o.count[l] == 0
                        ? 0
                        : static_cast<std::int64_t>(o.count[l] - 1) * page_size + o.last[l];
                EXPECT_EQ(read, tokens) << "list " << l;
                offset += o.count[l];
              }
              if (csr) {
                EXPECT_EQ(o.indptr[L], offset);
                for (std::size_t i = offset; i < o.indices.size(); ++i)
                  ASSERT_EQ(o.indices[i], -1);
              }
              ++cases;
            }
  EXPECT_EQ(cases, 216);
}

TEST(EnginePages, RefusesBadInputByName) {
  std::mt19937_64 rng(7);
  const EngineData d = make_engine_data({2, 2, 16, 10, 0.5}, rng);
  const PageTable t = d.table.table();
  const auto run = [&](const SelectionView& s, EngineLists lists, Out& o, bool csr = true,
                       int page_size = 16) {
    engine_pages(s, t, page_size, lists, o.view(csr));
  };
  Out ok = make_out(4, 12);
  run(d.selection.view(), EngineLists::per_kv_head, ok);

  // Output lists too short for the lists.
  Out small = make_out(2, 0);
  expect_error([&] { run(d.selection.view(), EngineLists::head_union, small); },
               ErrorCode::invalid_argument, "max_per_list");
  // Wrong output sizes.
  Out wrong = make_out(3, 12);
  expect_error([&] { run(d.selection.view(), EngineLists::per_kv_head, wrong); },
               ErrorCode::shape_mismatch, "ids");
  Out no_csr_sizes = make_out(4, 12);
  no_csr_sizes.indptr.resize(4);
  expect_error([&] { run(d.selection.view(), EngineLists::per_kv_head, no_csr_sizes); },
               ErrorCode::shape_mismatch, "indptr");
  // A token selection, a descending list, an id past the sequence, a bad count.
  SelectionStorage s = d.selection;
  s.unit = SelectionView::Unit::token;
  expect_error([&] { run(s.view(), EngineLists::per_kv_head, ok); }, ErrorCode::invalid_argument,
               "selection", "page ids");
  s = d.selection;
  s.count[0] = 2;
  s.ids[0] = 3;
  s.ids[1] = 1;
  Out ok_union = make_out(2, 12);
  expect_error([&] { run(s.view(), EngineLists::head_union, ok_union); },
               ErrorCode::invalid_argument, "selection", "ascending");
  s.ids[1] = t.num_pages(0);
  s.ids[0] = 0;
  expect_error([&] { run(s.view(), EngineLists::per_kv_head, ok); }, ErrorCode::invalid_argument,
               "selection");
  s = d.selection;
  s.count[1] = s.max_per_head + 1;
  expect_error([&] { run(s.view(), EngineLists::per_kv_head, ok); }, ErrorCode::invalid_argument,
               "selection", "count");
  // A selection of another batch; page_size 0; last_page_len past the page.
  SelectionStorage other;
  other.reset(SelectionView::Unit::page, 3, 2, 4);
  expect_error([&] { run(other.view(), EngineLists::per_kv_head, ok); },
               ErrorCode::shape_mismatch, "selection", "page table");
  expect_error([&] { run(d.selection.view(), EngineLists::per_kv_head, ok, true, 0); },
               ErrorCode::invalid_argument, "page_size");
  PageTableStorage long_last = d.table;
  long_last.last_page_len[0] = 16;
  expect_error([&] {
    engine_pages(d.selection.view(), long_last.table(), 8, EngineLists::per_kv_head, ok.view(true));
  }, ErrorCode::invalid_argument, "last_page_len");
}

}  // namespace
}  // namespace masskv::kv
