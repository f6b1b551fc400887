// Chat prompts for the instruct models: the two template families the packaged models use,
// recognised from tokenizer.chat_template (or, when the file has none, from the vocabulary),
// and rendered in C++ (no Jinja interpreter):
//   chatml  <|im_start|>role\ncontent<|im_end|>\n ... then <|im_start|>assistant\n   (SmolLM2)
//   gemma   <start_of_turn>user\ncontent<end_of_turn>\n ... then <start_of_turn>model\n (Gemma 3)
// The text holds special tokens as text: encode it with parse_special on. It never holds the
// bos token: encode with add_bos = Tokenizer::add_bos_default() (Gemma's template starts with
// bos, SmolLM2's has none).
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace masskv::model {

class GgufFile;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatStyle { chatml, gemma };

class ChatTemplate {
 public:
  // Throws Error(unsupported, "tokenizer.chat_template") when the template (or, without one,
  // the vocabulary) matches neither family.
  static ChatTemplate from_gguf(const GgufFile& file);
  // From a template string. ChatML templates that write a system turn when the first message
  // is not one (SmolLM2's does) keep that default system prompt.
  static ChatTemplate from_template(std::string_view jinja);
  static ChatTemplate chatml(std::string default_system = {});
  static ChatTemplate gemma();

  ChatStyle style() const noexcept { return style_; }
  const std::string& default_system() const noexcept { return default_system_; }
  // The text that ends a model turn (stop generating at its token).
  std::string_view end_of_turn() const noexcept;

  // Throws Error(invalid_argument, "messages") for an empty role or, in the gemma style, a
  // system message that is not the first one (Gemma folds it into the first user turn).
  std::string format_chat(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

 private:
  ChatTemplate(ChatStyle style, std::string default_system)
      : style_(style), default_system_(std::move(default_system)) {}
  ChatStyle style_;
  std::string default_system_;
};

}  // namespace masskv::model
