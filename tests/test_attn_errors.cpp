// Every bad input to decode / prefill (and their references) is rejected before any output is
// written, with the ErrorCode and the argument name a user needs (docs/design.md §6).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "expect_error.hpp"
#include "harness.hpp"
#include "masskv/error.hpp"

namespace masskv::test {
namespace {

using masskv::test::expect_error;

// 2 sequences (40 and 17 tokens), Hkv = 2, d = 64, P = 16.
KVConfig small_kv() {
  KVConfig c;
  c.lengths = {40, 17};
  c.num_kv_heads = 2;
  c.head_dim = 64;
  return c;
}

// A valid decode setup on small_kv() with Hq = 4.
class DecodeErrors : public ::testing::Test {
 protected:
  DecodeErrors() : cache_(small_kv()) {
    q_ = random_q(2, 4, 64, 1.0f, 1);
    out_.assign(2 * 4 * 64, 0.0f);
    stat_.assign(2 * 4, 0.0f);
    args_.q = View3<const float>::contiguous(q_.data(), 2, 4, 64);
    args_.cache = cache_.view();
    args_.out = View3<float>::contiguous(out_.data(), 2, 4, 64);
    args_.lse_or_tau = stat_;
    ref_out_.assign(out_.size(), 0.0);
    ref_stat_.assign(stat_.size(), 0.0);
  }
  // Both decode and the reference must reject it.
  void expect(ErrorCode code, const std::string& argument) {
    for (const ImplEntry& impl : decode_impls()) {
      args_.impl = impl.impl;
      expect_error([&] { attn::decode(args_); }, code, argument);
    }
    expect_error([&] { attn::decode_reference(args_, ref_out_, ref_stat_); }, code, argument);
  }

