// Tokenizer: vocabulary from GGUF metadata, special-token splitting and decoding shared by the
// BPE and SentencePiece algorithms.
#include "masskv/model/tokenizer.hpp"

#include <algorithm>
#include <utility>

#include "masskv/error.hpp"
#include "masskv/model/gguf.hpp"
#include "model/tokenizer_impl.hpp"

namespace masskv::model {
namespace {

TokenId optional_id(const GgufFile& file, std::string_view key, std::size_t n_tokens) {
  const GgufValue* v = file.find(key);
  if (v == nullptr) return -1;
  const auto id = v->as<std::int64_t>(key);
  require(id >= 0 && static_cast<std::size_t>(id) < n_tokens, ErrorCode::out_of_range, key, "id ",
          id, " is outside the vocabulary of ", n_tokens, " tokens");
  return static_cast<TokenId>(id);
}

}  // namespace

Vocab Vocab::from_gguf(const GgufFile& file) {
  Vocab v;
  v.model = file.get<std::string>("tokenizer.ggml.model");
  v.pre = file.get_or<std::string>("tokenizer.ggml.pre", "default");
  v.tokens = file.get_array<std::string>("tokenizer.ggml.tokens");
  const std::size_t n = v.tokens.size();
  require(n > 0 && n <= static_cast<std::size_t>(INT32_MAX), ErrorCode::invalid_argument,
          "tokenizer.ggml.tokens", "has ", n, " tokens");
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    const auto types = file.get_array<std::int32_t>("tokenizer.ggml.token_type");
    require(types.size() == n, ErrorCode::invalid_argument, "tokenizer.ggml.token_type", "has ",
            types.size(), " entries for ", n, " tokens");
    v.types.reserve(n);
    for (const std::int32_t t : types) {
      require(t >= 0 && t <= 6, ErrorCode::invalid_argument, "tokenizer.ggml.token_type",
              "unknown token type ", t);
      v.types.push_back(static_cast<TokenType>(t));
    }
  } else {
    v.types.assign(n, TokenType::normal);
  }
  if (file.find("tokenizer.ggml.scores") != nullptr) {
    v.scores = file.get_array<float>("tokenizer.ggml.scores");
    require(v.scores.size() == n, ErrorCode::invalid_argument, "tokenizer.ggml.scores", "has ",
            v.scores.size(), " entries for ", n, " tokens");
  }
  if (file.find("tokenizer.ggml.merges") != nullptr) {
    v.merges = file.get_array<std::string>("tokenizer.ggml.merges");
  }
  v.bos = optional_id(file, "tokenizer.ggml.bos_token_id", n);
  v.eos = optional_id(file, "tokenizer.ggml.eos_token_id", n);
  v.unk = optional_id(file, "tokenizer.ggml.unknown_token_id", n);
  v.add_bos = file.get_or<bool>("tokenizer.ggml.add_bos_token", false);
  v.add_space_prefix = file.get_or<bool>("tokenizer.ggml.add_space_prefix", false);
  return v;
}

std::unique_ptr<Tokenizer> Tokenizer::create(Vocab vocab) {
  if (vocab.model == "gpt2") return detail::make_bpe_tokenizer(std::move(vocab));
  if (vocab.model == "llama") return detail::make_spm_tokenizer(std::move(vocab));
  fail(ErrorCode::unsupported, "tokenizer.ggml.model", "'", vocab.model,
       "' is not supported (byte-level BPE 'gpt2' and SentencePiece 'llama' are)");
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  return create(Vocab::from_gguf(file));
}

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  const std::size_t n = vocab_.tokens.size();
  require(vocab_.types.size() == n, ErrorCode::shape_mismatch, "vocab.types", "has ",
          vocab_.types.size(), " entries for ", n, " tokens");
  require(vocab_.scores.empty() || vocab_.scores.size() == n, ErrorCode::shape_mismatch,
          "vocab.scores", "has ", vocab_.scores.size(), " entries for ", n, " tokens");
  for (const TokenId id : {vocab_.bos, vocab_.eos, vocab_.unk}) {
    require(id >= -1 && id < static_cast<TokenId>(n), ErrorCode::out_of_range, "vocab",
            "special id ", id, " is outside the vocabulary");
  }
  index_.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto id = static_cast<TokenId>(i);
    index_.emplace(vocab_.tokens[i], id);  // first id wins for a duplicated text
    if (vocab_.tokens[i].empty()) continue;
    if (vocab_.types[i] == TokenType::user_defined) {
      always_.add(vocab_.tokens[i], id);
      with_control_.add(vocab_.tokens[i], id);
    } else if (vocab_.types[i] == TokenType::control) {
      with_control_.add(vocab_.tokens[i], id);
    }
  }
  always_.finish();
  with_control_.finish();
}

