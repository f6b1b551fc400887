// The eval loop (eval/runner.hpp) on the real default model: shared prefill gives the same
// outcomes as separate runs, the prompt split loses nothing, the bookkeeping of dense and
// sparse rows, and generation on a generated task.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "installed_model.hpp"
#include "masskv/eval/runner.hpp"
#include "masskv/eval/tasks.hpp"

namespace masskv::eval {
namespace {

// A short hand-made sample (the generated tasks need >= 512 tokens; this keeps the test
// quick, and under ASan too).
Sample code_word_sample() {
  Sample s;
  s.task = "code_word";
  s.context = "A special magic number is hidden in this text.\n";
  s.context += "The special magic number for zebra-lamp is: 4829301.\n";
  for (int i = 0; i < 6; ++i) s.context += "The grass is green. The sky is blue. Here we go.\n";
  s.context += "\n";
  s.question = "What is the special magic number for zebra-lamp?";
  s.answer_prefix = "The special magic number for zebra-lamp is";
  s.answers = {"4829301"};
  s.max_new_tokens = 10;
  return s;
}

DecodeConfig quest(std::int64_t budget, Mapping mapping = Mapping::softmax()) {
  DecodeConfig c;
  c.mapping = mapping;
  c.selector = select::SelectorConfig{};
  c.selector->method = select::Method::quest;
  c.selector->mapping = mapping;
  c.selector->budget.tokens = budget;
  return c;
}

RunOptions small_pages() {
  RunOptions o;
  o.page_size = 4;
  return o;
}

TEST(EvalRunner, PromptSplitKeepsEveryTokenAndEndsTheContextAtTheHaystack) {
  REQUIRE_MODEL(m, "smollm2");
  const model::ChatTemplate chat = model::ChatTemplate::from_gguf(m->file());
  const Sample s = code_word_sample();
  const PromptTokens p = tokenize_sample(*m, chat, s);
  const std::string ctx = m->tokenizer().decode(p.context);
  const std::string rest = m->tokenizer().decode(p.rest);
  EXPECT_TRUE(ctx.ends_with(s.context)) << ctx;
  EXPECT_TRUE(rest.starts_with(s.question)) << rest;
  EXPECT_TRUE(rest.ends_with(s.answer_prefix)) << rest;
  EXPECT_EQ(
      ctx + rest,
      chat.format_chat(std::vector<model::ChatMessage>{{"user", s.context + s.question}}, true) +
          s.answer_prefix);
  EXPECT_GT(template_overhead(*m, chat), 0);
  EXPECT_GE(p.stop.size(), 1u);
}

TEST(EvalRunner, SharedPrefillGivesTheOutcomesOfSeparateRuns) {
  REQUIRE_MODEL(m, "smollm2");
  if (test::kSanitized) GTEST_SKIP() << "six short runs: too slow under sanitizers";
  const model::ChatTemplate chat = model::ChatTemplate::from_gguf(m->file());
  const Sample s = code_word_sample();
  // Mappings interleaved: one prefill each; the later configurations of a mapping decode from
  // a root that earlier forks have used.
  // One configuration at a time (every step the mat-vec path), so runs agree to the bit.
  const std::vector<DecodeConfig> configs{DecodeConfig{},
                                          DecodeConfig{Mapping::entmax(1.5), std::nullopt, {}, {}},
                                          quest(8), quest(8, Mapping::entmax(1.5))};
  RunOptions one = small_pages();
  one.max_batch = 1;
  const auto together = run_sample(*m, chat, s, configs, one);
  ASSERT_EQ(together.size(), configs.size());
  for (std::size_t i = 2; i < configs.size(); ++i) {
    const auto alone = run_sample(*m, chat, s, std::span(&configs[i], 1), one);
    EXPECT_EQ(together[i].output, alone[0].output) << "config " << i;
    EXPECT_EQ(together[i].steps, alone[0].steps) << "config " << i;
    EXPECT_EQ(together[i].kv_read, alone[0].kv_read) << "config " << i;
    EXPECT_EQ(together[i].delta_bound, alone[0].delta_bound) << "config " << i;
  }
}

// Lockstep decoding (all configurations in one batch; or three at a time, a finished one
// replaced by the next at another position) against one configuration at a time: the batch
// runs the GEMM where a lone step runs the mat-vec, so logits differ by ~1e-3 at most
// (DecodeBatch.*); on this sample that changes no token and no selection: same outputs,
// steps, KV read and certificates, δ bounds within 1e-6. Different stop points make the
// lanes leave the batch at different steps.
TEST(EvalRunner, LockstepBatchesGiveTheOutcomesOfOneAtATime) {
  REQUIRE_MODEL(m, "smollm2");
  if (test::kSanitized)
    GTEST_SKIP() << "three runs of four configurations: too slow under sanitizers";
  const model::ChatTemplate chat = model::ChatTemplate::from_gguf(m->file());
  const Sample s = code_word_sample();
  DecodeConfig top_p = quest(12);
  top_p.selector->method = select::Method::top_p;
  top_p.selector->budget.kind = select::Budget::Kind::top_p;
  const std::vector<DecodeConfig> configs{
      DecodeConfig{}, quest(8), DecodeConfig{Mapping::entmax(1.5), std::nullopt, {}, {}}, top_p};
  RunOptions opt = small_pages();
  opt.max_batch = 1;
  const auto ref = run_sample(*m, chat, s, configs, opt);
  for (const int batch : {0, 3}) {
    opt.max_batch = batch;
    std::int64_t ticks = 0;
    const auto got = run_sample(*m, chat, s, configs, opt, [&](std::int64_t n) { ticks += n; });
    std::int64_t steps = 0;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      SCOPED_TRACE(testing::Message() << "max_batch " << batch << " config " << i);
      EXPECT_EQ(got[i].output, ref[i].output);
      EXPECT_EQ(got[i].steps, ref[i].steps);
      EXPECT_EQ(got[i].kv_read, ref[i].kv_read);
      EXPECT_EQ(got[i].certified, ref[i].certified);
      EXPECT_NEAR(got[i].delta_bound, ref[i].delta_bound, 1e-6);
      EXPECT_GT(got[i].decode_seconds, 0.0);
      steps += got[i].steps;
    }
    const auto prompt = tokenize_sample(*m, chat, s);
    EXPECT_EQ(ticks, steps + 2 * static_cast<std::int64_t>(prompt.context.size()));  // 2 prefills
  }
  RunOptions bad = small_pages();
  bad.max_batch = -1;
  test::expect_error([&] { (void)run_sample(*m, chat, s, configs, bad); },
                     ErrorCode::invalid_argument, "max_batch");
}

TEST(EvalRunner, DenseFindsTheAnswerAndSparseRowsReportWhatTheyRead) {
  REQUIRE_MODEL(m, "smollm2");
  const model::ChatTemplate chat = model::ChatTemplate::from_gguf(m->file());
  const Sample s = code_word_sample();
  const std::vector<DecodeConfig> configs{DecodeConfig{}, quest(4096), quest(8)};
  const auto out = run_sample(*m, chat, s, configs, small_pages());
  // Dense: the answer, everything read, nothing dropped.
  EXPECT_EQ(out[0].score, 1.0) << out[0].output;
  EXPECT_EQ(out[0].kv_read, 1.0);
  EXPECT_EQ(out[0].delta_bound, 0.0);
  EXPECT_EQ(out[0].certified, 1.0);
  EXPECT_GT(out[0].steps, 0);
  // A budget covering every page is dense again, certified.
  EXPECT_EQ(out[1].output, out[0].output);
  EXPECT_EQ(out[1].kv_read, 1.0);
  EXPECT_EQ(out[1].delta_bound, 0.0);
  EXPECT_EQ(out[1].certified, 1.0);
  // Two pages: a fraction read, a positive δ bound, nothing certified.
  EXPECT_LT(out[2].kv_read, 0.5);
  EXPECT_GT(out[2].delta_bound, 0.0);
  EXPECT_LE(out[2].delta_bound, 1.0);
  EXPECT_LT(out[2].certified, 1.0);
}

// The standard protocol: the whole prompt prefilled (context, then the rest on a fork), the first
// answer token from that prefill's logits, every later token decoded through the selector. Its
// dense row equals that loop written out by hand; rows of both protocols share the context's
// prefill and give the outcomes of runs alone; a standard row decodes only the answer.
TEST(EvalRunner, StandardProtocolPrefillsThePromptAndDecodesOnlyTheAnswer) {
  REQUIRE_MODEL(m, "smollm2");
  if (test::kSanitized) GTEST_SKIP() << "several short runs: too slow under sanitizers";
  const model::ChatTemplate chat = model::ChatTemplate::from_gguf(m->file());
  const Sample s = code_word_sample();
  const PromptTokens p = tokenize_sample(*m, chat, s);
  auto standard = [](DecodeConfig c) {
    c.protocol = Protocol::standard;
    return c;
  };
  DecodeConfig two = quest(8);
  two.selector->method = select::Method::two_stage;
  const std::vector<DecodeConfig> configs{standard(DecodeConfig{}), DecodeConfig{},
                                          standard(quest(8)), quest(8), standard(two)};
  RunOptions one = small_pages();
  one.max_batch = 1;
  std::int64_t ticks = 0;
  const auto together = run_sample(*m, chat, s, configs, one, [&](std::int64_t n) { ticks += n; });
  ASSERT_EQ(together.size(), configs.size());
  // By hand: one session, the context and the rest prefilled, then greedy dense decoding.
  model::SessionOptions so;
  so.max_tokens = 512;
  so.page_size = 4;
  so.diagnostics = true;
  so.decode_activations = model::Activations::f32;
  model::Session session(*m, so);
  std::vector<float> logits(static_cast<std::size_t>(m->config().n_vocab));
  session.prefill(p.context, {});
  session.prefill(p.rest, logits);
  std::vector<model::TokenId> out;
  for (int i = 0; i < s.max_new_tokens; ++i) {
    const model::TokenId t = model::argmax(std::span<const float>(logits));
    if (std::find(p.stop.begin(), p.stop.end(), t) != p.stop.end()) break;
    out.push_back(t);
    if (i + 1 == s.max_new_tokens) break;
    session.decode(t, logits);
  }
  EXPECT_EQ(together[0].output, m->tokenizer().decode(out, false));
  EXPECT_EQ(together[0].score, 1.0) << together[0].output;
  // Standard rows decode the generated tokens but the last; strict rows the rest too.
  EXPECT_EQ(together[0].steps, static_cast<int>(out.size()) - (out.size() ==
                                   static_cast<std::size_t>(s.max_new_tokens) ? 1 : 0));
  EXPECT_EQ(together[1].steps - together[0].steps, static_cast<int>(p.rest.size()));
  // Shared prefills: the context once, the rest once for all standard rows.
  std::int64_t steps = 0;
  for (const Outcome& o : together) steps += o.steps;
  EXPECT_EQ(ticks, steps + static_cast<std::int64_t>(p.context.size() + p.rest.size()));
  for (std::size_t i = 2; i < configs.size(); ++i) {
    const auto alone = run_sample(*m, chat, s, std::span(&configs[i], 1), one);
    EXPECT_EQ(together[i].output, alone[0].output) << "config " << i;
    EXPECT_EQ(together[i].steps, alone[0].steps) << "config " << i;
    EXPECT_EQ(together[i].kv_read, alone[0].kv_read) << "config " << i;
    EXPECT_EQ(together[i].selector_read, alone[0].selector_read) << "config " << i;
  }
  // Selector reads: none for dense, the bounds of every page for Quest, more for two-stage.
  EXPECT_EQ(together[0].selector_read, 0.0);
  EXPECT_GT(together[2].selector_read, 0.0);
  EXPECT_GT(together[4].selector_read, together[2].selector_read);
}

TEST(EvalRunner, GeneratedNeedleTaskRunsEndToEnd) {
  REQUIRE_MODEL(m, "smollm2");
  if (test::kSanitized) GTEST_SKIP() << "a 512-token prefill is slow under sanitizers";
  const model::ChatTemplate chat = model::ChatTemplate::from_gguf(m->file());
  GenerateArgs ga;
  ga.tokenizer = &m->tokenizer();
  ga.length = 512;
  ga.reserve_tokens = template_overhead(*m, chat) + 2;
  ga.seed = 7;
  const Sample s = make_sample("niah_single_number", ga);
  const PromptTokens p = tokenize_sample(*m, chat, s);
  EXPECT_LE(static_cast<std::int64_t>(p.context.size() + p.rest.size()), ga.length);
  const std::vector<DecodeConfig> configs{DecodeConfig{}};
  const auto out = run_sample(*m, chat, s, configs, RunOptions{});
  EXPECT_EQ(out[0].score, 1.0) << out[0].output << " vs " << s.answers[0];
  EXPECT_GT(out[0].prefill_seconds, 0.0);
}

}  // namespace
}  // namespace masskv::eval
