// Distributed decode: local split-K decode on each rank's pages, then the §2.6 merge across
// ranks (docs/dist.md).
#include "masskv/dist/decode.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "masskv/attn/merge.hpp"
#include "masskv/error.hpp"

namespace masskv::dist {
namespace {

void check_args(const Communicator& comm, const DecodeArgs& a) {
  using enum ErrorCode;
  const LocalShard& sh = checked_shard(a.shard, comm.rank(), comm.size());
  a.mapping.validate();
  const int B = static_cast<int>(sh.shapes().size()), d = sh.head_dim();
  const auto check_view = [&](const auto& v, const char* name) {
    require(v.data != nullptr, invalid_argument, name, "null data");
    require(v.n0 == B && v.n2 == d, shape_mismatch, name, "is [", v.n0, "][", v.n1, "][", v.n2,
            "], expected [", B, "][q heads][", d, "]");
    require(v.s1 >= d && v.s0 >= static_cast<std::int64_t>(v.n1) * v.s1, shape_mismatch, name,
            "strides overlap");
  };
  check_view(a.q, "q");
  check_view(a.out, "out");
  require(a.q.n1 >= sh.num_kv_heads() && a.q.n1 % sh.num_kv_heads() == 0, shape_mismatch, "q",
          a.q.n1, " q heads is not a multiple of ", sh.num_kv_heads(), " kv heads");
  require(a.out.n1 == a.q.n1, shape_mismatch, "out", "has ", a.out.n1, " heads, q ", a.q.n1);
  require(a.lse_or_tau.empty() || a.lse_or_tau.size() == static_cast<std::size_t>(B) * a.q.n1,
          shape_mismatch, "lse_or_tau", "size ", a.lse_or_tau.size(), ", expected 0 or ",
          static_cast<std::size_t>(B) * a.q.n1);
  if (const SelectionView* s = a.selection) {
    require(s->unit == SelectionView::Unit::page, unsupported, "selection",
            "token selections are not sharded (use page selections)");
    require(s->batch == B && s->num_kv_heads == sh.num_kv_heads(), shape_mismatch, "selection",
            "is [", s->batch, "][", s->num_kv_heads, "], expected [", B, "][", sh.num_kv_heads(),
            "]");
    for (int b = 0; b < B; ++b) {
      const int n = sh.shapes()[static_cast<std::size_t>(b)].num_pages;
      for (int h = 0; h < s->num_kv_heads; ++h) {
        const std::span<const std::int32_t> ids = s->list(b, h);
        for (std::size_t i = 0; i < ids.size(); ++i) {
          require(ids[i] >= 0 && ids[i] < n && (i == 0 || ids[i] > ids[i - 1]), out_of_range,
                  "selection", "list (", b, ", ", h, ") is not ascending in [0, ", n, ")");
        }
      }
    }
  }
}

// The part of a global page selection that lives on this rank, in local logical ids
// (ascending stays ascending: local index = global / R).
void local_selection(const LocalShard& sh, const SelectionView& global, SelectionStorage& out) {
  const int LB = static_cast<int>(sh.local_batch().size()), H = global.num_kv_heads;
  const PageSharding s = sh.sharding();
  int most = 0;
  for (int lb = 0; lb < LB; ++lb) {
    for (int h = 0; h < H; ++h) {
      int n = 0;
      for (const std::int32_t j : global.list(sh.local_batch()[lb], h))
        n += s.owner(j) == sh.rank();
      most = std::max(most, n);
    }
  }
  out.reset(SelectionView::Unit::page, LB, H, most);
  for (int lb = 0; lb < LB; ++lb) {
    for (int h = 0; h < H; ++h) {
      const std::span<std::int32_t> slots = out.slots(lb, h);
      int n = 0;
      for (const std::int32_t j : global.list(sh.local_batch()[lb], h)) {
        if (s.owner(j) == sh.rank()) slots[n++] = s.local_index(j);
      }
      out.count[static_cast<std::size_t>(lb) * H + h] = n;
    }
  }
}

}  // namespace

void decode(Communicator& comm, const DecodeArgs& args, DecodeStats* stats) {
  check_args(comm, args);
  const LocalShard& sh = *args.shard;
  const int B = static_cast<int>(sh.shapes().size());
  const int LB = static_cast<int>(sh.local_batch().size());
  const int Hq = args.q.n1, d = sh.head_dim();
  const std::size_t heads = static_cast<std::size_t>(B) * Hq;
  const bool entmax = args.mapping.is_entmax();

  // The local batch: the sequences with pages here, their queries copied contiguously.
  std::vector<float> q_local(static_cast<std::size_t>(LB) * Hq * d);
  std::vector<float> o_local(q_local.size());
  std::vector<float> stat_local(static_cast<std::size_t>(LB) * Hq);
  for (int lb = 0; lb < LB; ++lb) {
    for (int h = 0; h < Hq; ++h) {
      std::memcpy(q_local.data() + (static_cast<std::size_t>(lb) * Hq + h) * d,
                  args.q.row(sh.local_batch()[lb], h), sizeof(float) * d);
    }
  }
  SelectionStorage sel_local;
  if (args.selection) local_selection(sh, *args.selection, sel_local);
  const SelectionView sel_view = sel_local.view();

  // Entmax: the local decode stops between step 1 and step 2 of §2.6 for the global tau.
  std::vector<double> tau(heads, std::numeric_limits<double>::quiet_NaN());
  std::vector<double> p_local(static_cast<std::size_t>(LB) * Hq);
  const auto global_tau = [&](std::span<const std::vector<double>> local_cand,
                              std::span<double> local_tau) {
    std::vector<std::vector<double>> cand(heads);
    for (int lb = 0; lb < LB; ++lb) {
      for (int h = 0; h < Hq; ++h) {
        cand[static_cast<std::size_t>(sh.local_batch()[lb]) * Hq + h] =
            local_cand[static_cast<std::size_t>(lb) * Hq + h];
      }
    }
    solve_global_tau(comm, cand, args.mapping.alpha, args.tau, tau, stats);
    for (int lb = 0; lb < LB; ++lb) {
      for (int h = 0; h < Hq; ++h) {
        local_tau[static_cast<std::size_t>(lb) * Hq + h] =
            tau[static_cast<std::size_t>(sh.local_batch()[lb]) * Hq + h];
      }
    }
  };
  attn::EntmaxExchange exchange{global_tau, p_local};

  if (LB > 0) {
    attn::DecodeArgs local;
    local.q = View3<const float>::contiguous(q_local.data(), LB, Hq, d);
    local.cache = sh.view();
    local.mapping = args.mapping;
    local.scale = args.scale;
    local.selection = args.selection ? &sel_view : nullptr;
    local.out = View3<float>::contiguous(o_local.data(), LB, Hq, d);
    local.lse_or_tau = stat_local;
    local.chunk_pages = args.chunk_pages;
    local.impl = args.impl;
    local.entmax_exchange = entmax ? &exchange : nullptr;
    attn::decode(local);
  } else if (entmax) {
    global_tau({}, {});  // nothing here, but every rank takes part in the exchange
  }

  // Merge message per global (b, q head): softmax (o, lse), entmax (sum p v, sum p); sequences
  // with no page here contribute the empty partial (o = 0, lse = -inf / p = 0).
  const std::size_t per_head = static_cast<std::size_t>(d) + 1;
  std::vector<float> msg(heads * per_head, 0.0f);
  for (std::size_t i = 0; i < heads; ++i) {
    msg[i * per_head + d] = entmax ? 0.0f : -std::numeric_limits<float>::infinity();
  }
  for (int lb = 0; lb < LB; ++lb) {
    for (int h = 0; h < Hq; ++h) {
      const std::size_t li = static_cast<std::size_t>(lb) * Hq + h;
      float* m = msg.data() + (static_cast<std::size_t>(sh.local_batch()[lb]) * Hq + h) * per_head;
      const float* o = o_local.data() + li * d;
      const double w = entmax ? p_local[li] : 1.0;
      for (int c = 0; c < d; ++c) m[c] = static_cast<float>(w * o[c]);
      m[d] = entmax ? static_cast<float>(p_local[li]) : stat_local[li];
    }
  }

  const auto write = [&](std::size_t i, float* o, float stat) {
    const int b = static_cast<int>(i / Hq), h = static_cast<int>(i % Hq);
    std::memcpy(args.out.row(b, h), o, sizeof(float) * d);
    if (!args.lse_or_tau.empty()) args.lse_or_tau[i] = stat;
  };
  std::vector<float> o(static_cast<std::size_t>(d));
  if (entmax) {
    comm.all_reduce(msg, ReduceOp::sum);
    for (std::size_t i = 0; i < heads; ++i) {
      const float* m = msg.data() + i * per_head;
      const attn::EntmaxPartialView part{m, m[d]};
      attn::merge_entmax(std::span(&part, 1), d, o.data());
      write(i, o.data(), static_cast<float>(tau[i]));
    }
  } else {
    const int R = comm.size();
    std::vector<float> all(msg.size() * static_cast<std::size_t>(R));
    comm.all_gather(msg, all);
    std::vector<attn::SoftmaxPartialView> parts(static_cast<std::size_t>(R));
    for (std::size_t i = 0; i < heads; ++i) {
      for (int r = 0; r < R; ++r) {
        const float* m = all.data() + static_cast<std::size_t>(r) * msg.size() + i * per_head;
        parts[static_cast<std::size_t>(r)] = {m, m[d]};
      }
      const float lse = attn::merge_softmax(parts, d, o.data());
      write(i, o.data(), lse);
    }
  }
}

}  // namespace masskv::dist
