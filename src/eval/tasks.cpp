// RULER-style tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
// Language Models?"), generated from a seed and sized to a token budget. See docs/eval.md.
#include "masskv/eval/tasks.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "eval/haystack.hpp"
#include "eval/rng.hpp"
#include "eval/words.hpp"
#include "masskv/error.hpp"
#include "masskv/model/tokenizer.hpp"

namespace masskv::eval {
namespace {

constexpr TaskInfo kTasks[] = {
    {"niah_single_number", "one key -> 7-digit number needle in repeated noise sentences", false},
    {"niah_single_uuid", "one key -> UUID needle in real text", true},
    {"niah_multikey", "four key -> number needles in real text, one of them asked", true},
    {"niah_multivalue", "one key with four numbers at four depths in real text, all asked", true},
    {"niah_multiquery", "four key -> number needles in real text, all four asked", true},
    {"vt", "variable tracking: every name of a 4-hop assignment chain, among distractors", false},
    {"cwe", "common words extraction: the 10 most repeated words of a numbered list", false},
    {"fwe", "frequent words extraction: the 3 most frequent coded words of a Zipf text", false},
    {"qa_text", "the number of a section of the real text, given its title", true},
};

// ---- random pieces ------------------------------------------------------------------------

// "ancient-cabbage": adjective-noun keys, distinct from those in `taken`.
std::string random_key(Rng& rng, std::set<std::string>& taken) {
  const auto adj = adjectives();
  const auto noun = nouns();
  while (true) {
    std::string key =
        std::string(adj[rng.below(adj.size())]) + "-" + std::string(noun[rng.below(noun.size())]);
    if (taken.insert(key).second) return key;
  }
}

// Decimal number of `digits` digits (no leading zero), distinct from those in `taken`.
std::string random_number(Rng& rng, int digits, std::set<std::string>& taken) {
  std::uint64_t low = 1;
  for (int i = 1; i < digits; ++i) low *= 10;
  while (true) {
    std::string s = std::to_string(low + rng.below(9 * low));
    if (taken.insert(s).second) return s;
  }
}

// Lowercase hex 8-4-4-4-12.
std::string random_uuid(Rng& rng) {
  constexpr std::string_view hex = "0123456789abcdef";
  std::string s;
  for (int group : {8, 4, 4, 4, 12}) {
    if (!s.empty()) s += '-';
    for (int i = 0; i < group; ++i) s += hex[rng.below(16)];
  }
  return s;
}

// Uppercase names of `letters` letters, distinct from those in `taken`.
std::string random_name(Rng& rng, int letters, std::set<std::string>& taken) {
  while (true) {
    std::string s;
    for (int i = 0; i < letters; ++i) s += static_cast<char>('A' + rng.below(26));
    if (taken.insert(s).second) return s;
  }
}

// Coded words for fwe: 4 to 6 random lowercase letters, none containing another.
std::vector<std::string> coded_words(Rng& rng, std::size_t count) {
  std::vector<std::string> words;
  while (words.size() < count) {
    std::string w;
    const std::size_t len = 4 + rng.below(3);
    for (std::size_t i = 0; i < len; ++i) w += static_cast<char>('a' + rng.below(26));
    const bool clash = std::any_of(words.begin(), words.end(), [&w](const std::string& o) {
      return o.find(w) != std::string::npos || w.find(o) != std::string::npos;
    });
    if (!clash) words.push_back(std::move(w));
  }
  return words;
}

std::string join(const std::vector<std::string>& items, std::string_view last_sep) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) s += i + 1 == items.size() ? last_sep : ", ";
    s += items[i];
  }
  return s;
}

// ---- sizing -------------------------------------------------------------------------------

// A task as a family of samples indexed by a size (noise copies, bytes of text, list items):
// make_sample picks the size whose prompt fills the token budget.
struct Family {
  std::int64_t min_size = 1;
  std::int64_t max_size = std::numeric_limits<std::int32_t>::max();
  double tokens_per_unit = 1;  // first guess of the slope
  std::function<Sample(std::int64_t)> build;
};

std::int64_t prompt_tokens(const model::Tokenizer& tok, const Sample& s) {
  return static_cast<std::int64_t>(tok.encode(s.context, false).size() +
                                   tok.encode(s.question, false).size() +
                                   tok.encode(s.answer_prefix, false).size());
}

