// Distributed Quest top-k page selection (docs/design.md §2.3, §7; docs/dist.md). Each rank bounds
// its own pages from its local summaries and proposes its best ones; one all-gather of
// (bound, page) candidates lets every rank derive the same global selection.
#pragma once

#include "masskv/dist/communicator.hpp"
#include "masskv/dist/shard.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/selection.hpp"
#include "masskv/tensor.hpp"

namespace masskv::dist {

struct QuestSelectArgs {
  View3<const float> q;               // [B][Hq][d], the whole batch, identical on every rank
  const LocalShard* shard = nullptr;  // this rank's pages
  float scale = 0;                    // 0 means 1/sqrt(d)
  select::TopkPolicy policy;
};

// Writes the global selection (logical page ids of the whole sequence, the layout of
// select::quest_select), identical on every rank and equal to select::quest_select on the
// unsharded cache: a page in the global top `need` is in its owner's local top `need`, the
// bounds are bit-equal (a page's bound depends on its own summary only, and a rank's
// summaries are recomputed from the same stored keys), and the ranking key and tie rule are
// the selector's own. The kept pages (sinks, window, last page) need no exchange.
// Exactly one collective: an all-gather of need_b (bound, page) pairs per (sequence, kv head)
// per rank, as f64. Throws Error (before any collective, on every rank alike) naming "q",
// "scale", "shard", "comm" or the policy's fields.
void quest_select(Communicator& comm, const QuestSelectArgs& args, SelectionStorage& out);

}  // namespace masskv::dist
