#!/usr/bin/env python3
"""Summary of the proj32mix prefill-indexer run (README.md of this folder).

Reads the baseline cache (../eval-prefill-smollm2/cache.jsonl: dense, the two oracles and the
learned indexer with the old selector.gguf) and this folder's cache.jsonl (the learned indexer
with proj32mix.gguf, one row set per selector key format), and prints per length the mean
accuracy over the cells where dense scores >= 20 % (10 samples each), the attended %, and the
per-task rows where a learned row differs from dense.
    python3 docs/results/eval-prefill-learned-proj32-smollm2/summarize.py
"""
import json
import pathlib
from collections import defaultdict

HERE = pathlib.Path(__file__).parent
BASE = HERE.parent / "eval-prefill-smollm2" / "cache.jsonl"
OLD_SEL = "9f3b70574a32885a"  # FNV-1a of docs/results/learned-smollm2/selector.gguf


def row_name(r):
    m = r["method"]
    if m != "prefill_learned64":
        return m
    s = r["settings"]
    sel = s[s.index("|sel") + 4:]
    h, fmt = sel[:16], sel[17:]
    return f"learned old ({fmt})" if h == OLD_SEL else f"learned proj32mix ({fmt})"


def load():
    score, kv = defaultdict(dict), defaultdict(dict)
    for path in (BASE, HERE / "cache.jsonl"):
        for line in path.open():
            r = json.loads(line)
            if r["budget"] not in ("-", "1/16") or r["length"] < 4096:
                continue
            k = (r["task"], r["length"], row_name(r))
            score[k][r["index"]] = r["score"]
            kv[k][r["index"]] = r.get("prefill_kv_read", 1.0)
    return score, kv


def mean(v):
    return sum(v) / len(v)


def main():
    score, kv = load()
    rows = sorted({k[2] for k in score}, key=lambda n: (n != "dense", n != "prefill_token",
                                                         n != "prefill_shared64", n))
    for L in (4096, 8192):
        tasks = sorted({k[0] for k in score if k[1] == L})
        cells = [t for t in tasks if len(score.get((t, L, "dense"), {})) >= 10
                 and mean(list(score[(t, L, "dense")].values())) >= 0.2]
        print(f"\n{L // 1024}K, cells where dense >= 20 % (10 samples): {', '.join(cells)}")
        print("| row | mean acc % | vs dense | attended % | n per cell |")
        print("| --- | ---: | ---: | ---: | --- |")
        d = mean([mean([score[(t, L, 'dense')][i] for i in range(10)]) for t in cells])
        for n in rows:
            if not all(all(i in score.get((t, L, n), {}) for i in range(10)) for t in cells):
                have = [len(score.get((t, L, n), {})) for t in cells]
                print(f"| {n} | incomplete | | | {have} |")
                continue
            a = mean([mean([score[(t, L, n)][i] for i in range(10)]) for t in cells])
            att = mean([mean([kv[(t, L, n)][i] for i in range(10)]) for t in cells])
            print(f"| {n} | {100 * a:.1f} | {100 * (a - d):+.1f} | {100 * att:.1f} | 10 |")
        full = [t for t in tasks if all(len(score.get((t, L, n), {})) >= 10 for n in rows)]
        if len(full) == len(tasks) == 9:
            d9 = mean([mean([score[(t, L, 'dense')][i] for i in range(10)]) for t in tasks])
            print("\nall 9 tasks (10 samples): " + ", ".join(
                f"{n} {100 * (a := mean([mean([score[(t, L, n)][i] for i in range(10)]) for t in tasks])):.1f}"
                f" ({100 * (a - d9):+.1f})" for n in rows))
        print("\n| task | " + " | ".join(rows) + " |")
        print("| --- |" + " ---: |" * len(rows))
        for t in tasks:
            if len(score.get((t, L, "dense"), {})) < 10:
                continue
            vals = []
            for n in rows:
                s = score.get((t, L, n), {})
                vals.append(f"{100 * mean([s[i] for i in range(10)]):.1f}"
                            if all(i in s for i in range(10)) else "–")
            print(f"| {t}{'' if t in cells else ' (dense < 20 %)'} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    main()
