// RULER-style long-context tasks generated from a seed (no downloads), and their scorers.
// Each sample is split where the eval shares work: `context` (instructions + haystack) is
// prefilled densely once; `question` and `answer_prefix` follow it token by token through the
// sparse decode path of every method, then the answer is generated greedily. The runner wraps
// context + question in the model's chat template (a user turn) and starts the model's turn
// with answer_prefix, so the generator only reserves `reserve_tokens` for that wrapping.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace masskv::model {
class Tokenizer;
}

namespace masskv::eval {

// RULER's two scorers: `all` = fraction of the references found in the output (string match,
// case-insensitive), `part` = 1 when any reference is found.
enum class Scoring { all, part };

struct Sample {
  std::string task;
  std::int64_t length = 0;  // target tokens of the whole prompt (template included)
  std::uint64_t seed = 0;
  std::string context;        // instructions + haystack: prefilled densely, shared by methods
  std::string question;       // after the haystack, inside the user turn: decoded
  std::string answer_prefix;  // starts the model's turn: decoded
  std::vector<std::string> answers;
  Scoring scoring = Scoring::all;
  int max_new_tokens = 16;  // generation budget for the answer
  double depth = 0;         // needle tasks: relative position of the (first) needle in [0, 1]
};

struct TaskInfo {
  std::string_view name;
  std::string_view description;
  bool needs_text;  // draws its haystack from the real text
};

// Every task, in report order.
std::span<const TaskInfo> tasks();
// Throws Error(invalid_argument, argument) naming the known tasks.
const TaskInfo& find_task(std::string_view name, std::string_view argument = "task");

struct GenerateArgs {
  const model::Tokenizer* tokenizer = nullptr;  // token counts are measured with it
  std::string_view text;    // real text (the Debian Policy Manual) for tasks that need it
  std::int64_t length = 0;  // tokens of the whole prompt
  int reserve_tokens = 32;  // chat template + bos, counted against `length`
  std::uint64_t seed = 0;
};

// Deterministic in (task, length, seed, text, tokenizer). The encoded context + question +
// answer_prefix fit in length − reserve_tokens and fill it to within a few percent; every
// answer occurs in the context (tests check both). Throws Error(invalid_argument, "length")
// when the length cannot hold the task, Error(invalid_argument, "text") when a task that
// needs text gets too little.
Sample make_sample(std::string_view task, const GenerateArgs& args);

// Score in [0, 1] of a generated output against the sample's answers (see Scoring).
double score(const Sample& sample, std::string_view output);

}  // namespace masskv::eval