void Tokenizer::SpecialMatcher::add(std::string_view text, TokenId id) {
  if (lengths_by_first_byte.empty()) lengths_by_first_byte.resize(256);
  if (!ids.emplace(text, id).second) return;
  lengths_by_first_byte[static_cast<unsigned char>(text[0])].push_back(text.size());
}

void Tokenizer::SpecialMatcher::finish() {
  for (auto& lengths : lengths_by_first_byte) {
    std::sort(lengths.begin(), lengths.end(), std::greater<>());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  }
}

std::pair<std::size_t, TokenId> Tokenizer::SpecialMatcher::match(std::string_view text) const {
  if (ids.empty() || text.empty()) return {0, -1};
  for (const std::size_t len : lengths_by_first_byte[static_cast<unsigned char>(text[0])]) {
    if (len > text.size()) continue;
    if (const auto it = ids.find(text.substr(0, len)); it != ids.end()) return {len, it->second};
  }
  return {0, -1};
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  std::vector<TokenId> out;
  if (add_bos) {
    require(vocab_.bos >= 0, ErrorCode::invalid_argument, "add_bos",
            "the model has no bos token (tokenizer.ggml.bos_token_id)");
    out.push_back(vocab_.bos);
  }
  const SpecialMatcher& special = parse_special ? with_control_ : always_;
  std::size_t fragment = 0;  // start of the text not yet encoded
  for (std::size_t i = 0; i < text.size();) {
    const auto [len, id] = special.match(text.substr(i));
    if (len == 0) {
      ++i;
      continue;
    }
    if (fragment < i) encode_fragment(text.substr(fragment, i - fragment), fragment == 0, out);
    out.push_back(id);
    i += len;
    fragment = i;
  }
  if (fragment < text.size()) encode_fragment(text.substr(fragment), fragment == 0, out);
  return out;
}

std::string Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  require(id >= 0 && static_cast<std::size_t>(id) < vocab_.tokens.size(), ErrorCode::out_of_range,
          "ids", "token id ", id, " is outside the vocabulary of ", vocab_.tokens.size());
  switch (vocab_.types[static_cast<std::size_t>(id)]) {
    case TokenType::control:
    case TokenType::unknown:
    case TokenType::unused:
      return render_special ? vocab_.tokens[static_cast<std::size_t>(id)] : std::string();
    default:
      return text_of(id);
  }
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_to_piece(ids[i], render_special);
    // The dummy prefix belongs to the first text token (after a leading bos).
    const bool first_text = i == 0 || (i == 1 && ids[0] == vocab_.bos);
    out.append(first_text ? piece.substr(std::min(strip_leading(ids[i]), piece.size())) : piece);
  }
  return out;
}

std::size_t Tokenizer::strip_leading(TokenId) const { return 0; }

TokenId Tokenizer::find_token(std::string_view text) const noexcept {
  const auto it = index_.find(text);
  return it == index_.end() ? -1 : it->second;
}

bool Tokenizer::is_special(TokenId id) const noexcept {
  if (id < 0 || static_cast<std::size_t>(id) >= vocab_.types.size()) return false;
  const TokenType t = vocab_.types[static_cast<std::size_t>(id)];
  return t == TokenType::control || t == TokenType::user_defined;
}

}  // namespace masskv::model
