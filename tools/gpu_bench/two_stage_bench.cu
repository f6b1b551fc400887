// masskv_gpu_bench's two-stage bench rows (two_stage_bench.hpp bench_two_stage): the
// "two_stage select + token decode" rows, token_codes (one pass and two passes: *_2p) beside
// them. The codes, their ranges and the two passes' channel-major copy are made on the device
// from the bench's bf16 pool. Also profile-two-stage, on a host cache of random keys.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "masskv/attn/decode.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/two_stage.hpp"
#include "masskv/kv/page_codes.hpp"
#include "masskv/select/selector.hpp"
#include "ts_case.cuh"
#include "two_stage_bench.hpp"

using namespace masskv;

// ---- bench ------------------------------------------------------------------------------------

namespace {

// The 2-bit codes of a bf16 HND pool's keys under their pages' 8-bit ranges (kv/page_codes.hpp's
// rule: l, u = fma(code, step, lo) of the range codes; RNE(3 (x - l) / (u - l)) clamped to
// [0, 3], 0 for an empty range).
__global__ void encode_codes_kernel(const std::uint16_t* k, const std::uint8_t* rmin,
                                    const std::uint8_t* rmax, const float* grid,
                                    std::uint8_t* codes, int hkv, int page, int d) {
  const int pg = blockIdx.x, h = blockIdx.y;
  const int bytes = d / 4;
  const std::int64_t ph = static_cast<std::int64_t>(pg) * hkv + h;
  const float lo0 = grid[2 * ph], step = grid[2 * ph + 1];
  for (int idx = threadIdx.x; idx < page * bytes; idx += blockDim.x) {
    const int slot = idx / bytes, byte = idx % bytes;
    const std::int64_t row = (ph * page + slot) * d;
    unsigned out = 0;
    for (int i = 0; i < 4; ++i) {
      const int c = 4 * byte + i;
      const float x = __uint_as_float(static_cast<unsigned>(k[row + c]) << 16);
      const float lo = fmaf(static_cast<float>(rmin[ph * d + c]), step, lo0);
      const float hi = fmaf(static_cast<float>(rmax[ph * d + c]), step, lo0);
      unsigned lvl = 0;
      if (hi > lo) {
        const float t = rintf(3.0f * ((x - lo) / (hi - lo)));
        lvl = t <= 0.f ? 0u : t >= 3.f ? 3u : static_cast<unsigned>(t);
      }
      out |= lvl << (2 * i);
    }
    codes[(ph * page + slot) * bytes + byte] = static_cast<std::uint8_t>(out);
  }
}

// The channel-major copy of a pool's codes and ranges (kv::PageCodesView::chan_codes [kv head]
// [channel][page][(page + 3) / 4] bytes, slot s at byte s / 4, bits 2 (s % 4); chan_ranges
// [kv head][channel][page][2]) from the token-major ones, as the host cache keeps it.
__global__ void channel_major_kernel(const std::uint8_t* codes, const std::uint8_t* rmin,
                                     const std::uint8_t* rmax, std::uint8_t* ccodes,
                                     std::uint8_t* cranges, int pool_pages, int hkv, int page,
                                     int d) {
  const int pg = blockIdx.x, h = blockIdx.y;
  const int wb = (page + 3) / 4, bytes = d / 4;
  const std::int64_t ph = static_cast<std::int64_t>(pg) * hkv + h;
  for (int idx = threadIdx.x; idx < d * wb; idx += blockDim.x) {
    const int c = idx / wb, w = idx % wb;
    unsigned out = 0;
    for (int e = 0; e < 4; ++e) {
      const int slot = 4 * w + e;
      if (slot >= page) break;
      const unsigned code = (codes[(ph * page + slot) * bytes + c / 4] >> (2 * (c % 4))) & 3u;
      out |= code << (2 * e);
    }
    const std::int64_t at = (static_cast<std::int64_t>(h) * d + c) * pool_pages + pg;
    ccodes[at * wb + w] = static_cast<std::uint8_t>(out);
    if (w == 0) {
      cranges[2 * at] = rmin[ph * d + c];
      cranges[2 * at + 1] = rmax[ph * d + c];
    }
  }
}

}  // namespace

