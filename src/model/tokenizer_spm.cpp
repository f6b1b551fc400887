// SentencePiece BPE as the "llama" GGUF tokenizer model: spaces are written as U+2581, the
// text starts as single characters, and the adjacent pair whose concatenation is a vocabulary
// piece with the highest score is merged until none is left (leftmost on ties). Pieces the
// vocabulary lacks fall back to <0xXX> byte tokens, else to the unknown token.
#include <array>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "masskv/error.hpp"
#include "model/tokenizer_impl.hpp"
#include "model/unicode.hpp"

namespace masskv::model::detail {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// "<0xAB>" -> 0xAB; -1 for anything else.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (const char c : t.substr(3, 2)) {
    const int d = (c >= '0' && c <= '9')   ? c - '0'
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                  : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                           : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(Vocab vocab) : Tokenizer(std::move(vocab)) {
    require(!vocab_.scores.empty(), ErrorCode::invalid_argument, "tokenizer.ggml.scores",
            "is required by the SentencePiece ('llama') tokenizer");
    byte_ids_.fill(-1);
    for (std::size_t i = 0; i < vocab_.tokens.size(); ++i) {
      const auto id = static_cast<TokenId>(i);
      const TokenType type = vocab_.types[i];
      if (type == TokenType::byte) {
        const int b = parse_byte_token(vocab_.tokens[i]);
        require(b >= 0, ErrorCode::invalid_argument, "tokenizer.ggml.tokens", "byte token ", i,
                " is '", vocab_.tokens[i], "', not <0xXX>");
        if (byte_ids_[static_cast<std::size_t>(b)] < 0) byte_ids_[static_cast<std::size_t>(b)] = id;
      }
      // SentencePiece merges into normal, user-defined and unused pieces (unused ones are split
      // again at the end); control, unknown and byte pieces never come out of a merge.
      if (type == TokenType::normal || type == TokenType::user_defined ||
          type == TokenType::unused || type == TokenType::undefined) {
        pieces_.emplace(vocab_.tokens[i], id);
      }
    }
  }

 protected:
  void encode_fragment(std::string_view text, bool at_start,
                       std::vector<TokenId>& out) const override {
    std::string s;
    if (vocab_.add_space_prefix && at_start) s += kSpace;
    for (const char c : text) {
      if (c == ' ') {
        s += kSpace;
      } else {
        s.push_back(c);
      }
    }
    std::vector<MergeSymbol> sym;
    for (std::size_t pos = 0; pos < s.size();) {
      const std::size_t len = unicode::decode_utf8(s, pos).len;
      const int k = static_cast<int>(sym.size());
      sym.push_back({pos, len, k - 1, k + 1});
      pos += len;
    }
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Candidate {
      float score;
      int left;
      std::size_t len;  // combined length, to tell whether the pair is still the same
      bool operator<(const Candidate& o) const {  // priority_queue pops the greatest
        return score != o.score ? score < o.score : left > o.left;
      }
    };
    std::priority_queue<Candidate> queue;
    // Unused pieces formed by a merge, with the two pieces they came from.
    std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> unmerge;
    const std::string_view sv(s);
    const auto consider = [&](int left) {
      if (left < 0 || sym[left].next < 0) return;
      const MergeSymbol& l = sym[left];
      const MergeSymbol& r = sym[l.next];
      const std::string_view piece = sv.substr(l.start, l.len + r.len);
      const auto it = pieces_.find(piece);
      if (it == pieces_.end()) return;
      const auto id = static_cast<std::size_t>(it->second);
      queue.push({vocab_.scores[id], left, piece.size()});
      if (vocab_.types[id] == TokenType::unused) {
        unmerge.emplace(piece, std::pair(sv.substr(l.start, l.len), sv.substr(r.start, r.len)));
      }
    };
    merge_pairs(sym, queue, consider);
    for (int k = 0; k >= 0; k = sym[k].next)
      emit(sv.substr(sym[k].start, sym[k].len), unmerge, out);
  }

  std::string text_of(TokenId id) const override {
    const std::string& t = vocab_.tokens[static_cast<std::size_t>(id)];
    if (vocab_.types[static_cast<std::size_t>(id)] == TokenType::byte) {
      return std::string(1, static_cast<char>(parse_byte_token(t)));
    }
    std::string out;
    for (std::size_t pos = 0; pos < t.size();) {
      if (t.compare(pos, kSpace.size(), kSpace) == 0) {
        out.push_back(' ');
        pos += kSpace.size();
      } else {
        out.push_back(t[pos++]);
      }
    }
    return out;
  }

  std::size_t strip_leading(TokenId first) const override {
    if (!vocab_.add_space_prefix || first < 0) return 0;
    const auto i = static_cast<std::size_t>(first);
    const bool text =
        vocab_.types[i] == TokenType::normal || vocab_.types[i] == TokenType::user_defined;
    return text && std::string_view(vocab_.tokens[i]).substr(0, kSpace.size()) == kSpace ? 1 : 0;
  }

 private:
  // A final symbol: its piece id, an unused piece split back into its parts, or its bytes.
  template <class Unmerge>
  void emit(std::string_view piece, const Unmerge& unmerge, std::vector<TokenId>& out) const {
    const auto it = pieces_.find(piece);
    if (it != pieces_.end()) {
      if (vocab_.types[static_cast<std::size_t>(it->second)] != TokenType::unused) {
        out.push_back(it->second);
        return;
      }
      if (const auto u = unmerge.find(piece); u != unmerge.end()) {
        emit(u->second.first, unmerge, out);
        emit(u->second.second, unmerge, out);
        return;
      }
    }
    bool all_bytes = true;
    for (const char c : piece)
      all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
    if (all_bytes) {
      for (const char c : piece) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      return;
    }
    require(vocab_.unk >= 0, ErrorCode::invalid_argument, "text", "'", piece,
            "' has no token, no byte tokens and the model has no unknown token");
    out.push_back(vocab_.unk);
  }

  std::unordered_map<std::string_view, TokenId> pieces_;  // mergeable pieces
  std::array<TokenId, 256> byte_ids_{};                   // <0xXX> tokens, -1 when absent
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab vocab) {
  return std::make_unique<SpmTokenizer>(std::move(vocab));
}

}  // namespace masskv::model::detail
