// masskv_gpu_bench prefill-bench: cuda::prefill (dense and block-sparse causal prefill) and
// cuda::prefill_index timed at 8K/32K/128K, beside torch SDPA (tools/gpu_bench/torch_peer.py
// --prefill); the check is tests/cuda/prefill_check.cu.
#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "masskv/attn/prefill.hpp"
#include "masskv/cuda/prefill.hpp"
#include "masskv/error.hpp"
#include "prefill_bench.hpp"

using namespace masskv;

// ---- benchmark -----------------------------------------------------------------------------
namespace {

struct PRow {
  std::string kind;
  int ctx, budget;
  double us, flops;
};

}  // namespace

int run_prefill_bench(const char* json_path) {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const int Hq = 32, Hkv = 8, d = 128, P = 16, G = Hq / Hkv;
  std::vector<PRow> rows;
  for (const int L : {8192, 32768, 131072}) {
    const int pages = L / P, tiles = L / 64;
    const std::size_t kv_elems = static_cast<std::size_t>(pages) * Hkv * P * d;
    DevBuf<std::uint16_t> K(kv_elems), V(kv_elems), Q(static_cast<std::size_t>(L) * Hq * d);
    fill_kernel<<<4096, 256>>>(K.p, kv_elems, 1, 2.f);
    fill_kernel<<<4096, 256>>>(V.p, kv_elems, 1ull << 40, 1.f);
    fill_kernel<<<4096, 256>>>(Q.p, Q.n, 1ull << 41, 3.f);
    CK(cudaGetLastError());
    std::vector<std::int32_t> indices(pages), indptr = {0, pages}, last = {P}, qind = {0, L},
                                              qbind = {0, tiles};
    std::iota(indices.begin(), indices.end(), 0);
    DevBuf<std::int32_t> d_ind = to_device(indices), d_ptr = to_device(indptr),
                         d_last = to_device(last), d_qind = to_device(qind),
                         d_qbind = to_device(qbind);
    DevBuf<std::uint16_t> out(static_cast<std::size_t>(L) * Hq * d);
    DevBuf<float> lse(static_cast<std::size_t>(L) * Hq);
    cuda::PrefillArgs a;
    a.q = View3<const std::uint16_t>::contiguous(Q.p, L, Hq, d);
    a.q_indptr = {d_qind.p, d_qind.n};
    a.cache = bf16_hnd_pool(K.p, V.p, pages, Hkv, P, d,
                            {{d_ptr.p, d_ptr.n}, {d_ind.p, d_ind.n}, {d_last.p, d_last.n}});
    a.out = {out.p, DType::bf16, static_cast<std::int64_t>(Hq) * d, d};
    a.lse = {lse.p, lse.n};
    cuda::PrefillWorkspace ws;
    cuda::PrefillLaunch launch = prefill_launch();
    launch.workspace = &ws;
    launch.max_q_per_seq = L;
    launch.check_errors = false;
    const int iters = L >= 131072 ? 5 : 10, warm = 2;
    // FLOPs of the computed tiles: 4·d per (query, key) pair and q head (S and P·V), 64×64
    // pairs a tile, whatever the causal mask zeroes inside it.
    const double tile_flops = 4.0 * d * 64 * 64 * G;
    const double dense_tiles = static_cast<double>(tiles) * (tiles + 1) / 2 * Hkv;

    const double dense_us = time_us(warm, iters, [&](int) { cuda::prefill(a, launch); });
    ws.check(nullptr);
    rows.push_back({"prefill_ours_dense", L, 0, dense_us, dense_tiles * tile_flops});

    // Dense as a block list: every causal block listed (one list for all kv heads).
    {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(tiles) * tiles, -1), cnt(tiles);
      for (int i = 0; i < tiles; ++i) {
        cnt[i] = i + 1;
        std::iota(ids.begin() + static_cast<std::size_t>(i) * tiles,
                  ids.begin() + static_cast<std::size_t>(i) * tiles + i + 1, 0);
      }
      DevBuf<std::int32_t> d_ids = to_device(ids), d_cnt = to_device(cnt);
      const cuda::PrefillBlockSelection all{
          64, 64, 1, tiles, {d_qbind.p, d_qbind.n}, {d_ids.p, d_ids.n}, {d_cnt.p, d_cnt.n}};
      cuda::PrefillArgs x = a;
      x.selection = &all;
      const double us = time_us(warm, iters, [&](int) { cuda::prefill(x, launch); });
      ws.check(nullptr);
      rows.push_back({"prefill_ours_dense_listed", L, 0, us, dense_tiles * tile_flops});
    }

    // Block-sparse on the GPU indexer's selection: L/16 keys per query block (>= 2048),
    // sink block and diagonal included.
    const int budget = std::max(L / 16, 2048), budget_blocks = budget / 64;
    const int cap = cuda::prefill_index_capacity(L, 64, 64, budget_blocks, 1);
    DevBuf<std::int32_t> s_ids(static_cast<std::size_t>(tiles) * Hkv * cap),
        s_cnt(static_cast<std::size_t>(tiles) * Hkv);
    cuda::PrefillIndexArgs ia;
    ia.q = a.q;
    ia.q_indptr = a.q_indptr;
    ia.cache = a.cache;
    ia.budget_blocks = budget_blocks;
    ia.sink_blocks = 1;
    ia.max_kv_len = L;
    ia.q_block_indptr = {d_qbind.p, d_qbind.n};
    ia.max_per_row = cap;
    ia.ids = {s_ids.p, s_ids.n};
    ia.count = {s_cnt.p, s_cnt.n};
    const cuda::PrefillBlockSelection sel{
        64, 64, Hkv, cap, {d_qbind.p, d_qbind.n}, {s_ids.p, s_ids.n}, {s_cnt.p, s_cnt.n}};
    cuda::PrefillArgs sa = a;
    sa.selection = &sel;
    const double index_us = time_us(warm, iters, [&](int) { cuda::prefill_index(ia, launch); });
    ws.check(nullptr);
    const std::vector<std::int32_t> cnt = s_cnt.download();
    const double listed = std::accumulate(cnt.begin(), cnt.end(), 0.0);
    const double sparse_us = time_us(warm, iters, [&](int) { cuda::prefill(sa, launch); });
    const double both_us = time_us(warm, iters, [&](int) {
      cuda::prefill_index(ia, launch);
      cuda::prefill(sa, launch);
    });
    ws.check(nullptr);
    rows.push_back({"prefill_gpu_index", L, budget, index_us, 0});
    rows.push_back({"prefill_ours_sparse", L, budget, sparse_us, listed * tile_flops});
    rows.push_back({"prefill_ours_sparse_with_index", L, budget, both_us, listed * tile_flops});
    std::printf(
        "prefill L=%6d: dense %10.1f us (%.0f TFLOP/s); sparse budget %d: index %.1f us, "
        "attention %.1f us (%.0f TFLOP/s, %.1f%% of dense tiles), index+attention %.1f "
        "us\n",
        L, dense_us, dense_tiles * tile_flops / dense_us / 1e6, budget, index_us, sparse_us,
        listed * tile_flops / sparse_us / 1e6, 100.0 * listed / dense_tiles, both_us);
    // α-entmax (1.5), the exact multi-pass path (max, Newton passes, output): dense and on the
    // indexer's selection, up to 32K. FLOPs counted as one softmax pass (an "effective" rate).
    if (L <= 32768) {
      cuda::PrefillArgs ea = a, es = sa;
      ea.mapping = es.mapping = Mapping::entmax(1.5);
      const double ed_us = time_us(1, 3, [&](int) { cuda::prefill(ea, launch); });
      const double es_us = time_us(1, 3, [&](int) { cuda::prefill(es, launch); });
      ws.check(nullptr);
      rows.push_back({"prefill_ours_entmax_dense", L, 0, ed_us, dense_tiles * tile_flops});
      rows.push_back({"prefill_ours_entmax_sparse", L, budget, es_us, listed * tile_flops});
      std::printf("prefill L=%6d: entmax 1.5 dense %.1f us (%.2fx softmax), sparse %.1f us "
                  "(%.2fx softmax sparse)\n",
                  L, ed_us, ed_us / dense_us, es_us, es_us / sparse_us);
    }
  }
  FILE* f = std::fopen(json_path, "w");
  if (!f) {
    std::perror(json_path);
    return 2;
  }
  std::fprintf(f, "{\"device\": \"%s\", \"sms\": %d, \"rows\": [\n", prop.name,
               prop.multiProcessorCount);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const PRow& r = rows[i];
    std::fprintf(f,
                 "  {\"kind\": \"%s\", \"ctx\": %d, \"batch\": 1, \"budget\": %d, \"us\": %.3f, "
                 "\"flops\": %.6g}%s\n",
                 r.kind.c_str(), r.ctx, r.budget, r.us, r.flops, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
  return 0;
}
