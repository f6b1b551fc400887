// masskv_gpu_tests append: cuda::append against kv::PagedKVCache::append (the pool, the
// f32 summaries, the count, max ‖v‖), select::BoundStore (the bf16 bound store and W) and, after
// each step, cuda::encode_page_codes and cuda::update_spread against the cache's page codes (after
// every step), bit for bit, over a grid of shapes with tokens crossing pages; then cuda::summarize_pages over
// every page of the same pool (poisoned stores, shuffled page order), the same bits again; the error flag on bad ids and
// non-finite inputs; and the append's time at the benchmark shape.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "append_target.cuh"
#include "gpu_util.cuh"
#include "masskv/cuda/append.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/select/page_bound.hpp"

using namespace masskv;

namespace {

struct AppendCase {
  DType dtype;
  int heads, d, page, batch, steps;
  kv::Layout layout;
};

// Random token values: mostly N(0,1)-ish, some large, some exact zeros and negative zeros, so
// min/max ties, signed zeros and Welford's cancellation all occur.
float token_value(Rng& rng) {
  const int r = rng.below(20);
  if (r == 0) return 0.0f;
  if (r == 1) return -0.0f;
  if (r == 2) return rng.sym(300.0f);
  return rng.sym(2.0f);
}

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

// The GPU's page codes against the CPU cache's (kv::PageCodesView), bit for bit over the
// written slots of every page of `table`: ranges, grid, token-major rows, the channel-major
// copies (a word's unwritten slots masked) and the spread rows.
std::string compare_codes(const kv::PageCodesView& pc, const kv::PageTableStorage& table,
                          const DevBuf<std::uint8_t>& gcodes, const DevBuf<std::uint8_t>& gra,
                          const DevBuf<std::uint8_t>& grb, const DevBuf<float>& ggrid,
                          const DevBuf<std::uint8_t>& gcc, const DevBuf<std::uint8_t>& gcr,
                          const DevBuf<float>& gspread) {
  const std::vector<std::uint8_t> codes = gcodes.download(), ra = gra.download(),
                                  rb = grb.download(), cc = gcc.download(), cr = gcr.download();
  const std::vector<float> grid = ggrid.download(), spread = gspread.download();
  const int H = pc.num_kv_heads, d = pc.head_dim, P = pc.page_size, cb = (d + 3) / 4;
  const int wb = pc.chan_word_bytes();
  const kv::PageTable t = table.table();
  for (int b = 0; b < t.batch(); ++b) {
    const int n = t.num_pages(b);
    for (int lp = 0; lp < n; ++lp) {
      const std::int32_t pg = t.page(b, lp);
      const int count = lp + 1 < n ? P : t.last_page_len[b];
      for (int h = 0; h < H; ++h) {
        const std::size_t ph = static_cast<std::size_t>(pg) * H + h;
        if (!same_bits(&grid[2 * ph], pc.grid + 2 * ph, 2)) return "grid differs";
        if (!same_bits(&ra[ph * d], pc.range_min + ph * d, d) ||
            !same_bits(&rb[ph * d], pc.range_max + ph * d, d))
          return "range codes differ";
        for (int sl = 0; sl < count; ++sl) {
          if (!same_bits(&codes[(ph * P + sl) * cb], pc.row(pg, h, sl), cb))
            return "token-major codes differ";
        }
        for (int ch = 0; ch < d; ++ch) {
          const std::size_t at = (static_cast<std::size_t>(h) * d + ch) * pc.num_pages + pg;
          if (cr[2 * at] != pc.chan_ranges[2 * at] || cr[2 * at + 1] != pc.chan_ranges[2 * at + 1])
            return "channel-major ranges differ";
          for (int w = 0; w < wb; ++w) {
            const int valid = std::min(4, count - 4 * w);
            if (valid <= 0) break;
            const unsigned mask = (1u << (2 * valid)) - 1u;
            if (((cc[at * wb + w] ^ pc.chan_codes[at * wb + w]) & mask) != 0)
              return "channel-major codes differ";
          }
        }
        if (!same_bits(&spread[ph * d], pc.spread_row(pg, h), d)) return "spread row differs";
      }
    }
  }
  return {};
}

// One case: the CPU cache and the GPU arrays take the same tokens; returns a failure reason or
// an empty string.
std::string run_case(const AppendCase& c, std::uint64_t seed) {
  kv::CacheConfig cfg;
  cfg.num_kv_heads = c.heads;
  cfg.head_dim = c.d;
  cfg.page_size = c.page;
  cfg.dtype = c.dtype;
  cfg.layout = c.layout;
  cfg.capacity_pages = c.batch * ((c.steps + c.page - 1) / c.page) + 3;
  cfg.page_codes = true;  // the GPU's encode_page_codes / update_spread are compared too
  kv::PagedKVCache cache(cfg);
  std::vector<kv::SeqId> seqs;
  for (int b = 0; b < c.batch; ++b) seqs.push_back(cache.create());

  const std::size_t slots = static_cast<std::size_t>(cfg.capacity_pages) * c.heads * c.page * c.d;
  const std::size_t sums = static_cast<std::size_t>(cfg.capacity_pages) * c.heads * c.d;
  const std::size_t ph = static_cast<std::size_t>(cfg.capacity_pages) * c.heads;
  DevBuf<std::uint16_t> gk(slots), gv(slots);
  AppendTarget g(cfg.capacity_pages, c.heads, c.d, true);
  // Garbage everywhere first: a fresh page must be reset by the kernel, not found clean.
  const auto poison = [&] {
    for (void* p : {static_cast<void*>(g.min.p), static_cast<void*>(g.max.p),
                    static_cast<void*>(g.mean.p), static_cast<void*>(g.m2.p)})
      CK(cudaMemset(p, 0x5a, sums * sizeof(float)));
    CK(cudaMemset(g.vnorm.p, 0x7f, ph * sizeof(float)));
    CK(cudaMemset(g.count.p, 0x33, cfg.capacity_pages * sizeof(std::int32_t)));
    CK(cudaMemset(g.bmin.p, 0x11, sums * sizeof(std::uint16_t)));
    CK(cudaMemset(g.bmax.p, 0x22, sums * sizeof(std::uint16_t)));
    CK(cudaMemset(g.wmax.p, 0x44, ph * sizeof(float)));
  };
  poison();

  kv::PagedKVView geometry;  // the pool's strides (the cache's own layout rule)
  geometry.num_kv_heads = c.heads;
  geometry.page_size = c.page;
  geometry.head_dim = c.d;
  geometry.set_layout(c.layout);
  cuda::AppendArgs a = g.args(gk.p, gv.p, c.dtype, c.page, geometry.stride_page,
                              geometry.stride_head, geometry.stride_slot);

  Rng rng(seed);
  cuda::AppendWorkspace ws;
  const std::size_t tok = static_cast<std::size_t>(c.batch) * c.heads * c.d;
  DevBuf<float> dk(tok), dv(tok);
  DevBuf<std::int32_t> dpage(c.batch), dslot(c.batch);
  // Page codes on the GPU (cuda::encode_page_codes after each append, cuda::update_spread with
  // the step's page table), in kv::PageCodesView's layout.
  const int cb = (c.d + 3) / 4, wb = (c.page + 3) / 4;
  DevBuf<std::uint8_t> gcodes(ph * c.page * cb), gra(sums), grb(sums),
      gcc(static_cast<std::size_t>(c.heads) * c.d * cfg.capacity_pages * wb), gcr(2 * sums);
  DevBuf<float> ggrid(2 * ph), gspread(sums);
  DevBuf<double> gmean(static_cast<std::size_t>(c.batch) * c.heads * c.d),
      gm2(static_cast<std::size_t>(c.batch) * c.heads * c.d);
  CK(cudaMemset(gmean.p, 0, gmean.n * sizeof(double)));
  CK(cudaMemset(gm2.p, 0, gm2.n * sizeof(double)));
  CK(cudaMemset(gcc.p, 0, gcc.n));
  const cuda::PageCodesStores gpc{gcodes.p, gra.p, grb.p, ggrid.p, gcc.p, gcr.p};
  // The group store refreshed by the append itself (GroupRefresh), groups of 2 pages so that
  // sequences cross groups: sequence b's group i in slot b * max_groups + i. Poisoned first.
  const int group_pages = 2, max_groups = cfg.capacity_pages / group_pages + 2;
  const std::size_t gsz = static_cast<std::size_t>(c.batch) * max_groups * c.heads * c.d;
  DevBuf<std::uint16_t> fused_min(gsz), fused_max(gsz);
  CK(cudaMemset(fused_min.p, 0x33, gsz * 2));
  CK(cudaMemset(fused_max.p, 0x33, gsz * 2));
  const auto group_table = [&](const kv::PageTableStorage& t) {
    std::vector<std::int32_t> ptr{0}, ids;
    for (int b = 0; b < c.batch; ++b) {
      const int ng = (t.table().num_pages(b) + group_pages - 1) / group_pages;
      for (int i = 0; i < ng; ++i) ids.push_back(b * max_groups + i);
      ptr.push_back(static_cast<std::int32_t>(ids.size()));
    }
    return std::pair{ptr, ids};
  };
  for (int t = 0; t < c.steps; ++t) {
    std::vector<float> hk(tok), hv(tok);
    for (float& x : hk) x = token_value(rng);
    for (float& x : hv) x = token_value(rng);
    std::vector<std::int32_t> page(c.batch), slot(c.batch);
    for (int b = 0; b < c.batch; ++b) {
      const std::size_t off = static_cast<std::size_t>(b) * c.heads * c.d;
      cache.append(seqs[b], {hk.data() + off, static_cast<std::size_t>(c.heads) * c.d},
                   {hv.data() + off, static_cast<std::size_t>(c.heads) * c.d}, 1);
      const kv::PageTableStorage one = cache.page_table({&seqs[b], 1});
      page[b] = one.indices.back();
      slot[b] = one.last_page_len[0] - 1;
    }
    dk.upload(hk);
    dv.upload(hv);
    dpage.upload(page);
    dslot.upload(slot);
    a.k = View3<const float>::contiguous(dk.p, c.batch, c.heads, c.d);
    a.v = View3<const float>::contiguous(dv.p, c.batch, c.heads, c.d);
    a.page = {dpage.p, static_cast<std::size_t>(c.batch)};
    a.slot = {dslot.p, static_cast<std::size_t>(c.batch)};
    const kv::PageTableStorage step_table = cache.page_table(seqs);
    DevBuf<std::int32_t> dptr = to_device(step_table.indptr),
                         didx = to_device(step_table.indices),
                         dlast = to_device(step_table.last_page_len);
    const auto [gptr, gids] = group_table(step_table);
    DevBuf<std::int32_t> dgptr = to_device(gptr), dgids = to_device(gids);
    // Every other step refreshes the group store in the append (the steps between leave it
    // stale; the next refresh must still give the right bits: it rebuilds from the pages).
    // A group's last token comes at an odd step (groups hold 2 pages of 16 or 64 tokens).
    a.groups = {};
    if (t % 2 == 1 || t + 1 == c.steps) {
      a.groups.min = reinterpret_cast<bf16*>(fused_min.p);
      a.groups.max = reinterpret_cast<bf16*>(fused_max.p);
      a.groups.slots = c.batch * max_groups;
      a.groups.group_pages = group_pages;
      a.groups.indptr = {dptr.p, dptr.n};
      a.groups.indices = {didx.p, didx.n};
      a.groups.group_indptr = {dgptr.p, dgptr.n};
      a.groups.group_indices = {dgids.p, dgids.n};
    }
    cuda::append(a, ws, nullptr, t + 1 == c.steps);  // the flag is checked once, at the end
    std::vector<std::int32_t> filled(c.batch);
    for (int b = 0; b < c.batch; ++b) filled[b] = slot[b] + 1;
    DevBuf<std::int32_t> dfilled = to_device(filled);
    cuda::encode_page_codes(a, gpc, {dpage.p, dpage.n}, {dfilled.p, dfilled.n}, ws, nullptr,
                            t + 1 == c.steps);
    cuda::update_spread(a, {dptr.p, dptr.n}, {didx.p, didx.n}, {dlast.p, dlast.n}, 1, gmean.p,
                        gm2.p, gspread.p, ws, nullptr, t + 1 == c.steps);
    // After every step: a page's codes change while it fills (its range widens).
    if (std::string why = compare_codes(cache.page_codes(), step_table, gcodes, gra, grb, ggrid,
                                        gcc, gcr, gspread);
        !why.empty())
      return "page codes after step " + std::to_string(t) + ": " + why;
  }
  CK(cudaDeviceSynchronize());

  const kv::PageTableStorage table = cache.page_table(seqs);
  const kv::PagedKVView cv = cache.view(table);
  const kv::SummariesView cs = cache.summaries();
  const select::BoundStore store(cs);
  const select::BoundStoreView bs = store.view();
  const auto* ck = static_cast<const std::uint16_t*>(cv.k);
  const auto* cvv = static_cast<const std::uint16_t*>(cv.v);
  // The GPU's pool and stores against the CPU cache's, bit for bit.
  const auto compare = [&]() -> std::string {
    const std::vector<std::uint16_t> k_pool = gk.download(), v_pool = gv.download();
    const std::vector<float> mn = g.min.download(), mx = g.max.download(),
                             mean = g.mean.download(), m2 = g.m2.download(),
                             vn = g.vnorm.download(), w = g.wmax.download();
    const std::vector<std::int32_t> count = g.count.download();
    const std::vector<std::uint16_t> bmin = g.bmin.download(), bmax = g.bmax.download();
    for (int b = 0; b < c.batch; ++b) {
      for (int lp = 0; lp < table.table().num_pages(b); ++lp) {
        const std::int32_t pg = table.table().page(b, lp);
        if (count[pg] != cs.count[pg]) return "count differs";
        for (int h = 0; h < c.heads; ++h) {
          const std::int64_t s = cs.at(pg, h);
          if (!same_bits(&mn[s], cs.min + s, c.d) || !same_bits(&mx[s], cs.max + s, c.d))
            return "min/max differ";
          if (!same_bits(&mean[s], cs.mean + s, c.d)) return "mean differs";
          if (!same_bits(&m2[s], cs.m2 + s, c.d)) return "M2 differs";
          const std::size_t ph_i = static_cast<std::size_t>(pg) * c.heads + h;
          if (!same_bits(&vn[ph_i], cs.max_vnorm + ph_i, 1)) return "max |v| differs";
          if (!same_bits(&bmin[s], reinterpret_cast<const std::uint16_t*>(bs.min) + s, c.d) ||
              !same_bits(&bmax[s], reinterpret_cast<const std::uint16_t*>(bs.max) + s, c.d))
            return "bf16 bound store differs";
          if (!same_bits(&w[ph_i], bs.wmax + ph_i, 1)) return "bound W differs";
          for (int sl = 0; sl < cs.count[pg]; ++sl) {
            const std::int64_t o = cv.offset(pg, h, sl);
            if (!same_bits(&k_pool[o], ck + o, c.d) || !same_bits(&v_pool[o], cvv + o, c.d))
              return "pool K/V differ";
          }
        }
      }
    }
    return {};
  };
  if (std::string why = compare(); !why.empty()) return why;

  // The groups the appends refreshed against cuda::update_groups over every group, bit for bit
  // (a group's last refresh came with its last token; both read the bound store).
  {
    const auto [gptr, gids] = group_table(table);
    DevBuf<std::int32_t> dptr = to_device(table.indptr), didx = to_device(table.indices),
                         dlast = to_device(table.last_page_len), dgptr = to_device(gptr),
                         dgids = to_device(gids);
    DevBuf<std::uint16_t> ref_min(gsz), ref_max(gsz);
    cuda::GroupUpdateArgs u;
    u.table = {{dptr.p, dptr.n}, {didx.p, didx.n}, {dlast.p, dlast.n}};
    u.pages.min = reinterpret_cast<const bf16*>(g.bmin.p);
    u.pages.max = reinterpret_cast<const bf16*>(g.bmax.p);
    u.pages.num_pages = cfg.capacity_pages;
    u.pages.num_kv_heads = c.heads;
    u.pages.head_dim = c.d;
    u.group_indptr = {dgptr.p, dgptr.n};
    u.group_indices = {dgids.p, dgids.n};
    u.group_min = reinterpret_cast<bf16*>(ref_min.p);
    u.group_max = reinterpret_cast<bf16*>(ref_max.p);
    u.group_slots = c.batch * max_groups;
    u.group_pages = group_pages;
    cuda::SelectWorkspace sw;
    cuda::SelectLaunch launch;
    launch.workspace = &sw;
    launch.max_pages_per_seq = cfg.capacity_pages;
    cuda::update_groups(u, launch);
    const std::vector<std::uint16_t> fmn = fused_min.download(), fmx = fused_max.download(),
                                     rmn = ref_min.download(), rmx = ref_max.download();
    const std::size_t row = static_cast<std::size_t>(c.heads) * c.d;
    for (const std::int32_t slot : gids) {
      if (!same_bits(&fmn[slot * row], &rmn[slot * row], row) ||
          !same_bits(&fmx[slot * row], &rmx[slot * row], row))
        return "the append's group refresh differs from update_groups";
    }
  }

  // update_spread with a count per sequence (a padded batch's step): the spread rows rebuilt
  // from zero moments in two steps, sequence b first its first len - 1 - 5b tokens (page
  // tables cut there; sequence 0 none, sequence 1 all), then the rest; the same rows and
  // moments as the token-by-token run.
  {
    const int P = c.page;
    std::vector<std::int32_t> cut(c.batch), rest(c.batch);
    std::vector<std::int32_t> ptr{0}, idx, last;
    for (int b = 0; b < c.batch; ++b) {
      const int len = static_cast<int>(table.table().length(b, P));
      // Sequence 0 folds nothing in the first call, sequence 1 nothing in the second (a
      // count of 0: a padded batch's row with no token in a step).
      cut[b] = b == 0 ? 0 : b == 1 ? len : std::max(0, len - 1 - 5 * b);
      rest[b] = len - cut[b];
      const int n = std::max(1, (cut[b] + P - 1) / P);  // a sequence keeps >= 1 page
      for (int lp = 0; lp < n; ++lp) idx.push_back(table.table().page(b, lp));
      ptr.push_back(static_cast<std::int32_t>(idx.size()));
      last.push_back(cut[b] == 0 ? 1 : cut[b] - (n - 1) * P);
    }
    DevBuf<double> m0(gmean.n), m2_0(gm2.n);
    CK(cudaMemset(m0.p, 0, m0.n * sizeof(double)));
    CK(cudaMemset(m2_0.p, 0, m2_0.n * sizeof(double)));
    CK(cudaMemset(gspread.p, 0x5a, gspread.n * sizeof(float)));
    DevBuf<std::int32_t> dptr = to_device(ptr), didx = to_device(idx), dlast = to_device(last),
                         dcut = to_device(cut), drest = to_device(rest),
                         fptr = to_device(table.indptr), fidx = to_device(table.indices),
                         flast = to_device(table.last_page_len);
    cuda::update_spread(a, {dptr.p, dptr.n}, {didx.p, didx.n}, {dlast.p, dlast.n}, 0, m0.p,
                        m2_0.p, gspread.p, ws, nullptr, true, {dcut.p, dcut.n});
    cuda::update_spread(a, {fptr.p, fptr.n}, {fidx.p, fidx.n}, {flast.p, flast.n}, 0, m0.p,
                        m2_0.p, gspread.p, ws, nullptr, true, {drest.p, drest.n});
    if (std::string why = compare_codes(cache.page_codes(), table, gcodes, gra, grb, ggrid, gcc,
                                        gcr, gspread);
        !why.empty())
      return "update_spread with counts: " + why;
    if (m0.download() != gmean.download() || m2_0.download() != gm2.download())
      return "update_spread with counts: the moments differ";
  }

  // summarize_pages: every page's stores rebuilt from the pool (as for pages an engine wrote
  // itself) over poisoned stores, in shuffled page order: the same bits again.
  std::vector<std::int32_t> pages, tokens;
  for (const std::int32_t pg : table.indices) {
    pages.push_back(pg);
    tokens.push_back(cs.count[pg]);
  }
  for (std::size_t i = pages.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(rng.below(static_cast<int>(i)));
    std::swap(pages[i - 1], pages[j]);
    std::swap(tokens[i - 1], tokens[j]);
  }
  poison();
  DevBuf<std::int32_t> dpages = to_device(pages), dtokens = to_device(tokens);
  cuda::summarize_pages(a, {dpages.p, dpages.n}, {dtokens.p, dtokens.n}, ws);
  if (std::string why = compare(); !why.empty()) return "summarize_pages: " + why;
  return {};
}

// The flag: bad page / slot ids and non-finite values are reported and not written.
int error_cases() {
  int failures = 0;
  const int H = 2, d = 64, P = 16, pages = 4;
  const std::size_t sums = static_cast<std::size_t>(pages) * H * d;
  DevBuf<std::uint16_t> gk(sums * P), gv(sums * P);
  AppendTarget g(pages, H, d, false);
  CK(cudaMemset(gk.p, 0, sums * P * 2));
  DevBuf<float> dk(H * d), dv(H * d);
  std::vector<float> ones(H * d, 1.0f);
  dk.upload(ones);
  dv.upload(ones);
  DevBuf<std::int32_t> dpage(1), dslot(1);
  cuda::AppendArgs a = g.args(gk.p, gv.p, DType::bf16, P, static_cast<std::int64_t>(H) * P * d,
                              static_cast<std::int64_t>(P) * d, d);
  a.k = View3<const float>::contiguous(dk.p, 1, H, d);
  a.v = View3<const float>::contiguous(dv.p, 1, H, d);
  a.page = {dpage.p, 1};
  a.slot = {dslot.p, 1};
  cuda::AppendWorkspace ws;
  const auto expect = [&](int page, int slot, int head, float kval, ErrorCode code,
                          const char* arg) {
    dpage.upload(&page, 1);
    dslot.upload(&slot, 1);
    std::vector<float> k(H * d, 1.0f);
    k[head * d + 5] = kval;
    dk.upload(k);
    try {
      cuda::append(a, ws);
      std::printf("FAIL append error case page=%d slot=%d k=%g: no error\n", page, slot, kval);
      ++failures;
    } catch (const Error& e) {
      if (e.code() != code || e.argument() != arg) {
        std::printf("FAIL append error case: got %s\n", e.what());
        ++failures;
      }
    }
  };
  expect(pages, 0, 0, 1.0f, ErrorCode::out_of_range, "page");
  expect(-1, 0, 0, 1.0f, ErrorCode::out_of_range, "page");
  expect(0, P, 0, 1.0f, ErrorCode::out_of_range, "slot");
  expect(0, 0, 0, NAN, ErrorCode::non_finite, "k");
  expect(0, 0, 1, INFINITY, ErrorCode::non_finite, "k");  // a bad value on another head
  expect(0, 0, 1, 3.5e38f, ErrorCode::non_finite, "k");   // finite f32 that overflows bf16
  // Every call above was rejected: the pool is untouched (it was zeroed).
  for (std::uint16_t x : gk.download()) {
    if (x != 0) {
      std::printf("FAIL append: a rejected token was written\n");
      ++failures;
      break;
    }
  }
  // summarize_pages: a page outside the pool, token counts outside [1, page_size], a stored
  // NaN (that page's stores are left as they were).
  const auto expect_sum = [&](int page, int tokens, ErrorCode code, const char* arg) {
    DevBuf<std::int32_t> dp = to_device(std::vector<std::int32_t>{page});
    DevBuf<std::int32_t> dt = to_device(std::vector<std::int32_t>{tokens});
    try {
      cuda::summarize_pages(a, {dp.p, 1}, {dt.p, 1}, ws);
      std::printf("FAIL summarize_pages page=%d tokens=%d: no error\n", page, tokens);
      ++failures;
    } catch (const Error& e) {
      if (e.code() != code || e.argument() != arg) {
        std::printf("FAIL summarize_pages error case: got %s\n", e.what());
        ++failures;
      }
    }
  };
  expect_sum(pages, 1, ErrorCode::out_of_range, "page");
  expect_sum(0, 0, ErrorCode::out_of_range, "tokens");
  expect_sum(0, P + 1, ErrorCode::out_of_range, "tokens");
  const std::int32_t marker = 777;
  CK(cudaMemcpy(g.count.p + 1, &marker, sizeof marker, cudaMemcpyHostToDevice));
  const std::uint16_t nan_bits = 0x7fc0;  // bf16 NaN, page 1, kv head 1, slot 0, channel 3
  CK(cudaMemcpy(gk.p + static_cast<std::size_t>(H) * P * d + static_cast<std::size_t>(P) * d + 3,
                &nan_bits, sizeof nan_bits, cudaMemcpyHostToDevice));
  expect_sum(1, 1, ErrorCode::non_finite, "k");
  std::int32_t after = 0;
  CK(cudaMemcpy(&after, g.count.p + 1, sizeof after, cudaMemcpyDeviceToHost));
  if (after != marker) {
    std::printf("FAIL summarize_pages: a page with a stored NaN had its stores rewritten\n");
    ++failures;
  }
  // The group refresh: a page table that does not end at the appended page (flagged on the
  // device), and group stores without the bound store (refused on the host).
  {
    AppendTarget gb(pages, H, d, true);
    cuda::AppendArgs b = gb.args(gk.p, gv.p, DType::bf16, P, static_cast<std::int64_t>(H) * P * d,
                                 static_cast<std::int64_t>(P) * d, d);
    b.k = a.k;
    b.v = a.v;
    b.page = a.page;
    b.slot = a.slot;
    const std::int32_t zero = 0;
    dpage.upload(&zero, 1);
    dslot.upload(&zero, 1);
    dk.upload(ones);
    DevBuf<std::uint16_t> gm(static_cast<std::size_t>(2) * H * d), gx(gm.n);
    DevBuf<std::int32_t> ptr = to_device(std::vector<std::int32_t>{0, 2}),
                         idx = to_device(std::vector<std::int32_t>{0, 1}),
                         gptr = to_device(std::vector<std::int32_t>{0, 1}),
                         gidx = to_device(std::vector<std::int32_t>{0});
    b.groups.min = reinterpret_cast<bf16*>(gm.p);
    b.groups.max = reinterpret_cast<bf16*>(gx.p);
    b.groups.slots = 2;
    b.groups.indptr = {ptr.p, ptr.n};
    b.groups.indices = {idx.p, idx.n};
    b.groups.group_indptr = {gptr.p, gptr.n};
    b.groups.group_indices = {gidx.p, gidx.n};
    const auto expect_group = [&](const cuda::AppendArgs& args, ErrorCode code, const char* arg) {
      try {
        cuda::append(args, ws);
        std::printf("FAIL append group refresh: no error (%s)\n", arg);
        ++failures;
      } catch (const Error& e) {
        if (e.code() != code || e.argument() != arg) {
          std::printf("FAIL append group refresh: got %s\n", e.what());
          ++failures;
        }
      }
    };
    expect_group(b, ErrorCode::out_of_range, "group_indices");  // the table ends at page 1
    cuda::AppendArgs no_bounds = a;
    no_bounds.groups = b.groups;
    expect_group(no_bounds, ErrorCode::invalid_argument, "groups");
    CK(cudaMemset(gk.p, 0, sums * P * 2));  // the pool stays untouched for the check below
  }
  // Host-side shape errors.
  try {
    cuda::AppendArgs bad = a;
    bad.head_dim = 512;
    cuda::append(bad, ws);
    std::printf("FAIL append: head_dim 512 accepted\n");
    ++failures;
  } catch (const Error& e) {
    if (e.argument() != "head_dim") {
      std::printf("FAIL append: head_dim 512 gave %s\n", e.what());
      ++failures;
    }
  }
  return failures;
}

// The append's time at the decode benchmark's shape (Hkv 8, d 128, bf16, page 16), with the
// bound store: one launch per step, so it is mostly launch latency.
void append_timing() {
  for (int B : {1, 16}) {
    const int H = 8, d = 128, P = 16, pages = 64 * B;
    const std::size_t sums = static_cast<std::size_t>(pages) * H * d;
    DevBuf<std::uint16_t> gk(sums * P), gv(sums * P);
    AppendTarget g(pages, H, d, true);
    DevBuf<std::int32_t> dpage(B), dslot(B);
    DevBuf<float> dk(static_cast<std::size_t>(B) * H * d), dv(static_cast<std::size_t>(B) * H * d);
    CK(cudaMemset(dk.p, 0, dk.n * sizeof(float)));
    CK(cudaMemset(dv.p, 0, dv.n * sizeof(float)));
    std::vector<std::int32_t> page(B);
    for (int b = 0; b < B; ++b) page[b] = b * 64;
    dpage.upload(page);
    cuda::AppendArgs a = g.args(gk.p, gv.p, DType::bf16, P, static_cast<std::int64_t>(H) * P * d,
                                static_cast<std::int64_t>(P) * d, d);
    a.k = View3<const float>::contiguous(dk.p, B, H, d);
    a.v = View3<const float>::contiguous(dv.p, B, H, d);
    a.page = {dpage.p, static_cast<std::size_t>(B)};
    a.slot = {dslot.p, static_cast<std::size_t>(B)};
    cuda::AppendWorkspace ws;
    std::vector<std::int32_t> slot(B, 0);
    dslot.upload(slot);
    const double us = time_us(20, 200, [&](int) { cuda::append(a, ws, nullptr, false); });
    ws.check(nullptr);
    std::printf("append B=%2d Hkv=8 d=128 bf16 (+ bf16 bound store): %.1f us per step\n", B, us);
  }
}

}  // namespace