// Largest-ish size whose prompt fits in `budget` tokens: secant steps aimed just below the
// budget, kept inside the bracket [largest fitting size, smallest overflowing size], bisection
// after a few steps; stops once the prompt fills kAccept of the budget. Tokenizes O(log) times.
Sample fit_to_budget(const Family& family, const GenerateArgs& args, const TaskInfo& task) {
  constexpr double kAim = 0.985, kAccept = 0.96, kRequired = 0.90;
  const std::int64_t budget = args.length - args.reserve_tokens;
  struct Point {
    std::int64_t size, tokens;
    Sample sample;
  };
  auto eval = [&](std::int64_t size) {
    Sample s = family.build(size);
    const std::int64_t t = prompt_tokens(*args.tokenizer, s);
    return Point{size, t, std::move(s)};
  };
  Point lo = eval(family.min_size);
  require(lo.tokens <= budget, ErrorCode::invalid_argument, "length", "task ", task.name,
          " needs at least ", lo.tokens + args.reserve_tokens, " tokens (", lo.tokens,
          " for its smallest prompt + ", args.reserve_tokens, " reserved), got ", args.length);
  std::optional<Point> hi;
  double slope = family.tokens_per_unit;
  const double aim = kAim * static_cast<double>(budget);
  for (int step = 0; static_cast<double>(lo.tokens) < kAccept * static_cast<double>(budget);
       ++step) {
    const std::int64_t upper = hi ? hi->size : family.max_size + 1;
    if (upper - lo.size <= 1) break;
    std::int64_t size;
    if (step < 6) {
      const double units = (aim - static_cast<double>(lo.tokens)) / std::max(slope, 1e-9);
      size = lo.size + static_cast<std::int64_t>(std::ceil(std::min(units, 1e15)));
    } else {
      size = lo.size + (upper - lo.size) / 2;
    }
    size = std::clamp(size, lo.size + 1, upper - 1);
    Point p = eval(size);
    if (p.tokens > lo.tokens) {
      slope = static_cast<double>(p.tokens - lo.tokens) / static_cast<double>(p.size - lo.size);
    }
    if (p.tokens <= budget) {
      lo = std::move(p);
    } else {
      hi = std::move(p);
    }
  }
  if (static_cast<double>(lo.tokens) < kRequired * static_cast<double>(budget)) {
    if (task.needs_text && lo.size == family.max_size) {
      fail(ErrorCode::invalid_argument, "text", "too short for task ", task.name, " at length ",
           args.length, ": all of it makes a prompt of ", lo.tokens, " tokens, the budget is ",
           budget);
    }
    fail(ErrorCode::invalid_argument, "length", "task ", task.name, " cannot fill ", budget,
         " tokens to ", kRequired * 100, "% (its prompt steps are too coarse): best ", lo.tokens);
  }
  return std::move(lo.sample);
}

// ---- needle in a haystack -----------------------------------------------------------------

constexpr double kCharsPerToken = 3.5;  // first guess for the real text

struct Needle {
  std::string key, value;
  double depth = 0;
};

std::string needle_sentence(std::string_view kind, const Needle& n) {
  return "The special magic " + std::string(kind) + " for " + n.key + " is " + n.value + ".";
}

