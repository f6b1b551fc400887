#!/usr/bin/env bash
# CLI checks: every command answers --help, bad input fails with exit 2 and names the
# option, and a tiny benchmark run writes its table and JSON. Ends with "N passed, N failed".
#   tests/cli/run.sh path/to/masskv
set -u
bin=${1:?usage: run.sh path/to/masskv}
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() {  # check NAME EXPECTED_RC GREP_PATTERN -- command...
  local name=$1 want=$2 pattern=$3; shift 4
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [[ $rc -eq $want ]] && grep -qE -- "$pattern" "$tmp/out"; then
    pass=$((pass + 1)); echo "PASS $name"
  else
    fail=$((fail + 1)); echo "FAIL $name (rc=$rc, want $want, pattern '$pattern')"
    head -20 "$tmp/out"
  fi
}

check help 0 'bench' -- "$bin" --help
check bench-help 0 'attn' -- "$bin" bench --help
check bench-attn-help 0 '--depth' -- "$bin" bench attn --help
check no-subcommand 106 'subcommand' -- "$bin"
check bad-depth 2 '--depth' -- "$bin" bench attn -d 12x
check bad-budget 2 '--budget' -- "$bin" bench attn -d 1K -b 3/2
check bad-dtype 2 '--kv-dtype' -- "$bin" bench attn -d 1K --kv-dtype fp8
check bad-alpha 2 'alpha' -- "$bin" bench attn -d 1K --mapping entmax --alpha 2.5
check bad-heads 2 '--hq' -- "$bin" bench attn -d 1K --hq 6 --hkv 4
check tiny-bench 0 '\| 1024 \| 1 \| 1/8 \|' -- "$bin" bench attn -d 1K -t 1 -b 1/8 \
  --min-seconds 0 -r 2 --hq 4 --hkv 2 --json "$tmp/b.json" --csv "$tmp/b.csv"
check tiny-bench-json 0 '"sparse"' -- cat "$tmp/b.json"
check tiny-bench-csv 0 '^sparse,1024,1,1/8,' -- cat "$tmp/b.csv"
check tiny-bench-entmax 0 'entmax' -- "$bin" bench attn -d 2K -t 2 -b 1/4 --min-seconds 0 \
  -r 2 --hq 8 --hkv 2 --mapping entmax --alpha 1.5 --kv-dtype bf16

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
