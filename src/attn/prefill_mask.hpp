// Which keys a prefill query may attend: causal, and inside the block mask when one is given
// (docs/design.md §4). Shared by prefill and its reference so both apply the same rule.
#pragma once

#include <cstdint>
#include <vector>

#include "masskv/attn/prefill.hpp"

namespace masskv::attn::detail {

class PrefillMask {
 public:
  // Sequence b with n_q new queries among `length` tokens.
  PrefillMask(const BlockMask* mask, int b, std::int64_t length, std::int64_t n_q)
      : mask_(mask), first_q_(length - n_q) {
    if (mask_ != nullptr) {
      cols_ = (length + mask_->k_block - 1) / mask_->k_block;
      row0_ = mask_->mask.data() + mask_->mask_offset[b];
    }
  }
  // Position in the sequence of query i.
  std::int64_t position(std::int64_t i) const { return first_q_ + i; }
  bool block_selected(std::int64_t i, std::int64_t key) const {
    if (mask_ == nullptr) return true;
    return row0_[(i / mask_->q_block) * cols_ + key / mask_->k_block] != 0;
  }
  bool allowed(std::int64_t i, std::int64_t key) const {
    return key <= position(i) && block_selected(i, key);
  }
  // Per key block, whether some query in [i0, i1) selects it (the OR of their mask rows):
  // one pass over the rows instead of a test per (query, key). All 1 without a mask.
  void blocks_of(std::int64_t i0, std::int64_t i1, std::vector<std::uint8_t>& out) const {
    if (mask_ == nullptr) return;
    out.assign(static_cast<std::size_t>(cols_), 0);
    for (std::int64_t r = i0 / mask_->q_block; r <= (i1 - 1) / mask_->q_block; ++r) {
      const std::uint8_t* row = row0_ + r * cols_;
      for (std::int64_t c = 0; c < cols_; ++c) out[static_cast<std::size_t>(c)] |= row[c];
    }
  }
  // Whether queries [i0, i1) all read the same mask row (always, without a mask).
  bool one_row(std::int64_t i0, std::int64_t i1) const {
    return mask_ == nullptr || i0 / mask_->q_block == (i1 - 1) / mask_->q_block;
  }
  int k_block() const { return mask_ != nullptr ? mask_->k_block : 1; }

 private:
  const BlockMask* mask_;
  std::int64_t first_q_;
  std::int64_t cols_ = 0;
  const std::uint8_t* row0_ = nullptr;
};

}  // namespace masskv::attn::detail
