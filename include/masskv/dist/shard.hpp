// Context parallelism: a sequence's pages spread over ranks (docs/design.md §7, docs/dist.md).
// Round-robin by page: logical page j of every sequence lives on rank j % R. Decode reads
// only selected pages, and selections cluster (sinks, the recent window, a topic's run of
// pages); round-robin spreads any run of R consecutive pages over all R ranks, so each rank
// attends about |S| / R of them, whereas contiguous blocks would put a cluster, and every
// new page, on one rank.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "masskv/kv/cache.hpp"
#include "masskv/kv/paged_kv.hpp"

namespace masskv::dist {

struct PageSharding {
  int ranks = 1;

  int owner(int page) const { return page % ranks; }
  int local_index(int page) const { return page / ranks; }
  int global_page(int rank, int local) const { return local * ranks + rank; }
  // Pages of a sequence with num_pages pages that live on `rank`.
  int local_pages(int num_pages, int rank) const {
    return num_pages > rank ? (num_pages - rank + ranks - 1) / ranks : 0;
  }
};

// What every rank knows about every sequence of the batch: the shape of the global page
// table, not its page ids (a few bytes per sequence, updated on append).
struct SequenceShape {
  int num_pages = 0;
  int last_page_len = 0;
  std::int64_t length(int page_size) const {
    return num_pages == 0 ? 0
                          : static_cast<std::int64_t>(num_pages - 1) * page_size + last_page_len;
  }
};

// One rank's part of a batch of sequences: a pool of its own holding its pages (same dtype,
// HND), with the summaries that pool computes on append, as they would be computed on the
// rank's device; a local page table over the sequences that have at least one page here.
// Local logical page l of a sequence is global logical page sharding().global_page(rank, l);
// only the rank holding the global last page has a partial page.
class LocalShard {
 public:
  // Copies rank `rank`'s pages of every sequence of `global` (values round-trip exactly
  // through f32). Throws Error naming "ranks", "rank" or the view's own arguments.
  LocalShard(const kv::PagedKVView& global, int rank, int ranks);

  int rank() const { return rank_; }
  PageSharding sharding() const { return sharding_; }
  int page_size() const { return page_size_; }
  int num_kv_heads() const { return cache_.config().num_kv_heads; }
  int head_dim() const { return cache_.config().head_dim; }

  // Every sequence of the batch, global order.
  std::span<const SequenceShape> shapes() const { return shapes_; }
  // Global sequence index of each local sequence.
  std::span<const int> local_batch() const { return local_batch_; }
  // Local index of global sequence b, or -1 when no page of b lives here.
  int local_seq(int b) const { return local_of_[static_cast<std::size_t>(b)]; }

  // The pool and summaries with the local page table (batch = local_batch().size()).
  kv::PagedKVView view() const { return cache_.view(table_); }
  kv::SummariesView summaries() const { return cache_.summaries(); }
  std::int64_t pages_held() const { return static_cast<std::int64_t>(table_.indices.size()); }

 private:
  int rank_;
  PageSharding sharding_;
  int page_size_;
  kv::PagedKVCache cache_;
  kv::PageTableStorage table_;
  std::vector<SequenceShape> shapes_;
  std::vector<int> local_batch_, local_of_;
};

// The shard a rank passes to a collective stage: not null and made for this rank of this
// many ranks. Throws Error naming "shard" or "comm".
const LocalShard& checked_shard(const LocalShard* shard, int comm_rank, int comm_size);

}  // namespace masskv::dist
