// Distributed Quest top-k (docs/dist.md "Selection").
#include "masskv/dist/select.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "masskv/error.hpp"
#include "select/topk_rank.hpp"

namespace masskv::dist {
namespace {

using select::detail::TopkSplit;

void check_args(const Communicator& comm, const QuestSelectArgs& a) {
  using enum ErrorCode;
  const LocalShard& sh = checked_shard(a.shard, comm.rank(), comm.size());
  const int B = static_cast<int>(sh.shapes().size());
  require(a.q.data != nullptr, invalid_argument, "q", "null query");
  require(a.q.n0 == B, shape_mismatch, "q", "has ", a.q.n0, " sequences, the shard ", B);
  require(a.q.n2 == sh.head_dim(), shape_mismatch, "q", "head_dim ", a.q.n2, " differs from ",
          sh.head_dim());
  require(a.q.n1 >= sh.num_kv_heads() && a.q.n1 % sh.num_kv_heads() == 0, shape_mismatch, "q",
          a.q.n1, " q heads is not a multiple of ", sh.num_kv_heads(), " kv heads");
  require(std::isfinite(a.scale) && a.scale >= 0, invalid_argument, "scale",
          "must be finite and >= 0, got ", a.scale);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < a.q.n1; ++h) {
      const float* row = a.q.row(b, h);
      for (int c = 0; c < a.q.n2; ++c) {
        require(std::isfinite(row[c]), non_finite, "q", "q[", b, "][", h, "][", c, "] = ", row[c],
                " is not finite");
      }
    }
  }
  select::topk_selected_pages(1, 1, sh.page_size(), a.policy);  // validates the policy
}

// This rank's best split.need pages of one (sequence, kv head) as (bound, page) pairs into
// `msg`, padded with (-inf, -1). bounds: [g][local pages], from page_upper_bounds. The bound
// travels as the f64 of the f32 value (exact).
void propose(const LocalShard& sh, const TopkSplit& split, std::span<const float> bounds, int g,
             std::vector<std::uint64_t>& keys, double* msg) {
  const std::size_t local_n = bounds.size() / static_cast<std::size_t>(g);
  keys.clear();
  for (std::size_t l = 0; l < local_n; ++l) {
    const int j = sh.sharding().global_page(sh.rank(), static_cast<int>(l));
    if (j < split.sinks || j >= split.window) continue;  // kept pages are never exchanged
    float m = bounds[l];
    for (int i = 1; i < g; ++i) m = std::max(m, bounds[static_cast<std::size_t>(i) * local_n + l]);
    keys.push_back(select::detail::topk_key(m, j));
  }
  select::detail::keep_best(keys, static_cast<std::size_t>(split.need));
  for (int i = 0; i < split.need; ++i) {
    const bool have = i < static_cast<int>(keys.size());
    msg[2 * i] = have ? select::detail::topk_key_bound(keys[static_cast<std::size_t>(i)])
                      : -std::numeric_limits<double>::infinity();
    msg[2 * i + 1] = have ? select::detail::topk_key_page(keys[static_cast<std::size_t>(i)]) : -1;
  }
}

}  // namespace

void quest_select(Communicator& comm, const QuestSelectArgs& args, SelectionStorage& out) {
  check_args(comm, args);
  const LocalShard& sh = *args.shard;
  const int B = static_cast<int>(sh.shapes().size());
  const int Hkv = sh.num_kv_heads(), Hq = args.q.n1, g = Hq / Hkv, d = sh.head_dim();
  const int P = sh.page_size();
  const float scale = args.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : args.scale;

  // Message layout, the same on every rank: (b, h) owns need_b pairs from offset[b * Hkv + h].
  std::vector<TopkSplit> split(static_cast<std::size_t>(B));
  std::vector<std::size_t> offset(static_cast<std::size_t>(B) * Hkv + 1, 0);
  int max_total = 0;
  for (int b = 0; b < B; ++b) {
    const SequenceShape s = sh.shapes()[static_cast<std::size_t>(b)];
    split[b] = select::detail::topk_split(s.num_pages, s.length(P), P, args.policy);
    max_total = std::max(max_total, split[b].total);
    for (int h = 0; h < Hkv; ++h) {
      const std::size_t i = static_cast<std::size_t>(b) * Hkv + h;
      offset[i + 1] = offset[i] + 2 * static_cast<std::size_t>(std::max(split[b].need, 0));
    }
  }
  const std::size_t msg_size = offset.back();

  std::vector<double> msg(msg_size);
  const kv::PagedKVView local = sh.view();
  const kv::SummariesView summaries = sh.summaries();
  std::vector<float> bounds;
  std::vector<std::uint64_t> keys;
  for (int b = 0; b < B; ++b) {
    if (split[b].need <= 0) continue;
    const int lb = sh.local_seq(b);
    const std::span<const std::int32_t> pages =
        lb < 0 ? std::span<const std::int32_t>()
               : local.table.indices.subspan(static_cast<std::size_t>(local.table.indptr[lb]),
                                             static_cast<std::size_t>(local.table.num_pages(lb)));
    for (int h = 0; h < Hkv; ++h) {
      bounds.resize(static_cast<std::size_t>(g) * pages.size());
      if (!pages.empty()) {
        select::page_upper_bounds(summaries, pages, h, args.q.row(b, h * g), g, args.q.s1, scale,
                                  bounds);
      }
      propose(sh, split[b], bounds, g, keys,
              msg.data() + offset[static_cast<std::size_t>(b) * Hkv + h]);
    }
  }

  const int R = comm.size();
  std::vector<double> all(msg_size * static_cast<std::size_t>(R));
  comm.all_gather(msg, all);

  out.reset(SelectionView::Unit::page, B, Hkv, max_total);
  for (int b = 0; b < B; ++b) {
    const SequenceShape s = sh.shapes()[static_cast<std::size_t>(b)];
    for (int h = 0; h < Hkv; ++h) {
      const std::size_t i = static_cast<std::size_t>(b) * Hkv + h;
      keys.clear();
      for (int r = 0; r < R; ++r) {
        const double* m = all.data() + static_cast<std::size_t>(r) * msg_size + offset[i];
        for (int k = 0; k < split[b].need && m[2 * k + 1] >= 0; ++k) {
          keys.push_back(select::detail::topk_key(static_cast<float>(m[2 * k]),
                                                  static_cast<int>(m[2 * k + 1])));
        }
      }
      const std::span<std::int32_t> slots = out.slots(b, h);
      out.count[i] = select::detail::write_topk(split[b], s.num_pages, keys, slots.data(),
                                                static_cast<int>(slots.size()));
    }
  }
}

}  // namespace masskv::dist
