// masskv_gpu_bench profile-phases: where a short sparse decode step's time goes, kernel by
// kernel and phase by phase, from the %globaltimer stamps the kernels write when
// SelectLaunch/DecodeLaunch::phase_stamps is set (masskv/cuda/stamps.hpp). At B = 1 the
// step is latency-bound and per-kernel durations (ncu) miss the overlap and gaps between
// launches; the stamps give the timeline inside one CUDA-graph replay.
#include "phases.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "hier_case.cuh"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/cuda/stamps.hpp"

using namespace masskv;
namespace st = masskv::cuda::stamps;

namespace {

constexpr const char* kKernelNames[st::kKernels] = {
    "hier_fused", "group_score", "group_topk", "page_score", "page_topk", "decode_chunks",
    "decode_merge"};

// The name of phase `ph` of kernel `k` (stamps.hpp).
std::string phase_name(int k, int ph) {
  if (ph == 0) return "entry";
  if (ph == st::kExit) return "exit";
  if (k == st::hier_fused) {
    static const char* n[] = {"", "groups scored", "barrier 1", "list ranked", "pages scored",
                              "barrier 2"};
    return ph <= 5 ? n[ph] : "?";
  }
  if (k == st::group_score || k == st::page_score) {
    static const char* n[] = {"", "q staged", "q norms", "tile 0 landed", "tile 0 keyed"};
    return ph <= 4 ? n[ph] : "?";
  }
  if (ph == 1) return "waited";
  if (k == st::decode_chunks) return ph == 2 ? "staged" : ph == 3 ? "streamed" : "?";
  if (k == st::page_topk) return ph == 2 ? "gathered" : ph == 3 ? "radix" : "?";
  return "?";
}

// One replay's stamps reduced: per (kernel, phase) the earliest and latest CTA, µs after the
// step's first stamp, and how many CTAs reached it.
struct PhaseSpan {
  double lo = 0, hi = 0;
  int ctas = 0;
};
using Timeline = std::array<std::array<PhaseSpan, st::kPhases>, st::kKernels>;

Timeline reduce(const std::vector<std::uint64_t>& s, double& span_us) {
  std::uint64_t t0 = ~0ull, t1 = 0;
  for (std::uint64_t t : s)
    if (t != 0) {
      t0 = std::min(t0, t);
      t1 = std::max(t1, t);
    }
  Timeline tl{};
  span_us = t1 > t0 ? (t1 - t0) / 1e3 : 0;
  for (int k = 0; k < st::kKernels; ++k)
    for (int ph = 0; ph < st::kPhases; ++ph) {
      std::uint64_t lo = ~0ull, hi = 0;
      int n = 0;
      for (int c = 0; c < st::kCtas; ++c) {
        const std::uint64_t t = s[st::index(k, c, ph)];
        if (t == 0) continue;
        lo = std::min(lo, t);
        hi = std::max(hi, t);
        ++n;
      }
      if (n > 0) tl[k][ph] = {(lo - t0) / 1e3, (hi - t0) / 1e3, n};
    }
  return tl;
}

// Replays step(r, stream) from one CUDA graph per rotation, `reps` times with the stamps
// zeroed before each, and prints the median timeline and the median graph time (events).
template <class F>
void profile(const char* what, int ctx, int rot, std::uint64_t* d_stamps, F&& step) {
  cudaStream_t sm;
  CK(cudaStreamCreateWithFlags(&sm, cudaStreamNonBlocking));
  const std::vector<cudaGraphExec_t> execs = capture_graphs(rot, sm, step);
  for (int i = 0; i < 2 * rot + 5; ++i) CK(cudaGraphLaunch(execs[i % rot], sm));
  constexpr int kReps = 31;
  std::vector<std::uint64_t> h(st::kEntries);
  std::vector<Timeline> tls;
  std::vector<double> graph_us, span_us;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < kReps; ++i) {
    CK(cudaMemsetAsync(d_stamps, 0, st::kEntries * sizeof(std::uint64_t), sm));
    CK(cudaEventRecord(e0, sm));
    CK(cudaGraphLaunch(execs[i % rot], sm));
    CK(cudaEventRecord(e1, sm));
    CK(cudaStreamSynchronize(sm));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    graph_us.push_back(ms * 1e3);
    CK(cudaMemcpy(h.data(), d_stamps, h.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
    double sp = 0;
    tls.push_back(reduce(h, sp));
    span_us.push_back(sp);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  for (auto& x : execs) CK(cudaGraphExecDestroy(x));
  CK(cudaStreamDestroy(sm));
  std::printf("phases %-13s ctx=%7d  graph %6.1f us (events), first to last stamp %6.1f us\n",
              what, ctx, median(graph_us), median(span_us));
  for (int k = 0; k < st::kKernels; ++k) {
    int ctas = 0;  // the most CTAs any phase saw (the one-kernel selection stamps no entry
                   // of the scoring and top-k code it runs)
    for (int ph = 0; ph < st::kPhases; ++ph) ctas = std::max(ctas, tls[0][k][ph].ctas);
    if (ctas == 0) continue;
    std::string line;
    char buf[96];
    for (int ph = 0; ph < st::kPhases; ++ph) {
      if (tls[0][k][ph].ctas == 0) continue;
      std::vector<double> lo, hi;
      for (const Timeline& t : tls) {
        lo.push_back(t[k][ph].lo);
        hi.push_back(t[k][ph].hi);
      }
      std::snprintf(buf, sizeof buf, "  %s %.1f-%.1f", phase_name(k, ph).c_str(), median(lo),
                    median(hi));
      line += buf;
    }
    std::printf("  %-13s %4d CTAs:%s\n", kKernelNames[k], ctas, line.c_str());
  }
}

}  // namespace

int run_profile_phases() {
  const int Hq = 32, Hkv = 8, d = 128, P = 16, pool_pages = (1 << 20) / P;
  // The KV pool (bf16, HND) and its page summaries (bf16 min/max), random.
  const std::size_t kv_elems = static_cast<std::size_t>(pool_pages) * Hkv * P * d;
  DevBuf<std::uint16_t> K(kv_elems), V(kv_elems);
  fill_kernel<<<4096, 256>>>(K.p, kv_elems, 1, 2.f);
  fill_kernel<<<4096, 256>>>(V.p, kv_elems, 1ull << 40, 1.f);
  CK(cudaGetLastError());
  const SummaryPool pool = make_summary_pool(pool_pages, Hkv, d);
  DevBuf<std::uint64_t> stamps(st::kEntries);
  Rng rng(13);
  cuda::SelectWorkspace sws;
  cuda::DecodeWorkspace dws;
  std::printf(
      "profile-phases: B 1, Hq %d, Hkv %d, d %d, page %d, 4096-token budget (sink 1 page, "
      "window 64), hier cover 2; µs after the step's first stamp, earliest-latest CTA, median "
      "of 31 graph replays\n",
      Hq, Hkv, d, P);
  for (const int ctx : {8192, 131072, 1048576}) {
    const int pages = ctx / P, rot = std::min(8, pool_pages / pages);
    cuda::SelectLaunch sl = select_launch();
    sl.workspace = &sws;
    sl.max_pages_per_seq = pages;
    sl.check_errors = false;
    const HierCase hc = make_hier_case(pool.store, Hq, P, pages, rot, true, rng, sl);
    std::vector<DevBuf<float>> d_out, d_lse;
    for (int r = 0; r < rot; ++r) {
      d_out.emplace_back(static_cast<std::size_t>(Hq) * d);
      d_lse.emplace_back(Hq);
    }
    const SelectionView sel{SelectionView::Unit::page, 1, Hkv, hc.cap, {hc.ids.p, hc.ids.n},
                            {hc.cnt.p, hc.cnt.n}};
    const auto decode = [&](int r, cudaStream_t s) {
      attn::DecodeArgs a;
      a.q = View3<const float>::contiguous(hc.q[r].p, 1, Hq, d);
      a.cache = bf16_hnd_pool(K.p, V.p, pool_pages, Hkv, P, d, hc.table(r));
      a.out = View3<float>::contiguous(d_out[r].p, 1, Hq, d);
      a.lse_or_tau = {d_lse[r].p, d_lse[r].n};
      a.selection = &sel;
      cuda::DecodeLaunch l;
      l.workspace = &dws;
      l.max_pages_per_seq = pages;
      l.check_errors = false;
      l.stream = s;
      l.phase_stamps = stamps.p;
      cuda::decode(a, l);
    };
    using Hk = cuda::SelectLaunch::HierKernel;
    const auto on = [&](cudaStream_t s, Hk hk) {
      cuda::SelectLaunch l = sl;
      l.stream = s;
      l.hier_kernel = hk;
      l.phase_stamps = stamps.p;
      return l;
    };
    // The lists the decode-alone rows read: the hierarchical selection's.
    cuda::hier_select(hc.hier_args(0), on(nullptr, Hk::separate));
    CK(cudaDeviceSynchronize());  // the profile's own stream does not wait for the legacy one
    profile("decode alone", ctx, 1, stamps.p, [&](int, cudaStream_t s) { decode(0, s); });
    profile("quest+decode", ctx, rot, stamps.p, [&](int r, cudaStream_t s) {
      cuda::quest_select(hc.args(r), on(s, Hk::separate));
      decode(r, s);
    });
    const bool fused_rows = bench_fused_rows();
    for (const Hk hk : {Hk::separate, Hk::fused})
      if (hk == Hk::separate || fused_rows)
        profile(hk == Hk::fused ? "fused+decode" : "hier+decode", ctx, rot, stamps.p,
                [&](int r, cudaStream_t s) {
                  cuda::hier_select(hc.hier_args(r), on(s, hk));
                  decode(r, s);
                });
    sws.check(nullptr);
    dws.check(nullptr);
  }
  return 0;
}
