// Distributed decode (context parallelism, docs/design.md §2.6 and §7; docs/dist.md): each rank
// attends its own pages (all of them, or those of a global selection) and the partial results
// are merged across ranks with the split-K merge of attn/merge.hpp.
#pragma once

#include <span>

#include "masskv/attn/decode.hpp"
#include "masskv/dist/communicator.hpp"
#include "masskv/dist/shard.hpp"
#include "masskv/mapping.hpp"
#include "masskv/selection.hpp"
#include "masskv/tensor.hpp"

namespace masskv::dist {

// The distributed entmax threshold (docs/dist.md "Entmax"). Each rank sends, per q head, its
// local candidate count, its local lower threshold and max, and up to `max_candidates` of its
// candidate scores in one all-gather; when no rank has more, every rank solves the exact tau
// on the union. Heads where some rank has more fall back to batched-candidate bisection:
// rounds of `batch` candidate taus evaluated by every rank and summed by one all-reduce each
// (exact closed form from the summed moments for alpha 2 and 1.5 once no score lies inside
// the bracket; bisection to 1e-9·max(1, |tau|) otherwise), at most `max_rounds` rounds.
struct EntmaxTauConfig {
  int max_candidates = 64;
  int batch = 32;
  int max_rounds = 12;
};

struct DecodeArgs {
  View3<const float> q;               // [B][Hq][d], the whole batch, identical on every rank
  const LocalShard* shard = nullptr;  // this rank's pages
  Mapping mapping = Mapping::softmax();
  float scale = 0;  // 0 means 1/sqrt(d)
  // nullptr: dense. Otherwise a page selection in global logical ids ([B][Hkv], e.g. from
  // dist::quest_select), the same on every rank; each rank reads the pages it holds.
  const SelectionView* selection = nullptr;
  View3<float> out;             // [B][Hq][d], written on every rank (identical bits)
  std::span<float> lse_or_tau;  // [B][Hq] or empty: as attn::DecodeArgs
  int chunk_pages = 64;         // split-K chunking of the local decode
  attn::Impl impl = attn::Impl::fast;
  EntmaxTauConfig tau;
};

// What one decode exchanged beyond the fixed collectives.
struct DecodeStats {
  int tau_rounds = 0;      // fallback all-reduces (0: the tau took one all-gather)
  int fallback_heads = 0;  // (b, q head) pairs that needed them
};

// Collectives per call: softmax 1 (an all-gather of (o, lse) per q head, merged by
// attn::merge_softmax in rank order); entmax 2 (the tau all-gather, then an all-reduce sum
// of (sum p v, sum p) per q head) plus DecodeStats::tau_rounds. Results equal the
// single-rank attn::decode within rounding (the chunking and merge order differ).
// Throws Error (before any collective, on every rank alike) naming "shard", "comm", "q",
// "out", "lse_or_tau", "selection", "tau" or attn::decode's argument names.
void decode(Communicator& comm, const DecodeArgs& args, DecodeStats* stats = nullptr);

// The exchange behind entmax decode, exposed for tests: candidates[b * Hq + hq] are this
// rank's local candidate scores of each q head (attn::append_local_candidates' output;
// empty where the rank has none); writes the global tau (z units, NaN where no rank has a
// candidate) into tau, the same on every rank. One all-gather, plus fallback rounds.
void solve_global_tau(Communicator& comm, std::span<const std::vector<double>> candidates,
                      double alpha, const EntmaxTauConfig& config, std::span<double> tau,
                      DecodeStats* stats = nullptr);

}  // namespace masskv::dist
