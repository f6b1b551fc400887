#!/usr/bin/env bash
# Builds the GGUF fuzz target with clang (libFuzzer + ASan + UBSan) and runs it.
#   scripts/fuzz.sh [seconds=60] [extra libFuzzer flags...]
# Seeds: tests/data/gguf (read only); new inputs go to build-fuzz/corpus; crashes are written
# to build-fuzz/crash-* and make the script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
cxx=${CXX_FUZZ:-clang++-14}
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DMASSKV_FUZZ=ON -DMASSKV_TOOLS=OFF -DMASSKV_CUDA=OFF -DMASSKV_WERROR=ON >/dev/null
ninja -C build-fuzz -j"${FUZZ_JOBS:-2}" gguf_fuzz
mkdir -p build-fuzz/corpus
cd build-fuzz
./gguf_fuzz -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 \
  -artifact_prefix=./ "$@" corpus ../tests/data/gguf
