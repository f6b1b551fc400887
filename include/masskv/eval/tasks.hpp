// RULER-style long-context tasks generated from a seed (no downloads), and their scorers.
// Each sample is split where the eval shares work: `context` (instructions + haystack) is
// prefilled densely once; `question` and `answer_prefix` follow it token by token through the
// sparse decode path of every method, then the answer is generated greedily. The runner wraps
// context + question in the model's chat template (a user turn) and starts the model's turn
// with answer_prefix, so the generator only reserves `reserve_tokens` for that wrapping.
// Layout: `context` ends with a blank line ("\n\n") so `question` can follow it directly;
// `answer_prefix` ends without a space, so the answer is its natural continuation
// ("... mentioned in the text above is" -> " 4829301"). Task definitions: docs/eval.md.
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
// case-insensitive), `part` = 1 when any reference is found. As in RULER the match is a plain
// substring, so "4829301" also counts inside "48293012" (answers are random 7-digit numbers,
// UUIDs, 5-letter names, or words that contain no other word of the lists, so this rarely
// matters; qa_text's "4.1" would also match "4.10").
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
  // Relative position in [0, 1] of what the question is about, in the haystack: the asked (or
  // first asked) needle, the first statement of vt's asked chain, qa_text's heading; 0 for cwe
  // and fwe. Needle depths are drawn uniformly per seed; this is where the needle landed.
  double depth = 0;
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

// Deterministic in (task, length, seed, text, tokenizer); samples are the same on every
// standard library (the PRNG is SplitMix64, no std:: distributions). The encoded context +
// question + answer_prefix (each encoded on its own, without bos) fit in length − reserve_tokens
// and fill at least 90% of it (95% or more in practice); every answer occurs in the context
// (tests check both). Throws Error(invalid_argument, "task") for an unknown task,
// Error(invalid_argument, "length") when the length cannot hold the task,
// Error(invalid_argument, "text") when a task that needs text gets none or too little, and
// Error(invalid_argument, "tokenizer" / "reserve_tokens") for a missing tokenizer or a reserve
// outside [0, length).
Sample make_sample(std::string_view task, const GenerateArgs& args);

// Score in [0, 1] of a generated output against the sample's answers (see Scoring).
double score(const Sample& sample, std::string_view output);

}  // namespace masskv::eval
