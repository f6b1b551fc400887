// The two-stage checks (masskv_gpu_tests):
//  - decode-token: cuda::decode over token selections (SelectionView::Unit::token, the
//    gather split-K kernel of src/cuda/decode_tokens.cu) against attn::decode_reference (f64)
//    and attn::decode (the CPU kernels) on the same bf16/f16 KV, random selections (empty,
//    sparse, dense lists), several shapes, the decode check's tolerances; a bad token id must
//    set the flag ("selection").
//  - two-stage: cuda::two_stage_select against select::run_selector(Method::two_stage)
//    with bounds_bf16 (the store the GPU reads), and with factor 0 against Method::token_codes,
//    on host caches built with CacheConfig::page_codes (the CPU cache computes the codes and
//    their ranges; uploaded as they are): lists
//    and counts identical (-1 padding included), a rerun identical, on random shapes (Hq/Hkv
//    1..8, d 64/128, page 16, lengths up to 32K, budgets 64..4096, factors 1..8, sinks,
//    windows), keys with many exact ties; the flag names "indptr" and "max_per_head".
//    token_codes' cases again in two passes (code_channels 0.375 / 0.5 x code_candidates 1..3,
//    the channels weighed by the keys' spread, and two settings by |q| alone,
//    and edges: every token a candidate, 1 channel, every channel, page sizes 1..64), the CPU
//    configured the same and the channel-major copy uploaded: lists identical, and the second
//    pass's pages (the workspace's candidate counts) equal to SelectOutput::code_pages; the
//    settings refused by name ("code_channels", "code_candidates", "codes").
// The host caches and their device copies are common/ts_case.cuh; the bench rows and
// profile-two-stage are tools/gpu_bench/two_stage_bench.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gpu_util.cuh"
#include "masskv/attn/decode.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/two_stage.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/page_codes.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/select/selector.hpp"
#include "checks.hpp"
#include "ts_case.cuh"

using namespace masskv;

