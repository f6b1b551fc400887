// RULER-style eval tasks (src/eval, docs/eval.md).
//  - Structure: the task list, argument errors, the scorer on hand-written outputs, the word
//    lists, the PRNG, and the haystack helpers on small inputs.
//  - Samples with the real tokenizers (skipped when the models are not installed) and the real
//    text (the Debian Policy Manual, skipped when absent): for every task and several lengths
//    and seeds the prompt fits length - reserve_tokens and fills >= 90% of it, every answer
//    occurs in the context, the sample is solvable as stated (each task's answer is recomputed
//    from the context by an independent parser), and generation is deterministic in the seed.
// GCC 12 reports a false -Wmaybe-uninitialized inside libstdc++'s std::regex NFA (a moved
// std::function) when it inlines under -O3 with ASan; the warning points into the system headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "eval/haystack.hpp"
#include "eval/rng.hpp"
#include "eval/words.hpp"
#include "expect_error.hpp"
#include "installed_model.hpp"
#include "masskv/error.hpp"
#include "masskv/eval/tasks.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/model.hpp"
#include "policy_text.hpp"

namespace masskv::eval {
namespace {

using masskv::test::expect_error;

using test::installed;
using test::kSanitized;

using test::policy_text;

std::int64_t prompt_tokens(const model::Tokenizer& tok, const Sample& s) {
  return static_cast<std::int64_t>(tok.encode(s.context, false).size() +
                                   tok.encode(s.question, false).size() +
                                   tok.encode(s.answer_prefix, false).size());
}

std::size_t count_of(std::string_view text, std::string_view what) {
  std::size_t n = 0;
  for (std::size_t p = text.find(what); p != std::string_view::npos; p = text.find(what, p + 1)) {
    ++n;
  }
  return n;
}

// The body of the context between the instruction paragraph and the trailing blank line.
std::string body_of(const Sample& s) {
  const std::size_t start = s.context.find("\n\n");
  return s.context.substr(start + 2);
}

// Recomputes each task's answer from the context alone (independently of the generator) and
// checks it against sample.answers.
void expect_solvable(const Sample& s) {
  const std::string& c = s.context;
  if (s.task.starts_with("niah")) {
    std::regex needle(R"(The special magic (number|UUID) for ([a-z]+-[a-z]+) is ([0-9a-f-]+)\.)");
    std::map<std::string, std::vector<std::string>> values;  // key -> values in text order
    std::size_t needles = 0;
    for (auto it = std::sregex_iterator(c.begin(), c.end(), needle); it != std::sregex_iterator();
         ++it) {
      values[(*it)[2]].push_back((*it)[3]);
      ++needles;
    }
    const std::size_t expected =
        s.task == "niah_single_number" || s.task == "niah_single_uuid" ? 1 : 4;
    EXPECT_EQ(needles, expected);
    std::vector<std::string> asked;  // keys named in the question, in order
    std::regex key(R"([a-z]+-[a-z]+)");
    for (auto it = std::sregex_iterator(s.question.begin(), s.question.end(), key);
         it != std::sregex_iterator(); ++it) {
      asked.push_back(it->str());
    }
    std::multiset<std::string> want, got(s.answers.begin(), s.answers.end());
    for (const auto& k : asked) {
      ASSERT_TRUE(values.count(k)) << k;
      want.insert(values[k].begin(), values[k].end());
      EXPECT_NE(s.answer_prefix.find(k), std::string::npos);
    }
    EXPECT_EQ(want, got);
    if (s.task == "niah_single_uuid") {
      EXPECT_TRUE(std::regex_match(s.answers[0],
                                   std::regex("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                                              "[0-9a-f]{12}")));
    } else {
      for (const auto& a : s.answers) EXPECT_TRUE(std::regex_match(a, std::regex("[1-9][0-9]{6}")));
    }
    EXPECT_EQ(asked.size(), s.task == "niah_multiquery" ? 4u : 1u);
  } else if (s.task == "vt") {
    // Follow the assignments in text order from the asked value.
    std::smatch m;
    ASSERT_TRUE(std::regex_search(s.question, m, std::regex("value ([0-9]+)")));
    const std::string value = m[1];
    std::set<std::string> holds_value;
    std::regex stmt(R"(VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|([0-9]+))\.)");
    std::size_t statements = 0;
    for (auto it = std::sregex_iterator(c.begin(), c.end(), stmt); it != std::sregex_iterator();
         ++it) {
      ++statements;
      const bool assigned = (*it)[4].matched ? (*it)[4] == value : holds_value.count((*it)[3]) > 0;
      if (assigned) holds_value.insert((*it)[1]);
    }
    EXPECT_EQ(statements, 15u);
    EXPECT_EQ(holds_value, std::set<std::string>(s.answers.begin(), s.answers.end()));
    EXPECT_EQ(s.answers.size(), 5u);
  } else if (s.task == "cwe" || s.task == "fwe") {
    std::map<std::string, int> counts;
    std::istringstream in(body_of(s));
    std::string token;
    while (in >> token) {
      if (std::isdigit(static_cast<unsigned char>(token[0]))) {
        ASSERT_EQ(token.back(), '.') << token;  // list numbers "12."
        continue;
      }
      ++counts[token];
    }
    const std::size_t top = s.task == "cwe" ? 10 : 3;
    ASSERT_EQ(s.answers.size(), top);
    int min_answer = 1 << 30, max_other = 0;
    for (const auto& [w, n] : counts) {
      const bool answer = std::find(s.answers.begin(), s.answers.end(), w) != s.answers.end();
      if (answer) min_answer = std::min(min_answer, n);
      if (!answer) max_other = std::max(max_other, n);
    }
    EXPECT_GT(min_answer, max_other) << "the answers are not strictly the most frequent";
    EXPECT_GT(counts.size(), top);
  } else if (s.task == "qa_text") {
    ASSERT_EQ(s.answers.size(), 1u);
    const std::string& number = s.answers[0];
    const std::size_t q = s.question.find("titled ");
    ASSERT_NE(q, std::string::npos);
    std::string title = s.question.substr(q + 8);
    title = title.substr(0, title.find(" in the text above?") - 1);
    // The heading is in the context, underlined, and no line gives the title another number.
    const std::string heading = "\n" + number + ". " + title + "\n";
    const std::size_t h = c.find(heading);
    ASSERT_NE(h, std::string::npos) << heading;
    const char underline = c[h + heading.size()];
    EXPECT_NE(std::string_view("*=-~^").find(underline), std::string_view::npos);
    const auto numbers = numbers_of_title(c, title);
    EXPECT_GE(numbers.size(), 1u);
    for (const auto& n : numbers) EXPECT_EQ(n, number) << title;
    EXPECT_NE(number.find('.'), std::string::npos);
    EXPECT_EQ(s.scoring, Scoring::part);
  } else {
    ADD_FAILURE() << "no check for task " << s.task;
  }
}

void expect_valid(const Sample& s, const GenerateArgs& args, std::string_view task) {
  SCOPED_TRACE(::testing::Message() << task << " length " << args.length << " seed " << args.seed);
  EXPECT_EQ(s.task, task);
  EXPECT_EQ(s.length, args.length);
  EXPECT_EQ(s.seed, args.seed);
  const std::int64_t budget = args.length - args.reserve_tokens;
  const std::int64_t tokens = prompt_tokens(*args.tokenizer, s);
  EXPECT_LE(tokens, budget);
  EXPECT_GE(tokens, 0.9 * static_cast<double>(budget)) << "fills too little";
  EXPECT_FALSE(s.question.empty());
  EXPECT_FALSE(s.answer_prefix.empty());
  EXPECT_FALSE(s.answers.empty());
  EXPECT_GT(s.max_new_tokens, 0);
  EXPECT_GE(s.depth, 0.0);
  EXPECT_LE(s.depth, 1.0);
  EXPECT_TRUE(s.context.ends_with("\n\n"));
  for (const auto& a : s.answers) {
    EXPECT_FALSE(a.empty());
    EXPECT_NE(s.context.find(a), std::string::npos) << "answer " << a << " not in the context";
    // The scorer gives full marks to the answers themselves and none to the bare prefix.
  }
  std::string all;
  for (const auto& a : s.answers) all += " " + a + ",";
  EXPECT_EQ(score(s, all), 1.0);
  EXPECT_EQ(score(s, s.answer_prefix), 0.0);
  expect_solvable(s);
}

GenerateArgs args_for(const model::Model& m, std::int64_t length, std::uint64_t seed) {
  GenerateArgs a;
  a.tokenizer = &m.tokenizer();
  a.text = policy_text();
  a.length = length;
  a.seed = seed;
  return a;
}

// ---- structure ----------------------------------------------------------------------------

TEST(EvalTasks, ListsTheNineTasksInReportOrder) {
  const std::vector<std::string> names = {"niah_single_number",
                                          "niah_single_uuid",
                                          "niah_multikey",
                                          "niah_multivalue",
                                          "niah_multiquery",
                                          "vt",
                                          "cwe",
                                          "fwe",
                                          "qa_text"};
  const std::set<std::string> with_text = {"niah_single_uuid", "niah_multikey", "niah_multivalue",
                                           "niah_multiquery", "qa_text"};
  ASSERT_EQ(tasks().size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(tasks()[i].name, names[i]);
    EXPECT_FALSE(tasks()[i].description.empty());
    EXPECT_EQ(tasks()[i].needs_text, with_text.count(names[i]) > 0) << names[i];
    EXPECT_EQ(&find_task(names[i]), &tasks()[i]);
  }
  expect_error([] { find_task("niah"); }, ErrorCode::invalid_argument, "task", "niah_multikey");
  expect_error([] { find_task("", "--tasks"); }, ErrorCode::invalid_argument, "--tasks");
}

TEST(EvalTasks, RejectsBadArguments) {
  REQUIRE_MODEL(m, "smollm2");
  GenerateArgs a = args_for(*m, 1024, 1);
  a.text = "Short text. Only two sentences.\n";
  expect_error([&] { make_sample("ruler", a); }, ErrorCode::invalid_argument, "task");
  expect_error([&] { make_sample("niah_multikey", a); }, ErrorCode::invalid_argument, "text");
  GenerateArgs b = a;
  b.text = {};
  expect_error([&] { make_sample("qa_text", b); }, ErrorCode::invalid_argument, "text");
  b.tokenizer = nullptr;
  expect_error([&] { make_sample("cwe", b); }, ErrorCode::invalid_argument, "tokenizer");
  b = a;
  b.length = 0;
  expect_error([&] { make_sample("cwe", b); }, ErrorCode::invalid_argument, "length");
  b.length = 32;
  expect_error([&] { make_sample("cwe", b); }, ErrorCode::invalid_argument, "reserve_tokens");
  b.reserve_tokens = -1;
  expect_error([&] { make_sample("cwe", b); }, ErrorCode::invalid_argument, "reserve_tokens");
  // Too short for the smallest prompt of each task.
  for (const TaskInfo& t : tasks()) {
    GenerateArgs c = args_for(*m, 96, 1);
    if (c.text.empty()) c.text = std::string(300000, 'x');
    expect_error([&] { make_sample(t.name, c); }, ErrorCode::invalid_argument, "length",
                 "needs at least");
  }
  if (!policy_text().empty()) {
    GenerateArgs c = args_for(*m, 1 << 20, 1);  // more tokens than the whole manual
    expect_error([&] { make_sample("niah_single_uuid", c); }, ErrorCode::invalid_argument, "text");
  }
}

TEST(EvalTasks, ScoresLikeRuler) {
  Sample s;
  s.answers = {"4829301", "ABCDE", "cabbage"};
  s.scoring = Scoring::all;
  EXPECT_DOUBLE_EQ(score(s, ""), 0.0);
  EXPECT_DOUBLE_EQ(score(s, "the number is 4829301."), 1.0 / 3);
  EXPECT_DOUBLE_EQ(score(s, "4829301, abcde"), 2.0 / 3);  // case-insensitive
  EXPECT_DOUBLE_EQ(score(s, "CABBAGE abcde 4829301"), 1.0);
  EXPECT_DOUBLE_EQ(score(s, "482930"), 0.0);        // a part of an answer is not the answer
  EXPECT_DOUBLE_EQ(score(s, "48293012"), 1.0 / 3);  // plain substring, as RULER does
  s.scoring = Scoring::part;
  EXPECT_DOUBLE_EQ(score(s, "nothing"), 0.0);
  EXPECT_DOUBLE_EQ(score(s, "Cabbage"), 1.0);
  EXPECT_DOUBLE_EQ(score(s, "cabbage 4829301 abcde"), 1.0);
  s.answers.clear();
  expect_error([&] { score(s, "x"); }, ErrorCode::invalid_argument, "sample");
}

TEST(EvalTasks, WordListsAreDistinctAndNoWordContainsAnother) {
  std::vector<std::string_view> all(adjectives().begin(), adjectives().end());
  all.insert(all.end(), nouns().begin(), nouns().end());
  EXPECT_GE(adjectives().size(), 64u);
  EXPECT_GE(nouns().size(), 128u);
  for (auto a : all) {
    EXPECT_GE(a.size(), 5u) << a;
    EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](char c) { return c >= 'a' && c <= 'z'; })) << a;
    for (auto b : all) {
      if (a.data() != b.data()) {
        EXPECT_EQ(b.find(a), std::string_view::npos) << a << " in " << b;
      }
    }
  }
}

TEST(EvalTasks, RngIsSplitMix64) {
  // Reference outputs of SplitMix64 from state 0 (Vigna's splitmix64.c).
  Rng r(0);
  EXPECT_EQ(r.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(r.next(), 0x6E789E6AA1B965F4ull);
  Rng u(7);
  for (int i = 0; i < 1000; ++i) {
    const double x = u.uniform();
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    ASSERT_LT(u.below(3), 3u);
  }
}

TEST(EvalTasks, NoiseHaystackPlacesInsertsByDepthInOrder) {
  const std::vector<Insert> ins = {{0.5, "MID1."}, {0.0, "FIRST."}, {1.0, "LAST."}, {0.5, "MID2."}};
  const Placed p = noise_haystack(10, ins);
  EXPECT_EQ(count_of(p.haystack, "The grass is green."), 10u);
  EXPECT_TRUE(p.haystack.starts_with("FIRST. The grass"));
  EXPECT_TRUE(p.haystack.ends_with("back again. LAST."));
  const std::size_t mid1 = p.haystack.find("MID1."), mid2 = p.haystack.find("MID2.");
  EXPECT_LT(mid1, mid2);
  EXPECT_EQ(count_of(p.haystack.substr(0, mid1), "The grass"), 5u);
  EXPECT_EQ(p.depths, (std::vector<double>{0.5, 0.0, 1.0, 0.5}));
  expect_error([] { noise_haystack(0, {}); }, ErrorCode::invalid_argument, "units");
}

TEST(EvalTasks, SentenceInsertsLandAtSentenceEnds) {
  const std::string hay = "First one here. Second, e.g. this one.\nThird line ends.\n\nNew para.";
  const std::vector<Insert> ins = {{0.0, "A."}, {0.3, "B."}, {1.0, "C."}};
  const Placed p = insert_at_sentences(hay, ins);
  EXPECT_EQ(p.haystack,
            "A.\nFirst one here. B. Second, e.g. this one.\nThird line ends.\n\nNew para.\nC.");
  EXPECT_DOUBLE_EQ(p.depths[0], 0.0);
  EXPECT_DOUBLE_EQ(p.depths[1], 15.0 / static_cast<double>(hay.size()));
  EXPECT_DOUBLE_EQ(p.depths[2], 1.0);
}

TEST(EvalTasks, TextWindowsStartAtParagraphsAndGrowByExtension) {
  const std::string text = "Alpha one.\nAlpha two.\n\nBeta one.\nBeta two.\n\nGamma one.\n";
  const std::string w = text_window(text, 0.3, 20);
  EXPECT_EQ(w, "Beta one.\nBeta two.");
  const std::string longer = text_window(text, 0.3, 40);
  EXPECT_TRUE(longer.starts_with(w));
  // Past the end the window wraps to the beginning after a blank line.
  EXPECT_EQ(text_window(text, 0.9, text.size()).substr(0, 14), "Alpha one.\nAlp");
  EXPECT_EQ(text_window(text, 0.5, text.size()),
            "Gamma one.\n\nAlpha one.\nAlpha two.\n\nBeta one.\nBeta two.");
  expect_error([&] { text_window(text, 0.0, text.size() + 1); }, ErrorCode::invalid_argument,
               "text");
}

TEST(EvalTasks, HeadingsAreNumberedUnderlinedLines) {
  const std::string text =
      "* 4.9. Main script\n\n4.9. Main script\n================\n\nBody 1. Not a title\n"
      "4. Chapter\n**********\n\n1. List item\n   text\n4.9.1. Sub\n----------\n";
  const auto h = numbered_headings(text);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].number, "4.9");
  EXPECT_EQ(h[0].title, "Main script");
  EXPECT_EQ(text.substr(h[0].begin, h[0].end - h[0].begin), "4.9. Main script\n================\n");
  EXPECT_EQ(h[1].number, "4");
  EXPECT_EQ(h[2].number, "4.9.1");
  EXPECT_EQ(numbers_of_title(text, "Main script"), (std::vector<std::string>{"4.9", "4.9"}));
}

// ---- samples with the real tokenizers -----------------------------------------------------

class EvalSamples : public ::testing::TestWithParam<std::string> {};

TEST_P(EvalSamples, FitTheBudgetAndAreSolvableWithSmolLM2) {
  REQUIRE_MODEL(m, "smollm2");
  const std::string task = GetParam();
  if (find_task(task).needs_text) REQUIRE_TEXT();
  std::vector<std::int64_t> lengths = {512, 1024, 4096, 8192};
  std::vector<std::uint64_t> seeds = {1, 2, 3};
  if (kSanitized) lengths = {512, 4096}, seeds = {1};
  for (std::int64_t length : lengths) {
    for (std::uint64_t seed : seeds) {
      const GenerateArgs a = args_for(*m, length, seed);
      expect_valid(make_sample(task, a), a, task);
    }
  }
}

TEST_P(EvalSamples, FitTheBudgetAndAreSolvableWithGemma3) {
  REQUIRE_MODEL(m, "gemma3");
  const std::string task = GetParam();
  if (find_task(task).needs_text) REQUIRE_TEXT();
  for (std::uint64_t seed : {1, 2}) {
    GenerateArgs a = args_for(*m, 1024, seed);
    a.reserve_tokens = 48;
    expect_valid(make_sample(task, a), a, task);
  }
}

TEST_P(EvalSamples, AreDeterministicInTheSeed) {
  REQUIRE_MODEL(m, "smollm2");
  const std::string task = GetParam();
  if (find_task(task).needs_text) REQUIRE_TEXT();
  const Sample a = make_sample(task, args_for(*m, 1024, 11));
  const Sample b = make_sample(task, args_for(*m, 1024, 11));
  const Sample c = make_sample(task, args_for(*m, 1024, 12));
  EXPECT_EQ(a.context, b.context);
  EXPECT_EQ(a.question, b.question);
  EXPECT_EQ(a.answer_prefix, b.answer_prefix);
  EXPECT_EQ(a.answers, b.answers);
  EXPECT_EQ(a.depth, b.depth);
  EXPECT_NE(a.context, c.context);
  EXPECT_NE(a.answers, c.answers);
}

INSTANTIATE_TEST_SUITE_P(Tasks, EvalSamples,
                         ::testing::Values("niah_single_number", "niah_single_uuid",
                                           "niah_multikey", "niah_multivalue", "niah_multiquery",
                                           "vt", "cwe", "fwe", "qa_text"),
                         [](const auto& param) { return param.param; });

TEST(EvalTasks, NeedleDepthsSpreadAndMatchTheNeedlePosition) {
  REQUIRE_MODEL(m, "smollm2");
  REQUIRE_TEXT();
  for (const char* task : {"niah_single_number", "niah_single_uuid", "qa_text"}) {
    double lo = 1, hi = 0;
    for (std::uint64_t seed = 0; seed < 12; ++seed) {
      const Sample s = make_sample(task, args_for(*m, 512, seed));
      lo = std::min(lo, s.depth);
      hi = std::max(hi, s.depth);
      if (std::string_view(task) == "qa_text") continue;
      // Position of the needle in the haystack without it (the generator's reference).
      std::string body = body_of(s);
      body.resize(body.size() - 2);  // the context's closing blank line
      const std::size_t at = body.find("The special magic");
      const std::size_t len = body.find('.', body.find(" is ", at) + 4) + 1 - at;
      body.erase(at, len + 1);  // the needle and its separator
      const double depth = static_cast<double>(at) / static_cast<double>(body.size());
      EXPECT_NEAR(depth, s.depth, 0.01) << task << " seed " << seed;
    }
    EXPECT_LT(lo, 0.3) << task;
    EXPECT_GT(hi, 0.7) << task;
  }
}

}  // namespace
}  // namespace masskv::eval
