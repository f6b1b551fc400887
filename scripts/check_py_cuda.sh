#!/usr/bin/env bash
# The CUDA half of the Python bindings (python/src/cuda_*.cpp and the MASSKV_PY_CUDA blocks of
# the others) compiled for syntax and types on a machine without a GPU: CI builds the module
# without CUDA, so this is the only check those files get before the GPU machine builds them.
# Takes the compile command of the CPU module's build (build/py, made by scripts/setup.sh
# --python), switches MASSKV_PY_CUDA on, adds the CUDA headers, and runs -fsyntax-only.
#   scripts/check_py_cuda.sh   (exit 0: every file compiles, or no CUDA headers to check with;
#   ends with "N passed, N failed" for scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
if [[ ! -f "$cuda_inc/cuda_runtime.h" ]]; then
  echo "check_py_cuda: no $cuda_inc/cuda_runtime.h: skipped"
  echo "0 passed, 0 failed"
  exit 0
fi
db=$(ls build/py/*/compile_commands.json 2>/dev/null | head -1)
[[ -n "$db" ]] || { echo "check_py_cuda: no build/py/*/compile_commands.json (scripts/setup.sh --python first)" >&2; exit 2; }
cmd=$(python3 - "$db" <<'PY'
import json, shlex, sys
for e in json.load(open(sys.argv[1])):
    if e["file"].endswith("python/src/bind_select.cpp"):
        a = shlex.split(e["command"])
        i = a.index("-c")
        out = [x for j, x in enumerate(a[:i]) if x != "-o" and (j == 0 or a[j - 1] != "-o")]
        print(" ".join(shlex.quote(x.replace("MASSKV_PY_CUDA=0", "MASSKV_PY_CUDA=1")) for x in out))
        break
PY
)
[[ -n "$cmd" ]] || { echo "check_py_cuda: bind_select.cpp is not in $db" >&2; exit 2; }
passed=0; failed=0
for f in python/src/cuda_calls.cpp python/src/cuda_stores.cpp python/src/cuda_prefill.cpp \
         python/src/bind_select.cpp \
         python/src/bind_attn.cpp python/src/module.cpp; do
  if eval "$cmd -isystem $cuda_inc -Werror -fsyntax-only $f"; then
    echo "PASS $f"; passed=$((passed + 1))
  else
    echo "FAIL $f"; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