// Needles placed in noise (haystack_text empty) or in real-text windows. `asked` are the needles
// whose values answer the question.
Family needle_family(const GenerateArgs& args, Rng& rng, std::string_view kind,
                     std::vector<Needle> needles, std::vector<std::size_t> asked, bool real_text,
                     int max_new_tokens) {
  const double start_fraction = rng.uniform();
  std::string header, question, prefix;
  const std::string plural = std::string(kind) + "s";
  std::vector<std::string> asked_keys;
  for (std::size_t i : asked) {
    if (std::find(asked_keys.begin(), asked_keys.end(), needles[i].key) == asked_keys.end()) {
      asked_keys.push_back(needles[i].key);
    }
  }
  const std::string keys = join(asked_keys, " and ");
  if (asked.size() == 1) {
    header = needles.size() == 1 ? "A special magic " + std::string(kind) +
                                       " is hidden in the text below. Read carefully and "
                                       "remember it: you will be asked for it afterwards."
                                 : "Some special magic " + plural +
                                       " are hidden in the text below. Read carefully and "
                                       "remember them: you will be asked about them afterwards.";
    question = "What is the special magic " + std::string(kind) + " for " + keys +
               " mentioned in the text above?";
    prefix = "The special magic " + std::string(kind) + " for " + keys +
             " mentioned in the text above is";
  } else {
    header = "Some special magic " + plural +
             " are hidden in the text below. Read carefully and remember them: you will be "
             "asked about them afterwards.";
    question = "What are all the special magic " + plural + " for " + keys +
               " mentioned in the text above?";
    prefix = "The special magic " + plural + " for " + keys + " mentioned in the text above are";
  }
  std::vector<Insert> inserts;
  for (const Needle& n : needles) inserts.push_back({n.depth, needle_sentence(kind, n)});
  Family f;
  if (real_text) {
    f.min_size = 200;
    f.max_size = static_cast<std::int64_t>(args.text.size());
    f.tokens_per_unit = 1 / kCharsPerToken;
  } else {
    f.min_size = 1;
    f.tokens_per_unit = 22;
  }
  f.build = [=, text = args.text](std::int64_t size) {
    const Placed placed =
        real_text ? insert_at_sentences(
                        text_window(text, start_fraction, static_cast<std::size_t>(size)), inserts)
                  : noise_haystack(size, inserts);
    Sample s;
    s.context = header + "\n\n" + placed.haystack + "\n\n";
    s.question = question;
    s.answer_prefix = prefix;
    for (std::size_t i : asked) s.answers.push_back(needles[i].value);
    s.scoring = Scoring::all;
    s.max_new_tokens = max_new_tokens;
    s.depth = placed.depths[asked.front()];
    return s;
  };
  return f;
}

Family niah_single_number(const GenerateArgs& args, Rng& rng) {
  std::set<std::string> keys, values;
  Needle n{random_key(rng, keys), random_number(rng, 7, values), rng.uniform()};
  return needle_family(args, rng, "number", {n}, {0}, false, 16);
}

Family niah_single_uuid(const GenerateArgs& args, Rng& rng) {
  std::set<std::string> keys;
  Needle n{random_key(rng, keys), random_uuid(rng), rng.uniform()};
  return needle_family(args, rng, "UUID", {n}, {0}, true, 48);
}

constexpr int kNeedles = 4;

// Depths of k needles, one in each k-th of the haystack in random order: every needle's depth is
// still uniform on [0, 1], but needles do not pile up in one place.
std::vector<double> spread_depths(Rng& rng, int k) {
  std::vector<int> stratum(static_cast<std::size_t>(k));
  for (int i = 0; i < k; ++i) stratum[static_cast<std::size_t>(i)] = i;
  shuffle(stratum, rng);
  std::vector<double> depths;
  for (int s : stratum) depths.push_back((s + rng.uniform()) / k);
  return depths;
}

Family niah_multikey(const GenerateArgs& args, Rng& rng) {
  std::set<std::string> keys, values;
  const std::vector<double> depths = spread_depths(rng, kNeedles);
  std::vector<Needle> needles;
  for (double d : depths)
    needles.push_back({random_key(rng, keys), random_number(rng, 7, values), d});
  return needle_family(args, rng, "number", needles, {0}, true, 16);
}

Family niah_multivalue(const GenerateArgs& args, Rng& rng) {
  std::set<std::string> keys, values;
  const std::string key = random_key(rng, keys);
  std::vector<Needle> needles;
  for (double d : spread_depths(rng, kNeedles))
    needles.push_back({key, random_number(rng, 7, values), d});
  return needle_family(args, rng, "number", needles, {0, 1, 2, 3}, true, 64);
}

Family niah_multiquery(const GenerateArgs& args, Rng& rng) {
  std::set<std::string> keys, values;
  const std::vector<double> depths = spread_depths(rng, kNeedles);
  std::vector<Needle> needles;
  for (double d : depths)
    needles.push_back({random_key(rng, keys), random_number(rng, 7, values), d});
  return needle_family(args, rng, "number", needles, {0, 1, 2, 3}, true, 64);
}

// ---- variable tracking --------------------------------------------------------------------

