#!/usr/bin/env bash
# The main job on a fresh machine: set up (build + the default model + the text), then run
# `masskv eval` — the quick suite on SmolLM2-135M-Instruct: long-context tasks, dense against
# every selector at a matched KV budget; the table is printed and written to out/eval/
# (results.md / .csv / .json, PNG plots). Extra arguments go to `masskv eval` (e.g. --full,
# -m gemma3; see `build/masskv eval --help`). Results are cached in out/eval/cache.jsonl: a
# stopped run resumes. The entmax rows use SmolLM2's committed entmax conversion.
set -euo pipefail
cd "$(dirname "$0")/.."
# The CLI alone: the test binary and CUDA objects are built by scripts/test.sh / scripts/gpu.sh.
scripts/setup.sh --build-dir build --default-model --cli-only
# The eval's plots (scripts/plot_eval.py) run with the python3 of the project's venv, where setup
# installed the pinned matplotlib.
source scripts/venv.sh
use_venv main.sh
# The entmax rows run the committed entmax conversion of SmolLM2 (docs/results/
# entmax-conversion-smollm2), not plain entmax on the softmax-trained model, unless another
# model or conversion is named.
conversion=(--entmax-conversion docs/results/entmax-conversion-smollm2/smollm2-entmax1.5.gguf)
out=(-O out/eval)
for a in "$@"; do
  case "$a" in
    -m | --model | --model=* | --entmax-conversion | --entmax-conversion=*) conversion=() ;;
    -O | --out-dir | --out-dir=*) out=() ;;
  esac
done
exec build/masskv eval "${out[@]}" "${conversion[@]}" "$@"
