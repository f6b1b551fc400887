// Pre-splitting text into words before byte-level BPE merges (no merge crosses a word).
#pragma once

#include <string_view>
#include <vector>

namespace masskv::model {

// The GPT-2 split
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written by hand; with isolate_digits every \p{N} character is first cut out as its own word
// (SmolLM2's "smollm" rule). Words are views into text and concatenate back to it; bytes that
// are not valid UTF-8 count as punctuation.
std::vector<std::string_view> split_gpt2(std::string_view text, bool isolate_digits);

}  // namespace masskv::model