Family vt(const GenerateArgs&, Rng& rng) {
  constexpr int kChains = 3, kHops = 4;  // chain 0 is asked, the others distract
  std::set<std::string> names, values;
  std::vector<std::vector<std::string>> chains(kChains);
  std::vector<std::string> chain_values;
  std::vector<Insert> inserts;
  for (int c = 0; c < kChains; ++c) {
    chain_values.push_back(random_number(rng, 5, values));
    std::vector<double> depths;
    for (int h = 0; h <= kHops; ++h) {
      chains[c].push_back(random_name(rng, 5, names));
      depths.push_back(rng.uniform());
    }
    std::sort(depths.begin(), depths.end());  // a chain's hops appear in order
    for (int h = 0; h <= kHops; ++h) {
      const std::string rhs = h == 0 ? chain_values[c] : "VAR " + chains[c][h - 1];
      inserts.push_back({depths[h], "VAR " + chains[c][h] + " = " + rhs + "."});
    }
  }
  const std::string value = chain_values[0];
  const std::vector<std::string> answers = chains[0];
  Family f;
  f.min_size = 1;
  f.tokens_per_unit = 22;
  f.build = [=](std::int64_t size) {
    const Placed placed = noise_haystack(size, inserts);
    Sample s;
    s.context =
        "Memorize and track the chains of variable assignments hidden in the following "
        "text.\n\n" +
        placed.haystack + "\n\n";
    s.question = "Find all variables that are assigned the value " + value + " in the text above.";
    s.answer_prefix =
        "Answer: According to the chains of variable assignments in the text above, " +
        std::to_string(answers.size()) + " variables are assigned the value " + value +
        ", they are:";
    s.answers = answers;
    s.scoring = Scoring::all;
    s.max_new_tokens = 48;
    s.depth = placed.depths[0];
    return s;
  };
  return f;
}

// ---- common words extraction --------------------------------------------------------------

Family cwe(const GenerateArgs&, Rng& rng) {
  constexpr std::int64_t kCommon = 10;
  std::vector<std::string> vocabulary;
  for (auto w : adjectives()) vocabulary.emplace_back(w);
  for (auto w : nouns()) vocabulary.emplace_back(w);
  shuffle(vocabulary, rng);  // the first kCommon are the common words
  const std::uint64_t order_seed = rng.next();
  Family f;
  f.min_size = 3 * kCommon;
  f.tokens_per_unit = 5.5;
  f.build = [=](std::int64_t items) {
    // Common words fill about a third of the list (each at least twice); the rest cycles
    // through as few other words as the vocabulary allows, each strictly less often.
    const std::int64_t common_freq = std::max<std::int64_t>(2, items / (3 * kCommon));
    const std::int64_t rest = items - kCommon * common_freq;
    const auto pool = static_cast<std::int64_t>(vocabulary.size()) - kCommon;
    const std::int64_t rare_freq = std::max<std::int64_t>(1, (rest + pool - 1) / pool);
    const std::int64_t rare_words = rest > 0 ? (rest + rare_freq - 1) / rare_freq : 0;
    require(rare_freq < common_freq, ErrorCode::invalid_argument, "length",
            "cwe cannot make the common words stand out at ", items, " items");
    std::vector<std::size_t> list;
    for (std::int64_t i = 0; i < kCommon * common_freq; ++i) {
      list.push_back(static_cast<std::size_t>(i % kCommon));
    }
    for (std::int64_t i = 0; i < rest; ++i) {
      list.push_back(static_cast<std::size_t>(kCommon + i % rare_words));
    }
    Rng order(order_seed ^ static_cast<std::uint64_t>(items));
    shuffle(list, order);
    Sample s;
    s.context =
        "Below is a numbered list of words. Some of the words appear many more times than "
        "the others. Memorize the ones that appear most often.\n\n";
    for (std::size_t i = 0; i < list.size(); ++i) {
      s.context += std::to_string(i + 1) + ". " + vocabulary[list[i]] + "\n";
    }
    s.context += "\n";
    s.question = "What are the 10 most common words in the list above?";
    s.answer_prefix = "Answer: The 10 words that appear most often in the list are:";
    s.answers.assign(vocabulary.begin(), vocabulary.begin() + kCommon);
    s.scoring = Scoring::all;
    s.max_new_tokens = 96;
    return s;
  };
  return f;
}

// ---- frequent words extraction ------------------------------------------------------------

