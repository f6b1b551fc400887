#!/usr/bin/env bash
# Sets up, builds and runs the whole masskv test suite; ends with one line
# "N passed, N failed" summed over every runner used.
#   scripts/test.sh              Release build: gtest suite + CLI checks + Python (pytest)
#   scripts/test.sh --sanitize   ... then the gtest suite again under ASan + UBSan, and a
#                                one-minute libFuzzer run of the GGUF reader (counts as 1 test)
set -uo pipefail
cd "$(dirname "$0")/.."

sanitize=0
for a in "$@"; do
  case "$a" in
    --sanitize) sanitize=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

# OpenMP threads that spin at barriers starve each other on a busy 2-core machine (a test
# that takes 5 s passive took 65 s spinning); tests never measure speed.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# Every python3 below (pytest, the CLI checks, the CLI's plots) is the one of the project's venv
# .venv/, which scripts/setup.sh makes with the pinned packages of requirements.txt.
source scripts/venv.sh

passed=0
failed=0
log_dir=$(mktemp -d)

# Runs a gtest binary; adds its counts. A crash (no summary line) counts as one failure.
run_gtest() {
  local name=$1; shift
  local log="$log_dir/$name.log"
  echo "== $name" >&2
  local t0=$SECONDS
  "$@" --gtest_brief=1 >"$log" 2>&1
  local rc=$?
  local p f
  p=$(grep -oP '^\[  PASSED  \] \K[0-9]+' "$log" | tail -1)
  f=$(grep -oP '^\[  FAILED  \] \K[0-9]+(?= tests?, listed below)' "$log" | tail -1)
  p=${p:-0}; f=${f:-0}
  if [[ $rc -ne 0 && $f -eq 0 ]]; then
    f=1
    echo "$name exited with status $rc without a test summary:" >&2
    tail -40 "$log" >&2
  fi
  grep -E '^\[  FAILED  \]|Failure|ERROR: AddressSanitizer|runtime error' "$log" | head -60 >&2
  echo "$name: $p passed, $f failed ($((SECONDS - t0)) s)" >&2
  passed=$((passed + p)); failed=$((failed + f))
}

# Runs a script that ends with "N passed, N failed"; adds its counts.
run_counted() {
  local name=$1; shift
  local log="$log_dir/$name.log"
  echo "== $name" >&2
  "$@" >"$log" 2>&1
  local rc=$?
  local line p f
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
  p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}')
  p=${p:-0}; f=${f:-0}
  [[ $rc -ne 0 && $f -eq 0 ]] && f=1
  grep -E '^FAIL' "$log" >&2
  echo "$name: $p passed, $f failed" >&2
  passed=$((passed + p)); failed=$((failed + f))
}

# Runs pytest; adds the counts of its summary line ("3 failed, 60 passed, 2 skipped in 4s").
# Exit 5 (no test collected) counts as a failure: python/tests always has tests.
run_pytest() {
  local name=$1; shift
  local log="$log_dir/$name.log"
  echo "== $name" >&2
  local t0=$SECONDS
  python3 -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1
  local rc=$?
  local summary p f e
  summary=$(grep -E '^=*.* in [0-9.]+s' "$log" | tail -1)
  p=$(grep -oP '[0-9]+(?= passed)' <<<"$summary"); f=$(grep -oP '[0-9]+(?= failed)' <<<"$summary")
  e=$(grep -oP '[0-9]+(?= errors?)' <<<"$summary")
  p=${p:-0}; f=$(( ${f:-0} + ${e:-0} ))
  if [[ $rc -eq 5 ]]; then
    echo "$name: pytest collected no tests" >&2; f=$((f + 1))
  elif [[ $rc -ne 0 && $f -eq 0 ]]; then
    f=1; tail -40 "$log" >&2
  fi
  grep -E '^(FAILED|ERROR) ' "$log" | head -40 >&2
  echo "$name: $p passed, $f failed ($((SECONDS - t0)) s): $summary" >&2
  passed=$((passed + p)); failed=$((failed + f))
}

if scripts/setup.sh --build-dir build --models && use_venv test.sh; then
  run_gtest unit build/masskv_tests
  run_counted cli tests/cli/run.sh build/masskv
  # Every subcommand's numeric options just outside their ranges, huge, NaN, garbage (< 90 s).
  run_counted sweep tests/cli/sweep.sh build/masskv
else
  echo "test.sh: Release build failed" >&2
  failed=$((failed + 1))
fi

# Python module: pip install . into .venv (incremental), then the NumPy tests; torch /
# transformers tests skip themselves where those packages are absent (they run on the GPU
# machine).
if scripts/setup.sh --no-build --python && use_venv test.sh; then
  run_pytest python python/tests
  # The CUDA half of the bindings, which the module built here leaves out: compiled for syntax.
  run_counted python-cuda scripts/check_py_cuda.sh
else
  echo "test.sh: Python module build failed" >&2
  failed=$((failed + 1))
fi

if [[ $sanitize -eq 1 ]]; then
  if scripts/setup.sh --build-dir build-asan --sanitize; then
    # Whole-model forward passes (ModelForward, LlamaCppAgreement: minutes in Release) would
    # take most of CI's time under ASan; the kernels they call are covered by the unit tests.
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
      run_gtest unit-asan-ubsan build-asan/masskv_tests \
      --gtest_filter='-ModelForward.*:LlamaCppAgreement.*'
  else
    echo "test.sh: sanitizer build failed" >&2
    failed=$((failed + 1))
  fi
fi

if [[ $sanitize -eq 1 ]]; then
  # The GGUF reader parses untrusted files: a short libFuzzer run (clang, ASan + UBSan) from the
  # committed corpus of malformed files; a crash or sanitizer report fails it.
  echo "== fuzz" >&2
  if scripts/setup.sh --no-build --fuzz && scripts/fuzz.sh 60 >"$log_dir/fuzz.log" 2>&1; then
    grep -E '^(stat::number_of_executed_units|Done )' "$log_dir/fuzz.log" >&2
    echo "fuzz: 1 passed, 0 failed" >&2
    passed=$((passed + 1))
  else
    tail -40 "$log_dir/fuzz.log" >&2
    echo "fuzz: 0 passed, 1 failed" >&2
    failed=$((failed + 1))
  fi
fi

rm -rf "$log_dir"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 && $passed -gt 0 ]]