namespace {

constexpr double kTolO = 1e-3;    // as the decode check: ||o - ref||_inf / ||ref||_inf
constexpr double kTolLse = 1e-4;  // |lse - ref| / max(1, |ref|)

// ---- decode over token selections -----------------------------------------------------------

struct TokCase {
  int B, group, Hkv, d, P;
  DType dt;
  int max_len;
  double density;  // per list; 0: empty lists
};

int run_token_case(const TokCase& tc, std::uint64_t seed, cuda::DecodeWorkspace& ws,
                   double (&worst)[2], long& lists_run) {
  Rng rng(seed);
  std::vector<int> lengths;
  for (int b = 0; b < tc.B; ++b) lengths.push_back(1 + rng.below(tc.max_len));
  HostCache hc = make_cache(rng, lengths, tc.Hkv, tc.d, tc.P, tc.dt, false, false);
  const kv::PageTable table = hc.table.table();
  const kv::PagedKVView hv = hc.cache->view(hc.table);
  const int Hq = tc.Hkv * tc.group, d = tc.d;
  // Random ascending token lists per (sequence, kv head); the last token always (a decode
  // step attends to its own token).
  std::vector<std::vector<std::int32_t>> lists;
  int widest = 1;
  for (int b = 0; b < tc.B; ++b) {
    const std::int64_t L = table.length(b, tc.P);
    for (int h = 0; h < tc.Hkv; ++h) {
      std::vector<std::int32_t> l;
      const double dens = (b + h) % 5 == 4 ? 0.0 : tc.density;
      for (std::int64_t x = 0; x < L; ++x)
        if (rng.uniform() < dens || (dens > 0 && x == L - 1)) l.push_back(static_cast<std::int32_t>(x));
      widest = std::max(widest, static_cast<int>(l.size()));
      lists.push_back(std::move(l));
    }
  }
  SelectionStorage sel;
  sel.reset(SelectionView::Unit::token, tc.B, tc.Hkv, widest + rng.below(3));
  for (int i = 0; i < tc.B * tc.Hkv; ++i) {
    const auto& l = lists[static_cast<std::size_t>(i)];
    std::copy(l.begin(), l.end(), sel.slots(i / tc.Hkv, i % tc.Hkv).begin());
    sel.count[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(l.size());
  }
  const SelectionView hsel = sel.view();
  std::vector<float> q = random_q(rng, static_cast<std::size_t>(tc.B) * Hq * d, false);
  attn::DecodeArgs ha;
  ha.q = View3<const float>::contiguous(q.data(), tc.B, Hq, d);
  ha.cache = hv;
  ha.selection = &hsel;
  std::vector<double> ref_o(q.size()), ref_l(static_cast<std::size_t>(tc.B) * Hq);
  std::vector<float> cpu_o(q.size()), cpu_l(ref_l.size());
  ha.out = View3<float>::contiguous(cpu_o.data(), tc.B, Hq, d);
  ha.lse_or_tau = cpu_l;
  attn::decode_reference(ha, ref_o, ref_l);
  attn::decode(ha);

  // Device copies: the pool as it is (HND, contiguous), table, q, the lists.
  const std::size_t elems = static_cast<std::size_t>(hv.num_pages) * hv.stride_page;
  DevBuf<std::uint16_t> dk(elems), dv(elems);
  dk.upload(static_cast<const std::uint16_t*>(hv.k), elems);
  dv.upload(static_cast<const std::uint16_t*>(hv.v), elems);
  DevTable dt(hc.table);
  DevBuf<float> dq = to_device(q), dout(q.size()), dlse(ref_l.size());
  DevBuf<std::int32_t> dids = to_device(sel.ids), dcnt = to_device(sel.count);
  const SelectionView dsel{SelectionView::Unit::token, tc.B, tc.Hkv, sel.max_per_head,
                           {dids.p, dids.n}, {dcnt.p, dcnt.n}};
  attn::DecodeArgs da;
  da.q = View3<const float>::contiguous(dq.p, tc.B, Hq, d);
  da.cache = hv;
  da.cache.k = dk.p;
  da.cache.v = dv.p;
  da.cache.table = dt.view();
  da.selection = &dsel;
  da.out = View3<float>::contiguous(dout.p, tc.B, Hq, d);
  da.lse_or_tau = {dlse.p, dlse.n};
  int failures = 0;
  for (const int cp : {0, 3, 64}) {  // planned chunks, tiny chunks (many partials), 64 tokens
    cuda::DecodeLaunch l;
    l.workspace = &ws;
    l.chunk_pages = cp;
    cuda::decode(da, l);
    const std::vector<float> o = dout.download(), lse = dlse.download();
    double omax = 0, eo = 0, ecpu = 0, el = 0;
    for (double x : ref_o) omax = std::max(omax, std::fabs(x));
    for (std::size_t i = 0; i < o.size(); ++i) {
      eo = std::max(eo, std::fabs(o[i] - ref_o[i]));
      ecpu = std::max(ecpu, std::fabs(static_cast<double>(o[i]) - cpu_o[i]));
    }
    eo /= std::max(omax, 1e-30);
    ecpu /= std::max(omax, 1e-30);
    bool ok = std::isfinite(eo);
    for (std::size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(ref_l[i])) {  // an empty list: -inf and o = 0
        ok = ok && std::isinf(lse[i]) && lse[i] < 0;
        for (int x = 0; x < d; ++x) ok = ok && o[i * d + x] == 0.f;
      } else {
        el = std::max(el, std::fabs(lse[i] - ref_l[i]) / std::max(1.0, std::fabs(ref_l[i])));
      }
    }
    const bool pass = ok && eo <= kTolO && ecpu <= kTolO && el <= kTolLse;
    const int w = tc.dt == DType::bf16 ? 0 : 1;
    worst[w] = std::max(worst[w], eo);
    lists_run += tc.B * tc.Hkv;
    if (!pass) {
      ++failures;
      std::printf(
          "FAIL decode-token B=%d group=%d Hkv=%d d=%d P=%d %s max_len=%d density=%.3f chunk=%d: "
          "o err %.3g (vs CPU %.3g), lse err %.3g%s\n",
          tc.B, tc.group, tc.Hkv, d, tc.P, tc.dt == DType::bf16 ? "bf16" : "f16", tc.max_len,
          tc.density, cp, eo, ecpu, el, ok ? "" : " (empty-list or non-finite mismatch)");
    }
  }
  return failures;
}

}  // namespace

