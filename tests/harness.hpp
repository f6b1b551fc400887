// The one reference harness of the attention stages (docs/design.md §4 "one test harness", §6
// "reference first"): a registry of implementations per stage, hand-built paged caches (no
// dependency on kv::PagedKVCache), and comparison against the f64 reference with tolerances
// stated here.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "masskv/attn/decode.hpp"
#include "masskv/attn/prefill.hpp"
#include "masskv/kv/paged_kv.hpp"

namespace masskv::test {

// ---- registry -------------------------------------------------------------------------------
struct ImplEntry {
  const char* name;
  attn::Impl impl;
};
// Every CPU implementation of decode / prefill; adding one here adds it to every test.
std::span<const ImplEntry> decode_impls();
std::span<const ImplEntry> prefill_impls();

// ---- tolerances -----------------------------------------------------------------------------
// The reference reads the *same stored* (already rounded) K/V values and converts them exactly
// to f64, so for every KV dtype the only error left is f32 arithmetic in scores, exp/power and
// the weighted sums: the same bound holds for f32, f16 and bf16 KV.
//   out: ||o_hat - o||_inf / ||o||_inf <= 1e-5   (per output row)
//   lse (softmax): |lse_hat - lse| <= 1e-5 * max(1, |lse|)
//   tau (entmax):  |tau_hat - tau| <= 1e-5 * max(1, |tau|)
// Worst seen on the grids: 3e-6 (out), 1e-6 (lse/tau). Non-finite lse/tau (empty rows) must
// match exactly (-inf, NaN).
struct Tolerance {
  double out = 1e-5;
  double stat = 1e-5;
};
Tolerance tolerance(DType kv_dtype);

// ---- hand-built paged cache -----------------------------------------------------------------
struct KVConfig {
  std::vector<int> lengths;  // tokens per sequence (>= 1)
  int num_kv_heads = 2;
  int head_dim = 64;
  int page_size = 16;
  DType dtype = DType::f32;
  kv::Layout layout = kv::Layout::HND;
  std::uint32_t seed = 1;
  float value_offset = 0;     // added to V so ||o|| stays away from 0 for long contexts
  bool shuffle_pages = true;  // false: logical page i is physical page i (timing runs)
};

// A pool filled with random N(0,1) keys/values stored in `dtype`, pages handed out in a
// shuffled order (so physical order != logical order), plus a few unused pages.
class HandCache {
 public:
  explicit HandCache(const KVConfig& config);
  kv::PagedKVView view() const;
  const KVConfig& config() const { return cfg_; }
  int num_pages(int b) const { return indptr_[b + 1] - indptr_[b]; }

 private:
  KVConfig cfg_;
  int pool_pages_ = 0;
  std::vector<std::uint8_t> k_, v_;
  std::vector<std::int32_t> indptr_, indices_, last_;
};

// A selection owning its arrays.
struct OwnedSelection {
  std::vector<std::int32_t> ids, count;
  SelectionView view;
};
// Random selection: every unit kept with probability `keep`; for pages the last page of each
// sequence is always kept (docs/design.md §3).
OwnedSelection random_selection(const HandCache& cache, SelectionView::Unit unit, double keep,
                                std::uint32_t seed);
// The same ids for every (b, kv head), from explicit lists per sequence.
OwnedSelection make_selection(const HandCache& cache, SelectionView::Unit unit,
                              const std::vector<std::vector<std::int32_t>>& per_seq);

// f64 scores scale * q . k_t of every token t of sequence b, kv head h (test-side, for
// building supports and supersets).
std::vector<double> token_scores(const HandCache& cache, int b, int h, const float* q,
                                 double scale);

std::vector<float> random_q(std::int64_t rows, int heads, int d, float sd, std::uint32_t seed);

// ---- comparison -----------------------------------------------------------------------------
struct Errors {
  double out = 0;   // ||o_hat - o||_inf / ||o||_inf (absolute when ||o|| == 0)
  double stat = 0;  // lse/tau relative-to-max(1,|x|) error; non-finite must match exactly
};
Errors compare(std::span<const float> out, std::span<const double> ref_out,
               std::span<const float> stat, std::span<const double> ref_stat, int d);

struct DecodeCase {
  KVConfig kv;
  int num_q_heads = 4;
  Mapping mapping = Mapping::softmax();
  int selection = 0;  // 0 dense, 1 page selection, 2 token selection
  double keep = 0.5;
  int chunk_pages = 4;
  float q_sd = 1;
  std::string describe() const;
};
// Runs the reference and every registered decode implementation; EXPECTs each within
// tolerance(). Returns the worst errors seen (for reporting).
Errors check_decode(const DecodeCase& c);

struct PrefillCase {
  KVConfig kv;
  std::vector<int> num_queries;  // per sequence, <= its length
  int num_q_heads = 4;
  Mapping mapping = Mapping::softmax();
  bool block_sparse = false;
  int q_block = 16, k_block = 32;
  double keep = 0.5;
  float q_sd = 1;
  std::string describe() const;
};
Errors check_prefill(const PrefillCase& c);

}  // namespace masskv::test
