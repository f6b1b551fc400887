// The rotated selection cases that profile-select (profiles.cu) and profile-phases (phases.cu)
// time: random bf16 page summaries over a pool, and per rotation a B = 1 page table into it, a
// q, and the group store rebuilt on the device from that rotation's pages, with a 4096-token
// Quest policy (sink 1 page, window 64) and cover 2 for the hierarchical selection.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "gpu_util.cuh"
#include "masskv/cuda/select.hpp"

namespace {

// Random bf16 min/max summaries [page][kv head][d] of `pages` pool pages, and their view.
struct SummaryPool {
  DevBuf<std::uint16_t> mn, mx;
  masskv::select::BoundStoreView store;
};
SummaryPool make_summary_pool(int pages, int kv_heads, int d) {
  const std::size_t n = static_cast<std::size_t>(pages) * kv_heads * d;
  SummaryPool s{DevBuf<std::uint16_t>(n), DevBuf<std::uint16_t>(n), {}};
  fill_kernel<<<4096, 256>>>(s.mn.p, n, 3, 1.f);
  fill_kernel<<<4096, 256>>>(s.mx.p, n, 1ull << 41, 1.f);
  CK(cudaGetLastError());
  s.store.min = reinterpret_cast<const masskv::bf16*>(s.mn.p);
  s.store.max = reinterpret_cast<const masskv::bf16*>(s.mx.p);
  s.store.num_pages = pages;
  s.store.num_kv_heads = kv_heads;
  s.store.head_dim = d;
  return s;
}

// `rot` rotations of a `pages`-page sequence over the pool: rotation r holds the pool pages
// [r·pages, (r + 1)·pages), in order or shuffled. Step i uses rotation i % rot.
struct HierCase {
  int hq = 0, pages = 0, rot = 0, page_size = 0, cap = 0;
  masskv::select::BoundStoreView store, groups;
  masskv::select::TopkPolicy policy;
  std::vector<DevBuf<std::int32_t>> ind, ptr, last, gptr, gind;
  std::vector<DevBuf<float>> q;
  DevBuf<std::uint16_t> gmn, gmx;
  DevBuf<std::int32_t> ids, cnt;  // the selection's output, [kv heads][cap] and [kv heads]

  masskv::kv::PageTable table(int i) const {
    const int r = i % rot;
    return {{ptr[r].p, ptr[r].n}, {ind[r].p, ind[r].n}, {last[r].p, last[r].n}};
  }
  masskv::cuda::QuestSelectArgs args(int i) const {
    masskv::cuda::QuestSelectArgs a;
    a.q = masskv::View3<const float>::contiguous(q[i % rot].p, 1, hq, store.head_dim);
    a.table = table(i);
    a.page_size = page_size;
    a.bounds = store;
    a.policy = policy;
    a.max_per_head = cap;
    a.ids = {ids.p, ids.n};
    a.count = {cnt.p, cnt.n};
    return a;
  }
  masskv::cuda::HierSelectArgs hier_args(int i) const {
    masskv::cuda::HierSelectArgs h;
    h.pages = args(i);
    h.groups = groups;
    h.group_indptr = {gptr[i % rot].p, gptr[i % rot].n};
    h.group_indices = {gind[i % rot].p, gind[i % rot].n};
    h.cover = 2.0;
    return h;
  }
};

// launch: its workspace and max_pages_per_seq (= pages) serve cuda::update_groups.
HierCase make_hier_case(const masskv::select::BoundStoreView& store, int hq, int page_size,
                        int pages, int rot, bool shuffled, Rng& rng,
                        const masskv::cuda::SelectLaunch& launch) {
  HierCase c;
  c.hq = hq;
  c.pages = pages;
  c.rot = rot;
  c.page_size = page_size;
  c.store = store;
  const int kv = store.num_kv_heads, d = store.head_dim, ngroups = (pages + 15) / 16;
  for (int r = 0; r < rot; ++r) {
    std::vector<std::int32_t> ind(pages);
    std::iota(ind.begin(), ind.end(), r * pages);
    if (shuffled)
      for (int i = pages - 1; i > 0; --i) std::swap(ind[i], ind[rng.below(i + 1)]);
    c.ind.push_back(to_device(ind));
    c.ptr.push_back(to_device(std::vector<std::int32_t>{0, pages}));
    c.last.push_back(to_device(std::vector<std::int32_t>{page_size}));
    std::vector<float> q(static_cast<std::size_t>(hq) * d);
    for (float& x : q) x = rng.sym(3.f);
    c.q.push_back(to_device(q));
  }
  c.policy.budget_pages = 4096 / page_size;
  c.policy.sink_pages = 1;
  c.policy.window_tokens = 64;
  c.cap = masskv::cuda::select_capacity(pages, page_size, c.policy);
  c.ids = DevBuf<std::int32_t>(static_cast<std::size_t>(kv) * c.cap);
  c.cnt = DevBuf<std::int32_t>(kv);
  // Groups of 16 pages: slots [r·ngroups, (r + 1)·ngroups) for rotation r.
  const std::size_t gn = static_cast<std::size_t>(rot) * ngroups * kv * d;
  c.gmn = DevBuf<std::uint16_t>(gn);
  c.gmx = DevBuf<std::uint16_t>(gn);
  for (int r = 0; r < rot; ++r) {
    std::vector<std::int32_t> gi(ngroups);
    std::iota(gi.begin(), gi.end(), r * ngroups);
    c.gind.push_back(to_device(gi));
    c.gptr.push_back(to_device(std::vector<std::int32_t>{0, ngroups}));
    masskv::cuda::GroupUpdateArgs u;
    u.table = c.table(r);
    u.pages = store;
    u.group_indptr = {c.gptr[r].p, c.gptr[r].n};
    u.group_indices = {c.gind[r].p, c.gind[r].n};
    u.group_min = reinterpret_cast<masskv::bf16*>(c.gmn.p);
    u.group_max = reinterpret_cast<masskv::bf16*>(c.gmx.p);
    u.group_slots = rot * ngroups;
    masskv::cuda::update_groups(u, launch);
  }
  c.groups = store;
  c.groups.min = reinterpret_cast<const masskv::bf16*>(c.gmn.p);
  c.groups.max = reinterpret_cast<const masskv::bf16*>(c.gmx.p);
  c.groups.num_pages = rot * ngroups;
  return c;
}

}  // namespace
