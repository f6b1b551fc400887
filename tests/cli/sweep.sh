#!/usr/bin/env bash
# The bad-input sweep (issue 34): every subcommand with each numeric option set just outside its
# valid range on each side, to a huge value, NaN and garbage. Each case must exit 2 (refused,
# not crashed: no signal), name the option in its message, and finish within 10 s (refused
# before any model load or prefill that could take longer). Legal but large values go through
# --dry-run (exit 0, nothing computed), and shapes that would not fit in memory are refused
# with what they would need. Ends with "N passed, N failed".
#   tests/cli/sweep.sh path/to/masskv
set -u
bin=${1:?usage: sweep.sh path/to/masskv}
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS

# The thread cap is 4 × the cores (tools/masskv/checks.cpp).
over_threads=$((4 * $(getconf _NPROCESSORS_ONLN) + 1))
echo hi >"$tmp/text.txt"

# One case: the command must exit 2 within 10 s and name `name` in its output.
case_() {  # case_ NAME -- command...
  local name=$1; shift 2
  timeout -s KILL 10 "$bin" "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -qF -- "$name" "$tmp/out"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    local why="rc=$rc"
    [[ $rc -ge 128 ]] && why="signal $((rc - 128))$([[ $rc -eq 137 ]] && echo ' (killed at 10 s)')"
    echo "FAIL masskv $* ($why, want 2 naming $name)"
    head -5 "$tmp/out"
  fi
}

# The table: a command (words joined by ':'), an option (its long name: messages use it) and
# the values just outside its valid range on each side. Every row is also tried with a huge
# value, NaN, inf and garbage. Options that belong to a shared registration (the model options
# of run, perplexity and bench; the head shape of bench attn, bench dist, study and bench
# select) are listed for every command that has them, since each command must refuse them.
model_rows() {  # the options of add_model_options
  local c=$1
  cat <<EOF
$c --page 0 3 512 -16
$c --window -1
$c --sink-pages -1
$c --top-p-mass 0 1.01 -0.5
$c --candidates 0 1025 -4
$c --reselect-every 0 1048577
$c --reselect-cos -1.01 1.01
EOF
}
shape_rows() {  # add_head_shape
  local c=$1
  cat <<EOF
$c --hq 0 1025 100000
$c --hkv 0 1025
$c --head-dim 0 1025 100000
$c --page 0 3 257 512
EOF
}
table() {
  model_rows run
  cat <<EOF
run --threads -1 $over_threads 10000
run --n-predict -1
run --ctx-size -5 -1
run --temp -0.1 100.5
run --top-k -1
run --top-p 0 5 -0.1
EOF
  model_rows perplexity
  cat <<EOF
perplexity --threads -1 $over_threads
perplexity --ctx-size 7 -5 0
perplexity --chunks -1
EOF
  model_rows bench
  cat <<EOF
bench --threads -1 $over_threads
bench --n-prompt -1 1Q
bench --n-gen -1 1.5
bench --depth -1 2.5K
bench --batch 0 257
bench --repetitions 0 -3
bench --prefill-k-block 8 256
bench --prefill-min-keys -1
EOF
  shape_rows bench:attn
  cat <<EOF
bench:attn --depth 0 -1 3T
bench:attn --threads -1 $over_threads
bench:attn --sink-pages -1
bench:attn --window -1
bench:attn --alpha 1 2.01 0.5
bench:attn --min-seconds -0.1 3601
bench:attn --repetitions 0 1048577
EOF
  shape_rows bench:dist
  cat <<EOF
bench:dist --depth 0 -1
bench:dist --ranks 0 $over_threads
bench:dist --batch 0 4097
bench:dist --max-candidates 0 1048577
EOF
  shape_rows bench:select
  cat <<EOF
bench:select --depth 0 -1
bench:select --alpha 1 2.5
bench:select --repetitions 0 -1
bench:keys --page 0 3 512
bench:keys --top-p-mass 0 1.5
EOF
  shape_rows study
  cat <<EOF
study --ctx-size 0 -5 1Q
study --steps 0 4097
study --top-p-mass 0 1.5
study --sink-pages -1
study --window -1
reuse --ages 0 -1
reuse --policy-every 0 1048577
reuse --policy-cos -1.5 1.5
reuse --page 0 3 512
reuse --top-p-mass 0 1.5
reuse --sink-pages -1
reuse --window -1
convert --alpha 1 2.5 0.9
convert --tokens 15 -1
convert --ctx-size 15 -1
convert --queries 0 -1
convert --scales 0 -1 1001
convert --threads -1 $over_threads
distill --dim 0 4097
distill --steps -1 16777217
distill --lr 0 -1 10.5
distill --lr-final 0 1.5
distill --batch 0 1048577
distill --tokens 15 -1
distill --sequences 1 65537
distill --queries 0 -1
distill --eval-every 0 -1
distill --threads -1 $over_threads
eval --lengths 0 -1 1Q
eval --samples -1 1048577
eval --threads -1 $over_threads
eval --workers -1 $((over_threads + 1))
eval --batch -1 65537
eval --page 0 3 512
eval --sink-pages -1
eval --window -1
eval --top-p-mass 0 1.5
eval --candidates 0 1025
eval --protocol
eval --alpha 1 2.5
selector:init --dim 0 4097
dump --threads -1 $over_threads
dump --steps 0 -1
dump --samples 0 -1
dump --depth 0 -1 1Q
EOF
  local c
  for c in run perplexity bench dump distill convert eval selector:init; do
    echo "$c --model gemma4 none.gguf"  # a known name or an existing GGUF file
  done
  for c in run bench bench:attn bench:dist bench:select study dump distill eval selector:init; do
    echo "$c --seed -1 1.5 18446744073709551616"
  done
  for c in bench bench:attn bench:dist bench:keys bench:select perplexity study reuse; do
    echo "$c --output xml txt"  # md, csv, json or jsonl
  done
}

