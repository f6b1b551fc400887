#!/usr/bin/env bash
# On the GPU machine: build the CUDA library, masskv_gpu_tests and masskv_gpu_bench, run the GPU
# tests (every CUDA kernel against the CPU references; check.log ends "N passed, N failed"), the
# benchmark, the torch SDPA peers, and write the joined report under $OUT
# (build.log check.log bench.log bench_ours.json bench_prefill.json bench_torch.json report.md
# report.json prefill.md prefill.json floor.md floor.json phases.log),
# then the Python tests CI cannot run (PyTorch tensors, the transformers integration) with the
# module built there (python.log), and with --e2e the whole-model decode table
# (tools/gpu_bench/e2e.py: e2e.md, e2e.json, e2e.log; E2E_ARGS adds its options). Wheels the machine lacks (nanobind, scikit-build-core) travel
# in .whl/ (see docs/python.md). Exit status: the check's, or pytest's when the check passed.
#   scripts/gpu.sh [--no-check] [--no-bench] [--no-python] [--e2e] [--prefill-only] [--sm80]   (stages to
#   skip: the device allows 10 minutes per call, so a long session splits the stages over calls
#   on the warm machine; --prefill-only: check and bench the prefill kernels alone, no Python;
#   --sm80: the sm_80 paths (MASSKV_CUDA_PATHS=sm80, no cluster or fused-selection runs); with
#   CUDA_ARCHS=80-virtual (the build's CMAKE_CUDA_ARCHITECTURES, default 90a) or GPU_BENCH a
#   binary of sm_80 PTX alone, the sm_80 code itself, JIT-compiled for this GPU)
set -uo pipefail
cd "$(dirname "$0")/.."
do_check=1; do_bench=1; do_python=1; do_e2e=0; prefill_only=0; sm80=0
for a in "$@"; do
  case "$a" in
    --no-check) do_check=0 ;;
    --no-bench) do_bench=0 ;;
    --no-python) do_python=0 ;;
    --e2e) do_e2e=1 ;;
    --prefill-only) prefill_only=1; do_python=0 ;;
    --sm80) sm80=1; export MASSKV_CUDA_PATHS=sm80 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem \
  --format=csv; nvcc --version | tail -1; } 2>&1 | tee "$OUT/check.log"
# GPU_BENCH=path and GPU_TESTS=path: masskv_gpu_bench and masskv_gpu_tests built elsewhere (same
# sources) instead of building here (both or neither).
if [[ $do_check -eq 0 && $do_bench -eq 0 ]]; then
  echo "no check or bench stage: masskv_gpu_tests / masskv_gpu_bench not built" > "$OUT/build.log"
elif [[ -n "${GPU_BENCH:-}" || -n "${GPU_TESTS:-}" ]]; then
  [[ -n "${GPU_BENCH:-}" && -n "${GPU_TESTS:-}" ]] \
    || { echo "gpu.sh: set GPU_BENCH and GPU_TESTS together" >&2; exit 2; }
  mkdir -p "$BUILD" && cp "$GPU_BENCH" "$BUILD/masskv_gpu_bench" \
    && cp "$GPU_TESTS" "$BUILD/masskv_gpu_tests" \
    && echo "prebuilt $GPU_BENCH $GPU_TESTS" > "$OUT/build.log"
else
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMASSKV_TOOLS=OFF -DMASSKV_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" \
    && ninja -C "$BUILD" -j"$(nproc)" masskv_gpu_tests masskv_gpu_bench; } > "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 2; }
