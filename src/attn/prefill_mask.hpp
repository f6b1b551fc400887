// Which keys a prefill query may attend: causal, and inside the block mask when one is given
// (DESIGN.md §4). Shared by prefill and its reference so both apply the same rule.
#pragma once

#include <cstdint>

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

 private:
  const BlockMask* mask_;
  std::int64_t first_q_;
  std::int64_t cols_ = 0;
  const std::uint8_t* row0_ = nullptr;
};

}  // namespace masskv::attn::detail