# Extra arguments a command needs to get as far as option parsing (required files).
base_of() {
  case $1 in
    run) echo "run -p hi -n 1" ;;
    perplexity) echo "perplexity -f $tmp/text.txt" ;;
    bench:keys) echo "bench keys --dumps $tmp/text.txt" ;;
    reuse) echo "reuse --inputs $tmp/text.txt --no-plots" ;;
    convert) echo "convert --out $tmp/c.gguf" ;;
    selector:init) echo "selector init --out $tmp/s.gguf" ;;
    dump) echo "dump -O $tmp/dump" ;;
    study) echo "study --no-plots" ;;
    *) echo "${1//:/ }" ;;
  esac
}

rows=0
while read -r cmd opt values; do
  [[ -z $cmd ]] && continue
  rows=$((rows + 1))
  read -r -a base <<<"$(base_of "$cmd")"
  for v in $values 99999999999999999999999 nan inf -inf x1 ''; do
    case_ "$opt" -- "${base[@]}" "$opt=$v"
  done
done < <(table)

# Combinations refused before the model is loaded or a prefill runs (each named).
case_ --selector -- run -p hi -n 1 --selector gaussian_tau
case_ --selector -- run -p hi -n 1 --selector entmax_support
case_ --selector -- run -p hi -n 1 --selector magic
case_ --budget -- run -p hi -n 1 --budget 3/2
case_ --budget -- run -p hi -n 1 --selector sink_recent --budget p0.9
case_ --budget-min -- run -p hi -n 1 --selector quest --budget 1/8 --budget-min 16
case_ --selector-file -- run -p hi -n 1 --selector learned
case_ --selector-file -- bench --selector learned --selector-file "$tmp/none.gguf"
case_ --selector -- perplexity -f "$tmp/text.txt" --selector gaussian_tau
case_ --selector -- bench -p 8 -n 0 --selector gaussian_tau
case_ -p/-n -- bench -p 0 -n 0
case_ --hq -- bench attn --hq 6 --hkv 4
case_ --hq -- study --hq 6 --hkv 4 --no-plots
case_ --hq -- bench dist --hq 6 --hkv 4
case_ --hq -- bench select --hq 6 --hkv 4
# The model's context: prompts, lengths and depths past it are refused before the prefill.
yes "The grass is green and the sky is blue." | head -3000 >"$tmp/long.txt"
case_ context -- run -f "$tmp/long.txt" -n 1
case_ context -- run -p hi -n 9000
case_ --ctx-size -- run -p hi -n 1 -c 9000
case_ --ctx-size -- perplexity -f "$tmp/long.txt" -c 16K
case_ --ctx-size -- convert -c 16K --tokens 32K --out "$tmp/c.gguf"
case_ --lengths -- eval --lengths 1M
case_ --depth -- bench -d 9000 -p 8 -n 0
# --out: a file that can be written (not a folder, nothing but folders above it).
case_ --out -- bench -p 8 -n 0 -o csv --out "$tmp"
case_ --out -- study --no-plots -o json --out "$tmp/text.txt/s.json"
case_ --out -- convert --out /
case_ --out -- perplexity -f "$tmp/text.txt" -o json --out "$tmp"

