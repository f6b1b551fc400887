// What the GPU checks (tests/cuda, masskv_gpu_tests) and the GPU bench (tools/gpu_bench) share:
// the CUDA error check, a seeded RNG, a device buffer, random bf16 fills, event timing (median),
// and the launch settings every selection and prefill call runs with.
#pragma once

#include <cuda_runtime.h>

#include "masskv/cuda/arch.hpp"
#include "masskv/cuda/prefill.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/selection.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#define CK(x)                                                                                \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, \
                   __LINE__, #x);                                                            \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

namespace {

// ---- small host utilities -----------------------------------------------------------------
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  float sym(float a) { return static_cast<float>((2 * uniform() - 1) * a); }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
};

template <class T>
struct DevBuf {
  T* p = nullptr;
  std::size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(std::size_t count) : n(count) {
    CK(cudaMalloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void upload(const T* h, std::size_t count) {
    CK(cudaMemcpy(p, h, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& h) { upload(h.data(), h.size()); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

template <class T>
DevBuf<T> to_device(const std::vector<T>& h) {
  DevBuf<T> d(h.size());
  if (!h.empty()) d.upload(h);
  return d;
}

__global__ void fill_kernel(std::uint16_t* p, std::size_t n, std::uint64_t seed, float amp) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = ((z >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f) * amp;
    p[i] = static_cast<std::uint16_t>(__float_as_uint(u) >> 16);  // bf16 (truncated)
  }
}

template <class T>
double median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One CUDA graph per rotation r of step(r, stream), each captured after one plain run (so the
// workspaces and kernel attributes exist before capture).
template <class F>
std::vector<cudaGraphExec_t> capture_graphs(int rot, cudaStream_t st, F&& step) {
  std::vector<cudaGraphExec_t> execs(rot);
  for (int r = 0; r < rot; ++r) {
    step(r, st);
    CK(cudaStreamSynchronize(st));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    step(r, st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&execs[r], g, 0));
    CK(cudaGraphDestroy(g));
  }
  return execs;
}

// The same steps replayed from CUDA graphs (one graph per rotation, captured after warm-up so
// the workspace and kernel attributes exist): shows what launch overhead costs the step.
template <class F>
double time_graph_us(int rot, int warmup, int iters, F&& step) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const std::vector<cudaGraphExec_t> execs = capture_graphs(rot, st, step);
  for (int i = 0; i < warmup; ++i) CK(cudaGraphLaunch(execs[i % rot], st));
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(ev[2 * i], st));
    CK(cudaGraphLaunch(execs[i % rot], st));
    CK(cudaEventRecord(ev[2 * i + 1], st));
  }
  CK(cudaStreamSynchronize(st));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) CK(cudaEventDestroy(e));
  for (auto& x : execs) CK(cudaGraphExecDestroy(x));
  CK(cudaStreamDestroy(st));
  return median(ms) * 1000.0;
}

// Per step, with `layers` steps (step(0 .. layers - 1)) in one CUDA graph, as a model's decode
// graph holds every layer's attention: the graph's launch and completion are paid once for all
// of them, not once per step as in time_graph_us.
template <class F>
double time_layers_graph_us(int layers, int warmup, int iters, F&& step) {
  return time_graph_us(1, warmup, iters, [&](int, cudaStream_t st) {
           for (int l = 0; l < layers; ++l) step(l, st);
         }) /
         layers;
}
// Per-rotation device selections: lists [batch][heads][cap] and counts, and their views.
struct DeviceLists {
  std::vector<DevBuf<std::int32_t>> ids, count;
  std::vector<masskv::SelectionView> views;
  DeviceLists(int rotations, int batch, int heads, int cap) {
    for (int r = 0; r < rotations; ++r) {
      ids.emplace_back(static_cast<std::size_t>(batch) * heads * cap);
      count.emplace_back(static_cast<std::size_t>(batch) * heads);
    }
    for (int r = 0; r < rotations; ++r) {
      views.push_back({masskv::SelectionView::Unit::page, batch, heads, cap,
                       {ids[r].p, ids[r].n}, {count[r].p, count[r].n}});
    }
  }
};

// The benchmarks' KV pool: bf16 K and V of num_pages HND pages (kv_heads x page x d each),
// read through `table` (device spans, or host spans for PagedKVView::validate).
inline masskv::kv::PagedKVView bf16_hnd_pool(const void* k, const void* v, int num_pages,
                                             int kv_heads, int page, int d,
                                             const masskv::kv::PageTable& table) {
  masskv::kv::PagedKVView c;
  c.k = k;
  c.v = v;
  c.dtype = masskv::DType::bf16;
  c.num_pages = num_pages;
  c.num_kv_heads = kv_heads;
  c.page_size = page;
  c.head_dim = d;
  c.set_layout(masskv::kv::Layout::HND);
  c.table = table;
  return c;
}

// Whether the bench and the profiles time the hierarchical selection in one kernel: a Hopper
// path (cuda::hopper_paths), left out under MASSKV_BENCH_FUSED=0 (scripts/gpu.sh sets it when
// that kernel failed its check: a fault would end the process).
inline bool bench_fused_rows() {
  const char* e = std::getenv("MASSKV_BENCH_FUSED");
  return (e == nullptr || std::string_view(e) != "0") && masskv::cuda::hopper_paths();
}

// The paths the environment asks for (include/masskv/cuda/arch.hpp): MASSKV_CUDA_PATHS=sm80 the
// sm_80 paths on any device (scripts/gpu.sh --sm80); unset, empty or auto: by the device. Throws
// masskv::Error for another value. main sets it before any CUDA call.
inline masskv::cuda::CudaPaths env_cuda_paths() {
  const char* e = std::getenv("MASSKV_CUDA_PATHS");
  if (e == nullptr || *e == 0 || std::string_view(e) == "auto")
    return masskv::cuda::CudaPaths::automatic;
  masskv::require(std::string_view(e) == "sm80", masskv::ErrorCode::invalid_argument,
                  "MASSKV_CUDA_PATHS", "must be auto or sm80, not '", e, "'");
  return masskv::cuda::CudaPaths::sm80;
}

// masskv_gpu_bench's selection launch, its tuning switches read from the environment (the
// library reads none; profile-phases and the bench compare the paths by them; masskv_gpu_tests
// sets its variants' launches itself):
// MASSKV_TOPK=cluster, or MASSKV_TOPK_CLUSTER set, runs the cluster top-k, at 1, 2, 4 or 8 CTAs
// where MASSKV_TOPK_CLUSTER says so (else planned); MASSKV_HIER_SCAN=list|mask; MASSKV_HIER_FUSED=1
// the fused hierarchical kernel (for launches that do not name one); MASSKV_SCORE_HOT_TILES=n.
inline masskv::cuda::SelectLaunch env_select_launch() {
  using L = masskv::cuda::SelectLaunch;
  L l;
  const char* topk = std::getenv("MASSKV_TOPK");
  const char* cluster = std::getenv("MASSKV_TOPK_CLUSTER");
  if ((topk != nullptr && std::string_view(topk) == "cluster") ||
      (cluster != nullptr && *cluster != 0))
    l.topk_kernel = L::TopkKernel::cluster;
  const int c = cluster != nullptr ? std::atoi(cluster) : 0;
  l.topk_cluster = c == 1 || c == 2 || c == 4 || c == 8 ? c : 0;
  if (const char* e = std::getenv("MASSKV_HIER_SCAN"); e != nullptr) {
    const std::string_view v(e);
    l.hier_scan = v == "list"   ? L::HierScan::list
                  : v == "mask" ? L::HierScan::mask
                                : L::HierScan::automatic;
  }
  if (const char* e = std::getenv("MASSKV_HIER_FUSED"); e != nullptr && std::string_view(e) == "1")
    l.hier_kernel = L::HierKernel::fused;
  if (const char* e = std::getenv("MASSKV_SCORE_HOT_TILES"); e != nullptr && std::atoi(e) > 0)
    l.score_hot_tiles = std::atoi(e);
  return l;
}

// A prefill launch with its kernel switches from the environment (for comparing the kernels
// on a device): MASSKV_PREFILL_KERNEL=wgmma|mma, MASSKV_PREFILL_HEADS=1|2 (q heads per CTA).
inline masskv::cuda::PrefillLaunch env_prefill_launch() {
  using L = masskv::cuda::PrefillLaunch;
  L l;
  if (const char* e = std::getenv("MASSKV_PREFILL_KERNEL"); e != nullptr) {
    const std::string_view v(e);
    l.kernel = v == "mma" ? L::Kernel::mma : v == "wgmma" ? L::Kernel::wgmma : L::Kernel::automatic;
  }
  if (const char* e = std::getenv("MASSKV_PREFILL_HEADS"); e != nullptr) {
    const int v = std::atoi(e);
    l.max_heads_per_cta = v == 1 || v == 2 ? v : 4;
  }
  return l;
}

// Times fn(iteration) with one event pair per launch; median in microseconds.
template <class F>
double time_us(int warmup, int iters, F&& fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(ev[2 * i]));
    fn(warmup + i);
    CK(cudaEventRecord(ev[2 * i + 1]));
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) CK(cudaEventDestroy(e));
  return median(ms) * 1000.0;
}

}  // namespace

// The selection and prefill launches every check and bench row runs with (one per process:
// inline, outside the anonymous namespace). masskv_gpu_bench's main sets them from the
// environment (env_select_launch, env_prefill_launch); masskv_gpu_tests per test variant (each
// top-k cluster size, each hierarchical scan, the fused hierarchical kernel).
inline masskv::cuda::SelectLaunch& select_launch() {
  static masskv::cuda::SelectLaunch launch;
  return launch;
}
inline masskv::cuda::PrefillLaunch& prefill_launch() {
  static masskv::cuda::PrefillLaunch launch;
  return launch;
}
