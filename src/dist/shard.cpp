// LocalShard: one rank's pages copied into a pool of its own (docs/dist.md).
#include "masskv/dist/shard.hpp"

#include <algorithm>

#include "masskv/error.hpp"

namespace masskv::dist {
namespace {

kv::CacheConfig local_config(const kv::PagedKVView& g, int rank, int ranks) {
  require(ranks >= 1, ErrorCode::invalid_argument, "ranks", "must be >= 1, got ", ranks);
  require(rank >= 0 && rank < ranks, ErrorCode::out_of_range, "rank", rank,
          " is outside [0, ranks = ", ranks, ")");
  g.validate();
  const PageSharding sh{ranks};
  int pages = 0;
  for (int b = 0; b < g.table.batch(); ++b) pages += sh.local_pages(g.table.num_pages(b), rank);
  kv::CacheConfig c;
  c.num_kv_heads = g.num_kv_heads;
  c.head_dim = g.head_dim;
  c.page_size = g.page_size;
  c.dtype = g.dtype;
  c.capacity_pages = std::max(pages, 1);
  c.layout = kv::Layout::HND;
  return c;
}

// Rows [0, n) of physical page `page` of `g` as [n][Hkv][d] f32 (exact for every dtype).
template <class T>
void read_page(const kv::PagedKVView& g, std::int32_t page, int n, std::vector<float>& k,
               std::vector<float>& v) {
  const int H = g.num_kv_heads, d = g.head_dim;
  k.resize(static_cast<std::size_t>(n) * H * d);
  v.resize(k.size());
  for (int s = 0; s < n; ++s) {
    for (int h = 0; h < H; ++h) {
      const T* ks = g.key<T>(page, h, s);
      const T* vs = g.value<T>(page, h, s);
      float* kd = k.data() + (static_cast<std::size_t>(s) * H + h) * d;
      float* vd = v.data() + (static_cast<std::size_t>(s) * H + h) * d;
      for (int c = 0; c < d; ++c) {
        kd[c] = to_f32(ks[c]);
        vd[c] = to_f32(vs[c]);
      }
    }
  }
}

}  // namespace

LocalShard::LocalShard(const kv::PagedKVView& global, int rank, int ranks)
    : rank_(rank),
      sharding_{ranks},
      page_size_(global.page_size),
      cache_(local_config(global, rank, ranks)) {
  const kv::PageTable& t = global.table;
  const int B = t.batch();
  local_of_.assign(static_cast<std::size_t>(B), -1);
  std::vector<kv::SeqId> seqs;
  std::vector<float> k, v;
  for (int b = 0; b < B; ++b) {
    const int n = t.num_pages(b);
    shapes_.push_back({n, t.last_page_len[b]});
    if (sharding_.local_pages(n, rank) == 0) continue;
    local_of_[static_cast<std::size_t>(b)] = static_cast<int>(local_batch_.size());
    local_batch_.push_back(b);
    const kv::SeqId seq = cache_.create();
    seqs.push_back(seq);
    // Every local page but the global last one is full, so appending page by page rebuilds
    // the same page boundaries.
    for (int j = rank; j < n; j += ranks) {
      const int len = t.page_len(b, j, page_size_);
      visit_dtype(global.dtype, [&]<class T>(T) { read_page<T>(global, t.page(b, j), len, k, v); });
      cache_.append(seq, k, v, len);
    }
  }
  // A rank may hold no page of any sequence (fewer pages than ranks): an empty table.
  if (seqs.empty()) {
    table_.indptr = {0};
  } else {
    table_ = cache_.page_table(seqs);
  }
}

const LocalShard& checked_shard(const LocalShard* shard, int comm_rank, int comm_size) {
  require(shard != nullptr, ErrorCode::invalid_argument, "shard", "must not be null");
  require(shard->sharding().ranks == comm_size && shard->rank() == comm_rank,
          ErrorCode::invalid_argument, "comm", "rank ", comm_rank, " of ", comm_size,
          " holds shard ", shard->rank(), " of ", shard->sharding().ranks);
  return *shard;
}

}  // namespace masskv::dist
