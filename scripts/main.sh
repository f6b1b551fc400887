#!/usr/bin/env bash
# The main job on a fresh machine: set up (build + the default model + the text), then run
# `masskv eval` — the quick suite on SmolLM2-135M-Instruct: long-context tasks, dense against
# every selector at a matched KV budget; the table is printed and written to out/eval/
# (results.md / .csv / .json, PNG plots). Extra arguments go to `masskv eval` (e.g. --full,
# -m gemma3; see `build/masskv eval --help`). Results are cached in out/eval/cache.jsonl: a
# stopped run resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --build-dir build --default-model
exec build/masskv eval -o out/eval "$@"
