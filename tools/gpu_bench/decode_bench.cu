// masskv_gpu_bench bench OUT.json: dense and sparse decode (and selection) timed against cuDNN-free
// floors: an empty kernel and a read-only bandwidth kernel.
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

#include "append_target.cuh"
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
#include "two_stage_bench.hpp"
#include "compact_stores.cuh"
#include "gpu_bench.hpp"

using namespace masskv;

namespace {

// ---- benchmark -----------------------------------------------------------------------------

// The launch floor: a kernel that does nothing (timed in a CUDA graph like the steps).
__global__ void empty_kernel() {}

// Read-only ceiling: every byte read once with 16-byte loads, four in flight per thread.
__global__ void read_kernel(const uint4* p, std::size_t n, unsigned* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
          d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads alive
}

// Key min/max per (page, kv head) for the CPU Quest selector (f32, [page][head][d]).
__global__ void summaries_kernel(const std::uint16_t* k, int heads, int page, int d, float* mn,
                                 float* mx) {
  const int pg = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
  const std::uint16_t* base = k + ((static_cast<std::size_t>(pg) * heads + h) * page) * d + c;
  float lo = INFINITY, hi = -INFINITY;
  for (int s = 0; s < page; ++s) {
    const float x = __uint_as_float(static_cast<unsigned>(base[s * d]) << 16);
    lo = fminf(lo, x);
    hi = fmaxf(hi, x);
  }
  const std::size_t o = (static_cast<std::size_t>(pg) * heads + h) * d + c;
  mn[o] = lo;
  mx[o] = hi;
}

// Page moments of the bf16 keys (the Gaussian-τ rows): per (page, head, channel) the mean and
// M2 over the page's slots, two passes in f64, stored f32 (the cache's Welford state, to
// rounding).
__global__ void moments_kernel(const std::uint16_t* k, int heads, int page, int d, float* mean,
                               float* m2) {
  const int pg = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
  const std::uint16_t* base = k + ((static_cast<std::size_t>(pg) * heads + h) * page) * d + c;
  double sum = 0;
  for (int s = 0; s < page; ++s) sum += __uint_as_float(static_cast<unsigned>(base[s * d]) << 16);
  const double mu = sum / page;
  double acc = 0;
  for (int s = 0; s < page; ++s) {
    const double x = __uint_as_float(static_cast<unsigned>(base[s * d]) << 16) - mu;
    acc += x * x;
  }
  const std::size_t o = (static_cast<std::size_t>(pg) * heads + h) * d + c;
  mean[o] = static_cast<float>(mu);
  m2[o] = static_cast<float>(acc);
}

constexpr int kLayers = 8;  // the "_layers_graph" rows: steps per graph

struct Row {
  std::string kind;
  int ctx, batch, budget;
  double us, bytes;
  double cpu_select_ms = 0;  // CPU Quest selection time of the step (not in us), when known
  // Selection rows of the 8-bit and hierarchical selectors: recall of the flat bf16 GPU
  // selection's pages and the fraction of identical lists (-1: not a selection row).
  double recall = -1, identical = -1;
  int hq = 32;  // q heads (Hkv = 8, d = 128 throughout)
};


// Writes the rows measured so far (the bench rewrites the file after every shape, so a crash
// keeps what was measured before it).
bool write_rows(const char* json_path, const cudaDeviceProp& prop, const std::vector<Row>& rows) {
  FILE* f = std::fopen(json_path, "w");
  if (!f) {
    std::perror(json_path);
    return false;
  }
  std::fprintf(f, "{\"device\": \"%s\", \"sms\": %d, \"rows\": [\n", prop.name,
               prop.multiProcessorCount);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "  {\"kind\": \"%s\", \"ctx\": %d, \"batch\": %d, \"budget\": %d, "
                 "\"us\": %.3f, \"bytes\": %.0f, \"cpu_select_ms\": %.4f, \"recall\": %.5f, "
                 "\"identical\": %.5f, \"hq\": %d}%s\n",
                 r.kind.c_str(), r.ctx, r.batch, r.budget, r.us, r.bytes, r.cpu_select_ms, r.recall,
                 r.identical, r.hq, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
  return true;
}

}  // namespace

