#!/usr/bin/env bash
# CLI checks: every command answers --help, bad input fails with exit 2 and names the
# option, a tiny benchmark run writes its table and JSON, and a tiny eval resumes from its
# cache. Ends with "N passed, N failed".
#   tests/cli/run.sh path/to/masskv
set -u
bin=${1:?usage: run.sh path/to/masskv}
pass=0
fail=0
tmp=$(mktemp -d)
root=$(cd "$(dirname "$0")/../.." && pwd)  # the repository (committed selector files)
trap 'rm -rf "$tmp"' EXIT
# python3 below, and the CLI's plot and llama.cpp calls, run the project's venv (scripts/setup.sh
# makes it, with matplotlib and the models).
source "$root/scripts/venv.sh" && use_venv tests/cli/run.sh || exit 1

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
check version 0 '^masskv [0-9.]+ \(commit [0-9a-f]+(\+modified)?; (Release|Debug|RelWithDebInfo).* build' -- \
  "$bin" --version
check bench-help 0 'attn' -- "$bin" bench --help
check bench-attn-help 0 '--depth' -- "$bin" bench attn --help
check no-subcommand 2 'subcommand' -- "$bin"
# Every command's --help ends with 2-3 examples that name only its options and pass its checks.
for c in run perplexity bench "bench attn" "bench dist" "bench keys" "bench select" study reuse \
    dump convert distill eval selector "selector init"; do
  check "help-examples-${c// /-}" 0 '^Examples:' -- "$bin" $c --help
  check "help-examples-valid-${c// /-}" 0 '^examples ok' -- python3 "$root/tests/cli/help_examples.py" \
    "$bin" $c
done
# One dialect (docs/cli.md); its old spellings are refused in tests/cli/sweep.sh.
check dialect-ctx-suffix 0 'ctx-size=1024' -- "$bin" run -p hi -n 1 -c 1K --dry-run
check dialect-model-unknown 2 '^masskv: error: --model: .*no such file' -- "$bin" run -m gemma4 \
  --dry-run
check dialect-models-unknown 2 '^masskv: error: --model' -- "$bin" bench -m smollm2,none.gguf \
  --dry-run
check bad-depth 2 '--depth' -- "$bin" bench attn -d 12x
check bad-budget 2 '--budget' -- "$bin" bench attn -d 1K --budget 3/2
check bad-dtype 2 '--kv-dtype' -- "$bin" bench attn -d 1K --kv-dtype fp8
check bad-alpha 2 'alpha' -- "$bin" bench attn -d 1K --mapping entmax --alpha 2.5
check bad-heads 2 '--hq' -- "$bin" bench attn -d 1K --hq 6 --hkv 4
check tiny-bench 0 '\| 1024 \| 1 \| 1/8 \|' -- "$bin" bench attn -d 1K -t 1 --budget 1/8 \
  --min-seconds 0 -r 2 --hq 4 --hkv 2 -o csv --out "$tmp/b.csv"
check tiny-bench-csv 0 '^sparse,1024,1,[0-9.e+-]+,[0-9.e+-]+,' -- cat "$tmp/b.csv"
check tiny-bench-csv-numeric 0 '^numeric$' -- python3 -c "
import csv
rows = list(csv.DictReader(open('$tmp/b.csv')))
num = lambda v: v == '' or float(v) == float(v)
ok = {r['kind'] for r in rows} == {'dense', 'sparse'} and all(
    num(v) for r in rows for k, v in r.items() if k not in ('kind', 'budget', 'kv_dtype', 'mapping'))
print('numeric' if ok else rows)"
check tiny-bench-json 0 '"kind": "sparse"' -- "$bin" bench attn -d 1K -t 0 --budget 1/8 \
  --min-seconds 0 -r 2 --hq 4 --hkv 2 -o json
check tiny-bench-entmax 0 'entmax' -- "$bin" bench attn -d 2K -t 2 --budget 1/4 --min-seconds 0 \
  -r 2 --hq 8 --hkv 2 --mapping entmax --alpha 1.5 --kv-dtype bf16

# bench (model, llama-bench style): errors before any work, a tiny run in each format.
check bench-model-help 0 '--n-depth' -- "$bin" bench --help
check bench-model-zero 2 '-p/-n' -- "$bin" bench -p 0 -n 0
check bench-model-reps 2 '^masskv: error.*-r' -- "$bin" bench -r 0
check bench-model-too-deep 2 'exceeds the context of smollm2' -- "$bin" bench -d 9000
check bench-model-bad-format 2 'output' -- "$bin" bench -o xml
check bench-model-tiny 0 '\| quest [0-9]+ \| tg4 @ d48 \|' -- "$bin" bench -p 16 -n 4 -d 0,48 -r 1 \
  --selector quest --budget 1/2
# --selector takes eval's METHOD+MOD spellings: the two-pass token codes run; a wrong one is
# refused by name before any work.
check bench-model-twopass 0 '\| token_codes\+twopass [0-9]+ \| tg4 @ d48 \|' -- "$bin" bench -p 16 \
  -n 4 -d 48 -r 1 --selector token_codes+twopass --budget 1/2
check bench-model-bad-modifier 2 '--selector.*\+twopass applies to token_codes only' -- "$bin" \
  bench -p 16 -n 4 --selector quest+twopass