std::vector<TwoStageBenchRow> bench_two_stage(const TwoStageBenchShape& s) {
  // The pool's code ranges (rounded on the host from its f32 summaries) and codes on the
  // device, made once per pool.
  static DevBuf<std::uint8_t> drmin, drmax, dcodes, dchan_codes, dchan_ranges;
  static DevBuf<float> dgrid, dspread;
  static const void* made_for = nullptr;
  static const void* chan_made_for = nullptr;
  const std::size_t nr = static_cast<std::size_t>(s.pool_pages) * s.hkv * s.d;
  if (made_for != s.k) {
    std::vector<std::uint8_t> ra(nr), rb(nr);
    std::vector<float> grid(2 * static_cast<std::size_t>(s.pool_pages) * s.hkv);
    for (std::size_t ph = 0; ph < static_cast<std::size_t>(s.pool_pages) * s.hkv; ++ph)
      kv::round_range8(s.host_min + ph * s.d, s.host_max + ph * s.d, s.d, ra.data() + ph * s.d,
                       rb.data() + ph * s.d, grid.data() + 2 * ph);
    drmin = DevBuf<std::uint8_t>(nr);
    drmax = DevBuf<std::uint8_t>(nr);
    dgrid = DevBuf<float>(grid.size());
    drmin.upload(ra.data(), nr);
    drmax.upload(rb.data(), nr);
    dgrid.upload(grid.data(), grid.size());
    dcodes = DevBuf<std::uint8_t>(static_cast<std::size_t>(s.pool_pages) * s.hkv * s.page * s.d / 4);
    encode_codes_kernel<<<dim3(s.pool_pages, s.hkv), 256>>>(
        static_cast<const std::uint16_t*>(s.k), drmin.p, drmax.p, dgrid.p, dcodes.p, s.hkv,
        s.page, s.d);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    made_for = s.k;
  }
  kv::PageCodesView pc;
  pc.codes = dcodes.p;
  pc.num_pages = s.pool_pages;
  pc.num_kv_heads = s.hkv;
  pc.page_size = s.page;
  pc.head_dim = s.d;
  pc.range_min = drmin.p;
  pc.range_max = drmax.p;
  pc.grid = dgrid.p;
  const bool two_pass = s.factor == 0 && s.code_channels < 1;
  if (two_pass && chan_made_for != s.k) {  // the channel-major copy, once per pool
    const int wb = (s.page + 3) / 4;
    dchan_codes = DevBuf<std::uint8_t>(nr * wb);
    dchan_ranges = DevBuf<std::uint8_t>(2 * nr);
    channel_major_kernel<<<dim3(s.pool_pages, s.hkv), 256>>>(dcodes.p, drmin.p, drmax.p,
                                                             dchan_codes.p, dchan_ranges.p,
                                                             s.pool_pages, s.hkv, s.page, s.d);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    // The spread rows the first pass weighs channels by: for timing, each page's range / 4 as
    // its row (the selection's work does not depend on the values; the two-stage test compares
    // the cache's own rows against the CPU).
    std::vector<float> spread(nr);
    for (std::size_t i = 0; i < nr; ++i) spread[i] = (s.host_max[i] - s.host_min[i]) / 4;
    dspread = DevBuf<float>(nr);
    dspread.upload(spread.data(), nr);
    chan_made_for = s.k;
  }
  if (two_pass) {
    pc.chan_codes = dchan_codes.p;
    pc.chan_ranges = dchan_ranges.p;
    pc.chan_spread = dspread.p;
  }

  const int pages = s.ctx / s.page;
  const int rq = static_cast<int>(s.q.size()), rt = static_cast<int>(s.tables.size());
  const int cap = cuda::two_stage_capacity(pages, s.page, s.budget, s.sink_pages, s.window_tokens);
  std::vector<DevBuf<std::int32_t>> ids, cnt;
  std::vector<SelectionView> views;
  for (int r = 0; r < rq; ++r) {
    ids.emplace_back(static_cast<std::size_t>(s.batch) * s.hkv * cap);
    cnt.emplace_back(static_cast<std::size_t>(s.batch) * s.hkv);
  }
  for (int r = 0; r < rq; ++r)
    views.push_back({SelectionView::Unit::token, s.batch, s.hkv, cap,
                     {ids[r].p, ids[r].n}, {cnt[r].p, cnt[r].n}});
  cuda::TwoStageWorkspace tws;
  const auto sel_args = [&](int r) {
    cuda::TwoStageSelectArgs a;
    a.q = View3<const float>::contiguous(s.q[r % rq], s.batch, s.hq, s.d);
    a.table = s.tables[r % rt];
    a.page_size = s.page;
    a.bounds = s.store;
    a.codes = pc;
    a.budget_tokens = s.budget;
    a.sink_pages = s.sink_pages;
    a.window_tokens = s.window_tokens;
    a.candidate_factor = s.factor;
    a.group = s.log_prob ? select::GroupRule::log_prob : select::GroupRule::union_heads;
    a.code_channels = s.code_channels;
    a.code_candidates = s.code_candidates;
    a.max_per_head = cap;
    a.ids = {ids[r % rq].p, ids[r % rq].n};
    a.count = {cnt[r % rq].p, cnt[r % rq].n};
    return a;
  };
  const auto select = [&](int r, cudaStream_t st) {
    cuda::TwoStageLaunch l;
    l.stream = st;
    l.workspace = &tws;
    l.max_pages_per_seq = pages;
    l.check_errors = false;
    cuda::two_stage_select(sel_args(r), l);
  };
  DevBuf<float> out(static_cast<std::size_t>(s.batch) * s.hq * s.d), lse(static_cast<std::size_t>(s.batch) * s.hq);
  const auto decode = [&](int r, cudaStream_t st) {
    attn::DecodeArgs a;
    a.q = View3<const float>::contiguous(s.q[r % rq], s.batch, s.hq, s.d);
    a.cache = bf16_hnd_pool(s.k, s.v, s.pool_pages, s.hkv, s.page, s.d, s.tables[r % rt]);
    a.out = View3<float>::contiguous(out.p, s.batch, s.hq, s.d);
    a.lse_or_tau = {lse.p, lse.n};
    a.selection = &views[r % rq];
    cuda::DecodeLaunch l;
    l.stream = st;
    l.workspace = s.decode_ws;
    l.max_pages_per_seq = pages;
    l.check_errors = false;
    cuda::decode(a, l);
  };
  // Held tokens and candidate pages per step (for the bytes), errors checked once.
  double held = 0, cand = 0;
  for (int r = 0; r < rq; ++r) {
    select(r, nullptr);
    tws.check(nullptr);
    for (int c : cnt[r].download()) held += c;
    std::vector<std::int32_t> nc(tws.candidate_counts().size());
    CK(cudaMemcpy(nc.data(), tws.candidate_counts().data(), nc.size() * 4, cudaMemcpyDeviceToHost));
    for (int c : nc) cand += c;
  }
  held /= rq;
  cand /= rq;
  const double kv_bytes = held * s.d * 2 * 2;
  // Stage 1 reads the bf16 bound store (not with factor 0); stage 2 the candidates' 8-bit
  // ranges (2 d + 8 bytes) and codes.
  // Two passes: pass 1 the chosen channels' words and ranges of every page (channel-major)
  // and every page's grid; pass 2 the candidate tokens' code rows (min(L, code_candidates x
  // budget) a kv head) and the ranges of the pages holding them (cand: those pages).
  const int r2p = two_pass ? std::clamp(static_cast<int>(std::lround(s.code_channels * s.d)), 1, s.d) : 0;
  const double cand_tokens =
      static_cast<double>(s.batch) * s.hkv *
      std::min<double>(s.ctx, static_cast<double>(s.code_candidates) * s.budget);
  const double sel_bytes =
      two_pass ? static_cast<double>(s.batch) * pages * s.hkv * (r2p * ((s.page + 3) / 4 + 2.0) + 8.0) +
                     cand * (s.d * 2.0 + 8.0) + cand_tokens * s.d / 4.0
               : (s.factor == 0 ? 0.0 : static_cast<double>(s.batch) * pages * s.hkv * s.d * 4) +
                     cand * (s.d * 2.0 + 8.0 + s.page * s.d / 4.0);
  constexpr int kWarm = 10, kIters = 100;
  const std::string tag = (s.factor != 0 ? std::string("two_stage")
                           : s.log_prob  ? std::string("token_codes_lse")
                                         : std::string("token_codes")) +
                          (two_pass ? "_2p" : "");
  std::vector<TwoStageBenchRow> rows;
  const double sel_us = time_us(kWarm, kIters, [&](int i) { select(i, nullptr); });
  tws.check(nullptr);
  rows.push_back({"gpu_" + tag + "_select", sel_us, sel_bytes});
  const double sel_graph = time_graph_us(rq, kWarm, kIters, select);
  rows.push_back({"gpu_" + tag + "_select_graph", sel_graph, sel_bytes});
  const double step = time_graph_us(rq, kWarm, kIters, [&](int r, cudaStream_t st) {
    select(r, st);
    decode(r, st);
  });
  tws.check(nullptr);
  s.decode_ws->check(nullptr);
  rows.push_back({"ours_sparse_" + tag + "_gpu_sel_graph", step, kv_bytes + sel_bytes});
  const double dec = time_graph_us(rq, kWarm, kIters, decode);
  s.decode_ws->check(nullptr);
  rows.push_back({"ours_sparse_" + tag + "_token_decode_graph", dec, kv_bytes});
  const int layers = std::min(8, rq);
  const double lay = time_layers_graph_us(layers, kWarm, kIters, [&](int l, cudaStream_t st) {
    select(l, st);
    decode(l, st);
  });
  tws.check(nullptr);
  s.decode_ws->check(nullptr);
  rows.push_back({"ours_sparse_" + tag + "_gpu_sel_layers_graph", lay, kv_bytes + sel_bytes});
  std::printf(
      "  %s ctx=%7d B=%2d budget=%5d factor %d%s: select %.1f us (graph %.1f), select + "
      "token decode (graph) %.1f us, token decode alone (graph) %.1f us, per layer in a %d-layer "
      "graph %.1f us; %.0f tokens held, %.0f candidate pages per step; %.1f MB selector reads\n",
      tag.c_str(), s.ctx, s.batch, s.budget, s.factor,
      two_pass ? (" code_channels " + std::to_string(s.code_channels) + " code_candidates " +
                  std::to_string(s.code_candidates)).c_str()
               : "",
      sel_us, sel_graph, step, dec, layers, lay,
      held, cand,
      sel_bytes / 1e6);
  return rows;
}