  HandCache cache_;
  std::vector<float> q_, out_, stat_;
  std::vector<double> ref_out_, ref_stat_;
  attn::DecodeArgs args_;
};

TEST_F(DecodeErrors, ValidArgumentsRun) {
  EXPECT_NO_THROW(attn::decode(args_));
  EXPECT_NO_THROW(attn::decode_reference(args_, ref_out_, ref_stat_));
}

TEST_F(DecodeErrors, QueryHeadDimMismatch) {
  args_.q.n2 = 32;
  expect(ErrorCode::shape_mismatch, "q");
}

TEST_F(DecodeErrors, QueryHeadsNotMultipleOfKvHeads) {
  args_.q.n1 = 3;
  args_.out.n1 = 3;
  expect(ErrorCode::shape_mismatch, "q");
}

TEST_F(DecodeErrors, QueryBatchMismatch) {
  args_.q.n0 = 1;
  expect(ErrorCode::shape_mismatch, "q");
}

TEST_F(DecodeErrors, OutputShapeMismatch) {
  args_.out.n1 = 2;
  expect(ErrorCode::shape_mismatch, "out");
}

TEST_F(DecodeErrors, LseSizeMismatch) {
  args_.lse_or_tau = std::span<float>(stat_).first(3);
  for (const ImplEntry& impl : decode_impls()) {
    args_.impl = impl.impl;
    expect_error([&] { attn::decode(args_); }, ErrorCode::shape_mismatch, "lse_or_tau");
  }
}

TEST_F(DecodeErrors, NonFiniteQuery) {
  q_[70] = std::numeric_limits<float>::quiet_NaN();
  expect(ErrorCode::non_finite, "q");
  q_[70] = std::numeric_limits<float>::infinity();
  expect(ErrorCode::non_finite, "q");
}

TEST_F(DecodeErrors, AlphaOutsideOneToTwo) {
  for (const double alpha : {1.0, 0.5, 2.5, std::nan("")}) {
    args_.mapping = Mapping::entmax(alpha);
    expect(ErrorCode::invalid_argument, "alpha");
  }
}

TEST_F(DecodeErrors, PageIdOutOfRange) {
  std::vector<std::int32_t> indices(args_.cache.table.indices.begin(),
                                    args_.cache.table.indices.end());
  indices[1] = args_.cache.num_pages;
  args_.cache.table.indices = indices;
  expect(ErrorCode::out_of_range, "indices");
}

TEST_F(DecodeErrors, NonMonotoneIndptr) {
  std::vector<std::int32_t> indptr{0, 3, 2};
  args_.cache.table.indptr = indptr;
  expect(ErrorCode::invalid_argument, "indptr");
}

TEST_F(DecodeErrors, ZeroLengthSequence) {
  // Sequence 1 owns no page.
  std::vector<std::int32_t> indptr{0, 3, 3};
  std::vector<std::int32_t> indices(args_.cache.table.indices.begin(),
                                    args_.cache.table.indices.begin() + 3);
  args_.cache.table.indptr = indptr;
  args_.cache.table.indices = indices;
  expect(ErrorCode::invalid_argument, "indptr");
}

TEST_F(DecodeErrors, UnsupportedHeadDim) {
  // A cache view whose rows are 12 wide (q and out follow): the kernels cannot serve it.
  args_.cache.head_dim = 12;
  args_.cache.stride_slot = 12;
  args_.cache.stride_head = 12 * 16;
  args_.cache.stride_page = 12 * 16 * 2;
  args_.q.n2 = 12;
  args_.out.n2 = 12;
  expect(ErrorCode::unsupported, "head_dim");
}

TEST_F(DecodeErrors, BadChunkPages) {
  args_.chunk_pages = 0;
  expect(ErrorCode::invalid_argument, "chunk_pages");
}

TEST_F(DecodeErrors, NonFiniteScale) {
  args_.scale = std::numeric_limits<float>::infinity();
  expect(ErrorCode::non_finite, "scale");
}

TEST_F(DecodeErrors, SelectionIdsNotAscending) {
  OwnedSelection sel = make_selection(cache_, SelectionView::Unit::token, {{3, 2}, {0}});
  args_.selection = &sel.view;
  expect(ErrorCode::invalid_argument, "selection");
}

TEST_F(DecodeErrors, SelectionRepeatsId) {
  OwnedSelection sel = make_selection(cache_, SelectionView::Unit::page, {{1, 1}, {0}});
  args_.selection = &sel.view;
  expect(ErrorCode::invalid_argument, "selection");
}

TEST_F(DecodeErrors, SelectionPageIdOutOfRange) {
  // Sequence 1 has 2 pages (17 tokens).
  OwnedSelection sel = make_selection(cache_, SelectionView::Unit::page, {{0}, {0, 2}});
  args_.selection = &sel.view;
  expect(ErrorCode::out_of_range, "selection");
}

TEST_F(DecodeErrors, SelectionTokenIdOutOfRange) {
  OwnedSelection sel = make_selection(cache_, SelectionView::Unit::token, {{39}, {17}});
  args_.selection = &sel.view;
  expect(ErrorCode::out_of_range, "selection");
  OwnedSelection neg = make_selection(cache_, SelectionView::Unit::token, {{-1}, {0}});
  args_.selection = &neg.view;
  expect(ErrorCode::out_of_range, "selection");
}

TEST_F(DecodeErrors, SelectionCountAboveMaxPerHead) {
  OwnedSelection sel = make_selection(cache_, SelectionView::Unit::token, {{1, 2}, {0}});
  sel.count[0] = sel.view.max_per_head + 1;
  expect_error(
      [&] {
        args_.selection = &sel.view;
        attn::decode(args_);
      },
      ErrorCode::out_of_range, "selection");
}

TEST_F(DecodeErrors, SelectionShapeMismatch) {
  OwnedSelection sel = make_selection(cache_, SelectionView::Unit::token, {{1}, {0}});
  sel.view.num_kv_heads = 1;
  args_.selection = &sel.view;
  expect(ErrorCode::shape_mismatch, "selection");
}

TEST_F(DecodeErrors, NothingWrittenOnError) {
  std::fill(out_.begin(), out_.end(), 5.0f);
  q_[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(attn::decode(args_), Error);
  for (float x : out_) ASSERT_EQ(x, 5.0f);
}

// ---- prefill --------------------------------------------------------------------------------

class PrefillErrors : public ::testing::Test {
 protected:
  PrefillErrors() : cache_(small_kv()) {
    q_ = random_q(10, 4, 64, 1.0f, 1);
    out_.assign(10 * 4 * 64, 0.0f);
    args_.q = View3<const float>::contiguous(q_.data(), 10, 4, 64);
    args_.q_indptr = indptr_;
    args_.cache = cache_.view();
    args_.out = View3<float>::contiguous(out_.data(), 10, 4, 64);
    ref_out_.assign(out_.size(), 0.0);
  }
  void expect(ErrorCode code, const std::string& argument) {
    for (const ImplEntry& impl : prefill_impls()) {
      args_.impl = impl.impl;
      expect_error([&] { attn::prefill(args_); }, code, argument);
    }
    expect_error([&] { attn::prefill_reference(args_, ref_out_, {}); }, code, argument);
  }

  HandCache cache_;
  std::vector<std::int32_t> indptr_{0, 6, 10};
  std::vector<float> q_, out_;
  std::vector<double> ref_out_;
  attn::PrefillArgs args_;
};

TEST_F(PrefillErrors, ValidArgumentsRun) {
  EXPECT_NO_THROW(attn::prefill(args_));
  EXPECT_NO_THROW(attn::prefill_reference(args_, ref_out_, {}));
}

TEST_F(PrefillErrors, NonMonotoneQueryIndptr) {
  indptr_ = {0, 6, 5};
  args_.q_indptr = indptr_;
  expect(ErrorCode::invalid_argument, "q_indptr");
}

TEST_F(PrefillErrors, QueryIndptrWrongSize) {
  indptr_ = {0, 10};
  args_.q_indptr = indptr_;
  expect(ErrorCode::shape_mismatch, "q_indptr");
}

TEST_F(PrefillErrors, MoreQueriesThanTokens) {
  // Sequence 1 holds 17 tokens.
  std::vector<float> q = random_q(26, 4, 64, 1.0f, 2);
  std::vector<float> out(26 * 4 * 64);
  indptr_ = {0, 6, 24};
  args_.q_indptr = indptr_;
  args_.q = View3<const float>::contiguous(q.data(), 24, 4, 64);
  args_.out = View3<float>::contiguous(out.data(), 24, 4, 64);
  expect(ErrorCode::out_of_range, "q_indptr");
}

TEST_F(PrefillErrors, QueryRowsMismatchIndptr) {
  args_.q.n0 = 9;
  expect(ErrorCode::shape_mismatch, "q");
}

TEST_F(PrefillErrors, NonFiniteQuery) {
  q_[5] = -std::numeric_limits<float>::infinity();
  expect(ErrorCode::non_finite, "q");
}

TEST_F(PrefillErrors, AlphaOutsideOneToTwo) {
  args_.mapping = Mapping::entmax(3.0);
  expect(ErrorCode::invalid_argument, "alpha");
}

TEST_F(PrefillErrors, BlockMaskTooSmall) {
  // Sequence 0 needs 1 x 3 entries, sequence 1 needs 1 x 2 at offset 3: 5 in all.
  std::vector<std::uint8_t> bits(4, 1);
  std::vector<std::int64_t> offsets{0, 3};
  attn::BlockMask mask{16, 16, bits, offsets};
  args_.block_mask = &mask;
  expect(ErrorCode::out_of_range, "block_mask");
}

TEST_F(PrefillErrors, BlockMaskZeroBlock) {
  std::vector<std::uint8_t> bits(100, 1);
  std::vector<std::int64_t> offsets{0, 10};
  attn::BlockMask mask{0, 16, bits, offsets};
  args_.block_mask = &mask;
  expect(ErrorCode::invalid_argument, "block_mask");
}

}  // namespace
}  // namespace masskv::test
