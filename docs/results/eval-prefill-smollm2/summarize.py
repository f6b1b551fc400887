#!/usr/bin/env python3
"""Summary tables of the sparse-prefill eval from its cache (README.md of this folder).

Per length: the mean over the 9 tasks of each row's accuracy (5 samples per task) and the
attended fraction of the prefill's (query, key) pairs; then the same means restricted to the
cells where dense scores at least 20%. A cell with fewer than 5 samples is reported as
missing, not averaged.
    python3 docs/results/eval-prefill-smollm2/summarize.py
"""
import json
import pathlib

CACHE = pathlib.Path(__file__).with_name("cache.jsonl")
SAMPLES = 5
ROWS = [("dense", "-")] + [(m, b) for b in ("1/16", "1/8", "1/4")
                           for m in ("prefill_token", "prefill_shared64", "prefill_learned64")]


def load():
    recs = {}
    for line in CACHE.open():
        r = json.loads(line)
        if r["index"] < SAMPLES:
            recs[(r["task"], r["length"], r["method"], r["budget"], r["index"])] = r
    return recs


def mean(v):
    return sum(v) / len(v)


def main():
    recs = load()
    tasks = sorted({k[0] for k in recs})
    lengths = sorted({k[1] for k in recs})

    def cell(t, length, m, b):
        return [recs[(t, length, m, b, i)] for i in range(SAMPLES) if (t, length, m, b, i) in recs]

    def complete(length, m, b):
        return all(len(cell(t, length, m, b)) == SAMPLES for t in tasks)

    rows = [(m, b) for m, b in ROWS if any(cell(t, L, m, b) for t in tasks for L in lengths)]
    names = [f"{L // 1024}K" for L in lengths]
    print("| method | budget | " + " | ".join(f"{n} acc % | {n} attended %" for n in names) + " |")
    print("| --- | --- |" + " ---: |" * (2 * len(lengths)))
    for m, b in rows:
        out = []
        for L in lengths:
            if not complete(L, m, b):
                out += ["–", "–"]
                continue
            acc = mean([mean([r["score"] for r in cell(t, L, m, b)]) for t in tasks])
            att = mean([r.get("prefill_kv_read", r["kv_read"]) for t in tasks
                        for r in cell(t, L, m, b)])
            out += [f"{100 * acc:.1f}", f"{100 * att:.1f}"]
        print(f"| {m} | {b} | " + " | ".join(out) + " |")
    print()
    print("| length | cells with dense ≥ 20% | " + " | ".join(f"{m} {b}" for m, b in rows) + " |")
    print("| --- | ---: |" + " ---: |" * len(rows))
    for L in lengths:
        cells = [t for t in tasks if len(cell(t, L, "dense", "-")) == SAMPLES
                 and mean([r["score"] for r in cell(t, L, "dense", "-")]) >= 0.2]
        out = []
        for m, b in rows:
            if not cells or not complete(L, m, b):
                out.append("–")
                continue
            out.append(f"{100 * mean([mean([r['score'] for r in cell(t, L, m, b)]) for t in cells]):.1f}")
        print(f"| {L // 1024}K | {len(cells)} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    main()