Family fwe(const GenerateArgs&, Rng& rng) {
  constexpr std::size_t kVocabulary = 100, kTop = 3, kPerLine = 10;
  constexpr double kAlpha = 2.0;  // RULER's Zipf exponent
  const std::vector<std::string> words = coded_words(rng, kVocabulary);
  std::vector<double> weight(kVocabulary);
  for (std::size_t i = 0; i < kVocabulary; ++i) {
    weight[i] = std::pow(static_cast<double>(i + 1), -kAlpha);
  }
  double total_weight = 0;
  for (double w : weight) total_weight += w;
  const std::uint64_t order_seed = rng.next();
  Family f;
  f.min_size = 40;
  f.tokens_per_unit = 3;
  f.build = [=](std::int64_t n) {
    // Counts floor(n * w_i / sum w), the remainder to the most frequent word: with alpha = 2 and
    // n >= 40 the top three counts are strictly above every other (24, 6, 2 vs <= 1 at n = 40).
    std::vector<std::int64_t> count(kVocabulary);
    std::int64_t assigned = 0;
    for (std::size_t i = 0; i < kVocabulary; ++i) {
      count[i] = static_cast<std::int64_t>(static_cast<double>(n) * weight[i] / total_weight);
      assigned += count[i];
    }
    count[0] += n - assigned;
    require(count[kTop - 1] > count[kTop], ErrorCode::invalid_argument, "length",
            "fwe cannot separate the top words at ", n, " words");
    std::vector<std::size_t> text;
    for (std::size_t i = 0; i < kVocabulary; ++i) text.insert(text.end(), count[i], i);
    Rng order(order_seed ^ static_cast<std::uint64_t>(n));
    shuffle(text, order);
    Sample s;
    s.context =
        "Read the coded text below and keep count of how often each coded word appears. "
        "Find the three coded words that appear most often.\n\n";
    for (std::size_t i = 0; i < text.size(); ++i) {
      s.context += words[text[i]];
      s.context += (i + 1) % kPerLine == 0 || i + 1 == text.size() ? '\n' : ' ';
    }
    s.context += "\n";
    s.question = "What are the three most frequent coded words in the text above?";
    s.answer_prefix =
        "Answer: According to the coded text above, the three most frequent coded "
        "words are:";
    s.answers.assign(words.begin(), words.begin() + kTop);
    s.scoring = Scoring::all;
    s.max_new_tokens = 48;
    return s;
  };
  return f;
}

// ---- question answering over the real text ------------------------------------------------

