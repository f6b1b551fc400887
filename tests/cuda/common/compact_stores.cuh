// masskv_gpu_bench's compact stores on the device: the 8-bit bound store, the group store with
// its table, the page moments, and the hierarchical selection's arguments over them
// (compact_check.cu, decode_bench.cu, profiles.cu).
#pragma once

#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "hier_case.cuh"
#include "masskv/attn/decode.hpp"
#include "masskv/cuda/arch.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/page_bound.hpp"
#include "select/kept.hpp"
#include "sel_case.cuh"

using namespace masskv;

namespace {

// ---- 8-bit and hierarchical selection: check against the CPU references ----------------------
// select::quest_select8 and select::hier_select evaluate every bound in the GPU kernel's order
// (compact_bounds.hpp, std::fma where the GPU fuses), on any host: keys and lists must be
// identical, no tolerance.

// Device copies of a host 8-bit store and of a group store (with its group table).
struct Store8Gpu {
  DevBuf<std::uint8_t> mn, mx;
  DevBuf<float> grid;
  select::BoundStore8View view;  // device pointers
};
inline Store8Gpu upload_store8(const select::BoundStore8View& hv) {
  Store8Gpu g;
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads * hv.head_dim;
  g.mn = DevBuf<std::uint8_t>(n);
  g.mx = DevBuf<std::uint8_t>(n);
  g.grid = DevBuf<float>(2 * static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads);
  g.mn.upload(hv.min, n);
  g.mx.upload(hv.max, n);
  g.grid.upload(hv.grid, g.grid.n);
  g.view = hv;
  g.view.min = g.mn.p;
  g.view.max = g.mx.p;
  g.view.grid = g.grid.p;
  return g;
}
struct GroupGpu {
  DevBuf<std::uint16_t> mn, mx;
  DevBuf<std::int32_t> indptr, indices;
  select::BoundStoreView view;  // device pointers
};
inline GroupGpu upload_groups(const select::GroupStore& gs) {
  GroupGpu g;
  const select::BoundStoreView hv = gs.view();
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads * hv.head_dim;
  g.mn = DevBuf<std::uint16_t>(n);
  g.mx = DevBuf<std::uint16_t>(n);
  g.mn.upload(reinterpret_cast<const std::uint16_t*>(hv.min), n);
  g.mx.upload(reinterpret_cast<const std::uint16_t*>(hv.max), n);
  g.indptr = to_device(std::vector<std::int32_t>(gs.indptr().begin(), gs.indptr().end()));
  g.indices = to_device(std::vector<std::int32_t>(gs.indices().begin(), gs.indices().end()));
  g.view = hv;
  g.view.min = reinterpret_cast<const bf16*>(g.mn.p);
  g.view.max = reinterpret_cast<const bf16*>(g.mx.p);
  g.view.wmax = nullptr;
  return g;
}
inline cuda::HierSelectArgs hier_args(const cuda::QuestSelectArgs& pages, const GroupGpu& gg,
                               double cover) {
  cuda::HierSelectArgs h;
  h.pages = pages;
  h.groups = gg.view;
  h.group_indptr = {gg.indptr.p, gg.indptr.n};
  h.group_indices = {gg.indices.p, gg.indices.n};
  h.group_pages = 16;
  h.cover = cover;
  return h;
}

// Page moments for the Gaussian-τ checks: mean inside [min, max], M2 >= 0, counts 1..page
// (from their own seed: the case's other data are unchanged).
struct MomentData {
  std::vector<float> mean, m2;
  std::vector<std::int32_t> count;
  kv::SummariesView view(int num_kv_heads, int head_dim) const {
    kv::SummariesView v;
    v.mean = mean.data();
    v.m2 = m2.data();
    v.count = count.data();
    v.num_pages = static_cast<int>(count.size());
    v.num_kv_heads = num_kv_heads;
    v.head_dim = head_dim;
    return v;
  }
};
inline MomentData make_moments(const SelData& sd, std::uint64_t seed) {
  Rng rng(seed);
  MomentData m;
  m.mean.resize(sd.smin.size());
  m.m2.resize(sd.smin.size());
  m.count.resize(static_cast<std::size_t>(sd.pool_pages));
  for (auto& n : m.count) n = 1 + rng.below(sd.c.page);
  const std::size_t per_page = static_cast<std::size_t>(sd.c.hkv) * sd.c.d;
  for (std::size_t i = 0; i < m.mean.size(); ++i) {
    const float lo = sd.smin[i], hi = sd.smax[i];
    m.mean[i] = lo + static_cast<float>(rng.uniform()) * (hi - lo);
    const float sd_c = 0.5f * (hi - lo) * static_cast<float>(rng.uniform());
    m.m2[i] = static_cast<float>(m.count[i / per_page]) * sd_c * sd_c;
  }
  return m;
}
// Device copy of a MomentStore and its table.
struct MomentGpu {
  DevBuf<float> mean, m2;
  DevBuf<std::int32_t> count, indptr, indices;
  kv::SummariesView view;  // device pointers
};
inline MomentGpu upload_moments(const select::MomentStore& ms) {
  MomentGpu g;
  const kv::SummariesView hv = ms.view();
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads * hv.head_dim;
  g.mean = DevBuf<float>(n);
  g.m2 = DevBuf<float>(n);
  g.count = DevBuf<std::int32_t>(static_cast<std::size_t>(hv.num_pages));
  g.mean.upload(hv.mean, n);
  g.m2.upload(hv.m2, n);
  g.count.upload(hv.count, g.count.n);
  g.indptr = to_device(std::vector<std::int32_t>(ms.indptr().begin(), ms.indptr().end()));
  g.indices = to_device(std::vector<std::int32_t>(ms.indices().begin(), ms.indices().end()));
  g.view = hv;
  g.view.mean = g.mean.p;
  g.view.m2 = g.m2.p;
  g.view.count = g.count.p;
  return g;
}
inline void set_moments(cuda::HierSelectArgs& h, const MomentGpu& mg, int moment_pages, double alpha,
                 bool adaptive, float margin) {
  h.moments = mg.view;
  h.moment_indptr = {mg.indptr.p, mg.indptr.n};
  h.moment_indices = {mg.indices.p, mg.indices.n};
  h.moment_pages = moment_pages;
  h.alpha = alpha;
  h.adaptive = adaptive;
  h.margin = margin;
}


}  // namespace
