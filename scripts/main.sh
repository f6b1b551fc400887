#!/usr/bin/env bash
# The main job on a fresh machine: set up (dependencies + build), then run it.
# Until the long-context eval exists, the main job is the CPU attention benchmark
# (dense vs sparse decode, read bandwidth measured in the same run). Extra arguments go to
# `masskv bench attn` (see `build/masskv bench attn --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --build-dir build
mkdir -p out
exec build/masskv bench attn --json out/bench_attn.json "$@"
