// masskv_gpu_tests extend-kept: a selection made at an earlier length, extended on the
// GPU (cuda::extend_kept) and on the CPU (select::extend_kept), must give the same lists and
// counts (-1 padding included) on random tables and lists; bad lists, too small outputs and
// bad tables set the flag and leave the affected lists empty; then the kernel's time at the
// bench shape (one stream, graph-free, events).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "checks.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/select/selector.hpp"

using namespace masskv;

namespace {

// One case on the host: a table (current lengths), the earlier lists, the CPU's result laid
// out like the GPU's output ([B][Hkv][max_out], -1 padded).
struct ExtendCase {
  int B = 0, H = 0, P = 0, max_pages = 0, max_in = 0, max_out = 0;
  select::TopkPolicy policy;
  kv::PageTableStorage table;
  std::vector<std::int32_t> ids_in, count_in, want_ids, want_count;
};

ExtendCase make_case(Rng& rng, int B, int H, int P, int max_tokens, int pad_out) {
  ExtendCase c;
  c.B = B;
  c.H = H;
  c.P = P;
  c.policy.sink_pages = rng.below(3);
  c.policy.window_tokens = rng.below(4) * 13;
  c.table.indptr.push_back(0);
  std::vector<int> old_pages;
  for (int b = 0; b < B; ++b) {
    const int L = 1 + rng.below(max_tokens);
    const int n = (L + P - 1) / P;
    for (int j = 0; j < n; ++j) c.table.indices.push_back(rng.below(1 << 20));
    c.table.indptr.push_back(static_cast<std::int32_t>(c.table.indices.size()));
    c.table.last_page_len.push_back(L - (n - 1) * P);
    c.max_pages = std::max(c.max_pages, n);
    old_pages.push_back(std::max(1, n - rng.below(3)));  // pages at the earlier selection
  }
  std::vector<std::vector<std::int32_t>> lists;
  for (int b = 0; b < B; ++b) {
    const int density = 1 + rng.below(6);  // every density-th page, on average
    for (int h = 0; h < H; ++h) {
      std::vector<std::int32_t> l;
      for (int j = 0; j < old_pages[static_cast<std::size_t>(b)]; ++j) {
        if (rng.below(density) == 0) l.push_back(j);
      }
      c.max_in = std::max(c.max_in, static_cast<int>(l.size()));
      lists.push_back(std::move(l));
    }
  }
  c.max_in += rng.below(3);
  SelectionStorage sel;
  sel.reset(SelectionView::Unit::page, B, H, c.max_in);
  for (int i = 0; i < B * H; ++i) {
    const auto& l = lists[static_cast<std::size_t>(i)];
    std::copy(l.begin(), l.end(), sel.slots(i / H, i % H).begin());
    sel.count[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(l.size());
  }
  c.ids_in = sel.ids;
  c.count_in = sel.count;
  select::SelectorConfig cfg;
  cfg.sink_pages = c.policy.sink_pages;
  cfg.window_tokens = c.policy.window_tokens;
  SelectionStorage out;
  select::extend_kept(sel.view(), c.table.table(), P, cfg, out);
  c.max_out = out.max_per_head + pad_out;
  c.want_ids.assign(static_cast<std::size_t>(B) * H * c.max_out, -1);
  for (int i = 0; i < B * H; ++i) {
    const auto l = out.view().list(i / H, i % H);
    std::copy(l.begin(), l.end(), c.want_ids.begin() + static_cast<std::ptrdiff_t>(i) * c.max_out);
  }
  c.want_count = out.count;
  return c;
}

// A case's arrays on the device, outputs sized for max_out pages per list (filled with a
// pattern the kernel must overwrite), and the args that name them.
struct DeviceCase {
  DevBuf<std::int32_t> indptr, indices, last, ids_in, count_in, ids, count;
  cuda::ExtendKeptArgs args;
  DeviceCase(const ExtendCase& c, int max_out)
      : indptr(to_device(c.table.indptr)),
        indices(to_device(c.table.indices)),
        last(to_device(c.table.last_page_len)),
        ids_in(to_device(c.ids_in)),
        count_in(to_device(c.count_in)),
        ids(static_cast<std::size_t>(c.B) * c.H * max_out),
        count(static_cast<std::size_t>(c.B) * c.H) {
    CK(cudaMemset(ids.p, 0x5a, std::max<std::size_t>(ids.n, 1) * sizeof(std::int32_t)));
    args.table = {{indptr.p, indptr.n}, {indices.p, indices.n}, {last.p, last.n}};
    args.page_size = c.P;
    args.policy = c.policy;
    args.max_in = c.max_in;
    args.ids_in = {ids_in.p, ids_in.n};
    args.count_in = {count_in.p, count_in.n};
    args.max_per_head = max_out;
    args.ids = {ids.p, ids.n};
    args.count = {count.p, count.n};
  }
};

// Runs the GPU on `c`; returns the error's argument ("" without one) and the lists and counts
// it wrote.
struct GpuOut {
  std::string error;
  std::vector<std::int32_t> ids, count;
};
GpuOut run_gpu(const ExtendCase& c, int max_out, int max_pages) {
  DeviceCase dc(c, max_out);
  cuda::SelectWorkspace ws;
  cuda::SelectLaunch l = select_launch();
  l.workspace = &ws;
  l.max_pages_per_seq = max_pages;
  GpuOut o;
  try {
    cuda::extend_kept(dc.args, l);
  } catch (const Error& e) {
    o.error = e.argument();
  }
  o.ids = dc.ids.download();
  o.count = dc.count.download();
  return o;
}

}  // namespace

int run_extend_check() {
  Rng rng(41);
  int fails = 0, cases = 0;
  for (int P : {1, 4, 16}) {
    for (int B : {1, 3, 17}) {
      for (int H : {1, 2, 8}) {
        for (int rep = 0; rep < 3; ++rep) {
          const ExtendCase c = make_case(rng, B, H, P, P == 1 ? 300 : 3000, rep);
          const GpuOut g = run_gpu(c, c.max_out, c.max_pages);
          ++cases;
          if (!g.error.empty() || g.ids != c.want_ids || g.count != c.want_count) {
            ++fails;
            std::printf("extend_kept FAIL P=%d B=%d H=%d rep=%d: error '%s', %s\n", P, B, H, rep,
                        g.error.c_str(), g.ids != c.want_ids ? "lists differ" : "counts differ");
          }
        }
      }
    }
  }
  // Errors: each sets the flag, names its argument, empties only the affected lists.
  const auto expect = [&](const char* what, const ExtendCase& c, int max_out, int max_pages,
                          const std::string& arg, int pair) {
    const GpuOut g = run_gpu(c, max_out, max_pages);
    // pair >= 0: that list must be empty and every other one right.
    bool ok = g.error == arg;
    for (int i = 0; i < c.B * c.H && ok && pair >= 0; ++i) {
      const auto at = static_cast<std::size_t>(i);
      ok = i == pair ? g.count[at] == 0 : g.count[at] == c.want_count[at];
    }
    if (!ok) {
      ++fails;
      std::printf("extend_kept FAIL %s: error '%s', want '%s'\n", what, g.error.c_str(),
                  arg.c_str());
    }
  };
  ExtendCase c = make_case(rng, 3, 2, 16, 2000, 0);
  const int widest = *std::max_element(c.want_count.begin(), c.want_count.end());
  expect("output too small", c, widest - 1, c.max_pages, "max_per_head", -1);
  // (The cases below spoil one list or one sequence; pair -1: only the error is checked.)
  ExtendCase bad = c;
  int pair = -1;
  for (int i = 0; i < bad.B * bad.H; ++i) {
    if (bad.count_in[static_cast<std::size_t>(i)] >= 2) pair = i;
  }
  if (pair >= 0) {
    std::swap(bad.ids_in[static_cast<std::size_t>(pair) * bad.max_in],
              bad.ids_in[static_cast<std::size_t>(pair) * bad.max_in + 1]);
    expect("list not ascending", bad, bad.max_out, bad.max_pages, "selection", pair);
  }
  bad = c;
  if (bad.max_in > 0) {
    bad.ids_in[0] = 1 << 20;
    bad.count_in[0] = 1;
    expect("page beyond the sequence", bad, bad.max_out, bad.max_pages, "selection", 0);
  }
  expect("sequence longer than max_pages_per_seq", c, c.max_out, c.max_pages - 1, "indptr", -1);
  bad = c;
  bad.table.last_page_len[1] = 17;
  expect("last_page_len > page_size", bad, bad.max_out, bad.max_pages, "last_page_len", -1);
  std::printf("extend_kept: %d cases + 5 error cases, %d failure(s)\n", cases, fails);

  // Time at the bench shape: B = 1, 8 kv heads, 128K tokens (8192 pages), 256 pages selected.
  {
    ExtendCase t;
    t.B = 1;
    t.H = 8;
    t.P = 16;
    t.max_pages = 8192;
    t.policy.sink_pages = 1;
    t.policy.window_tokens = 64;
    t.table.indptr = {0, 8192};
    for (int j = 0; j < 8192; ++j) t.table.indices.push_back(j);
    t.table.last_page_len = {3};
    t.max_in = 256;
    for (int h = 0; h < 8; ++h) {
      for (int i = 0; i < 256; ++i) t.ids_in.push_back(i * 32);
      t.count_in.push_back(256);
    }
    t.max_out = 264;
    const DeviceCase dc(t, t.max_out);
    cuda::SelectWorkspace ws;
    cuda::SelectLaunch l = select_launch();
    l.workspace = &ws;  // the default stream, which time_us's events time
    l.max_pages_per_seq = 8192;
    l.check_errors = false;
    const double us = time_us(20, 200, [&](int) { cuda::extend_kept(dc.args, l); });
    ws.check(nullptr);
    std::printf("extend_kept time (B 1, Hkv 8, 8192 pages, 256 selected): %.2f us per launch\n",
                us);
  }
  return fails;
}
