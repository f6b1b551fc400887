// Built-in word lists of the eval tasks: adjectives and nouns for needle keys ("ancient-cabbage")
// and the vocabulary of common words extraction. Every word is lowercase ASCII, at least five
// letters, and no word contains another (tests check), so a case-insensitive substring match of
// one word never fires on another.
#pragma once

#include <span>
#include <string_view>

namespace masskv::eval {

std::span<const std::string_view> adjectives();
std::span<const std::string_view> nouns();

}  // namespace masskv::eval
