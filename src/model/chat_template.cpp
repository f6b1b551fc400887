// Renders the ChatML and Gemma chat formats; see chat_template.hpp for what each looks like.
#include "masskv/model/chat_template.hpp"

#include <string>
#include <utility>

#include "masskv/error.hpp"
#include "masskv/model/gguf.hpp"

namespace masskv::model {
namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kTurnStart = "<start_of_turn>";
constexpr std::string_view kTurnEnd = "<end_of_turn>";

// A ChatML template's built-in system prompt: the text between "<|im_start|>system\n" and
// "<|im_end|>" inside one quoted literal. Templates write the newline either as a real newline
// or as the two characters backslash-n.
std::string chatml_default_system(std::string_view jinja) {
  for (const std::string_view nl : {std::string_view("\n"), std::string_view("\\n")}) {
    const std::string head = std::string(kImStart) + "system" + std::string(nl);
    const std::size_t b = jinja.find(head);
    if (b == std::string_view::npos) continue;
    const std::size_t start = b + head.size();
    const std::size_t end = jinja.find(kImEnd, start);
    if (end == std::string_view::npos) continue;
    const std::string_view body = jinja.substr(start, end - start);
    // "... + message['content'] + ..." means the system turn is the user's, not a default.
    if (body.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string out;
    for (std::size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
        out.push_back('\n');
        ++i;
      } else {
        out.push_back(body[i]);
      }
    }
    return out;
  }
  return {};
}

// Gemma's template strips surrounding whitespace from each message (Jinja's trim).
std::string_view trim(std::string_view s) {
  const std::size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1);
}

}  // namespace

ChatTemplate ChatTemplate::chatml(std::string default_system) {
  return ChatTemplate(ChatStyle::chatml, std::move(default_system));
}

ChatTemplate ChatTemplate::gemma() { return ChatTemplate(ChatStyle::gemma, {}); }

ChatTemplate ChatTemplate::from_template(std::string_view jinja) {
  if (jinja.find(kImStart) != std::string_view::npos) return chatml(chatml_default_system(jinja));
  if (jinja.find(kTurnStart) != std::string_view::npos) return gemma();
  fail(ErrorCode::unsupported, "tokenizer.chat_template",
       "neither a ChatML (<|im_start|>) nor a Gemma (<start_of_turn>) template");
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& file) {
  if (const GgufValue* t = file.find("tokenizer.chat_template")) {
    return from_template(t->as<std::string_view>("tokenizer.chat_template"));
  }
  // No template in the file (the packaged Gemma 3 has none): the vocabulary tells the family.
  bool im_start = false, turn_start = false;
  if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens")) {
    for (const std::string_view tok : tokens->strings("tokenizer.ggml.tokens")) {
      im_start = im_start || tok == kImStart;
      turn_start = turn_start || tok == kTurnStart;
    }
  }
  if (im_start) return chatml();
  if (turn_start) return gemma();
  fail(ErrorCode::unsupported, "tokenizer.chat_template",
       "absent, and the vocabulary has neither <|im_start|> nor <start_of_turn>");
}

std::string_view ChatTemplate::end_of_turn() const noexcept {
  return style_ == ChatStyle::chatml ? kImEnd : kTurnEnd;
}

std::string ChatTemplate::format_chat(std::span<const ChatMessage> messages,
                                      bool add_generation_prompt) const {
  std::string out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    require(!messages[i].role.empty(), ErrorCode::invalid_argument, "messages", "message ", i,
            " has an empty role");
  }
  if (style_ == ChatStyle::chatml) {
    const auto turn = [&](std::string_view role, std::string_view content) {
      out.append(kImStart).append(role).append("\n").append(content).append(kImEnd).append("\n");
    };
    if (!default_system_.empty() && !messages.empty() && messages[0].role != "system") {
      turn("system", default_system_);
    }
    for (const ChatMessage& m : messages) turn(m.role, m.content);
    if (add_generation_prompt) out.append(kImStart).append("assistant\n");
    return out;
  }
  // gemma: a leading system message becomes a prefix of the first turn after it.
  std::string prefix;
  std::size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    prefix = messages[0].content + "\n\n";  // not trimmed, unlike the turns
    first = 1;
  }
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    require(m.role != "system", ErrorCode::invalid_argument, "messages", "message ", i,
            " is a system message; Gemma takes one only as the first message");
    const std::string_view role = m.role == "assistant" ? "model" : std::string_view(m.role);
    out.append(kTurnStart).append(role).append("\n");
    if (i == first) out.append(prefix);
    out.append(trim(m.content)).append(kTurnEnd).append("\n");
  }
  if (add_generation_prompt) out.append(kTurnStart).append("model\n");
  return out;
}

}  // namespace masskv::model
