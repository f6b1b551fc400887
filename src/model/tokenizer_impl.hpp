// The two tokenizer algorithms behind Tokenizer::create (tokenizer_bpe.cpp, tokenizer_spm.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "masskv/model/tokenizer.hpp"

namespace masskv::model::detail {

std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab vocab);
std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab vocab);

// A symbol of the word being merged: a byte range of the word, linked to its neighbours.
struct MergeSymbol {
  std::size_t start, len;
  int prev, next;
};

// The pair-merge loop shared by BPE (lowest rank first) and SentencePiece (highest score
// first): `queue` pops the best candidate (fields `left`, and `len` = the pair's combined
// length, which tells whether the pair is still the one that was pushed);
// `consider(left)` pushes the pair starting at symbol `left` when the vocabulary has it.
template <class Queue, class Consider>
void merge_pairs(std::vector<MergeSymbol>& sym, Queue& queue, Consider&& consider) {
  for (int k = 0; k + 1 < static_cast<int>(sym.size()); ++k) consider(k);
  while (!queue.empty()) {
    const auto c = queue.top();
    queue.pop();
    MergeSymbol& l = sym[c.left];
    if (l.len == 0 || l.next < 0 || l.len + sym[l.next].len != c.len) continue;  // stale
    MergeSymbol& r = sym[l.next];
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (l.next >= 0) sym[l.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
}

}  // namespace masskv::model::detail