# Old spellings (docs/cli.md "Old spellings"): a letter that changed meaning or a retired name is
# refused before any work with a message naming the new spelling.
old_spellings() {  # NEW SPELLING | the old use
  cat <<EOF
--mapping|study -m softmax
--mapping|reuse --inputs x.mkvd -m softmax
--mapping|bench attn -m entmax
--mapping|bench keys --dumps x.mkvd -m softmax
--selectors|study -s quest
--selectors|reuse --inputs x.mkvd -s quest
--selectors|bench select -s quest
--budget|study -b 1/8
--budget|reuse --inputs x.mkvd -b 1/8
--budget|bench attn -b 1/8
--budget|bench dist -b 1/16
--budget|bench keys --dumps x.mkvd -b 1/8
--budget|bench select -b 1/8
-O DIR|study -o out/study
-O DIR|reuse --inputs x.mkvd -o out/reuse
-O/--out-dir DIR|dump -o out/dump
-O/--out-dir DIR|eval -o out/eval
--out FILE|convert -o c.gguf
--out FILE|distill -o s.gguf
--out FILE|selector init -o s.gguf
-o json|bench --json
-o csv|bench --csv
-o json|bench --json b.json
-o json --out FILE|perplexity -f x.txt --json p.json
-o json --out FILE|study --json s.json
-o csv --out FILE|study --csv s.csv
-o json --out FILE|bench attn --json a.json
-o csv --out FILE|bench attn --csv a.csv
-o json --out FILE|bench dist --json d.json
-o json --out FILE|bench keys --dumps x.mkvd --json k.json
-o json --out FILE|bench select --json s.json
--formats|bench keys --dumps x.mkvd -f int4
--dumps|bench keys -i x.mkvd
--inputs|reuse -i x.mkvd
--generators|study -g needles
--ages|reuse --inputs x.mkvd -a 1
--layers|dump -l 3
--layers|selector init -l 3 --out s.gguf
-c/--ctx-size|study --context 8K
-f/--file|convert --text t.txt --out c.gguf
-f/--file|eval --text t.txt
--top-p-mass|study --top-p 0.9
--top-p-mass|reuse --inputs x.mkvd --top-p 0.9
--top-p-mass|bench keys --dumps x.mkvd --top-p 0.9
-r/--repetitions|bench attn --repeat 3
-r/--repetitions|bench select --repeat 3
EOF
}
old=0
while IFS='|' read -r now use; do
  read -r -a words <<<"$use"
  old=$((old + 1))
  case_ "use $now" -- "${words[@]}"
done < <(old_spellings)
# Memory guards: shapes that would not fit say what they would need (no std::bad_alloc).
case_ --ctx-size -- study -c 1000M --no-plots
case_ --ctx-size -- study -c 100M --hq 64 --hkv 64 --head-dim 1024 --no-plots
case_ --depth -- bench attn -d 1000M
case_ --depth -- bench dist -d 1000M
case_ --depth -- bench select -d 1000M

# Legal but large values: --dry-run validates and prints the plan without the work.
dry() {  # dry command...
  timeout -s KILL 10 "$bin" "$@" --dry-run >"$tmp/out" 2>&1
  local rc=$?
  if [[ $rc -eq 0 ]] && grep -q 'dry run' "$tmp/out"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAIL dry run masskv $* (rc=$rc)"; head -5 "$tmp/out"
  fi
}
dry run -p hi -n 8000 -t 0 --page 256 --window 100000
dry perplexity -f "$tmp/long.txt" -c 8192
dry bench -p 4K -n 4K -d 0 -b 256 -r 1000 -t 0,1
dry bench attn -d 1M --hq 1024 --hkv 8 --head-dim 128
dry bench dist -d 256K --batch 4
dry bench select -d 256K --hq 1024 --hkv 8
dry study -c 256K --hq 1024 --hkv 8 --steps 2
dry eval --lengths 8K --samples 1048576 --methods dense,quest
dry convert --tokens 1M -c 8K --out "$tmp/c.gguf"
dry distill --tokens 8K --sequences 1000 --steps 1000000
# The dialect's spellings (docs/cli.md), each through the checks.
dry run -m smollm2 -p hi -n 1 -c 4K -s 7 -t 0
dry perplexity -f "$tmp/long.txt" -c 1K -o jsonl --out "$tmp/ppl.jsonl"
dry bench -m smollm2 -m smollm2 -p 1K -n 16 -d 0,1K -b 1,2 -r 2 -s 3 -o csv --out "$tmp/b.csv"
dry bench attn -d 64K -t 0,1 --budget 1/16 -r 3 -s 2 -o jsonl
dry bench dist -d 4K -b 2 --budget 1/16 -s 2 -o json --out "$tmp/dist.json"
dry bench select -d 32K --selectors quest --budget 1/16 -r 3 -s 2 -o csv
dry study -c 4K --generators needles --selectors quest --budget 1/8 --mapping softmax \
  --top-p-mass 0.9 -s 2 -o json --out "$tmp/study.json" -O "$tmp/study" --no-plots
dry eval -m smollm2 -f "$tmp/long.txt" -b 2 -s 2 -t 0 -O "$tmp/eval" --methods dense,quest
dry convert -m smollm2 -f "$tmp/long.txt" -c 1K -t 0 --out "$tmp/conv.gguf"
dry distill -m smollm2 -f "$tmp/long.txt" -s 2 -t 0 --out "$tmp/distill/s.gguf"
echo "sweep: $rows table rows, $old old spellings, $((pass + fail)) cases in $((SECONDS - t0)) s"

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