int run_decode_token_check() {
  std::vector<TokCase> cases;
  for (int d : {64, 128, 256})
    for (int group : {1, 4, 8})
      for (int P : {16, 64})
        for (double dens : {0.02, 0.3, 1.0}) {
          const DType dt = (d + group + P) % 2 == 0 ? DType::bf16 : DType::f16;
          cases.push_back({group == 8 ? 1 : 3, group, 2, d, P, dt, 6000, dens});
        }
  cases.push_back({2, 3, 2, 128, 16, DType::bf16, 3000, 0.2});    // group 3 (padded to 4)
  cases.push_back({1, 16, 1, 128, 16, DType::bf16, 40000, 0.1});  // two head groups, long
  cases.push_back({2, 4, 2, 128, 1, DType::f16, 2000, 0.5});      // 1-token pages
  cases.push_back({1, 4, 8, 128, 16, DType::bf16, 70000, 0.06});  // 4K-token lists
  std::printf("decode-token: %zu cases x chunk {planned, 3, 64} tokens; tolerances "
              "||o-ref||inf/||ref||inf <= %.0e (f64 reference and the CPU attn::decode), "
              "|lse-ref|/max(1,|ref|) <= %.0e\n",
              cases.size(), kTolO, kTolLse);
  const auto t0 = std::chrono::steady_clock::now();
  cuda::DecodeWorkspace ws;
  int failures = 0;
  double worst[2] = {0, 0};
  long lists = 0;
  for (std::size_t i = 0; i < cases.size(); ++i)
    failures += run_token_case(cases[i], 7000 + i, ws, worst, lists);
  // A token id outside its sequence: the flag names "selection".
  {
    Rng rng(99);
    HostCache hc = make_cache(rng, {100}, 1, 64, 16, DType::bf16, false, false);
    const kv::PagedKVView hv = hc.cache->view(hc.table);
    const std::size_t elems = static_cast<std::size_t>(hv.num_pages) * hv.stride_page;
    DevBuf<std::uint16_t> dk(elems), dv(elems);
    dk.upload(static_cast<const std::uint16_t*>(hv.k), elems);
    dv.upload(static_cast<const std::uint16_t*>(hv.v), elems);
    DevTable dt(hc.table);
    std::vector<float> q = random_q(rng, 64, false);
    DevBuf<float> dq = to_device(q), dout(64), dlse(1);
    DevBuf<std::int32_t> dids = to_device(std::vector<std::int32_t>{3, 50, 100}),
                         dcnt = to_device(std::vector<std::int32_t>{3});
    const SelectionView dsel{SelectionView::Unit::token, 1, 1, 3, {dids.p, 3}, {dcnt.p, 1}};
    attn::DecodeArgs da;
    da.q = View3<const float>::contiguous(dq.p, 1, 1, 64);
    da.cache = hv;
    da.cache.k = dk.p;
    da.cache.v = dv.p;
    da.cache.table = dt.view();
    da.selection = &dsel;
    da.out = View3<float>::contiguous(dout.p, 1, 1, 64);
    cuda::DecodeLaunch l;
    l.workspace = &ws;
    bool named = false;
    try {
      cuda::decode(da, l);
    } catch (const Error& e) {
      named = std::string(e.what()).find("selection") != std::string::npos;
    }
    if (!named) {
      ++failures;
      std::printf("FAIL decode-token: a token id past the sequence did not raise 'selection'\n");
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "decode-token: %s, %d failure(s); %ld lists; worst o err bf16 %.3g f16 %.3g (%.1f s)\n",
      failures ? "FAILED" : "passed", failures, lists, worst[0], worst[1], secs);
  return failures;
}

// ---- two-stage selection ----------------------------------------------------------------------

namespace {

// One setting of token_codes' two passes (code_channels 1: one pass).
struct TwoPass {
  double channels;
  int candidates;
  bool spread;  // code_channel_spread
};

struct TsCase {
  int B, group, Hkv, d, P;
  int max_len;
  std::int64_t budget;
  int factor, sinks, window;
  bool ties;
  bool log_prob;  // factor 0 only: GroupRule::log_prob in place of the round robin
  // factor 0 only: besides one pass, the two-pass settings kTwoPasses (the same cache and
  // queries, the CPU configured the same), and `extra` ones.
  bool two_pass = false;
  std::vector<TwoPass> extra = {};
};

// token_codes' two passes: (code_channels, code_candidates, code_channel_spread).
const TwoPass kTwoPasses[] = {{0.375, 1, true}, {0.375, 2, true},  {0.375, 3, true},
                              {0.5, 1, true},   {0.5, 2, true},    {0.5, 3, true},
                              {0.375, 2, false}, {0.5, 3, false}};

struct TsStats {
  long lists = 0, identical = 0, tokens = 0;
  long lists_2p = 0, identical_2p = 0, code_pages_2p = 0;  // two passes (code_pages: equal)
};

int run_ts_case(const TsCase& c, std::uint64_t seed, cuda::TwoStageWorkspace& ws, TsStats& st) {
  Rng rng(seed);
  std::vector<int> lengths;
  for (int b = 0; b < c.B; ++b) lengths.push_back(1 + rng.below(c.max_len));
  if (c.B > 1) lengths[0] = c.max_len;  // one sequence at the longest length
  HostCache hc = make_cache(rng, lengths, c.Hkv, c.d, c.P, DType::bf16, true, c.ties);
  const int Hq = c.Hkv * c.group;
  std::vector<float> q = random_q(rng, static_cast<std::size_t>(c.B) * Hq * c.d, c.ties);
  const kv::SummariesView hsum = hc.cache->summaries();
  const select::BoundStore store(hsum);
  const select::BoundStoreView sv = store.view();
  select::SelectArgs a;
  a.q = View3<const float>::contiguous(q.data(), c.B, Hq, c.d);
  a.cache = hc.cache->view(hc.table);
  a.summaries = hsum;
  a.bounds_bf16 = &sv;
  a.page_codes = hc.cache->page_codes();
  // One pass (code_channels 1), then token_codes' two passes where the case asks.
  std::vector<TwoPass> passes = {{1.0, 2, true}};
  if (c.factor == 0 && c.two_pass) passes.insert(passes.end(), std::begin(kTwoPasses), std::end(kTwoPasses));
  if (c.factor == 0) passes.insert(passes.end(), c.extra.begin(), c.extra.end());
  TsGpu g(sv, a.page_codes);
  DevTable dt(hc.table);
  DevBuf<float> dq = to_device(q);
  int max_pages = 1;
  for (int b = 0; b < c.B; ++b) max_pages = std::max(max_pages, hc.table.table().num_pages(b));
  const int cap = cuda::two_stage_capacity(max_pages, c.P, c.budget, c.sinks, c.window);
  DevBuf<std::int32_t> ids(static_cast<std::size_t>(c.B) * c.Hkv * cap),
      cnt(static_cast<std::size_t>(c.B) * c.Hkv);
  int failures = 0;
  for (const auto& [channels, cands, spread] : passes) {
    const bool two = channels < 1;
    select::SelectorConfig cfg;
    // Factor 0 is token_codes (every page a candidate, no page stage).
    cfg.method = c.factor == 0 ? select::Method::token_codes : select::Method::two_stage;
    cfg.budget = {select::Budget::Kind::fixed, c.budget, 0.9};
    cfg.sink_pages = c.sinks;
    cfg.window_tokens = c.window;
    cfg.candidate_factor = c.factor == 0 ? cfg.candidate_factor : c.factor;
    // The methods' defaults on both sides (token_codes: log_prob; two_stage: the round robin),
    // and token_codes' round robin named where the case asks for it.
    const select::GroupRule group = c.factor == 0 && !c.log_prob
                                        ? select::GroupRule::union_heads
                                        : select::GroupRule::method_default;
    cfg.group = group;
    cfg.code_channels = channels;
    cfg.code_candidates = cands;
    cfg.code_channel_spread = spread;
    select::SelectOutput out;
    select::run_selector(a, cfg, out);
    const SelectionView want = out.selection.view();

    cuda::TwoStageSelectArgs ta;
    ta.q = View3<const float>::contiguous(dq.p, c.B, Hq, c.d);
    ta.table = dt.view();
    ta.page_size = c.P;
    ta.bounds = g.store;
    ta.codes = g.pc;
    ta.budget_tokens = c.budget;
    ta.sink_pages = c.sinks;
    ta.window_tokens = c.window;
    ta.candidate_factor = c.factor;
    ta.group = group;
    ta.code_channels = channels;
    ta.code_candidates = cands;
    ta.code_channel_spread = spread;
    ta.max_per_head = cap;
    ta.ids = {ids.p, ids.n};
    ta.count = {cnt.p, cnt.n};
    cuda::TwoStageLaunch l;
    l.workspace = &ws;
    l.max_pages_per_seq = max_pages;
    std::vector<std::int32_t> first_ids;
    for (int run = 0; run < 2; ++run) {
      cuda::two_stage_select(ta, l);
      const std::vector<std::int32_t> gi = ids.download(), gc = cnt.download();
      if (run == 1) {
        if (gi != first_ids) {
          ++failures;
          std::printf("FAIL two-stage: a rerun gave other lists%s\n", two ? " (two passes)" : "");
        }
        break;
      }
      first_ids = gi;
      // Two passes: the second pass's pages (the workspace's candidate counts) are the CPU's
      // SelectOutput::code_pages.
      std::vector<std::int32_t> gpages;
      if (two) {
        gpages.resize(ws.candidate_counts().size());
        CK(cudaMemcpy(gpages.data(), ws.candidate_counts().data(), gpages.size() * 4,
                      cudaMemcpyDeviceToHost));
      }
      for (int b = 0; b < c.B; ++b) {
        for (int h = 0; h < c.Hkv; ++h) {
          const std::size_t pair = static_cast<std::size_t>(b) * c.Hkv + h;
          const auto w = want.list(b, h);
          const std::size_t base = pair * cap;
          bool same = gc[pair] == static_cast<int>(w.size()) && static_cast<int>(w.size()) <= cap;
          for (std::size_t i = 0; same && i < w.size(); ++i) same = gi[base + i] == w[i];
          for (int i = static_cast<int>(w.size()); same && i < cap; ++i) same = gi[base + i] == -1;
          const bool pages_same = !two || (pair < gpages.size() && gpages[pair] == out.code_pages[pair]);
          ++st.lists;
          st.identical += same;
          st.tokens += static_cast<long>(w.size());
          if (two) {
            ++st.lists_2p;
            st.identical_2p += same;
            st.code_pages_2p += pages_same;
          }
          if (!same || !pages_same) {
            ++failures;
            int first_diff = 0;
            const int gn = gc[pair];
            while (first_diff < static_cast<int>(w.size()) && first_diff < gn &&
                   gi[base + first_diff] == w[first_diff])
              ++first_diff;
            if (failures <= 3)
              std::printf(
                  "FAIL two-stage B=%d group=%d Hkv=%d d=%d P=%d L=%lld budget=%lld factor=%d "
                  "sinks=%d window=%d%s%s code_channels=%g code_candidates=%d%s: list [%d][%d] "
                  "count gpu %d cpu %zu, first difference at %d (gpu %d, cpu %d); code pages "
                  "gpu %d cpu %d\n",
                  c.B, c.group, c.Hkv, c.d, c.P,
                  static_cast<long long>(hc.table.table().length(b, c.P)),
                  static_cast<long long>(c.budget), c.factor, c.sinks, c.window,
                  c.ties ? " ties" : "", c.log_prob ? " log_prob" : "", channels, cands,
                  two && !spread ? " by |q|" : "", b, h,
                  gn, w.size(), first_diff, first_diff < gn ? gi[base + first_diff] : -1,
                  first_diff < static_cast<int>(w.size()) ? w[first_diff] : -1,
                  pair < gpages.size() ? gpages[pair] : -1, out.code_pages[pair]);
          }
        }
      }
    }
  }
  return failures;
}

}  // namespace

int run_two_stage_check() {
  std::vector<TsCase> cases;
  Rng rng(2027);
  const int groups[] = {1, 2, 3, 4, 5, 8};
  const int budgets[] = {64, 128, 512, 1024, 2048, 4096};
  const int factors[] = {0, 1, 2, 4, 8};  // 0: token_codes
  for (int i = 0; i < 96; ++i) {
    TsCase c;
    c.group = groups[i % 6];
    c.Hkv = c.group == 8 ? 1 + rng.below(2) : 1 + rng.below(3);
    c.d = i % 2 ? 128 : 64;
    c.P = 16;
    c.B = 1 + rng.below(3);
    const int lens[] = {40, 700, 3000, 9000, 32768};
    c.max_len = lens[rng.below(i % 8 == 7 ? 5 : 4)];
    c.budget = budgets[rng.below(6)];
    c.factor = factors[rng.below(5)];
    c.sinks = rng.below(3);
    c.window = rng.below(3) == 0 ? 0 : rng.below(400);
    c.ties = i % 5 == 4;
    c.log_prob = false;
    cases.push_back(c);
    if (c.factor == 0) {  // token_codes: the same case under the log-prob pooling too
      c.log_prob = true;
      cases.push_back(c);
    }
  }
  // Edges: a budget past the sequence, 1-token sequences, every page a candidate, the largest
  // lists (4096 tokens, factor 8 at 32K), wide groups at 32K, a window past the sequence.
  cases.push_back({2, 4, 2, 128, 16, 300, 4096, 4, 1, 0, false, false});
  cases.push_back({3, 2, 2, 64, 16, 1, 64, 1, 0, 0, false, false});
  cases.push_back({1, 4, 2, 128, 16, 2048, 512, 8, 1, 64, false, false});
  cases.push_back({1, 4, 8, 128, 16, 32768, 4096, 8, 1, 0, false, false});
  cases.push_back({1, 8, 4, 128, 16, 32768, 4096, 4, 2, 256, false, false});
  cases.push_back({1, 4, 8, 128, 16, 32768, 4096, 4, 1, 0, true, false});
  cases.push_back({2, 1, 8, 64, 16, 32768, 1024, 8, 0, 5000, false, false});
  cases.push_back({1, 3, 2, 128, 16, 5000, 256, 2, 3, 100000, false, false});
  // token_codes: windows that end inside a page (its other tokens are ranked), tied keys, a
  // 128K sequence, a window past the sequence.
  cases.push_back({2, 4, 2, 128, 16, 32768, 4096, 0, 1, 100, false, false});
  cases.push_back({1, 8, 2, 64, 16, 9000, 512, 0, 2, 37, true, false});
  cases.push_back({1, 4, 2, 128, 16, 131072, 4096, 0, 1, 0, false, false});
  cases.push_back({3, 1, 3, 64, 16, 3000, 64, 0, 0, 5, false, false});
  cases.push_back({1, 2, 1, 64, 16, 700, 128, 0, 1, 100000, false, false});
  // log_prob: the same edges, and the widest group over 128K with a budget near the cap.
  cases.push_back({2, 4, 2, 128, 16, 32768, 4096, 0, 1, 100, false, true});
  cases.push_back({1, 8, 2, 64, 16, 9000, 512, 0, 2, 37, true, true});
  cases.push_back({1, 8, 1, 128, 16, 131072, 8000, 0, 1, 0, false, true});
  cases.push_back({3, 1, 3, 64, 16, 3000, 64, 0, 0, 5, false, true});
  cases.push_back({1, 2, 1, 64, 16, 700, 128, 0, 1, 100000, false, true});
  cases.push_back({3, 3, 2, 64, 16, 1, 64, 0, 0, 0, false, true});
  // Every token_codes case above again in two passes (kTwoPasses), both rules.
  for (TsCase& c : cases) c.two_pass = c.factor == 0;
  // Two passes' own edges, both rules: every token a candidate (code_candidates x cap >= L),
  // one chosen channel and every channel, 1-token sequences, g 8 with tied keys and a window
  // ending inside a page, and page sizes other than 16 (the first pass's byte-wise words below
  // 16, several words a page above).
  for (const bool lp : {false, true}) {
    TsCase e{1, 4, 2, 128, 16, 3000, 1024, 0, 1, 50, false, lp};
    e.extra = {{0.5, 1 << 20, true}, {0.375, 3, true}, {0.01, 2, true}, {0.999, 2, false}};
    cases.push_back(e);
    e = {2, 3, 2, 64, 16, 700, 64, 0, 0, 0, false, lp};
    e.extra = {{0.01, 1, true}, {0.999, 3, true}};
    cases.push_back(e);
    e = {3, 3, 2, 64, 16, 1, 64, 0, 0, 0, false, lp};
    e.two_pass = true;
    cases.push_back(e);
    e = {1, 8, 2, 128, 16, 9000, 1024, 0, 1, 100, true, lp};
    e.two_pass = true;
    cases.push_back(e);
    for (const int P : {1, 4, 8, 32, 64}) {
      e = {2, 4, 2, P % 2 ? 64 : 128, P, P == 1 ? 1500 : 5000, 512, 0, 1, 37, P == 8, lp};
      e.extra = {{0.375, 2, true}, {0.5, 3, false}};
      cases.push_back(e);
    }
  }
  std::printf(
      "two-stage: %zu cases (Hq/Hkv 1..8, d 64/128, page 16 (token_codes' two passes: "
      "1..64 too), lengths up to 128K, budgets 64..8000, factors 0 (token_codes: round robin, "
      "log_prob; one pass and two passes, code_channels 0.375/0.5 x code_candidates 1..3 and "
      "edges) and 1..8, sinks 0..2, windows; every 5th with tied keys) vs "
      "select::run_selector(two_stage with bounds_bf16, or token_codes with the same "
      "code_channels / code_candidates): identical lists (and two passes' code_pages) "
      "required\n",
      cases.size());
  const auto t0 = std::chrono::steady_clock::now();
  cuda::TwoStageWorkspace ws;
  TsStats st;
  int failures = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    try {
      failures += run_ts_case(cases[i], 9100 + i, ws, st);
    } catch (const Error& e) {
      ++failures;
      std::printf("FAIL two-stage case %zu: masskv::Error %s\n", i, e.what());
    }
  }
  // The flag: a sequence longer than max_pages_per_seq ("indptr"), lists too short
  // ("max_per_head").
  {
    Rng r2(5);
    HostCache hc = make_cache(r2, {1000}, 1, 64, 16, DType::bf16, true, false);
    const kv::SummariesView hsum = hc.cache->summaries();
    const select::BoundStore store(hsum);
    TsGpu g(store.view(), hc.cache->page_codes());
    DevTable dt(hc.table);
    std::vector<float> q = random_q(r2, 64, false);
    DevBuf<float> dq = to_device(q);
    DevBuf<std::int32_t> ids(400), cnt(1);
    cuda::TwoStageSelectArgs ta;
    ta.q = View3<const float>::contiguous(dq.p, 1, 1, 64);
    ta.table = dt.view();
    ta.bounds = g.store;
    ta.codes = g.pc;
    ta.budget_tokens = 128;
    ta.ids = {ids.p, ids.n};
    ta.count = {cnt.p, cnt.n};
    cuda::TwoStageLaunch l;
    l.workspace = &ws;
    const auto names = [&](const char* what) {
      try {
        cuda::two_stage_select(ta, l);
      } catch (const Error& e) {
        return std::string(e.what()).find(what) != std::string::npos;
      }
      return false;
    };
    ta.max_per_head = 400;
    l.max_pages_per_seq = 10;  // the sequence has 63 pages
    if (!names("indptr")) {
      ++failures;
      std::printf("FAIL two-stage: a sequence past max_pages_per_seq did not raise 'indptr'\n");
    }
    l.max_pages_per_seq = 63;
    ta.max_per_head = 40;  // the list holds 128 tokens
    ta.ids = {ids.p, 40};
    if (!names("max_per_head")) {
      ++failures;
      std::printf("FAIL two-stage: short output lists did not raise 'max_per_head'\n");
    }
    ta.max_per_head = 400;
    ta.ids = {ids.p, ids.n};
    for (const select::GroupRule rule :
         {select::GroupRule::aggregate, select::GroupRule::log_prob}) {
      ta.group = rule;  // aggregate never; log_prob with a page stage never
      ta.candidate_factor = 4;
      if (!names("group")) {
        ++failures;
        std::printf("FAIL two-stage: an unserved GQA rule did not raise 'group'\n");
      }
    }
    // Two passes' settings (token_codes): the CPU's ranges, and the channel-major copy.
    ta.group = select::GroupRule::method_default;
    ta.candidate_factor = 0;
    for (const double f : {0.0, -0.5, 1.5, std::nan("")}) {
      ta.code_channels = f;
      if (!names("code_channels")) {
        ++failures;
        std::printf("FAIL two-stage: code_channels %g did not raise 'code_channels'\n", f);
      }
    }
    ta.code_channels = 0.5;
    ta.code_candidates = 0;
    if (!names("code_candidates")) {
      ++failures;
      std::printf("FAIL two-stage: code_candidates 0 did not raise 'code_candidates'\n");
    }
    ta.code_candidates = 2;
    const float* spread_rows = ta.codes.chan_spread;
    ta.codes.chan_spread = nullptr;
    if (!names("codes")) {
      ++failures;
      std::printf("FAIL two-stage: two passes without the spread rows did not raise 'codes'\n");
    }
    ta.codes.chan_spread = spread_rows;
    ta.codes.chan_codes = nullptr;
    if (!names("codes")) {
      ++failures;
      std::printf("FAIL two-stage: two passes without the channel-major copy did not raise "
                  "'codes'\n");
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "two-stage: %s, %d failure(s); %ld/%ld lists identical, %ld tokens; two passes: "
      "%ld/%ld lists identical, %ld/%ld code_pages equal (%.1f s)\n",
      failures ? "FAILED" : "passed", failures, st.identical, st.lists, st.tokens,
      st.identical_2p, st.lists_2p, st.code_pages_2p, st.lists_2p, secs);
  return failures;
}