int run_append_check() {
  std::vector<AppendCase> cases;
  for (DType dt : {DType::bf16, DType::f16})
    for (int h : {1, 3, 8})
      for (int d : {64, 100, 128, 256})
        for (int page : {16, 64})
          for (kv::Layout lay : {kv::Layout::HND, kv::Layout::NHD})
            cases.push_back({dt, h, d, page, h == 3 ? 5 : 2, page + 37, lay});
  std::printf(
      "append check: %zu cases (bf16/f16, kv heads 1/3/8, d 64/100/128/256, pages 16/64, "
      "HND/NHD, 2-5 sequences, tokens crossing pages) vs PagedKVCache::append + "
      "BoundStore, bit for bit\n",
      cases.size());
  int failures = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const AppendCase& c = cases[i];
    const std::string why = run_case(c, 77 + i);
    if (!why.empty()) {
      ++failures;
      std::printf("FAIL append %s H=%d d=%d page=%d B=%d %s: %s\n",
                  std::string(to_string(c.dtype)).c_str(), c.heads, c.d, c.page, c.batch,
                  c.layout == kv::Layout::HND ? "HND" : "NHD", why.c_str());
    }
  }
  failures += error_cases();
  std::printf("append check: %d failure(s)\n", failures);
  append_timing();
  return failures;
}