// ---- profile --------------------------------------------------------------------------------

int run_profile_two_stage() {
  // The bench's shape (B 1, Hq 32, Hkv 8, d 128, page 16, budget 4096, one sink page) on a host
  // cache of random keys: token_codes with the round robin and with log_prob, each step timed
  // by events (the per-kernel times: run under ncu).
  for (const int L : {32768, 131072}) {
    Rng rng(77);
    HostCache hc = make_cache(rng, {L}, 8, 128, 16, DType::bf16, true, false);
    const kv::SummariesView hsum = hc.cache->summaries();
    const select::BoundStore store(hsum);
    TsGpu g(store.view(), hc.cache->page_codes());
    DevTable dt(hc.table);
    std::vector<float> q = random_q(rng, 32 * 128, false);
    DevBuf<float> dq = to_device(q);
    const int pages = hc.table.table().num_pages(0);
    const int cap = cuda::two_stage_capacity(pages, 16, 4096, 1, 0);
    DevBuf<std::int32_t> ids(static_cast<std::size_t>(8) * cap), cnt(8);
    cuda::TwoStageWorkspace ws;
    // One pass, then two passes (token_codes_2p: code_channels 0.5 and 0.375, 2 candidates
    // per cap token).
    const std::pair<double, int> settings[] = {{1.0, 2}, {0.5, 2}, {0.375, 2}};
    for (const auto& [channels, cands] : settings)
    for (const bool lp : {false, true}) {
      cuda::TwoStageSelectArgs ta;
      ta.q = View3<const float>::contiguous(dq.p, 1, 32, 128);
      ta.table = dt.view();
      ta.page_size = 16;
      ta.bounds = g.store;
      ta.codes = g.pc;
      ta.budget_tokens = 4096;
      ta.sink_pages = 1;
      ta.window_tokens = 0;
      ta.candidate_factor = 0;
      ta.group = lp ? select::GroupRule::log_prob : select::GroupRule::union_heads;
      ta.code_channels = channels;
      ta.code_candidates = cands;
      ta.max_per_head = cap;
      ta.ids = {ids.p, ids.n};
      ta.count = {cnt.p, cnt.n};
      cuda::TwoStageLaunch l;
      l.workspace = &ws;
      l.max_pages_per_seq = pages;
      l.check_errors = false;
      const double us = time_us(3, 20, [&](int) { cuda::two_stage_select(ta, l); });
      ws.check(nullptr);
      if (channels < 1) {
        std::printf("profile-two-stage L=%d token_codes_2p%s (code_channels %g, code_candidates "
                    "%d): %.1f us per select\n",
                    L, lp ? "+lse" : "", channels, cands, us);
      } else {
        std::printf("profile-two-stage L=%d token_codes%s: %.1f us per select\n", L,
                    lp ? "+lse" : "", us);
      }
    }
  }
  return 0;
}
