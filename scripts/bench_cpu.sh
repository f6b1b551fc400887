#!/usr/bin/env bash
# Runs the CPU attention benchmark and commits-ready results under bench/results/:
# <date>-cpu-attn.md (command, date, machine, table) and .json (its rows, -o json --out).
#   scripts/bench_cpu.sh [extra masskv bench attn arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --build-dir build >/dev/null
day=$(date -u +%Y-%m-%d)
out=bench/results/$day-cpu-attn
cmd=(build/masskv bench attn -o json --out "$out.json" "$@")
{
  echo "# CPU attention benchmark, $day"
  echo
  echo "- command: \`${cmd[*]}\`"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(lscpu | sed -n 's/^L3 cache: *//p') L3," \
       "flags: $(grep -m1 -o -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "- load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  "${cmd[@]}"
} | tee "$out.md"
