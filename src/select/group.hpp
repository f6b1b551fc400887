// The shared shape of every CPU selector (docs/design.md §3): a selection is made per group (one
// sequence, one kv head) from the always-kept items, per-voter rankings and optional masses,
// and one fill loop. Scorers (src/select/scorers/) write rankings and masses into the group's
// Scratch; rules (src/select/rules/) turn them into the selection. The contract between the
// two is select/scorer.hpp; run_selector (selectors.cpp) builds the groups.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "masskv/select/selector.hpp"
#include "select/kept.hpp"

namespace masskv::select::detail {

struct Scorer;
struct Rule;

constexpr double kInf = std::numeric_limits<double>::infinity();

// One (sequence, kv head): the unit of work and of the shared selection.
struct Group {
  int b = 0, h = 0, g = 0;  // g: q heads in the group
  int n = 0;                // items: pages, or tokens for token scorers
  int pages = 0, page_size = 0;
  std::int64_t length = 0;
  std::span<const std::int32_t> phys;  // physical pages in logical order
  std::size_t csr = 0;                 // indptr[b]: the group's offset in the CSR page order
};

// Always-kept items (§3; the one rule of select/kept.hpp): sink pages, pages covering the last
// W tokens, the last page; token items: the same tokens. Two ranges, [0, first_end) and
// [last_begin, n).
using Kept = KeptRanges<std::int64_t>;
inline Kept kept_items(const Group& G, const SelectorConfig& c, bool tokens) {
  if (tokens) return kept_tokens(G.pages, G.length, G.page_size, c.sink_pages, c.window_tokens);
  const KeptRanges<int> k =
      kept_pages(G.pages, G.length, G.page_size, c.sink_pages, c.window_tokens);
  return {k.first_end, k.last_begin};
}

// Items of a selection: how many the rule may hold.
int item_cap(const Group& G, const Budget& budget, int kept, bool tokens, bool fill_to_cap);
// Items a top-p selection holds at least (K_min of §2.8), within [kept, cap].
int item_floor(const Group& G, const Budget& budget, int kept, int cap, bool tokens);

// The best `limit` items of a ranking (ties to the lower id) among the eligible ones, in no
// order: items[0..k) of the returned buffer (thread-local, valid until the next call), k =
// min(limit, eligible items). (rank, id) pairs are partitioned in place rather than ids through
// the rank array, which costs a cache miss per comparison. When the limit is at most 1 /
// `sample_ratio` of n, a threshold from every 16th rank first keeps only the items that can be
// among the best: the same set, from about 1.5 limit + 128 items (if fewer than `limit` pass,
// all of them are partitioned).
struct RankedItem {
  double r;
  std::int32_t id;
};
struct BetterItem {  // a type, not a function pointer, so that the sorts inline it
  bool operator()(const RankedItem& x, const RankedItem& y) const {
    return x.r > y.r || (x.r == y.r && x.id < y.id);
  }
};
inline constexpr BetterItem better_item{};
template <class R>
std::span<RankedItem> best_items(const R* rank, int n, const std::uint8_t* eligible, int limit,
                                 int sample_ratio) {
  thread_local std::vector<RankedItem> items;
  thread_local std::vector<double> sample;
  constexpr int kStride = 16;
  const auto push_all = [&] {
    items.clear();
    for (int j = 0; j < n; ++j) {
      if (!eligible || eligible[j]) items.push_back({static_cast<double>(rank[j]), j});
    }
  };
  bool done = false;
  if (limit > 0 && n >= 8 * kStride && n / limit >= sample_ratio) {
    sample.clear();
    for (int j = 0; j < n; j += kStride) {
      if (!eligible || eligible[j]) sample.push_back(static_cast<double>(rank[j]));
    }
    // The sample's (limit / stride x 1.5 + 8)-th best: about 1.5 limit + 128 items pass it.
    const std::size_t at = static_cast<std::size_t>(limit) * 3 / (2 * kStride) + 8;
    if (at < sample.size()) {
      std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(at),
                       sample.end(), std::greater<double>());
      const double t = sample[at];
      items.clear();
      for (int j = 0; j < n; ++j) {
        const double r = static_cast<double>(rank[j]);
        // !(r < t): NaN ranks pass, so that no item the full ranking could place is dropped.
        if ((!eligible || eligible[j]) && !(r < t)) items.push_back({r, j});
      }
      // Every item better than those left out passed: exact whenever `limit` items did.
      done = items.size() >= static_cast<std::size_t>(limit);
    }
  }
  if (!done) push_all();
  const std::size_t k = std::min<std::size_t>(items.size(), static_cast<std::size_t>(limit));
  if (k < items.size()) {
    std::nth_element(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(k), items.end(),
                     better_item);
  }
  return {items.data(), k};
}

// A ranking of one voter (a q head, or the group's aggregate): candidate items best first,
// ties to the lower id. Only the first `limit` are needed by a fill of at most `limit`. The
// threshold pays when the limit is a small part of n (token selectors: 1/16 of every token).
template <class R>
void order_by(const R* rank, int n, const std::uint8_t* eligible, int limit,
              std::vector<std::int32_t>& ids) {
  const std::span<RankedItem> best = best_items(rank, n, eligible, limit, 8);
  std::sort(best.begin(), best.end(), better_item);
  ids.resize(best.size());
  for (std::size_t i = 0; i < best.size(); ++i) ids[i] = best[i].id;
}

