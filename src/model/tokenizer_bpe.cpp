// Byte-level BPE (GPT-2 style): the text is pre-split into words by the model's
// tokenizer.ggml.pre rule, each word's bytes are mapped to printable code points (so the
// vocabulary holds only printable strings), and adjacent symbols are merged lowest rank first.
#include <algorithm>
#include <array>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "masskv/error.hpp"
#include "model/pretokenize.hpp"
#include "model/tokenizer_impl.hpp"
#include "model/unicode.hpp"

namespace masskv::model::detail {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes (C0
// controls, space, DEL, C1 controls, NBSP, soft hyphen) to U+0100.. in byte order.
struct ByteMap {
  std::array<std::string, 256> to_text;  // byte -> UTF-8 of its code point
  std::array<int, 0x200> to_byte{};      // code point -> byte, -1 when not a byte's image

  ByteMap() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      unicode::append_utf8(to_text[static_cast<std::size_t>(b)], cp);
      to_byte[cp] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(Vocab vocab) : Tokenizer(std::move(vocab)) {
    // tokenizer.ggml.pre names from llama.cpp's converter; each is a fixed split rule.
    if (vocab_.pre == "gpt2") {
      isolate_digits_ = false;
    } else if (vocab_.pre == "smollm") {
      isolate_digits_ = true;  // SmolLM2 splits every digit off before the GPT-2 split
    } else {
      fail(ErrorCode::unsupported, "tokenizer.ggml.pre", "pre-tokenizer '", vocab_.pre,
           "' is not supported for BPE (supported: gpt2, smollm)");
    }
    ranks_.reserve(vocab_.merges.size());
    for (std::size_t r = 0; r < vocab_.merges.size(); ++r) {
      const std::string& m = vocab_.merges[r];
      const std::size_t space = m.find(' ', 1);
      require(space != std::string::npos && space + 1 < m.size(), ErrorCode::invalid_argument,
              "tokenizer.ggml.merges", "entry ", r, " '", m, "' is not 'left right'");
      ranks_.emplace(m, static_cast<int>(r));  // first rank wins for a repeated merge
    }
    const ByteMap& map = byte_map();
    for (std::size_t b = 0; b < 256; ++b) byte_ids_[b] = find_token(map.to_text[b]);
  }

 protected:
  void encode_fragment(std::string_view text, bool, std::vector<TokenId>& out) const override {
    for (const std::string_view word : split_gpt2(text, isolate_digits_)) encode_word(word, out);
  }

  std::string text_of(TokenId id) const override {
    const std::string& t = vocab_.tokens[static_cast<std::size_t>(id)];
    // User-defined tokens are stored as the text they stand for, not in byte images.
    if (vocab_.types[static_cast<std::size_t>(id)] == TokenType::user_defined) return t;
    std::string out;
    const ByteMap& map = byte_map();
    for (std::size_t pos = 0; pos < t.size();) {
      const unicode::Utf8Char c = unicode::decode_utf8(t, pos);
      // A character that is no byte's image (malformed vocabulary) stands for itself.
      const int b = c.valid && c.cp < map.to_byte.size() ? map.to_byte[c.cp] : -1;
      if (b >= 0) {
        out.push_back(static_cast<char>(b));
      } else {
        out.append(t, pos, c.len);
      }
      pos += c.len;
    }
    return out;
  }

 private:
  // One pre-split word: merge its byte images pairwise, lowest rank first, leftmost on ties.
  void encode_word(std::string_view bytes, std::vector<TokenId>& out) const {
    const ByteMap& map = byte_map();
    std::string s;  // the word in byte images
    std::vector<MergeSymbol> sym;
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      const std::string& t = map.to_text[static_cast<unsigned char>(bytes[i])];
      const int k = static_cast<int>(sym.size());
      sym.push_back({s.size(), t.size(), k - 1, k + 1});
      s += t;
    }
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Candidate {
      int rank;
      int left;
      std::size_t len;  // combined length, to tell whether the pair is still the same
      bool operator<(const Candidate& o) const {  // priority_queue pops the greatest
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::priority_queue<Candidate> queue;
    std::string key;
    const auto consider = [&](int left) {
      if (left < 0 || sym[left].next < 0) return;
      const MergeSymbol& l = sym[left];
      const MergeSymbol& r = sym[l.next];
      key.assign(s, l.start, l.len).append(1, ' ').append(s, r.start, r.len);
      const auto it = ranks_.find(key);
      if (it != ranks_.end()) queue.push({it->second, left, l.len + r.len});
    };
    merge_pairs(sym, queue, consider);
    for (int k = 0; k >= 0; k = sym[k].next) {
      const std::string_view piece = std::string_view(s).substr(sym[k].start, sym[k].len);
      const TokenId id = find_token(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // A merge result missing from the vocabulary: fall back to its single bytes.
      for (std::size_t b = sym[k].start; b < sym[k].start + sym[k].len;) {
        const unicode::Utf8Char c = unicode::decode_utf8(s, b);
        const int byte = map.to_byte[c.cp];
        const TokenId bid = byte_ids_[static_cast<std::size_t>(byte)];
        require(bid >= 0 || vocab_.unk >= 0, ErrorCode::invalid_argument, "text", "byte ", byte,
                " has no token and the model has no unknown token");
        out.push_back(bid >= 0 ? bid : vocab_.unk);
        b += c.len;
      }
    }
  }

  bool isolate_digits_ = false;
  std::unordered_map<std::string, int> ranks_;  // "left right" -> merge rank
  std::array<TokenId, 256> byte_ids_{};         // single-byte tokens, -1 when absent
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab vocab) {
  return std::make_unique<BpeTokenizer>(std::move(vocab));
}

}  // namespace masskv::model::detail