// Subsection headings ("4.9", not the chapter "4") whose title has no digit and is not the
// title of any other heading, so the question has one answer anywhere in the text.
std::vector<Heading> askable_headings(std::string_view text) {
  std::vector<Heading> all = numbered_headings(text);
  std::map<std::string, int> uses;
  for (const Heading& h : all) ++uses[h.title];
  std::vector<Heading> askable;
  for (Heading& h : all) {
    const bool subsection = h.number.find('.') != std::string::npos;
    const bool digit_free =
        std::none_of(h.title.begin(), h.title.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (subsection && digit_free && uses[h.title] == 1) askable.push_back(std::move(h));
  }
  return askable;
}

Family qa_text(const GenerateArgs& args, Rng& rng) {
  auto headings = std::make_shared<const std::vector<Heading>>(askable_headings(args.text));
  require(!headings->empty(), ErrorCode::invalid_argument, "text",
          "has no numbered, underlined section headings (qa_text asks for their numbers)");
  const std::size_t first = rng.below(headings->size());
  const double depth = rng.uniform();
  Family f;
  f.min_size = 400;
  f.max_size = static_cast<std::int64_t>(args.text.size());
  f.tokens_per_unit = 1 / kCharsPerToken;
  f.build = [=, text = args.text](std::int64_t size) {
    const auto chars = static_cast<std::size_t>(size);
    // The heading at relative position `depth` of a window starting at a paragraph; the next
    // askable heading when the window would repeat its title under another number.
    for (std::size_t k = 0; k < headings->size(); ++k) {
      const Heading& h = (*headings)[(first + k) % headings->size()];
      if (h.end - h.begin > chars) continue;
      const double before = depth * static_cast<double>(chars - (h.end - h.begin));
      std::size_t start = previous_paragraph_start(
          text, h.begin - std::min(h.begin, static_cast<std::size_t>(before)));
      start = std::min(start, previous_paragraph_start(text, text.size() - chars));
      if (start + chars < h.end) start = h.begin;  // the heading opens its paragraph
      std::string_view window = text.substr(start, chars);
      const std::size_t cut = window.rfind('\n');
      if (start + chars < text.size() && cut != std::string_view::npos && cut >= h.end - start) {
        window = window.substr(0, cut);
      }
      while (!window.empty() && (window.back() == '\n' || window.back() == ' ')) {
        window.remove_suffix(1);
      }
      if (start + window.size() + 1 < h.end) continue;
      const auto numbers = numbers_of_title(window, h.title);
      if (std::any_of(numbers.begin(), numbers.end(),
                      [&h](const std::string& n) { return n != h.number; })) {
        continue;
      }
      const std::string quoted =
          h.title.find('"') == std::string::npos ? "\"" + h.title + "\"" : "'" + h.title + "'";
      Sample s;
      s.context = "Read the following part of a technical manual. Its sections are numbered.\n\n" +
                  std::string(window) + "\n\n";
      s.question = "What is the number of the section titled " + quoted + " in the text above?";
      s.answer_prefix = "The number of the section titled " + quoted + " is";
      s.answers = {h.number};
      s.scoring = Scoring::part;
      s.max_new_tokens = 16;
      s.depth = static_cast<double>(h.begin - start) / static_cast<double>(window.size());
      return s;
    }
    fail(ErrorCode::invalid_argument, "text", "no section heading fits a window of ", chars,
         " bytes with a unique title");
  };
  return f;
}

using Generator = Family (*)(const GenerateArgs&, Rng&);
constexpr Generator kGenerators[] = {niah_single_number,
                                     niah_single_uuid,
                                     niah_multikey,
                                     niah_multivalue,
                                     niah_multiquery,
                                     vt,
                                     cwe,
                                     fwe,
                                     qa_text};
static_assert(std::size(kGenerators) == std::size(kTasks));

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool contains_ignoring_case(std::string_view haystack, std::string_view needle) {
  auto it = std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return ascii_lower(a) == ascii_lower(b); });
  return it != haystack.end() || needle.empty();
}

}  // namespace

std::span<const TaskInfo> tasks() { return kTasks; }

const TaskInfo& find_task(std::string_view name, std::string_view argument) {
  for (const TaskInfo& t : kTasks) {
    if (t.name == name) return t;
  }
  std::string known;
  for (const TaskInfo& t : kTasks) known += (known.empty() ? "" : ", ") + std::string(t.name);
  fail(ErrorCode::invalid_argument, argument, "unknown task '", name, "' (known: ", known, ")");
}

Sample make_sample(std::string_view task, const GenerateArgs& args) {
  const TaskInfo& info = find_task(task);
  require(args.tokenizer != nullptr, ErrorCode::invalid_argument, "tokenizer",
          "is required (token counts are measured with it)");
  require(args.length > 0, ErrorCode::invalid_argument, "length", "must be > 0, got ", args.length);
  require(args.reserve_tokens >= 0 && args.reserve_tokens < args.length,
          ErrorCode::invalid_argument, "reserve_tokens", "must be in [0, length = ", args.length,
          "), got ", args.reserve_tokens);
  require(!info.needs_text || !args.text.empty(), ErrorCode::invalid_argument, "text", "task ",
          info.name, " draws its haystack from the real text, but none was given");
  const auto index = static_cast<std::size_t>(&info - kTasks);
  // The task name is mixed in so tasks with the same seed draw different keys.
  Rng rng(args.seed ^ fnv1a(info.name));
  Sample s = fit_to_budget(kGenerators[index](args, rng), args, info);
  s.task = std::string(info.name);
  s.length = args.length;
  s.seed = args.seed;
  return s;
}

double score(const Sample& sample, std::string_view output) {
  require(!sample.answers.empty(), ErrorCode::invalid_argument, "sample",
          "has no answers to score against");
  std::size_t found = 0;
  for (const std::string& a : sample.answers) found += contains_ignoring_case(output, a) ? 1 : 0;
  if (sample.scoring == Scoring::part) return found > 0 ? 1.0 : 0.0;
  return static_cast<double>(found) / static_cast<double>(sample.answers.size());
}

}  // namespace masskv::eval