int run_bench(const char* json_path) {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  const int Hkv = 8, d = 128, P = 16;  // Hq per shape: 32, and 64 (group 8) at two contexts
  const int kIters = 100, kWarm = 10;
  // 2M tokens (8.6 GB of K and V): the largest shape, 16 sequences of 128K, in one cache.
  const int pool_pages = (1 << 21) / P;
  const std::size_t elems = static_cast<std::size_t>(pool_pages) * Hkv * P * d;
  DevBuf<std::uint16_t> K(elems), V(elems);
  fill_kernel<<<4096, 256>>>(K.p, elems, 1, 2.f);
  fill_kernel<<<4096, 256>>>(V.p, elems, 1ull << 40, 1.f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  std::vector<Row> rows;
  // Ceiling: read K and V once (4.29 GB).
  {
    DevBuf<unsigned> sink(1);
    const std::size_t n16 = elems * 2 / 16;
    const int grid = prop.multiProcessorCount * 8;
    const double us = time_us(3, 20, [&](int i) {
      read_kernel<<<grid, 512>>>(reinterpret_cast<const uint4*>(i % 2 ? V.p : K.p), n16, sink.p);
    });
    const double us2 = time_us(2, 10, [&](int) {
      read_kernel<<<grid, 512>>>(reinterpret_cast<const uint4*>(K.p), n16, sink.p);
      read_kernel<<<grid, 512>>>(reinterpret_cast<const uint4*>(V.p), n16, sink.p);
    });
    rows.push_back({"ceiling_read", 0, 0, 0, us, static_cast<double>(elems) * 2});
    rows.push_back({"ceiling_read_KV", 0, 0, 0, us2, static_cast<double>(elems) * 4});
    CK(cudaGetLastError());
  }
  // The launch floor of a step timed this way: one, two and four empty kernels in a row in one
  // CUDA graph (what a step of that many launches costs before it moves a byte).
  for (const int kernels : {1, 2, 4}) {
    const double us = time_graph_us(1, kWarm, kIters, [&](int, cudaStream_t st) {
      for (int k = 0; k < kernels; ++k) empty_kernel<<<1, 32, 0, st>>>();
    });
    rows.push_back({"floor_graph_" + std::to_string(kernels), 0, 0, 0, us, 0});
    std::printf("launch floor: %d empty kernel(s) in one CUDA graph %.1f us\n", kernels, us);
  }

  // Summaries of the whole pool for the CPU Quest selector (selection time not measured).
  std::vector<float> smin, smax;
  {
    const std::size_t n = static_cast<std::size_t>(pool_pages) * Hkv * d;
    DevBuf<float> mn(n), mx(n);
    summaries_kernel<<<dim3(pool_pages, Hkv), d>>>(K.p, Hkv, P, d, mn.p, mx.p);
    CK(cudaGetLastError());
    smin = mn.download();
    smax = mx.download();
  }
  std::vector<float> smean, sm2;
  std::vector<std::int32_t> scount(static_cast<std::size_t>(pool_pages), P);
  {
    const std::size_t n = static_cast<std::size_t>(pool_pages) * Hkv * d;
    DevBuf<float> mu(n), m2(n);
    moments_kernel<<<dim3(pool_pages, Hkv), d>>>(K.p, Hkv, P, d, mu.p, m2.p);
    CK(cudaGetLastError());
    smean = mu.download();
    sm2 = m2.download();
  }
  // The page moments on the device (the top-p rows read them).
  DevBuf<float> d_mean = to_device(smean), d_m2 = to_device(sm2);
  DevBuf<std::int32_t> d_count = to_device(scount);
  kv::SummariesView dsumm;
  dsumm.mean = d_mean.p;
  dsumm.m2 = d_m2.p;
  dsumm.count = d_count.p;
  dsumm.num_pages = pool_pages;
  dsumm.num_kv_heads = Hkv;
  dsumm.head_dim = d;
  kv::SummariesView summ;
  summ.min = smin.data();
  summ.max = smax.data();
  summ.mean = smean.data();
  summ.m2 = sm2.data();
  summ.count = scount.data();
  summ.num_pages = pool_pages;
  summ.num_kv_heads = Hkv;
  summ.head_dim = d;
  // The outward-rounded bf16 store the GPU selector reads (the summaries of bf16 keys are
  // bf16 values, so the rounding is exact here and CPU and GPU rank the same bounds).
  select::BoundStoreView dstore;
  DevBuf<std::uint16_t> store_min, store_max;
  const select::BoundStore store(summ);  // kept: the group stores are built from it
  {
    const select::BoundStoreView hv = store.view();
    const std::size_t n = static_cast<std::size_t>(pool_pages) * Hkv * d;
    store_min = DevBuf<std::uint16_t>(n);
    store_max = DevBuf<std::uint16_t>(n);
    store_min.upload(reinterpret_cast<const std::uint16_t*>(hv.min), n);
    store_max.upload(reinterpret_cast<const std::uint16_t*>(hv.max), n);
    dstore = hv;
    dstore.min = reinterpret_cast<const bf16*>(store_min.p);
    dstore.max = reinterpret_cast<const bf16*>(store_max.p);
    dstore.wmax = nullptr;
  }
  // The 8-bit store of the same summaries.
  const Store8Gpu store8 = upload_store8(select::BoundStore8(summ).view());
  cuda::SelectWorkspace sws;
  // The whole-step rows' append: the step's token goes into its sequence's last page, its
  // summaries and a scratch bf16 bound store (the selector keeps reading `dstore`, equal to
  // the CPU's summaries, so the selection the other rows compare is unchanged).
  AppendTarget app(pool_pages, Hkv, d, true);
  cuda::AppendWorkspace aws;
  constexpr int kMaxBatch = 16;
  DevBuf<float> app_k(static_cast<std::size_t>(kMaxBatch) * Hkv * d), app_v(app_k.n);
  CK(cudaMemset(app_k.p, 0, app_k.n * sizeof(float)));
  CK(cudaMemset(app_v.p, 0, app_v.n * sizeof(float)));
  const std::int64_t pool_stride_page = static_cast<std::int64_t>(Hkv) * P * d;

  cuda::DecodeWorkspace ws;
  Rng rng(42);
  struct Shape {
    int ctx, batch, hq = 32;
  };
  const Shape shapes[] = {{1024, 1},      {32768, 1},      {131072, 1},
                          {524288, 1},    {1048576, 1},    {32768, 16},
                          {131072, 16},   {131072, 1, 64}, {1048576, 1, 64}};
  for (const Shape& sh : shapes) {
    const int Hq = sh.hq;
    const std::size_t first_row = rows.size();  // this shape's rows get hq below
    std::printf("-- ctx=%d B=%d Hq=%d Hkv=%d d=%d\n", sh.ctx, sh.batch, Hq, Hkv, d);
    const int pages = sh.ctx / P;
    const double kv_bytes = static_cast<double>(sh.batch) * sh.ctx * Hkv * d * 2 * 2;
    const int rot = kv_bytes < 400e6 ? 8 : 1;  // rotate layer-sized caches past the L2
    const int seq_pages = pages * sh.batch;
    if (seq_pages * rot > pool_pages) {
      std::printf("skip ctx=%d B=%d: pool too small\n", sh.ctx, sh.batch);
      continue;
    }
    // Tables: rotation r owns pool pages [r * seq_pages, (r+1) * seq_pages), shuffled.
    std::vector<std::vector<std::int32_t>> indices(rot), indptr(rot), last(rot);
    std::vector<DevBuf<std::int32_t>> d_indices, d_indptr, d_last;
    // Queries rotate over kQRot vectors whatever `rot` is: a sparse step's selection follows
    // its q, so rotating q rotates the selected pages too (a budget of 8192 tokens is 34 MB of
    // KV, inside the 50 MB L2: one fixed selection would be served from L2).
    constexpr int kQRot = 8;
    std::vector<std::vector<float>> qh(kQRot);
    std::vector<DevBuf<float>> d_q, d_out, d_lse;
    for (int r = 0; r < kQRot; ++r) {
      qh[r].resize(static_cast<std::size_t>(sh.batch) * Hq * d);
      for (float& x : qh[r]) x = rng.sym(3.f);
      d_q.push_back(to_device(qh[r]));
      d_out.emplace_back(qh[r].size());
      d_lse.emplace_back(static_cast<std::size_t>(sh.batch) * Hq);
    }
    for (int r = 0; r < rot; ++r) {
      indices[r].resize(seq_pages);
      std::iota(indices[r].begin(), indices[r].end(), r * seq_pages);
      for (int i = seq_pages - 1; i > 0; --i)
        std::swap(indices[r][i], indices[r][rng.below(i + 1)]);
      for (int b = 0; b <= sh.batch; ++b) indptr[r].push_back(b * pages);
      last[r].assign(sh.batch, P);
      const kv::PagedKVView hv =
          bf16_hnd_pool(K.p, V.p, pool_pages, Hkv, P, d, {indptr[r], indices[r], last[r]});
      hv.validate();  // host-side validation where the table is built
      d_indices.push_back(to_device(indices[r]));
      d_indptr.push_back(to_device(indptr[r]));
      d_last.push_back(to_device(last[r]));
    }
    // The step's token slot per table: each sequence's last page, its last slot.
    std::vector<DevBuf<std::int32_t>> d_app_page;
    DevBuf<std::int32_t> d_app_slot = to_device(std::vector<std::int32_t>(sh.batch, P - 1));
    for (int r = 0; r < rot; ++r) {
      std::vector<std::int32_t> lastp(sh.batch);
      for (int b = 0; b < sh.batch; ++b) lastp[b] = indices[r][(b + 1) * pages - 1];
      d_app_page.push_back(to_device(lastp));
    }
    const auto append_args = [&](int r) {
      cuda::AppendArgs aa =
          app.args(K.p, V.p, DType::bf16, P, pool_stride_page, static_cast<std::int64_t>(P) * d, d);
      aa.k = View3<const float>::contiguous(app_k.p, sh.batch, Hkv, d);
      aa.v = View3<const float>::contiguous(app_v.p, sh.batch, Hkv, d);
      aa.page = {d_app_page[r % rot].p, static_cast<std::size_t>(sh.batch)};
      aa.slot = {d_app_slot.p, static_cast<std::size_t>(sh.batch)};
      return aa;
    };
    // Step r: page table r % rot, query r % kQRot.
    auto args_for = [&](int r) {
      const int t = r % rot;
      r %= kQRot;
      attn::DecodeArgs a;
      a.q = View3<const float>::contiguous(d_q[r].p, sh.batch, Hq, d);
      a.cache = bf16_hnd_pool(K.p, V.p, pool_pages, Hkv, P, d,
                              {{d_indptr[t].p, d_indptr[t].n},
                               {d_indices[t].p, d_indices[t].n},
                               {d_last[t].p, d_last[t].n}});
      a.out = View3<float>::contiguous(d_out[r].p, sh.batch, Hq, d);
      a.lse_or_tau = {d_lse[r].p, d_lse[r].n};
      return a;
    };
    cuda::DecodeLaunch launch;
    launch.workspace = &ws;
    launch.max_pages_per_seq = pages;
    launch.check_errors = false;
    // Median µs of decode(args(step % n_rot)): plain launches, and replayed from CUDA graphs.
    const auto time_decode = [&](int n_rot, const auto& args) {
      const double plain =
          time_us(kWarm, kIters, [&](int i) { cuda::decode(args(i % n_rot), launch); });
      ws.check(nullptr);
      const double graph = time_graph_us(n_rot, kWarm, kIters, [&](int r, cudaStream_t st) {
        cuda::DecodeLaunch l = launch;
        l.stream = st;
        cuda::decode(args(r), l);
      });
      ws.check(nullptr);
      return std::pair<double, double>{plain, graph};
    };
    const auto [us, gus] = time_decode(rot, args_for);
    rows.push_back({"ours_dense_graph", sh.ctx, sh.batch, 0, gus, kv_bytes});
    if (sh.batch == 1 && Hq == 32) {  // per layer in a kLayers-layer graph (cuDNN: torch_peer)
      const double lus = time_layers_graph_us(kLayers, kWarm, kIters, [&](int r, cudaStream_t st) {
        cuda::DecodeLaunch l = launch;
        l.stream = st;
        cuda::decode(args_for(r % rot), l);
      });
      ws.check(nullptr);
      rows.push_back({"ours_dense_layers_graph", sh.ctx, sh.batch, 0, lus, kv_bytes});
      std::printf("dense  ctx=%7d B=%2d: per layer in a %d-layer graph %.1f us\n", sh.ctx,
                  sh.batch, kLayers, lus);
    }
    const int cp = cuda::planned_chunk_pages(DType::bf16, d, sh.batch, Hkv, Hq, pages);
    std::printf(
        "dense  ctx=%7d B=%2d rot=%d chunk_pages(plan)=%d: %9.1f us  %7.1f GB/s "
        "(graph %.1f us)\n",
        sh.ctx, sh.batch, rot, cp, us, kv_bytes / us / 1e3, gus);
    rows.push_back({"ours_dense", sh.ctx, sh.batch, 0, us, kv_bytes});
    if (sh.batch == 1 && sh.ctx >= 131072) {
      // Smaller chunks than planned (several waves of CTAs): whether the tail of one wave
      // (CTAs that finish late) costs more than the extra partials and launches.
      for (int waves : {2, 4}) {
        launch.chunk_pages = std::max(8, (cp + waves - 1) / waves);
        const auto [wus, wgus] = time_decode(rot, args_for);
        std::printf(
            "dense  ctx=%7d B=%2d chunk_pages=%d (%d x planned chunks): %9.1f us "
            "(graph %.1f us), planned / this %.3f\n",
            sh.ctx, sh.batch, launch.chunk_pages, waves, wus, wgus, us / wus);
        rows.push_back({"ours_dense_chunks_x" + std::to_string(waves) + "_graph", sh.ctx, sh.batch,
                        0, wgus, kv_bytes});
      }
      launch.chunk_pages = 0;
    }
    {  // The SIMT softmax kernel side by side (the automatic choice is the tensor-core one).
      launch.kernel = cuda::DecodeLaunch::Kernel::simt;
      const auto [sus, sgus] = time_decode(rot, args_for);
      launch.kernel = cuda::DecodeLaunch::Kernel::automatic;
      std::printf("dense SIMT kernel ctx=%7d B=%2d: %9.1f us  %7.1f GB/s (graph %.1f us)\n", sh.ctx,
                  sh.batch, sus, kv_bytes / sus / 1e3, sgus);
      rows.push_back({"ours_dense_simt", sh.ctx, sh.batch, 0, sus, kv_bytes});
      rows.push_back({"ours_dense_simt_graph", sh.ctx, sh.batch, 0, sgus, kv_bytes});
    }

    // 1.5-entmax, dense. Bytes: K only (V is read at the support rows alone, a few per head
    // with these random scores), so GB/s is a lower bound of what moved.
    const auto ent_args = [&](int r) {
      attn::DecodeArgs a = args_for(r);
      a.mapping = Mapping::entmax(kBenchAlpha);
      return a;
    };
    const auto [eus, egus] = time_decode(rot, ent_args);
    std::printf("entmax dense ctx=%7d B=%2d: %9.1f us (graph %.1f us), softmax %.1f us: %.2fx\n",
                sh.ctx, sh.batch, eus, egus, us, eus / us);
    rows.push_back({"ours_entmax_dense", sh.ctx, sh.batch, 0, eus, kv_bytes / 2});
    rows.push_back({"ours_entmax_dense_graph", sh.ctx, sh.batch, 0, egus, kv_bytes / 2});

    // Sparse, kQRot steps in rotation (query r, table r % rot), per budget:
    //  - CPU Quest selection (f32 summaries) computed and uploaded beforehand: decode only;
    //  - GPU Quest selection (bf16 store) + decode in the step, plain and CUDA-graph captured;
    //  - the GPU selection alone, and its scoring kernel alone.
    const double summary_bytes = static_cast<double>(sh.batch) * pages * Hkv * d * 2 * 2;
    // MASSKV_BENCH_COMPACT=0 leaves out the rows past the flat Quest ones (top-k alone, 8-bit,
    // hierarchical, entmax-aware, top-p).
    static const bool compact_rows = [] {
      const char* e = std::getenv("MASSKV_BENCH_COMPACT");
      return e == nullptr || std::string(e) != "0";
    }();
    static const bool fused_rows = bench_fused_rows();
    // Their group stores (groups of 16 pages) and moment stores (64 pages), one per page
    // table: the same for every budget.
    constexpr int kMomentPages = 64;
    std::vector<GroupGpu> groups;
    std::vector<MomentGpu> mgpu;
    for (int t = 0; compact_rows && t < rot; ++t) {
      const kv::PageTable table{indptr[t], indices[t], last[t]};
      groups.push_back(upload_groups(select::GroupStore(store.view(), table, 16)));
      mgpu.push_back(upload_moments(select::MomentStore(summ, table, kMomentPages)));
    }
    for (int budget : {2048, 4096, 8192}) {
      select::TopkPolicy pol;
      pol.budget_pages = budget / P;
      pol.sink_pages = 1;
      pol.window_tokens = 0;
      std::vector<SelectionStorage> sels(kQRot);
      std::vector<DevBuf<std::int32_t>> s_ids, s_cnt;
      std::vector<SelectionView> svs(kQRot);
      double sel_pages = 0;
      const auto ts = std::chrono::steady_clock::now();
      for (int r = 0; r < kQRot; ++r) {
        const int t = r % rot;
        select::QuestArgs qa;
        qa.q = View3<const float>::contiguous(qh[r].data(), sh.batch, Hq, d);
        qa.table = {indptr[t], indices[t], last[t]};
        qa.page_size = P;
        qa.summaries = &summ;
        qa.policy = pol;
        select::quest_select(qa, sels[r]);
        for (int c : sels[r].count) sel_pages += c;
        s_ids.push_back(to_device(sels[r].ids));
        s_cnt.push_back(to_device(sels[r].count));
      }
      const double sel_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count() /
          kQRot;
      for (int r = 0; r < kQRot; ++r)
        svs[r] = {SelectionView::Unit::page, sels[r].batch,
                  sels[r].num_kv_heads,      sels[r].max_per_head,
                  {s_ids[r].p, s_ids[r].n},  {s_cnt[r].p, s_cnt[r].n}};
      const double bytes = sel_pages / kQRot * P * d * 2 * 2;
      const auto sparse_args = [&](int r, bool entmax) {
        attn::DecodeArgs a = entmax ? ent_args(r) : args_for(r);
        a.selection = &svs[r % kQRot];
        return a;
      };
      const auto [sus, sgus] = time_decode(kQRot, [&](int r) { return sparse_args(r, false); });
      std::printf(
          "sparse ctx=%7d B=%2d budget=%5d: %9.1f us  %7.1f GB/s (graph %.1f us; CPU Quest "
          "select %.2f ms, not in the time)\n",
          sh.ctx, sh.batch, budget, sus, bytes / sus / 1e3, sgus, sel_ms);
      Row cpu_row{"ours_sparse_quest_cpu_sel", sh.ctx, sh.batch, budget, sus, bytes, sel_ms};
      rows.push_back(cpu_row);
      cpu_row.kind = "ours_sparse_quest_cpu_sel_graph";
      cpu_row.us = sgus;
      rows.push_back(cpu_row);

      // 1.5-entmax on the same selections (decode only; K bytes, as the dense entmax rows).
      const auto [esus, esgus] = time_decode(kQRot, [&](int r) { return sparse_args(r, true); });
      std::printf(
          "entmax sparse ctx=%7d B=%2d budget=%5d: %9.1f us (graph %.1f us); softmax %.1f us "
          "(graph %.1f): %.2fx (graph %.2fx)\n",
          sh.ctx, sh.batch, budget, esus, esgus, sus, sgus, esus / sus, esgus / sgus);
      rows.push_back(
          {"ours_entmax_sparse_quest_cpu_sel", sh.ctx, sh.batch, budget, esus, bytes / 2, sel_ms});
      rows.push_back({"ours_entmax_sparse_quest_cpu_sel_graph", sh.ctx, sh.batch, budget, esgus,
                      bytes / 2, sel_ms});
      {  // The split-K entmax path (three kernels) on the same selections, side by side.
        launch.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::split;
        const auto [xus, xgus] = time_decode(kQRot, [&](int r) { return sparse_args(r, true); });
        launch.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::automatic;
        std::printf(
            "entmax sparse split-K ctx=%7d B=%2d budget=%5d: %9.1f us (graph %.1f us); "
            "automatic (cluster) / split-K %.2f (graph %.2f)\n",
            sh.ctx, sh.batch, budget, xus, xgus, esus / xus, esgus / xgus);
        rows.push_back({"ours_entmax_sparse_split_quest_cpu_sel", sh.ctx, sh.batch, budget, xus,
                        bytes / 2, sel_ms});
        rows.push_back({"ours_entmax_sparse_split_quest_cpu_sel_graph", sh.ctx, sh.batch, budget,
                        xgus, bytes / 2, sel_ms});
      }

      // GPU selection into per-rotation device lists, consumed by the same decode.
      const int cap = cuda::select_capacity(pages, P, pol);
      DeviceLists glists(kQRot, sh.batch, Hkv, cap);
      auto& g_ids = glists.ids;
      auto& g_cnt = glists.count;
      auto& gsv = glists.views;
      auto sel_args = [&](int r) {
        const int t = r % rot;
        r %= kQRot;
        cuda::QuestSelectArgs sa;
        sa.q = View3<const float>::contiguous(d_q[r].p, sh.batch, Hq, d);
        sa.table = {{d_indptr[t].p, d_indptr[t].n},
                    {d_indices[t].p, d_indices[t].n},
                    {d_last[t].p, d_last[t].n}};
        sa.page_size = P;
        sa.bounds = dstore;
        sa.policy = pol;
        sa.max_per_head = cap;
        sa.ids = {g_ids[r].p, g_ids[r].n};
        sa.count = {g_cnt[r].p, g_cnt[r].n};
        return sa;
      };
      cuda::SelectLaunch sl = select_launch();
      sl.workspace = &sws;
      sl.max_pages_per_seq = pages;
      sl.check_errors = false;
      // Same selection as the CPU's? (bf16-exact summaries: expected identical.)
      int same = 0;
      for (int r = 0; r < kQRot; ++r) {
        cuda::quest_select(sel_args(r), sl);
        sws.check(nullptr);
        const auto ids = g_ids[r].download();
        const auto cnt = g_cnt[r].download();
        bool eq = cnt == sels[r].count;
        for (int b = 0; eq && b < sh.batch; ++b)
          for (int h = 0; eq && h < Hkv; ++h) {
            const auto l = sels[r].view().list(b, h);
            eq = std::equal(l.begin(), l.end(), ids.begin() + (b * Hkv + h) * cap);
          }
        same += eq;
      }
      const double gsel_us =
          time_us(kWarm, kIters, [&](int i) { cuda::quest_select(sel_args(i), sl); });
      const double gscore_us =
          time_us(kWarm, kIters, [&](int i) { cuda::quest_score(sel_args(i), sl); });
      sws.check(nullptr);
      const double gus_plain = time_us(kWarm, kIters, [&](int i) {
        cuda::quest_select(sel_args(i), sl);
        attn::DecodeArgs a = args_for(i);
        a.selection = &gsv[i % kQRot];
        cuda::decode(a, launch);
      });
      sws.check(nullptr);
      ws.check(nullptr);
      // A step of rotation r: select_fn(r, stream), then the sparse decode on its lists.
      const auto sparse_step = [&](const auto& select_fn, bool entmax, int r, cudaStream_t st) {
        select_fn(r, st);
        attn::DecodeArgs a = entmax ? ent_args(r) : args_for(r);
        a.selection = &gsv[r];
        cuda::DecodeLaunch l = launch;
        l.stream = st;
        cuda::decode(a, l);
      };
      // A step in one CUDA graph per rotation.
      const auto step_graph = [&](const auto& select_fn, bool entmax = false) {
        const double us = time_graph_us(kQRot, kWarm, kIters, [&](int r, cudaStream_t st) {
          sparse_step(select_fn, entmax, r, st);
        });
        sws.check(nullptr);
        ws.check(nullptr);
        return us;
      };
      // The same step per layer, kLayers steps (rotations 0 .. kLayers - 1) in one graph.
      static_assert(kLayers <= kQRot, "a layer per query rotation");
      // Returns the µs per layer, or -1 off the shapes that have these rows.
      // B 1, and B 16 at 128K (issue 33's rows), as torch_peer.py's layer rows.
      const bool layer_shape = (sh.batch == 1 || (sh.batch == 16 && sh.ctx == 131072)) &&
                               Hq == 32 && budget == 4096;
      const auto layers_graph_row = [&](const std::string& kind, double row_bytes,
                                        const auto& layer_fn) {
        if (!layer_shape) return -1.0;
        const double us = time_layers_graph_us(kLayers, kWarm, kIters, layer_fn);
        sws.check(nullptr);
        ws.check(nullptr);
        std::printf("  %s ctx=%7d: per layer in a %d-layer graph %.1f us\n", kind.c_str(), sh.ctx,
                    kLayers, us);
        rows.push_back({kind, sh.ctx, sh.batch, budget, us, row_bytes});
        return us;
      };
      const auto layers_row = [&](const std::string& kind, double row_bytes,
                                  const auto& select_fn) {
        return layers_graph_row(kind, row_bytes, [&](int r, cudaStream_t st) {
          sparse_step(select_fn, false, r, st);
        });
      };
      const auto quest = [&](int r, cudaStream_t st) {
        cuda::SelectLaunch l2 = sl;
        l2.stream = st;
        cuda::quest_select(sel_args(r), l2);
      };
      const double gus_graph = step_graph(quest);
      // Selection reuse (SessionOptions::reselect_every): a step between two selections
      // extends the last lists (cuda::extend_kept, from the lists quest just left in g_ids)
      // and decodes on them; a selection serving R steps costs (fresh + (R - 1) x reuse) / R
      // per step, both timed here as graphs. Quality: masskv reuse (docs/study.md).
      const int e_cap = cap + (pol.window_tokens + P - 1) / P + 2;
      DeviceLists elists(kQRot, sh.batch, Hkv, e_cap);
      auto& e_ids = elists.ids;
      auto& e_cnt = elists.count;
      auto& esv = elists.views;
      const auto reuse_step = [&](int r, cudaStream_t st) {
        const cuda::QuestSelectArgs sa = sel_args(r);
        cuda::ExtendKeptArgs ea;
        ea.table = sa.table;
        ea.page_size = P;
        ea.policy = pol;
        ea.max_in = cap;
        ea.ids_in = {g_ids[r].p, g_ids[r].n};
        ea.count_in = {g_cnt[r].p, g_cnt[r].n};
        ea.max_per_head = e_cap;
        ea.ids = {e_ids[r].p, e_ids[r].n};
        ea.count = {e_cnt[r].p, e_cnt[r].n};
        cuda::SelectLaunch l2 = sl;
        l2.stream = st;
        cuda::extend_kept(ea, l2);
        attn::DecodeArgs a = args_for(r);
        a.selection = &esv[r];
        cuda::DecodeLaunch l = launch;
        l.stream = st;
        cuda::decode(a, l);
      };
      const double reuse_us = time_graph_us(kQRot, kWarm, kIters, reuse_step);
      sws.check(nullptr);
      ws.check(nullptr);
      rows.push_back({"ours_sparse_reuse_step_graph", sh.ctx, sh.batch, budget, reuse_us, bytes});
      // The reuse step per layer of a model's decode graph (extend_kept's input: the lists each
      // rotation's selection left in g_ids above).
      const double reuse_layer_us = layers_graph_row("ours_sparse_reuse_layers_graph", bytes,
                                                     reuse_step);
      // Amortised rows of a selector whose fresh step (select + decode) took fresh_us: as
      // standalone graphs, and per layer of the layers graph where fresh_layer_us >= 0.
      const auto reuse_rows = [&](const std::string& tag, double fresh_us, double sel_bytes,
                                  double fresh_layer_us) {
        const auto amortised = [&](const std::string& kind, double fresh, double reuse, int R) {
          const double us = (fresh + (R - 1) * reuse) / R;
          std::printf("  reuse ctx=%7d B=%2d budget=%5d: %s every %2d steps %.1f us per step "
                      "(fresh %.1f, reuse %.1f)\n",
                      sh.ctx, sh.batch, budget, kind.c_str(), R, us, fresh, reuse);
          rows.push_back({kind, sh.ctx, sh.batch, budget, us, bytes + sel_bytes / R});
        };
        for (const int R : {4, 8, 16}) {
          const std::string kind = "ours_sparse_" + tag + "_gpu_sel_reuse" + std::to_string(R);
          amortised(kind + "_graph", fresh_us, reuse_us, R);
          if (fresh_layer_us >= 0 && reuse_layer_us >= 0)
            amortised(kind + "_layers_graph", fresh_layer_us, reuse_layer_us, R);
        }
      };
      reuse_rows("quest", gus_graph, summary_bytes,
                 layers_row("ours_sparse_quest_gpu_sel_layers_graph", bytes + summary_bytes, quest));
      // The whole decode step of issue 7 item 4 in one graph: append, select, attend.
      const double append_step = step_graph([&](int r, cudaStream_t st) {
        cuda::append(append_args(r), aws, st, false);
        quest(r, st);
      });
      aws.check(nullptr);
      std::printf("  step ctx=%7d B=%2d budget=%5d: append+select+decode graph %.1f us\n", sh.ctx,
                  sh.batch, budget, append_step);
      rows.push_back({"ours_step_append_select_decode_graph", sh.ctx, sh.batch, budget, append_step,
                      bytes + summary_bytes});
      std::printf(
          "  gpu-sel ctx=%7d B=%2d budget=%5d: select+decode %9.1f us (graph %.1f us); select "
          "%.1f us, score %.1f us; GPU selection == CPU selection in %d/%d steps\n",
          sh.ctx, sh.batch, budget, gus_plain, gus_graph, gsel_us, gscore_us, same, kQRot);
      rows.push_back({"ours_sparse_quest_gpu_sel", sh.ctx, sh.batch, budget, gus_plain,
                      bytes + summary_bytes});
      rows.push_back({"ours_sparse_quest_gpu_sel_graph", sh.ctx, sh.batch, budget, gus_graph,
                      bytes + summary_bytes});
      rows.push_back({"gpu_quest_select", sh.ctx, sh.batch, budget, gsel_us, summary_bytes});
      rows.push_back({"gpu_quest_score", sh.ctx, sh.batch, budget, gscore_us, summary_bytes});
      // Two-stage selection + token decode (two_stage_check.cu), the default candidate factor
      // and factor 0 (token_codes), beside flat Quest; MASSKV_BENCH_TWO_STAGE=0 leaves it out (scripts/gpu.sh, when its
      // check failed).
      static const bool two_stage_rows = [] {
        const char* e = std::getenv("MASSKV_BENCH_TWO_STAGE");
        return e == nullptr || std::string(e) != "0";
      }();
      if (two_stage_rows && budget == 4096 && sh.batch == 1 && Hq == 32 &&
          (sh.ctx == 32768 || sh.ctx == 131072 || sh.ctx == 1048576)) {
        TwoStageBenchShape ts;
        ts.ctx = sh.ctx;
        ts.batch = sh.batch;
        ts.hq = Hq;
        ts.hkv = Hkv;
        ts.d = d;
        ts.page = P;
        ts.pool_pages = pool_pages;
        ts.budget = budget;
        ts.sink_pages = pol.sink_pages;
        ts.window_tokens = pol.window_tokens;
        ts.k = K.p;
        ts.v = V.p;
        ts.host_min = smin.data();
        ts.host_max = smax.data();
        ts.store = dstore;
        for (int t = 0; t < rot; ++t) ts.tables.push_back(sel_args(t).table);
        for (int r = 0; r < kQRot; ++r) ts.q.push_back(d_q[r].p);
        ts.decode_ws = &ws;
        for (const TwoStageBenchRow& x : bench_two_stage(ts))
          rows.push_back({x.kind, sh.ctx, sh.batch, budget, x.us, x.bytes});
        ts.factor = 0;  // token_codes: every page a candidate
        for (const TwoStageBenchRow& x : bench_two_stage(ts))
          rows.push_back({x.kind, sh.ctx, sh.batch, budget, x.us, x.bytes});
        ts.log_prob = true;  // token_codes, the heads pooled by log-probability
        for (const TwoStageBenchRow& x : bench_two_stage(ts))
          rows.push_back({x.kind, sh.ctx, sh.batch, budget, x.us, x.bytes});
        // token_codes in two passes (rows ..._2p): 3/8 of the channels for every token, its
        // best 2 x budget tokens on every channel (the CPU default, the selection lab's
        // cascade), both rules.
        ts.code_channels = 0.375;
        ts.code_candidates = 2;
        for (const bool lp : {false, true}) {
          ts.log_prob = lp;
          for (const TwoStageBenchRow& x : bench_two_stage(ts))
            rows.push_back({x.kind, sh.ctx, sh.batch, budget, x.us, x.bytes});
        }
      }
      if (!compact_rows) continue;
      // Every compact row at 4096 tokens; at 2048 and 8192 the hierarchical selection (cover 2)
      // and the entmax-aware one (fixed budget) alone, the budgets issue 7 asks of both.
      const bool full = budget == 4096;

      // Top-k alone (on the keys the last scoring left), the 8-bit store, the hierarchical
      // selector: selection alone and the whole step (select + decode) in one CUDA graph,
      // bytes each reads, and the recall of the flat bf16 selection (GPU lists) per rotation.
      const double key_bytes = static_cast<double>(sh.batch) * Hkv * pages * 4;
      cuda::quest_score(sel_args(0), sl);
      const double topk_us =
          full ? time_us(kWarm, kIters, [&](int i) { cuda::quest_topk(sel_args(i), sl); }) : 0;
      if (full) rows.push_back({"gpu_quest_topk", sh.ctx, sh.batch, budget, topk_us, key_bytes});
      const auto sel8_args = [&](int r) {
        cuda::QuestSelectArgs a = sel_args(r);
        a.bounds8 = store8.view;
        return a;
      };
      // Flat lists of every rotation, then each selector's agreement with them.
      std::vector<std::vector<std::int32_t>> flat_ids(kQRot), flat_cnt(kQRot);
      for (int r = 0; r < kQRot; ++r) {
        cuda::quest_select(sel_args(r), sl);
        flat_ids[r] = g_ids[r].download();
        flat_cnt[r] = g_cnt[r].download();
      }
      sws.check(nullptr);
      const auto agreement = [&](const auto& select_fn) {
        long lists = 0, identical = 0;
        double hit = 0, total = 0;
        for (int r = 0; r < kQRot; ++r) {
          select_fn(r);
          sws.check(nullptr);
          const auto ids = g_ids[r].download();
          const auto cnt = g_cnt[r].download();
          const SelectionView ref{
              SelectionView::Unit::page, sh.batch, Hkv, cap, flat_ids[r], flat_cnt[r]};
          const SelectionView got{SelectionView::Unit::page, sh.batch, Hkv, cap, ids, cnt};
          const select::SelectionAgreement a = select::compare_selections(ref, got);
          lists += a.lists;
          identical += a.identical;
          long ref_pages = 0;
          for (int c : flat_cnt[r]) ref_pages += c;
          hit += a.recall * static_cast<double>(ref_pages);
          total += static_cast<double>(ref_pages);
        }
        return std::pair<double, double>{total ? hit / total : 1.0,
                                         lists ? static_cast<double>(identical) / lists : 1.0};
      };
      // One GPU selector, select_fn(step, stream): alone, its agreement with the flat lists,
      // and in the graph step; two rows (selection, step), `sel_bytes` the summaries it reads.
      const auto measure = [&](const std::string& tag, double sel_bytes, const auto& select_fn) {
        const double sel_us = time_us(kWarm, kIters, [&](int i) { select_fn(i, nullptr); });
        sws.check(nullptr);
        const auto [rec, same] = agreement([&](int r) { select_fn(r, nullptr); });
        const double step_us = step_graph(select_fn);
        std::printf(
            "  compact ctx=%7d B=%2d budget=%5d: %-8s select %6.1f us, step (graph) %6.1f us, "
            "%.1f MB, recall %.4f, identical lists %.3f\n",
            sh.ctx, sh.batch, budget, tag.c_str(), sel_us, step_us, sel_bytes / 1e6, rec, same);
        rows.push_back(
            {"gpu_" + tag + "_select", sh.ctx, sh.batch, budget, sel_us, sel_bytes, 0, rec, same});
        rows.push_back({"ours_sparse_" + tag + "_gpu_sel_graph", sh.ctx, sh.batch, budget, step_us,
                        bytes + sel_bytes, 0, rec, same});
        if (tag == "hier") {
          reuse_rows("hier", step_us, sel_bytes,
                     layers_row("ours_sparse_hier_gpu_sel_layers_graph", bytes + sel_bytes,
                                select_fn));
        }
      };
      const auto on = [&](cudaStream_t st) {
        cuda::SelectLaunch l2 = sl;
        l2.stream = st;
        return l2;
      };
      // 8-bit: the scoring kernel alone too.
      if (full) {
        const double bytes8 = static_cast<double>(sh.batch) * pages * Hkv * (2.0 * d + 8);
        const double score8_us =
            time_us(kWarm, kIters, [&](int i) { cuda::quest_score(sel8_args(i), sl); });
        rows.push_back({"gpu_quest8_score", sh.ctx, sh.batch, budget, score8_us, bytes8});
        std::printf("  compact ctx=%7d B=%2d budget=%5d: top-k %.1f us, 8-bit score %.1f us\n",
                    sh.ctx, sh.batch, budget, topk_us, score8_us);
        measure("quest8", bytes8,
                [&](int r, cudaStream_t st) { cuda::quest_select(sel8_args(r), on(st)); });
      }
      // Hierarchical (groups of 16 pages): every group's bf16 summaries, and the pages of the
      // chosen groups (at most m per (sequence, kv head)); cover 2 and 4, and cover 4 over
      // 8-bit pages.
      const int ngroups = (pages + 15) / 16;
      for (const double cover : {2.0, 4.0}) {
        if (cover == 4.0 && !full) continue;
        const int m = select::hier_groups(ngroups, 16, pol.budget_pages, cover);
        const double group_bytes = static_cast<double>(sh.batch) * Hkv * 4.0 * d * ngroups;
        const double chosen = static_cast<double>(sh.batch) * Hkv * m * 16.0;
        const GroupGpu* gr = groups.data();
        measure(cover == 2.0 ? "hier" : "hier_c4", group_bytes + chosen * 4.0 * d,
                [&](int r, cudaStream_t st) {
                  cuda::hier_select(hier_args(sel_args(r), gr[r % rot], cover), on(st));
                });
        // The same selection in one kernel (SelectLaunch::HierKernel::fused).
        if (fused_rows && full)
          measure(cover == 2.0 ? "hier_fused" : "hier_fused_c4", group_bytes + chosen * 4.0 * d,
                  [&](int r, cudaStream_t st) {
                    cuda::SelectLaunch lf = on(st);
                    lf.hier_kernel = cuda::SelectLaunch::HierKernel::fused;
                    cuda::hier_select(hier_args(sel_args(r), gr[r % rot], cover), lf);
                  });
        if (cover == 4.0)
          measure("hier8_c4", group_bytes + chosen * (2.0 * d + 8), [&](int r, cudaStream_t st) {
            cuda::hier_select(hier_args(sel8_args(r), gr[r % rot], cover), on(st));
          });
      }
      // Entmax-aware hierarchical selection (Gaussian-τ from moments pooled over 64 pages,
      // alpha 1.5, cover 2): the fixed budget and the adaptive rule (margin 0), each in a step
      // with softmax decode (as the Quest rows) and with 1.5-entmax decode (what it is for).
      {
        const int m = select::hier_groups(ngroups, 16, pol.budget_pages, 2.0);
        const double group_bytes = static_cast<double>(sh.batch) * Hkv * 4.0 * d * ngroups;
        const double moment_bytes = static_cast<double>(sh.batch) * Hkv * 8.0 * d *
                                    ((pages + kMomentPages - 1) / kMomentPages);
        const double chosen = static_cast<double>(sh.batch) * Hkv * m * 16.0;
        const GroupGpu* gr = groups.data();
        // The fixed budget and the adaptive rule, then the fixed budget in one kernel
        // (SelectLaunch::HierKernel::fused).
        // Pages the lists of select_fn hold per step, over the rotations (the adaptive rule's
        // and top-p's budget is a cap).
        const auto held_pages = [&](const auto& select_fn) {
          double held = 0;
          for (int r = 0; r < kQRot; ++r) {
            select_fn(r, nullptr);
            sws.check(nullptr);
            for (int c : g_cnt[r].download()) held += c;
          }
          return held / kQRot;
        };
        struct GaussRun {
          bool adaptive, fused;
        };
        for (const GaussRun run : {GaussRun{false, false}, GaussRun{true, false},
                                   GaussRun{false, true}}) {
          const bool adaptive = run.adaptive, fused = run.fused;
          if ((fused && !fused_rows) || ((adaptive || fused) && !full)) continue;
          const auto gauss = [&, adaptive, fused](int r, cudaStream_t st) {
            cuda::HierSelectArgs h = hier_args(sel_args(r), gr[r % rot], 2.0);
            set_moments(h, mgpu[r % rot], kMomentPages, kBenchAlpha, adaptive, 0.f);
            cuda::SelectLaunch lg = on(st);
            if (fused) lg.hier_kernel = cuda::SelectLaunch::HierKernel::fused;
            cuda::hier_select(h, lg);
          };
          const std::string tag = fused ? "gauss_fused" : adaptive ? "gauss_adaptive" : "gauss";
          const double sel_bytes = group_bytes + moment_bytes + chosen * 4.0 * d;
          const double held = held_pages(gauss);
          const double kv_sel = held * P * d * 2 * 2;
          measure(tag, sel_bytes, gauss);
          rows.back().bytes = kv_sel + sel_bytes;  // the step row: the pages actually held
          const double ent_us = step_graph(gauss, true);
          std::printf(
              "  gauss   ctx=%7d B=%2d budget=%5d: %-14s %.0f pages held per step (budget %d x "
              "%d lists); entmax step (graph) %.1f us\n",
              sh.ctx, sh.batch, budget, tag.c_str(), held, pol.budget_pages, sh.batch * Hkv,
              ent_us);
          rows.push_back({"ours_entmax_sparse_" + tag + "_gpu_sel_graph", sh.ctx, sh.batch, budget,
                          ent_us, kv_sel / 2 + sel_bytes});
        }
        // Hierarchical top-p (p = 0.9, cover 2): the group stage, the moment groups' m and v,
        // the masses of the kept and chosen groups' pages from their f32 summaries.
        if (!full) continue;  // the last rows of this budget
        const auto top_p = [&](int r, cudaStream_t st) {
          cuda::HierTopPArgs t;
          t.hier = hier_args(sel_args(r), gr[r % rot], 2.0);
          set_moments(t.hier, mgpu[r % rot], kMomentPages, kBenchAlpha, false, 0.f);
          t.pages = dsumm;
          t.p = 0.9;
          cuda::hier_top_p(t, on(st));
        };
        const double held = held_pages(top_p);
        const double tp_bytes = group_bytes + moment_bytes + chosen * 8.0 * d;
        measure("top_p", tp_bytes, top_p);
        rows.back().bytes = held * P * d * 2 * 2 + tp_bytes;
        std::printf(
            "  top-p   ctx=%7d B=%2d budget=%5d: p 0.9, %.0f pages held per step (budget %d x "
            "%d lists)\n",
            sh.ctx, sh.batch, budget, held, pol.budget_pages, sh.batch * Hkv);
      }
    }
    for (std::size_t i = first_row; i < rows.size(); ++i) rows[i].hq = Hq;
    if (!write_rows(json_path, prop, rows)) return 2;
  }

  return write_rows(json_path, prop, rows) ? 0 : 2;
}