check run-unknown-modifier 2 "--selector.*unknown modifier '\+foo'" -- "$bin" run -n 1 -p hi \
  --selector token_codes+foo
check run-dense-modifier 2 '--selector.*applies to decode selectors' -- "$bin" run -n 1 -p hi \
  --selector dense+dense1
check bench-model-json 0 '"tps_sd"' -- "$bin" bench -p 8 -n 2 -r 1 -o json
check bench-model-jsonl 0 '^2 rows, numeric$' -- bash -c "'$bin' bench -p 8 -n 2 -r 1 -o jsonl \
  2>/dev/null | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
ok = all(isinstance(r[\"tps_mean\"], float) and isinstance(r[\"tps_sd\"], float) for r in rows)
print(len(rows), \"rows,\", \"numeric\" if ok else rows)'"
check bench-model-out 0 '^\| smollm2 \| .* \| pp8 \|' -- "$bin" bench -p 8 -n 0 -r 1 -o csv \
  --out "$tmp/bench.csv"
check bench-model-out-file 0 '^smollm2,llama,[0-9.]+,masskv,1,dense,pp8,0,8,[0-9.e+-]+,' -- \
  cat "$tmp/bench.csv"
check bench-model-out-no-symbols 1 '^0$' -- grep -cE '±|×' "$tmp/bench.csv"
check bench-model-out-dir 2 '--out' -- "$bin" bench -p 8 -n 0 -r 1 -o csv --out "$tmp"
if "$bin" run -m gemma3 -n 1 -p hi >/dev/null 2>&1; then  # bench: several -m, a group each
  check bench-models 0 '\| smollm2 \| .* \| tg2 \|.*\| gemma3 \| .* \| tg2 \|' -- bash -c \
    "'$bin' bench -m smollm2 -m gemma3 -p 8 -n 2 -r 1 2>/dev/null | tr '\n' ' '"
fi
check bench-model-batch 0 '\| tg2x3 \|' -- "$bin" bench -p 0 -n 2 -b 1,3 -r 1
check bench-model-bad-batch 2 '-b' -- "$bin" bench -p 0 -n 2 -b 0
check bench-model-csv 0 '^smollm2,llama,[0-9.]+,masskv,1,dense,pp8,0,8,[0-9.e+-]+,[0-9.e+-]+,' -- \
  "$bin" bench -p 8 -n 0 -r 1 -o csv
check bench-model-all-cores 0 "\\| masskv \\| $(nproc) \\| dense \\| pp8 \\|" -- "$bin" bench -p 8 -n 0 \
  -r 1 -t 0
if python3 -c 'import llama_cpp' 2>/dev/null; then
  check bench-model-peer 0 '\| llama.cpp \| 1 \| dense \| tg2 \|' -- "$bin" bench -p 8 -n 2 -r 1 \
    --peer llama.cpp
else
  check bench-model-peer-missing 2 'setup.sh --peer' -- "$bin" bench -p 8 -n 2 --peer llama.cpp
fi

# dump: real q/k/v that study reads back; damaged files are errors naming the file.
check dump-help 0 '--layers' -- "$bin" dump --help
check dump-bad-layer 2 'layer 99 out of range' -- "$bin" dump --layers 99 -d 64 -O "$tmp/dump"
check dump-too-deep 2 'exceeds' -- "$bin" dump -d 9000 -O "$tmp/dump"
check dump-tiny 0 'layer03.mkvd' -- "$bin" dump -d 96 --layers 2,3 --steps 2 -t 1 -O "$tmp/dump"
# bench select times the page-code selectors too (the cache keeps the codes when one is asked).
check bench-select-codes 0 '\| 2048 \| token_codes \| [0-9]+ \| 128 \|' -- "$bin" bench select \
  -d 2K --hq 4 --hkv 2 --head-dim 64 --budget 1/16 --selectors quest,token_codes -r 1
# --prompts: JSON lines of the caller's own; a bad line is an error naming the file and line.
printf '%s\n' '{"name": "p1", "prompt": "The box is red. The cup is blue.\nQuestion: What colour is the cup?\nAnswer:", "answer": " blue"}' > "$tmp/prompts.jsonl"
check dump-prompts 0 'p1/layer01.mkvd' -- "$bin" dump --prompts "$tmp/prompts.jsonl" --layers 1 \
  -t 1 -O "$tmp/dump-prompts"
printf '%s\n' '{"name": "p1", "prompt": "x"}' > "$tmp/prompts-bad.jsonl"
check dump-prompts-no-answer 2 'line 1: "answer" must be a non-empty string' -- "$bin" dump \
  --prompts "$tmp/prompts-bad.jsonl" --layers 1 -O "$tmp/dump-prompts"
printf '%s\n%s\n' '{"name": "a", "prompt": "x", "answer": "y"}' 'not json' > "$tmp/prompts-bad.jsonl"
check dump-prompts-not-json 2 'line 2: not a JSON object' -- "$bin" dump \
  --prompts "$tmp/prompts-bad.jsonl" --layers 1 -O "$tmp/dump-prompts"
printf '%s\n%s\n' '{"name": "a", "prompt": "x", "answer": "y"}' '{"name": "a", "prompt": "z", "answer": "y"}' > "$tmp/prompts-bad.jsonl"
check dump-prompts-twice 2 "the name 'a' is used twice" -- "$bin" dump \
  --prompts "$tmp/prompts-bad.jsonl" --layers 1 -O "$tmp/dump-prompts"
check dump-prompts-missing 2 'no such file' -- "$bin" dump --prompts "$tmp/nope.jsonl" \
  -O "$tmp/dump-prompts"
check dump-prompts-and-task 2 'not both' -- "$bin" dump --prompts "$tmp/prompts.jsonl" \
  --task niah_single_number -O "$tmp/dump-prompts"
check study-dump 0 '\| dump:.*layer02.mkvd \| softmax \| quest \| 1/4 \|' -- "$bin" study \
  --generators "dump:$tmp/dump/layer02.mkvd" --budget 1/4 --mapping softmax --selectors quest \
  --no-plots
check study-dump-csv 0 '^dump:.*layer02.mkvd,softmax,quest,1/4,0.25,' -- "$bin" study \
  --generators "dump:$tmp/dump/layer02.mkvd" --budget 1/4 --mapping softmax --selectors quest \
  --no-plots -o csv
head -c 1000 "$tmp/dump/layer02.mkvd" > "$tmp/cut.mkvd"
check study-dump-truncated 2 'truncated' -- "$bin" study --generators "dump:$tmp/cut.mkvd" \
  --budget 1/4 --mapping softmax --selectors quest --no-plots
check study-dump-not-a-dump 2 'not a masskv q/k/v dump' -- "$bin" study \
  --generators "dump:$tmp/b.csv" --no-plots
# Progress in logs: with stderr not a terminal, a line every MASSKV_PROGRESS_SECONDS (default 5).
check progress-in-logs 0 '^study: [0-9]+/[0-9]+ \([0-9]+%\), .*/s, .* elapsed, ETA' -- env \
  MASSKV_PROGRESS_SECONDS=0.001 "$bin" study -c 2K --steps 1 --generators gaussian,needles \
  --selectors quest --budget 1/8,1/4 --mapping softmax --no-plots
# reuse: selections reused across steps and layers, on the dumps; its fresh rows are the study's.
check reuse-help 0 '--ages' -- "$bin" reuse --help
check reuse-tiny 0 '\| softmax \| quest \| 1/4 \| prev layer \|' -- "$bin" reuse \
  --inputs "$tmp/dump/layer02.mkvd,$tmp/dump/layer03.mkvd" --selectors quest --budget 1/4 \
  --mapping softmax --ages 1,4 --policy-cos 0.9 -O "$tmp/reuse" --no-plots
check reuse-age-skipped 0 'age 4 skipped' -- "$bin" reuse --inputs "$tmp/dump/layer02.mkvd" \
  --selectors quest --budget 1/4 --mapping softmax --ages 4 --no-plots
check reuse-jsonl 0 '"source":"fresh"' -- "$bin" reuse --inputs "$tmp/dump/layer02.mkvd" \
  --selectors quest --budget 1/4 --mapping softmax --ages 1 --no-plots -o jsonl
check reuse-step-row 0 '^3,softmax,quest,1/4,step −1,1,' -- cat "$tmp/reuse/reuse.csv"
check reuse-policy-row 0 '^3,softmax,quest,1/4,R 16 cos 0.9,-2,' -- cat "$tmp/reuse/reuse.csv"
"$bin" study --generators "dump:$tmp/dump/layer02.mkvd" --budget 1/4 --mapping softmax \
  --selectors quest --no-plots -o json --out "$tmp/study.json" >/dev/null 2>&1
check reuse-fresh-is-study 0 '^same$' -- python3 -c "
import json
s = [r for r in json.load(open('$tmp/study.json')) if r['selector'] == 'quest']
r = [r for r in json.load(open('$tmp/reuse/reuse.json'))['rows']
     if r['layer'] == 2 and r['source'] == 'fresh']
ok = len(s) == len(r) == 1 and s[0]['delta'] == r[0]['delta'] and s[0]['recall'] == r[0]['recall']
print('same' if ok else f'differ: {s} {r}')"
check reuse-bad-age 2 '--ages' -- "$bin" reuse --inputs "$tmp/dump/layer02.mkvd" --ages 0 \
  --no-plots
check reuse-q4 2 '--selectors' -- "$bin" reuse --inputs "$tmp/dump/layer02.mkvd" \
  --selectors top_p_q4 --no-plots
"$bin" dump -d 96 --layers 2 --steps 1 -t 1 -O "$tmp/dump1" >/dev/null 2>&1
check reuse-one-query 2 'at least 2' -- "$bin" reuse --inputs "$tmp/dump1/layer02.mkvd" --no-plots
check reuse-shapes 2 'shapes differ' -- "$bin" reuse \
  --inputs "$tmp/dump/layer02.mkvd,$tmp/dump1/layer02.mkvd" --no-plots
check run-bad-reselect 2 '--reselect-every' -- "$bin" run --reselect-every 0 -p hi
# bench keys: selector key formats on the dumped keys.
check bench-keys-help 0 '--formats' -- "$bin" bench keys --help
check bench-keys-bad-format 2 '--formats' -- "$bin" bench keys --dumps "$tmp/dump/layer02.mkvd" \
  --formats fp4
check bench-keys-tiny 0 '\| nvfp4 \| 4.5 \| 4.5 \| 36 \| 72 \|' -- "$bin" bench keys \
  --dumps "$tmp/dump/layer02.mkvd" --budget 1/2 -o json --out "$tmp/keys.json"
check bench-keys-json 0 '"mass_recall"' -- cat "$tmp/keys.json"

# distill: options checked before any work; a tiny run writes the selector, curves and summary.
check distill-help 0 '--groups' -- "$bin" distill --help
check distill-bad-layers 2 '--layers' -- "$bin" distill --layers 3-1
check distill-layer-range 2 'outside the model' -- "$bin" distill --layers 0-99
check distill-bad-dim 2 'dim' -- "$bin" distill --dim 0
check distill-bad-input 2 '--input' -- "$bin" distill --input values
check distill-bad-groups 2 '--groups' -- "$bin" distill --groups heads
check distill-rope-qk 2 'rope' -- "$bin" distill --rope
check distill-tiny 0 '^\| 2 \| [0-9.]+ \| [0-9.]+ \|' -- "$bin" distill --layers 2 --tokens 96 \
  --sequences 2 --queries 8 --steps 4 --dim 32 -t 1 --out "$tmp/distill/s.gguf" \
  --cache-dir "$tmp/acts"
check distill-outputs 0 's_curves.csv' -- ls "$tmp/distill"
# bench keys on the distilled selector's projections: d_s = 32 rows, layer 2 only.
check bench-keys-selector 0 '\| int4 \| 4.5 \| 4.5 \| 18 \| 36 \|' -- "$bin" bench keys \
  --dumps "$tmp/dump/layer02.mkvd" --budget 1/2 --selector-file "$tmp/distill/s.gguf"
check bench-keys-selector-layer 2 'no layer 3' -- "$bin" bench keys \
  --dumps "$tmp/dump/layer03.mkvd" --selector-file "$tmp/distill/s.gguf"

# eval: options checked before any work; a tiny run, its cache resumed, then widened.
check eval-help 0 '--budgets' -- "$bin" eval --help
check eval-bad-task 2 '--tasks' -- "$bin" eval --tasks needle_in_a_sack
check eval-bad-length 2 '--lengths' -- "$bin" eval --tasks vt --lengths 1Q
check eval-bad-method 2 '--methods' -- "$bin" eval --methods quest,magic
check eval-bad-budget 2 '--budgets' -- "$bin" eval --budgets 3/2
check eval-too-long 2 'context' -- "$bin" eval --tasks vt --lengths 1M
check eval-bad-batch 2 '--batch' -- "$bin" eval --batch -1
check eval-bad-reselect 2 'decode selectors only' -- "$bin" eval --methods dense@4
check eval-bad-reselect-steps 2 'METHOD@R' -- "$bin" eval --methods quest@0
check eval-bad-reselect-cos 2 'METHOD@RcCOS' -- "$bin" eval --methods quest@4c1.5
check eval-bad-timing 2 'METHOD@prev or METHOD@union' -- "$bin" eval --methods quest@previous
check eval-timing-dense 2 'decode selectors only' -- "$bin" eval --methods dense@prev
check eval-bad-modifier 2 '\+pages applies to two_stage only' -- "$bin" eval --methods quest+pages
check eval-unknown-modifier 2 "unknown modifier '\+foo'" -- "$bin" eval --methods two_stage+foo@2
check eval-modifier-dry-run 0 'report_rows=3' -- "$bin" eval --methods dense,oracle+tokens,two_stage+pages@2 \
  --budgets 1/16 --protocol strict --dry-run
# One protocol keeps these runs short; eval-protocols runs both.
ev=(--tasks niah_single_number --lengths 512 --samples 1 --budgets 1/8 -t 1 --no-plots
    --protocol strict -O "$tmp/eval")
check eval-tiny 0 '\| quest \| 1/8 \| softmax \|' -- "$bin" eval "${ev[@]}" --methods dense,quest
check eval-tiny-files 0 'niah_single_number' -- cat "$tmp/eval/results.md" "$tmp/eval/results.csv"
if python3 -c 'import matplotlib' 2>/dev/null; then  # the plots of the tiny run (one budget)
  check eval-plots 0 'accuracy_vs_budget.png' -- bash -c "python3 '$root/scripts/plot_eval.py' \
    '$tmp/eval/results.csv' '$tmp/eval' && ls '$tmp/eval'"
fi
check eval-resumes 0 '2 results cached, 0 samples to run' -- \
  "$bin" eval "${ev[@]}" --methods dense,quest
check eval-widens 0 '2 results cached, 1 samples to run' -- \
  "$bin" eval "${ev[@]}" --methods dense,quest,sink_recent
check eval-cache-lines 0 '^3$' -- bash -c "wc -l < '$tmp/eval/cache.jsonl'"
# token_codes' rule in one cache spelling: the default (log_prob) finds +lse's rows; the round
# robin (+rr) is a row of its own, and finds the rows plain token_codes wrote before the change.
evc=(--tasks niah_single_number --lengths 512 --samples 1 --budgets 1/8 -t 1 --no-plots
     --protocol strict -O "$tmp/eval-tc")
check eval-tc-lse 0 '0 results cached, 1 samples to run' -- "$bin" eval "${evc[@]}" \
  --methods token_codes+lse
check eval-tc-default-is-lse 0 '1 results cached, 0 samples to run' -- "$bin" eval "${evc[@]}" \
  --methods token_codes
check eval-tc-rr-apart 0 '0 results cached, 1 samples to run' -- "$bin" eval "${evc[@]}" \
  --methods token_codes+rr
check eval-tc-rr-old-rows 0 '1 results cached, 0 samples to run' -- bash -c "python3 -c \"
import json
for l in open('$tmp/eval-tc/cache.jsonl'):
    r = json.loads(l)
    if r['method'] == 'token_codes+rr': r['method'] = 'token_codes'; print(json.dumps(r))
\" > '$tmp/eval-tc/old.jsonl' && '$bin' eval ${evc[*]} --methods token_codes+rr \
  --cache '$tmp/eval-tc/old.jsonl'"
# ... and results.json's records carry the run's spelling, not the cached line's.
check eval-tc-records-spelling 0 '^token_codes\+rr$' -- python3 -c "
import json
print(*sorted({r['method'] for r in json.load(open('$tmp/eval-tc/results.json'))['records']}))"
# Two passes became token_codes' default later: plain token_codes finds +twopass's rows, and
# +onepass finds the rows plain token_codes wrote before (one pass, no "|2p" in their tag).
check eval-tc-twopass-is-default 0 '1 results cached, 0 samples to run' -- "$bin" eval \
  "${evc[@]}" --methods token_codes+twopass
check eval-tc-onepass-apart 0 '0 results cached, 1 samples to run' -- "$bin" eval "${evc[@]}" \
  --methods token_codes+onepass
check eval-tc-onepass-old-rows 0 '1 results cached, 0 samples to run' -- bash -c "python3 -c \"
import json
for l in open('$tmp/eval-tc/cache.jsonl'):
    r = json.loads(l)
    if r['method'] == 'token_codes+onepass': r['method'] = 'token_codes'; print(json.dumps(r))
\" > '$tmp/eval-tc/old1.jsonl' && '$bin' eval ${evc[*]} --methods token_codes+onepass \
  --cache '$tmp/eval-tc/old1.jsonl'"
check eval-tc-old-rows-not-twopass 0 '0 results cached, 1 samples to run' -- "$bin" eval \
  "${evc[@]}" --methods token_codes --cache "$tmp/eval-tc/old1.jsonl"
# The first pass's channels took the keys' spread later still: rows tagged "|2p" (channels by
# |q| alone) are +qonly's, not the default's.
check eval-tc-qonly-apart 0 '0 results cached, 1 samples to run' -- "$bin" eval "${evc[@]}" \
  --methods token_codes+qonly
check eval-tc-qonly-old-rows 0 '1 results cached, 0 samples to run' -- bash -c "python3 -c \"
import json
for l in open('$tmp/eval-tc/cache.jsonl'):
    r = json.loads(l)
    if r['method'] in ('token_codes', 'token_codes+lse') and r['settings'].endswith('|2ps'):
        r['settings'] = r['settings'][:-1]; print(json.dumps(r))
\" > '$tmp/eval-tc/old2.jsonl' && '$bin' eval ${evc[*]} --methods token_codes+twopass+qonly \
  --cache '$tmp/eval-tc/old2.jsonl'"
check eval-tc-qonly-not-default 0 '0 results cached, 1 samples to run' -- "$bin" eval \
  "${evc[@]}" --methods token_codes --cache "$tmp/eval-tc/old2.jsonl"
# Rows that spell "+twopass" with no "|2p"/"|2ps" in their tag (sessions 23-24 wrote them) chose
# the channels by |q| too: +qonly's, never the default's.
python3 -c "
import json
for l in open('$tmp/eval-tc/cache.jsonl'):
    r = json.loads(l)
    if r['method'] in ('token_codes', 'token_codes+lse') and r['settings'].endswith('|2ps'):
        r['settings'] = r['settings'][:-4]; r['method'] += '+twopass'; print(json.dumps(r))
" > "$tmp/eval-tc/old3.jsonl"
check eval-tc-spelled-twopass-is-qonly 0 '1 results cached, 0 samples to run' -- "$bin" eval \
  "${evc[@]}" --methods token_codes+qonly --cache "$tmp/eval-tc/old3.jsonl"
check eval-tc-spelled-twopass-not-default 0 '0 results cached, 1 samples to run' -- "$bin" eval \
  "${evc[@]}" --methods token_codes --cache "$tmp/eval-tc/old3.jsonl"
# A run killed mid-write leaves a torn last record: it alone is recomputed, the others are
# kept, and the file holds whole lines again. A record out of range is skipped, not reported.
# (tests/test_line_file.cpp tears the file at every byte offset of its last record.)
mkdir -p "$tmp/eval-torn"
head -c -40 "$tmp/eval/cache.jsonl" > "$tmp/eval-torn/cache.jsonl"
check eval-torn-tail 0 'last line was cut off' -- "$bin" eval "${ev[@]}" \
  --methods dense,quest,sink_recent --cache "$tmp/eval-torn/cache.jsonl"
check eval-torn-recomputed 0 '^3 whole$' -- python3 -c "
import json
print(len([json.loads(l) for l in open('$tmp/eval-torn/cache.jsonl')]), 'whole')"
python3 -c "
import json
ls = open('$tmp/eval-torn/cache.jsonl').read().splitlines()
j = json.loads(ls[0]); j['score'] = 7; ls[0] = json.dumps(j)
open('$tmp/eval-torn/cache.jsonl', 'w').write('\n'.join(ls) + '\n')"
check eval-cache-out-of-range 0 'skipped \(score: must be in \[0, 1\], got 7' -- "$bin" eval \
  "${ev[@]}" --methods dense,quest,sink_recent --cache "$tmp/eval-torn/cache.jsonl" --report-only
check eval-reselect 0 '\| quest@2 \| 1/8 \| softmax \|' -- "$bin" eval --tasks \
  niah_single_number --lengths 512 --samples 1 --budgets 1/8 -t 1 --no-plots --protocol strict \
  --methods dense,quest@2,quest@4c0.9 -O "$tmp/eval-reselect"
# One sample on 2 kernel threads: the same records as on one thread (timings aside).
evw=(--tasks niah_single_number --lengths 512 --samples 1 --budgets 1/8 --no-plots
     --methods dense,quest,sink_recent --protocol strict)
check eval-one-thread 0 '1 worker\(s\) × 1 thread\(s\)' -- "$bin" eval "${evw[@]}" -t 1 \
  -O "$tmp/eval-1"
check eval-workers 0 '1 worker\(s\) × 2 thread\(s\)' -- "$bin" eval "${evw[@]}" -t 2 \
  --workers 1 -O "$tmp/eval-2"
check eval-workers-same 0 '^same$' -- python3 -c "
import json
strip = lambda f: sorted(json.dumps({k: v for k, v in json.loads(l).items() if 'seconds' not in k},
                                    sort_keys=True) for l in open(f))
a, b = strip('$tmp/eval-1/cache.jsonl'), strip('$tmp/eval-2/cache.jsonl')
print('same' if a == b and len(a) == 3 else 'differ')"
check eval-report-only 0 '2 results missing, not computed' -- "$bin" eval --tasks \
  niah_single_number --lengths 512 --samples 1 --budgets 1/8 --no-plots -t 1 --protocol strict \
  --methods dense,quest,oracle,top_p --report-only -O "$tmp/eval-1"
check eval-report-only-table 0 'incomplete.*2 of the 4' -- cat "$tmp/eval-1/results.md"
check eval-report-only-wrote-nothing 0 '^3$' -- bash -c "wc -l < '$tmp/eval-1/cache.jsonl'"
check eval-bad-workers 2 '--workers' -- "$bin" eval --workers -1
check eval-bad-protocol 2 '--protocol' -- "$bin" eval --protocol lenient
# Both protocols (the default): one context prefill serves both; every row says its protocol,
# and the standard rows reuse nothing of the strict ones' cache entries.
check eval-protocols 0 '\| standard \| two_stage \| 1/8 \| softmax \|.*\| strict \| two_stage' -- \
  bash -c "'$bin' eval --tasks niah_single_number --lengths 512 --samples 1 --budgets 1/8 -t 1 \
  --no-plots --methods dense,two_stage -O '$tmp/eval-proto' | tr '\n' ' '"
check eval-protocols-records 0 '^standard 2 strict 2$' -- python3 -c "
import json, collections
c = collections.Counter(json.loads(l)['protocol'] for l in open('$tmp/eval-proto/cache.jsonl'))
print('standard', c['standard'], 'strict', c['strict'])"

# sparse prefill (docs/prefill.md): eval rows and the bench's TTFT table; bad values named.
check eval-prefill-bad-method 2 '--methods' -- "$bin" eval --methods prefill_shared32
check eval-prefill-bad-kind 2 '--methods' -- "$bin" eval --methods prefill_magic64
check eval-prefill-tiny 0 '\| prefill_shared16 \| 1/8 \| softmax \|' -- "$bin" eval "${ev[@]}" \
  --methods dense,prefill_shared16,prefill_token
check eval-prefill-kv-read 0 '"prefill_kv_read":0\.' -- cat "$tmp/eval/cache.jsonl"
check eval-prefill-cached 0 '4 results cached, 1 samples to run' -- "$bin" eval "${ev[@]}" \
  --methods dense,quest,prefill_shared16,prefill_token,prefill_index16
check bench-prefill-bad-method 2 '--sparse-prefill' -- "$bin" bench -p 64 -n 0 \
  --sparse-prefill magic
check bench-prefill-bad-budget 2 '--prefill-budget' -- "$bin" bench -p 64 -n 0 \
  --sparse-prefill shared --prefill-budget 3/2
check bench-prefill-bad-block 2 '--prefill-k-block' -- "$bin" bench -p 64 -n 0 \
  --sparse-prefill index --prefill-k-block 32
check bench-prefill-dense 2 '--sparse-prefill' -- "$bin" bench -p 64 -n 0 --sparse-prefill dense
check bench-prefill-ttft 0 '\| pp200 \| sparse prefill index16 1/4 \| .*× \|' -- "$bin" bench \
  -p 200 -n 0 -r 1 --sparse-prefill index --prefill-k-block 16 --prefill-budget 1/4
check bench-prefill-json 0 '"attended_fraction"' -- "$bin" bench -p 64 -n 0 -r 1 \
  --sparse-prefill token -o json
check bench-prefill-learned-no-file 2 '--selector-file' -- "$bin" bench -p 64 -n 0 \
  --sparse-prefill learned
check bench-prefill-learned 0 '\| pp200 \| sparse prefill learned16 1/4 \| .*× \|' -- "$bin" \
  bench -p 200 -n 0 -r 1 --sparse-prefill learned --prefill-k-block 16 --prefill-budget 1/4 \
  --selector-file "$root/docs/results/learned-smollm2/selector.gguf"
check eval-prefill-learned-no-file 2 '--selector-file' -- "$bin" eval --methods prefill_learned64

# learned selector: a file made without training, then run / bench / perplexity / eval with it.
check selector-help 0 '--kind' -- "$bin" selector init --help
check selector-bad-kind 2 '--kind' -- "$bin" selector init --kind magic --out "$tmp/x.gguf"
check selector-bad-groups 2 '--groups' -- "$bin" selector init --groups 2 --out "$tmp/x.gguf"
check selector-init 0 'mean_score selector, input qk, 30 layer' -- "$bin" selector init \
  --kind mean_score --out "$tmp/mean.gguf"
check selector-init-random 0 'random selector, input hidden, 2 layer.*rope' -- "$bin" selector \
  init --kind random --input hidden --dim 16 --rope --layers 3,7 --out "$tmp/rand.gguf"
check run-help-learned 0 '--selector-file' -- "$bin" run --help
check run-learned-no-file 2 '--selector-file' -- "$bin" run -p hi -n 1 --selector learned
check run-learned-missing 2 'missing.gguf' -- "$bin" run -p hi -n 1 --selector learned \
  --selector-file "$tmp/missing.gguf"
check run-file-not-learned 2 '--selector-file' -- "$bin" run -p hi -n 1 --selector quest \
  --selector-file "$tmp/mean.gguf"
check run-bad-top-p 2 '--budget' -- "$bin" run -p hi -n 1 --selector learned \
  --selector-file "$tmp/mean.gguf" --budget p1.5
check run-top-p-sink 2 '--budget' -- "$bin" run -p hi -n 1 --selector sink_recent --budget p0.9
check run-bad-budget-min 2 '--budget-min' -- "$bin" run -p hi -n 1 --selector learned \
  --selector-file "$tmp/mean.gguf" --budget 64 --budget-min 16
check run-bad-key-format 2 '--selector-key-format' -- "$bin" run -p hi -n 1 --selector learned \
  --selector-file "$tmp/mean.gguf" --selector-key-format int3
check run-learned-tiny 0 'KV read' -- "$bin" run -p "The capital of France is" -n 4 -t 1 \
  --selector learned --selector-file "$tmp/rand.gguf" --budget p0.9:32 --budget-min 16 \
  --page 4 --window 0
check run-learned-codes-no-file 2 '--selector-file' -- "$bin" run -p hi -n 1 \
  --selector learned_codes
check run-learned-codes-top-p 2 '--budget' -- "$bin" run -p hi -n 1 --selector learned_codes \
  --selector-file "$tmp/mean.gguf" --budget p0.9
check run-learned-codes-tiny 0 'KV read' -- "$bin" run -p "The capital of France is" -n 4 -t 1 \
  --selector learned_codes --selector-file "$tmp/rand.gguf" --budget 16 --page 4 --window 0
check run-learned-codes-top-p-cap 0 'KV read' -- "$bin" run -p "The capital of France is" -n 4 \
  -t 1 --selector learned_codes --selector-file "$tmp/rand.gguf" --budget p0.9:16 --page 4 \
  --window 0
check run-token-codes-top-p 0 'KV read' -- "$bin" run -p "The capital of France is" -n 4 -t 1 \
  --selector token_codes --budget p0.9 --page 4 --window 0
# pMASS:CAP:MIN: the floor in the budget itself (the eval has no --budget-min).
check run-top-p-floor 0 'KV read' -- "$bin" run -p "The capital of France is" -n 4 -t 1 \
  --selector token_codes --budget p0.5:16:8 --page 4 --window 0
check run-top-p-floor-over-cap 2 'exceeds its cap' -- "$bin" run -p hi -n 1 \
  --selector token_codes --budget p0.9:8:16
check run-top-p-floor-twice 2 'give one of the two' -- "$bin" run -p hi -n 1 \
  --selector token_codes --budget p0.9:16:8 --budget-min 4
check eval-learned-codes-no-file 2 '--selector-file' -- "$bin" eval --methods learned_codes+c2
check bench-learned-tiny 0 '\| learned p0.9:[0-9]+ \| tg2 @ d64 \|' -- "$bin" bench -p 0 -n 2 \
  -d 64 -r 1 --selector learned --selector-file "$tmp/mean.gguf" --budget p0.9:1/2 \
  --selector-key-format bf16
yes "The grass is green and the sky is blue. Here we go, there and back again." | head -40 \
  > "$tmp/text.txt"
check ppl-learned-tiny 0 '\| learned \|' -- "$bin" perplexity -f "$tmp/text.txt" -c 64 \
  --chunks 1 -t 1 --selector learned --selector-file "$tmp/mean.gguf" --budget 1/4 -o json \
  --out "$tmp/ppl.json"
check ppl-json 0 '^ppl [0-9.]+ dense [0-9.]+$' -- python3 -c "
import json
[r] = json.load(open('$tmp/ppl.json'))
print('ppl', r['ppl'], 'dense', r['ppl_dense'])"
check eval-learned-no-file 2 '--selector-file' -- "$bin" eval --methods learned
check eval-bad-top-p 2 '--budgets' -- "$bin" eval --budgets p0
ev=(--tasks niah_single_number --lengths 512 --samples 1 -t 1 --no-plots --protocol strict
    -O "$tmp/eval")
check eval-learned-tiny 0 '\| learned \| p0.9 \| softmax \|' -- "$bin" eval "${ev[@]}" \
  --methods dense,learned,sink_recent --budgets 1/8,p0.9 --selector-file "$tmp/mean.gguf"
check eval-learned-rows 0 '2 results cached, 0 samples' -- "$bin" eval "${ev[@]}" \
  --methods learned --budgets 1/8,p0.9 --selector-file "$tmp/mean.gguf"
check eval-learned-new-file 0 '0 results cached, 1 samples' -- "$bin" eval "${ev[@]}" \
  --methods learned --budgets 1/8,p0.9 --selector-file "$tmp/rand.gguf"
# convert: entmax conversion files; --entmax-conversion checks them against the model.
for i in $(seq 40); do echo "Every package must specify the dependency information it needs."; done \
  > "$tmp/text.txt"
check convert-help 0 '--entmax-conversion|--alpha' -- "$bin" convert --help
check convert-bad-alpha 2 '--alpha' -- "$bin" convert --alpha 2.5 --out "$tmp/c.gguf"
check convert-bad-proxy 2 '--proxy' -- "$bin" convert --proxy magic --out "$tmp/c.gguf"
check convert-bad-scale 2 '--scales' -- "$bin" convert --scales 0 --out "$tmp/c.gguf"
check convert-too-many-tokens 2 '--tokens' -- "$bin" convert -f "$tmp/text.txt" --tokens 4K \
  --out "$tmp/c.gguf"
check convert-identity 0 'identity' -- "$bin" convert --identity --alpha 2 --out "$tmp/id.gguf"
check convert-tiny 0 'chosen: α 1.5' -- "$bin" convert -f "$tmp/text.txt" --tokens 128 -c 64 \
  --queries 4 --scales 1.1 -t 1 --out "$tmp/conv.gguf"
check conv-missing 2 '^masskv: error.*--entmax-conversion' -- "$bin" run -n 1 \
  --entmax-conversion "$tmp/none.gguf"
check conv-not-a-conversion 2 '^masskv: error.*--entmax-conversion' -- "$bin" run -n 1 \
  --entmax-conversion "$tmp/text.txt"
check ppl-entmax-support-needs-conversion 2 'entmax-conversion' -- "$bin" perplexity \
  -f "$tmp/text.txt" -c 64 --chunks 1 --selector entmax_support
check ppl-converted-tiny 0 '\| entmax2, t = 1 \(unconverted\) \| entmax_support \|' -- "$bin" \
  perplexity -f "$tmp/text.txt" -c 64 --chunks 1 -t 1 --kl --window 0 \
  --entmax-conversion "$tmp/id.gguf" --selector entmax_support --budget 1/2
check run-converted-tiny 0 'attention converted entmax1.5' -- "$bin" run -n 3 -t 1 \
  --entmax-conversion "$tmp/conv.gguf"
check eval-conversion-alpha 2 '--alpha' -- "$bin" eval --tasks niah_single_number --lengths 512 \
  --entmax-conversion "$tmp/id.gguf" --alpha 1.5 -O "$tmp/eval-conv"
# The conversion keys the entmax rows only: softmax rows of a run without it are reused (at
# the same α: α is in every row's key), and its entmax rows are not mixed with plain ones.
evc=(--tasks niah_single_number --lengths 512 --samples 1 --budgets 1/8 --no-plots -t 1
     --protocol strict --methods dense,dense_entmax --cache "$tmp/eval-1/cache.jsonl"
     -O "$tmp/eval-conv")
check eval-conv-reuses-softmax 0 '1 results cached, 1 samples to run' -- "$bin" eval \
  "${evc[@]}" --entmax-conversion "$tmp/conv.gguf"
check eval-conv-cached 0 '2 results cached, 0 samples to run' -- "$bin" eval "${evc[@]}" \
  --entmax-conversion "$tmp/conv.gguf"
check eval-plain-entmax-apart 0 '1 results cached, 1 samples to run' -- "$bin" eval "${evc[@]}"
if "$bin" run -m gemma3 -n 1 -p hi >/dev/null 2>&1; then
  check conv-other-model 2 'not on this model' -- "$bin" run -m gemma3 -n 1 \
    --entmax-conversion "$tmp/id.gguf"
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