struct Voter {
  std::vector<std::int32_t> order;
  const double* mass = nullptr;  // normalised estimated mass per item, or none
  double have = 0;
  std::size_t pos = 0;
};

// Per-thread scratch, reused across groups and calls (no allocation per call once warm).
// Scorers and rules that need more keep their own thread_local buffers in their file.
struct Scratch {
  std::vector<std::uint8_t> in, eligible, agg_elig;
  std::vector<std::int32_t> kept, picked;
  std::vector<double> rank, mass, agg_rank, agg_mass;  // rank/mass: [rows][items]
  std::vector<double> tau;                             // [g]: the scorer's tau_hat per head
  std::vector<Voter> voters;
  int code_pages = -1;  // SelectOutput::code_pages of the group (set by the scorer)
  // The items rank's rows hold when a scorer ranked a subset (page_codes' two passes, for a
  // rule that gave Want::cap): rows [rows][listed.size()], ascending ids, every other item
  // ranked −inf. Empty: rows of every item. run_selector clears it before each group.
  std::vector<std::int32_t> listed;
  static Scratch& get() {
    thread_local Scratch s;
    return s;
  }
};

// The fill loop: voters take turns adding their best unselected item (round robin, which is
// the union of per-head top lists cut to the budget) until `cap` items are in, every voter
// with a mass estimate holds >= p of it (once `floor` items are in), or no voter has
// candidates left. `kept` lists the items already in, ascending.
int fill(std::vector<Voter>& voters, std::size_t nv, std::vector<std::uint8_t>& in,
         std::span<const std::int32_t> kept, int count, int cap, double p, int floor);

// GroupRule::log_prob's pooling of one head's row of n ranks: agg[j] = max(agg[j], rank[j] −
// the row's LSE) (select/log_prob.hpp's LSE; −inf ranks add nothing to it). Start agg at −inf.
void pool_log_prob(const double* rank, int n, double* agg);

// w <- exp(w - max w) / sum: masses from log-weights.
void normalise_log(std::span<double> w);
// w <- w / sum (unchanged when the sum is 0).
void normalise(std::span<double> w);
// log(n) of a page count, from a table for the counts a page can hold (<= 256).
double log_count(double n);

// One run_selector call: the arguments, the pair chosen for the method, and the batch-wide
// values computed before the groups.
struct Context {
  const SelectArgs& a;
  const SelectorConfig& c;
  const Scorer* scorer = nullptr;  // null for dense, which reads nothing
  const Rule* rule = nullptr;
  int d = 0, Hq = 0, Hkv = 0, gsize = 0;
  float scale = 0;
  bool tokens = false;  // the items are tokens (the scorer's unit)
  // The scorer's batch-wide values per sequence, written by its prepare() (oracle: true masses
  // [Hq][items]; learned: page masses [groups][pages]; learned_codes: ŝ [groups][tokens]).
  std::vector<std::vector<double>> prepared = {};
  // Page-major scans (select/page_scan.hpp), CSR order [indptr[b] * Hq + q head * pages + j].
  const float* bounds = nullptr;
  const float* wmax = nullptr;  // [indptr[b] + j][Hkv]: W of the f32 summaries
  const double* m = nullptr;
  const double* v = nullptr;
};

inline const float* qrow(const Context& X, int b, int qh) { return X.a.q.row(b, qh); }

// Row of q head i of group G in a CSR-ordered scan output.
template <class T>
const T* head_row(const T* base, const Context& X, const Group& G, int i) {
  return base + G.csr * X.Hq + static_cast<std::size_t>(G.h * X.gsize + i) * G.pages;
}

// Rows of the scorer's output in Scratch: row i of `n` items.
inline double* rank_row(Scratch& S, int n, int i) {
  return S.rank.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(n);
}
inline double* mass_row(Scratch& S, int n, int i) {
  return S.mass.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(n);
}

// What a rule hands the shared fill: `rows` rank rows of G.n items (one per q head, or one for
// the group), optional mass rows and per-row eligibility ([rows][n]).
struct Ranked {
  const double* rank = nullptr;
  // Rows over these items only (ascending; Scratch::listed), every other item ranked −inf;
  // empty: rows of G.n items. The rows of mass and eligible (if given) are then of them too.
  std::span<const std::int32_t> items = {};
  const double* mass = nullptr;
  const std::uint8_t* eligible = nullptr;
  int rows = 0;
  // The GQA rule of selector.hpp: aggregate pools the rows into one voter, by the mean when
  // the ranking is a mass and by the max when it is a bound (so a page one head needs is not
  // outvoted, as select_topk_pages does); union gives each row a voter.
  bool aggregate = false;
  // With aggregate: pool each row's log-probability (rank minus the row's log-sum-exp over the
  // items) by the max (GroupRule::log_prob) instead of the rank itself.
  bool log_prob = false;
  bool rank_is_mass = false;
};

// Voters from `r` (ranked `cap` deep), then the fill from the items already in S.in, which
// hold their masses from the start. Returns the count.
int fill_ranked(const Group& G, Scratch& S, const Ranked& r, int count, int cap, double p,
                int floor);

// estimate[i] (i < g) = the mass row of head i (row 0 for a group-wide ranking) summed over
// the selection: the estimated selected mass. With `items` (Ranked::items) the rows are of
// those items only.
void selected_mass(const Group& G, const Scratch& S, int rows, double* estimate,
                   std::span<const std::int32_t> items = {});

}  // namespace masskv::select::detail
