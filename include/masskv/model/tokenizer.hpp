// Tokenizers built from GGUF metadata (ggml's docs/gguf.md, "tokenizer.ggml.*" keys):
//   "gpt2"  byte-level BPE (SmolLM2): bytes mapped to printable code points, pre-split by the
//           model's tokenizer.ggml.pre rule, then merged by rank (tokenizer.ggml.merges).
//   "llama" SentencePiece BPE (Gemma): spaces become U+2581, adjacent pieces merged by highest
//           score (tokenizer.ggml.scores), byte fallback <0xXX> for what the vocabulary lacks.
// Both first split special tokens out of the text by leftmost-longest match: user-defined
// tokens always (SentencePiece matches them verbatim), control tokens (<|im_start|>,
// <start_of_turn>, ...) only when parse_special is on; a special token never comes out of a
// merge. Token ids are int32 as in llama.cpp. decode(encode(s)) == s for every byte string s
// (invalid UTF-8 included) whose bytes all have tokens, except that SentencePiece decodes a
// U+2581 of the text as a space (it writes spaces that way) and, with add_space_prefix, a text
// starting with a special token. A byte without a token (SmolLM2 lacks 0xC0, 0xFF and a few
// more) encodes as the unknown token (where HuggingFace and llama.cpp drop it silently).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace masskv::model {

class GgufFile;

using TokenId = std::int32_t;

// tokenizer.ggml.token_type values (the numbering of SentencePiece's ModelProto).
enum class TokenType : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

// What both algorithms read from the file. Tokenizers copy it, so they outlive the GgufFile.
struct Vocab {
  std::string model;  // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;    // tokenizer.ggml.pre ("default" when absent)
  std::vector<std::string> tokens;
  std::vector<TokenType> types;          // normal when the file has none
  std::vector<float> scores;             // empty when the file has none (BPE)
  std::vector<std::string> merges;       // "left right", rank = index (BPE only)
  TokenId bos = -1, eos = -1, unk = -1;  // -1: absent
  bool add_bos = false;                  // tokenizer.ggml.add_bos_token (the model's default)
  bool add_space_prefix = false;         // tokenizer.ggml.add_space_prefix (SentencePiece only)

  // Throws Error(invalid_argument / out_of_range, "tokenizer.ggml.<key>") on missing or
  // inconsistent metadata (array sizes differ, ids out of range). A duplicated token text
  // keeps its first id, as llama.cpp does.
  static Vocab from_gguf(const GgufFile& file);
};

class Tokenizer {
 public:
  // Picks the algorithm from vocab.model; throws Error(unsupported, "tokenizer.ggml.model") for
  // other models and Error(unsupported, "tokenizer.ggml.pre") for an unknown pre-split rule.
  static std::unique_ptr<Tokenizer> create(Vocab vocab);
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);

  virtual ~Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_bos prepends bos (Error(invalid_argument, "add_bos") if the model has none).
  std::vector<TokenId> encode(std::string_view text, bool add_bos,
                              bool parse_special = false) const;
  // The concatenated bytes of the tokens; control tokens contribute their text only when
  // render_special is on. Throws Error(out_of_range, "ids") for an id outside the vocabulary.
  std::string decode(std::span<const TokenId> ids, bool render_special = true) const;
  // The bytes one token stands for in decoded text (may be part of a UTF-8 character).
  std::string token_to_piece(TokenId id, bool render_special = true) const;

  const Vocab& vocab() const noexcept { return vocab_; }
  std::size_t vocab_size() const noexcept { return vocab_.tokens.size(); }
  TokenId bos() const noexcept { return vocab_.bos; }
  TokenId eos() const noexcept { return vocab_.eos; }
  bool add_bos_default() const noexcept { return vocab_.add_bos; }
  // Exact token text lookup; -1 when absent.
  TokenId find_token(std::string_view text) const noexcept;
  bool is_special(TokenId id) const noexcept;  // control or user-defined

 protected:
  explicit Tokenizer(Vocab vocab);
  // Appends the ids of one fragment holding no special token; at_start: the fragment begins
  // the text (SentencePiece's dummy prefix goes only there).
  virtual void encode_fragment(std::string_view text, bool at_start,
                               std::vector<TokenId>& out) const = 0;
  // Bytes of a normal / user-defined / byte token.
  virtual std::string text_of(TokenId id) const = 0;
  // Leading bytes decode() drops from the first token (the dummy prefix space).
  virtual std::size_t strip_leading(TokenId first) const;

  Vocab vocab_;
  std::unordered_map<std::string_view, TokenId> index_;  // views into vocab_.tokens

 private:
  // Leftmost-longest matching of special token texts: candidate lengths by first byte, then one
  // hash lookup per length.
  struct SpecialMatcher {
    std::unordered_map<std::string_view, TokenId> ids;
    std::vector<std::vector<std::size_t>> lengths_by_first_byte;  // descending, 256 entries
    void add(std::string_view text, TokenId id);
    void finish();
    // Length and id of the longest special token starting at text[0]; {0, -1} if none.
    std::pair<std::size_t, TokenId> match(std::string_view text) const;
  };
  SpecialMatcher always_;        // user-defined
  SpecialMatcher with_control_;  // user-defined and control
};

}  // namespace masskv::model
