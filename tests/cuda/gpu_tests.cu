// masskv_gpu_tests: every GPU correctness check (checks.hpp) as a named test, each in its own
// child process, ending with the suite's "N passed, N failed" line (scripts/test.sh's format).
//   masskv_gpu_tests                 every test
//   masskv_gpu_tests NAME ...        the tests named NAME or NAME/<variant>
//   masskv_gpu_tests --list          the names
// A variant runs its check with another selection launch (every top-k cluster size, each
// hierarchical scan, the fused hierarchical kernel), the paths the tuning switches choose among.
// Why a process per test: the checks stop their process on a CUDA error (CK) and a kernel fault
// leaves the context unusable, so one failing kernel must not take the others' results with it.
// The parent makes no CUDA call (a CUDA context does not survive fork). MASSKV_CUDA_PATHS=sm80
// forces the sm_80 paths (scripts/gpu.sh --sm80); Hopper-only variants are skipped there.
// Plain printf only: the GPU machine has none of the Debian C++ libraries.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "checks.hpp"
#include "gpu_util.cuh"
#include "masskv/cuda/arch.hpp"
#include "masskv/error.hpp"

namespace {

using L = masskv::cuda::SelectLaunch;

struct GpuTest {
  std::string name;
  int (*run)();
  bool hopper_only = false;
  std::function<void(L&)> launch = {};  // the variant's selection launch, from the default
};

std::vector<GpuTest> all_tests() {
  std::vector<GpuTest> t = {
      {"decode", run_decode_check},
      {"decode-token", run_decode_token_check},
      {"select-selftest", run_select_selftest},
      {"select", run_select_check},
  };
  // The top-k's cluster size follows the sequence length: every size on every case (Hopper:
  // before sm_90 the block top-k serves every length).
  for (const int c : {1, 2, 4, 8})
    t.push_back({"select/topk-cluster-" + std::to_string(c), run_select_check, true, [c](L& l) {
                   l.topk_kernel = L::TopkKernel::cluster;
                   l.topk_cluster = c;
                 }});
  t.push_back({"prefill", run_prefill_check});
  t.push_back({"append", run_append_check});
  t.push_back({"extend-kept", run_extend_check});
  t.push_back({"two-stage", run_two_stage_check});
  t.push_back({"engine-pages", run_engine_pages_check});
  // The newest kernels last. The hierarchical page pass has two scans chosen by the sequence
  // length: each on every case; then the hierarchical selection in one kernel for every call
  // (the entmax-aware and adaptive selections run through it too).
  t.push_back({"select-compact", run_compact_check});
  t.push_back({"select-compact/hier-scan-mask", run_compact_check, false,
               [](L& l) { l.hier_scan = L::HierScan::mask; }});
  t.push_back({"select-compact/hier-scan-list", run_compact_check, false,
               [](L& l) { l.hier_scan = L::HierScan::list; }});
  t.push_back({"select-compact/hier-fused", run_compact_check, true,
               [](L& l) { l.hier_kernel = L::HierKernel::fused; }});
  t.push_back({"scorer", run_scorer_check});
  return t;
}

bool selected(const std::string& name, const std::vector<std::string_view>& wanted) {
  if (wanted.empty()) return true;
  for (const std::string_view w : wanted)
    if (name == w || (name.size() > w.size() && name.compare(0, w.size(), w) == 0 &&
                      name[w.size()] == '/'))
      return true;
  return false;
}

constexpr int kSkipped = 77;  // a child's exit status: the test does not apply to these paths

// In the child: the check's failures as its exit status (0 passed, 1 failed, kSkipped).
[[noreturn]] void run_child(const GpuTest& t) {
  int status = 1;
  try {
    if (t.hopper_only && !masskv::cuda::hopper_paths()) {
      std::printf("skipped: a Hopper (sm_90) path, and these are the sm_80 paths\n");
      status = kSkipped;
    } else {
      if (t.launch) t.launch(select_launch());
      status = t.run() == 0 ? 0 : 1;
    }
  } catch (const masskv::Error& e) {
    std::printf("masskv::Error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::printf("exception: %s\n", e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string_view> wanted;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--list") {
      list = true;
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: %s [--list] [NAME ...]\n", argv[0]);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "masskv_gpu_tests: unknown option %s (try --help)\n", argv[i]);
      return 2;
    } else {
      wanted.push_back(a);
    }
  }
  const std::vector<GpuTest> tests = all_tests();
  for (const std::string_view w : wanted) {
    bool any = false;
    for (const GpuTest& t : tests) any = any || selected(t.name, {w});
    if (!any) {
      std::fprintf(stderr, "masskv_gpu_tests: no test named %.*s (--list names them)\n",
                   static_cast<int>(w.size()), w.data());
      return 2;
    }
  }
  if (list) {
    for (const GpuTest& t : tests) std::printf("%s\n", t.name.c_str());
    return 0;
  }
  try {
    masskv::cuda::set_cuda_paths(env_cuda_paths());  // no CUDA call: the children decide
  } catch (const masskv::Error& e) {
    std::fprintf(stderr, "masskv::Error: %s\n", e.what());
    return 2;
  }
  int passed = 0, failed = 0, skipped = 0;
  std::vector<std::string> failures;
  for (const GpuTest& t : tests) {
    if (!selected(t.name, wanted)) continue;
    std::printf("== %s\n", t.name.c_str());
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) run_child(t);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0) {
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == kSkipped) {
      ++skipped;
      std::printf("[ skip ] %s\n", t.name.c_str());
    } else if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
      ++passed;
      std::printf("[  ok  ] %s (%.1f s)\n", t.name.c_str(), secs);
    } else {
      ++failed;
      failures.push_back(t.name);
      if (WIFSIGNALED(ws))
        std::printf("[ FAIL ] %s (%.1f s): killed by signal %d\n", t.name.c_str(), secs,
                    WTERMSIG(ws));
      else
        std::printf("[ FAIL ] %s (%.1f s): exit status %d\n", t.name.c_str(), secs,
                    WEXITSTATUS(ws));
    }
    std::fflush(stdout);
  }
  for (const std::string& f : failures) std::printf("FAILED: %s\n", f.c_str());
  if (skipped > 0) std::printf("%d skipped (Hopper-only variants on the sm_80 paths)\n", skipped);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed > 0 ? 1 : 0;
}
