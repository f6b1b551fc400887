// masskv_nccl_check [ranks]: distributed Quest selection and decode over NcclComm (one thread
// and one GPU per rank, ranks = visible GPUs by default) against the single-rank selector
// and decode on the CPU, plus the same run over InProcessComm. Prints one line per check and
// exits non-zero on a mismatch. Built with -DMASSKV_NCCL=ON (docs/dist.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "masskv/attn/decode.hpp"
#include "masskv/dist/decode.hpp"
#include "masskv/dist/nccl_comm.hpp"
#include "masskv/dist/select.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/select/page_bound.hpp"

namespace {

using namespace masskv;

struct Result {
  SelectionStorage sel;
  std::vector<float> out;
  dist::CommStats stats;
};

// Runs body on R threads, one NcclComm each on device r % devices.
void run_nccl(int R, int devices, const std::function<void(dist::Communicator&)>& body) {
  const dist::NcclId id = dist::nccl_unique_id();
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::NcclComm comm(id, R, r, r % devices);
        body(comm);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        std::exit(2);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(b[i])));
  }
  return diff / std::max(norm, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  const int R = argc > 1 ? std::atoi(argv[1]) : devices;
  const int Hkv = 2, Hq = 8, d = 128, P = 16;
  const std::vector<int> lengths = {4000, 333};
  kv::CacheConfig cfg;
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = d;
  cfg.page_size = P;
  cfg.capacity_pages = 300;
  kv::PagedKVCache cache(cfg);
  std::mt19937 rng(1);
  std::normal_distribution<float> N;
  std::vector<kv::SeqId> seqs;
  for (const int len : lengths) {
    std::vector<float> k(static_cast<std::size_t>(len) * Hkv * d), v(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = N(rng) + 0.7f * static_cast<float>((i / (P * Hkv * d)) % 5);
      v[i] = N(rng);
    }
    seqs.push_back(cache.create());
    cache.append(seqs.back(), k, v, len);
  }
  const kv::PageTableStorage table = cache.page_table(seqs);
  const kv::PagedKVView view = cache.view(table);
  const int B = static_cast<int>(lengths.size());
  std::vector<float> q(static_cast<std::size_t>(B) * Hq * d);
  for (float& x : q) x = 2.0f * N(rng);
  const View3<const float> qv = View3<const float>::contiguous(q.data(), B, Hq, d);
  select::TopkPolicy policy;
  policy.budget_pages = 24;

  std::vector<dist::LocalShard> shards;
  for (int r = 0; r < R; ++r) shards.emplace_back(view, r, R);

  int failures = 0;
  for (const Mapping mapping : {Mapping::softmax(), Mapping::entmax(1.5), Mapping::entmax(2.0)}) {
    // Single rank on the CPU.
    const kv::SummariesView sum = cache.summaries();
    select::QuestArgs qa{qv, table.table(), P, &sum, nullptr, 0, policy};
    SelectionStorage want_sel;
    select::quest_select(qa, want_sel);
    const SelectionView want_view = want_sel.view();
    std::vector<float> want(q.size());
    attn::DecodeArgs a;
    a.q = qv;
    a.cache = view;
    a.mapping = mapping;
    a.selection = &want_view;
    a.out = View3<float>::contiguous(want.data(), B, Hq, d);
    attn::decode(a);

    const auto body = [&](std::vector<Result>& res) {
      return [&](dist::Communicator& comm) {
        Result& r = res[static_cast<std::size_t>(comm.rank())];
        dist::QuestSelectArgs sa{qv, &shards[static_cast<std::size_t>(comm.rank())], 0, policy};
        dist::quest_select(comm, sa, r.sel);
        const SelectionView sv = r.sel.view();
        r.out.resize(q.size());
        dist::DecodeArgs da;
        da.q = qv;
        da.shard = sa.shard;
        da.mapping = mapping;
        da.selection = &sv;
        da.out = View3<float>::contiguous(r.out.data(), B, Hq, d);
        dist::decode(comm, da);
        r.stats = comm.stats();
      };
    };
    std::vector<Result> nccl(static_cast<std::size_t>(R)), inproc(static_cast<std::size_t>(R));
    run_nccl(R, devices, body(nccl));
    dist::run_in_process(R, body(inproc));
    for (int r = 0; r < R; ++r) {
      const Result& x = nccl[static_cast<std::size_t>(r)];
      const bool sel_ok = x.sel.ids == want_sel.ids && x.sel.count == want_sel.count;
      const double e = rel_diff(x.out, want),
                   e_in = rel_diff(x.out, inproc[static_cast<std::size_t>(r)].out);
      const bool ok = sel_ok && e <= 2e-5;
      failures += !ok;
      std::printf(
          "%s alpha %.2g rank %d/%d: selection %s, out rel diff vs single rank %.3g, vs "
          "in-process %.3g, collectives %lld, bytes sent %lld received %lld: %s\n",
          mapping.is_entmax() ? "entmax" : "softmax", mapping.alpha, r, R,
          sel_ok ? "equal" : "DIFFERS", e, e_in, static_cast<long long>(x.stats.collectives),
          static_cast<long long>(x.stats.bytes_sent),
          static_cast<long long>(x.stats.bytes_received), ok ? "ok" : "FAIL");
    }
  }
  std::printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