fi
check_rc=0
if [[ $do_check -eq 1 ]]; then
  # Every check in its own process (a faulting kernel fails its test, not the run), the
  # selection checks again under each launch variant (masskv_gpu_tests --list).
  "$BUILD/masskv_gpu_tests" $([[ $prefill_only -eq 1 ]] && echo prefill) 2>&1 \
    | tee -a "$OUT/check.log"
  check_rc=${PIPESTATUS[0]}
  # A failing (or faulting) kernel must not take the benchmark's process down with it: the bench
  # leaves out the rows of the fused hierarchical selection and of the two-stage selection when
  # their tests failed.
  if grep -q '^FAILED: select-compact/hier-fused$' "$OUT/check.log"; then
    export MASSKV_BENCH_FUSED=0
    echo "the fused hierarchical selection failed its check: the bench leaves its rows out" \
      | tee -a "$OUT/check.log"
  fi
  if grep -q '^FAILED: two-stage$' "$OUT/check.log"; then
    export MASSKV_BENCH_TWO_STAGE=0
    echo "the two-stage selection failed its check: the bench leaves its rows out" \
      | tee -a "$OUT/check.log"
  fi
  echo "check exit status: $check_rc"
fi
if [[ $do_bench -eq 1 ]]; then
  : > "$OUT/bench.log"
  [[ $prefill_only -eq 0 ]] && "$BUILD/masskv_gpu_bench" bench "$OUT/bench_ours.json" 2>&1 \
    | tee -a "$OUT/bench.log"
  "$BUILD/masskv_gpu_bench" prefill-bench "$OUT/bench_prefill.json" 2>&1 | tee -a "$OUT/bench.log"
  PYTHONUNBUFFERED=1 python3 tools/gpu_bench/torch_peer.py "$OUT/bench_torch.json" \
    $([[ $prefill_only -eq 1 ]] && echo --prefill) 2>&1 | tee -a "$OUT/bench.log"
  [[ $prefill_only -eq 0 ]] && python3 tools/gpu_bench/report.py "$OUT/bench_ours.json" \
    "$OUT/bench_torch.json" "$OUT/report.md" "$OUT/report.json"
  python3 tools/gpu_bench/prefill_report.py "$OUT/bench_prefill.json" "$OUT/bench_torch.json" \
    "$OUT/prefill.md" "$OUT/prefill.json"
  # issue 33's table: every row against cuDNN and the floor of a fresh sparse step, same run.
  [[ $prefill_only -eq 0 ]] && python3 tools/gpu_bench/floor_report.py "$OUT/bench_ours.json" \
    "$OUT/bench_torch.json" "$OUT/bench_prefill.json" "$OUT/floor.md" "$OUT/floor.json" \
    --command "scripts/gpu.sh $*" > /dev/null
  # Where a B = 1 step's time goes, kernel phase by phase (docs/gpu.md).
  [[ $prefill_only -eq 0 ]] && "$BUILD/masskv_gpu_bench" profile-phases > "$OUT/phases.log" 2>&1
fi
[[ $do_python -eq 0 && $do_e2e -eq 0 ]] && exit "$check_rc"

# Python: the module against torch and transformers (python3 there holds them). The GPU machine
# reaches no package registry, so this is its own python3, not the .venv of scripts/setup.sh.
SITE=${SITE:-/tmp/masskv-site}
{ if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl
  fi
  # The CUDA build of the module: decode / Quest selection on torch CUDA tensors (test_cuda.py).
  PYTHONPATH="$SITE" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip install -q \
    --no-build-isolation --no-deps --no-index --target "$SITE" \
    -C cmake.define.MASSKV_CUDA=ON -C build-dir=build/py-cuda . &&
  { [[ $do_python -eq 0 ]] || PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 python3 -X faulthandler \
    -m pytest -v -p no:cacheprovider python/tests; }; } > "$OUT/python.log" 2>&1
py_rc=$?
tail -30 "$OUT/python.log"
echo "pytest exit status: $py_rc"
# E2E_ALWAYS=1: the table even when a Python test failed (its own --check still guards it).
if [[ $do_e2e -eq 1 && ( $py_rc -eq 0 || -n "${E2E_ALWAYS:-}" ) ]]; then
  # shellcheck disable=SC2086  # E2E_ARGS: several options
  PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 python3 tools/gpu_bench/e2e.py "$OUT/e2e" --check \
    ${E2E_ARGS:-} 2>&1 | tee "$OUT/e2e.log"
  py_rc=${PIPESTATUS[0]}
fi
[[ $check_rc -ne 0 ]] && exit "$check_rc"
exit "$py_rc"
