// The eval loop of one sample (docs/design.md §6's data flow): the context is prefilled once per
// attention (mapping, score multipliers and sparse prefill; dense by default), and once more
// with the rest of the prompt on a fork of it for the standard protocol (DecodeConfig::protocol);
// every decode configuration then forks its protocol's session (shared pages, copy-on-write),
// decodes what the prefill left (strict: the question and the answer prefix, token by token
// through its selector) and generates the answer greedily. The configurations step in lockstep through model::decode_batch (one
// forward pass per step for all of them, each row under its own selector); one that finishes leaves
// the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "masskv/dtype.hpp"
#include "masskv/eval/tasks.hpp"
#include "masskv/mapping.hpp"
#include "masskv/model/chat_template.hpp"
#include "masskv/model/model.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::eval {

// Which tokens decode through the selectors (docs/eval.md "Protocols").
enum class Protocol {
  // The context is prefilled densely; the question, the end of the user turn, the start of the
  // model's turn and the answer prefix decode token by token through each configuration's
  // selector, then the answer: sparsity acts on every token that reads the question.
  strict,
  // The field's protocol (Quest, Twilight, EntmaxKV, SpotAttention): the whole prompt is
  // prefilled (densely, or by the configuration's sparse prefill), the first answer token comes
  // from that prefill's logits, and every generated token after it decodes sparsely.
  standard,
};
std::string_view to_string(Protocol p);
// "strict" or "standard"; throws Error(invalid_argument, argument) otherwise.
Protocol parse_protocol(std::string_view name, std::string_view argument);

struct DecodeConfig {
  Mapping mapping = Mapping::softmax();            // attention of every layer, prefill included
  std::optional<select::SelectorConfig> selector;  // nullopt: dense decode
  // Per-head score multipliers (an entmax conversion, SessionOptions::score_multipliers);
  // empty: none. Configurations with the same mapping and multipliers share one prefill.
  std::vector<float> score_multipliers;
  // Sparse prefill of the context (SessionOptions::sparse_prefill; method dense: dense).
  // Decode stays dense unless `selector` is set. Configurations share a prefill only when
  // this matches too.
  select::PrefillSelectConfig prefill;
  // Decode steps one selection serves, and the query change that ends it early
  // (SessionOptions::reselect_every, reselect_cos).
  int reselect_every = 1;
  double reselect_cos = -1;
  model::SelectionTiming selection_timing = model::SelectionTiming::fresh;
  // Which tokens decode through `selector` (Protocol); configurations of both protocols share
  // the context's prefill.
  Protocol protocol = Protocol::strict;
};

struct Outcome {
  std::string output;  // generated text, special tokens not rendered
  double score = 0;    // eval::score(sample, output)
  int steps = 0;       // decode steps: question + answer prefix + generated tokens
  double kv_read = 1;  // KV rows read / rows dense decode reads, over all steps and layers
  // Over the steps and the q heads of the layers that ran a selector: the mean certified δ
  // upper bound (§2.5) and the fraction of heads certified exact (§2.2). Dense: 0 and 1.
  double delta_bound = 0;
  double certified = 1;
  // This configuration's share of the batched steps it took part in: per step, the time
  // outside attention divided by the rows of the step, plus its own attention time.
  double decode_seconds = 0;
  double prefill_seconds = 0;  // the shared prefill this configuration used (not divided)
  // (query, key) pairs that prefill attended / what dense prefill attends (all layers).
  double prefill_kv_read = 1;
  // Layer steps that selected / layer steps that ran a selector (1 without reuse or selector).
  double fresh_select = 1;
  // The selectors' own reads (select/read_cost.hpp) / the bytes dense decode reads, over all
  // steps and layers: the budget's second part (docs/eval.md "Budgets").
  double selector_read = 0;
};


struct RunOptions {
  int page_size = 16;
  DType kv_dtype = DType::f16;
  int prefill_block = 64;
  bool diagnostics = true;  // certified δ bounds per step (about one more bound pass per layer)
  // Configurations decoded together per step (0: all of the sample's; 1: one at a time, each
  // step a mat-vec pass as Session::decode). Outcomes agree up to f32 rounding (argmax
  // near-ties may part).
  int max_batch = 0;
  // The learned selector of the configurations with select::uses_learned_keys: every prefill of
  // a sample that has one keeps its key cache (model.hpp). Null: no such configuration.
  std::shared_ptr<const learn::Selector> learned_selector;
  kv::RowFormat learned_key_format = kv::RowFormat::f32;
};

// The prompt split where the work is shared: `context` is the chat template's start and the
// sample's context (bos included when the model wants one); `rest` is the question, the end
// of the user turn, the start of the model's turn and the answer prefix.
struct PromptTokens {
  std::vector<model::TokenId> context, rest;
  std::vector<model::TokenId> stop;  // eos and the template's end of turn
};
PromptTokens tokenize_sample(const model::Model& model, const model::ChatTemplate& chat,
                             const Sample& sample);
// Tokens the chat template and bos add to a user turn (GenerateArgs::reserve_tokens).
int template_overhead(const model::Model& model, const model::ChatTemplate& chat);

// Runs `configs` on one sample; outcomes in config order. progress(done, total) counts
// prefilled tokens and decode steps. Throws Error(invalid_argument, "max_batch") for a
// negative max_batch, and masskv::Error from the model or selector.
std::vector<Outcome> run_sample(const model::Model& model, const model::ChatTemplate& chat,
                                const Sample& sample, std::span<const DecodeConfig> configs,
                                const RunOptions& options,
                                const std::function<void(std::int64_t)>& progress = {});

}  // namespace masskv::eval
