#!/usr/bin/env python3
"""Summary tables of the sparse-prefill eval from its cache (README.md of this folder).

Per length: the mean over the 9 tasks of each row's accuracy and the attended fraction of the
prefill's (query, key) pairs; the same means restricted to the cells where dense scores at
least 20%; and, per task, the smallest budget at which the token oracle scores at least
dense's accuracy (the attention a task needs). A (task, length) counts 10 samples where dense
and every 1/16 row have ten, else 5; a row with fewer samples in some task is reported as
missing, not averaged.
    python3 docs/results/eval-prefill-smollm2/summarize.py [--plot accuracy_vs_length.png]
"""
import argparse
import json
import pathlib

CACHE = pathlib.Path(__file__).with_name("cache.jsonl")
BUDGETS = ("1/16", "1/8", "1/4")
ROWS = [("dense", "-")] + [(m, b) for b in BUDGETS
                           for m in ("prefill_token", "prefill_shared64", "prefill_learned64")]


def load():
    recs = {}
    for line in CACHE.open():
        r = json.loads(line)
        recs[(r["task"], r["length"], r["method"], r["budget"], r["index"])] = r
    return recs


def mean(v):
    return sum(v) / len(v)


def plot(path, lengths, tasks, acc, complete):
    """Accuracy against context length at budget 1/16: all tasks, and the dense-scoring cells."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [("dense", "-", "dense"), ("prefill_token", "1/16", "token oracle"),
            ("prefill_shared64", "1/16", "shared-support oracle (64)"),
            ("prefill_learned64", "1/16", "learned indexer (64)")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, scoring in zip(axes, (False, True)):
        for m, b, label in rows:
            xs, ys = [], []
            for L in lengths:
                cells = [t for t in tasks if not scoring or acc(t, L, "dense", "-") >= 0.2]
                if cells and complete(L, m, b):
                    xs.append(L)
                    ys.append(100 * mean([acc(t, L, m, b) for t in cells]))
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{L // 1024}K" for L in lengths])
        ax.set_xlabel("context length")
        ax.set_title("cells where dense scores >= 20%" if scoring else "all 9 tasks")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy % (budget 1/16)")
    axes[1].legend(fontsize=8)
    fig.suptitle("SmolLM2, sparse prefill at 1/16 of the keys (dense decode)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", help="also write accuracy against length to this PNG")
    args = ap.parse_args()
    recs = load()
    tasks = sorted({k[0] for k in recs})
    lengths = sorted({k[1] for k in recs})

    def count(t, length, m, b):
        n = 0
        while (t, length, m, b, n) in recs:
            n += 1
        return n

    # Samples of a (task, length): 10 where dense and every 1/16 row have ten, else 5 (the
    # second five were run for some cells only).
    def samples_of(t, length):
        rows16 = [m for m in ("dense", "prefill_token", "prefill_shared64", "prefill_learned64")
                  if count(t, length, m, "-" if m == "dense" else "1/16") > 0]
        full = all(count(t, length, m, "-" if m == "dense" else "1/16") >= 10 for m in rows16)
        return 10 if full else 5

    def cell(t, length, m, b):
        n = samples_of(t, length)
        return [recs[(t, length, m, b, i)] for i in range(n) if (t, length, m, b, i) in recs]

    def complete(length, m, b):
        return all(len(cell(t, length, m, b)) == samples_of(t, length) for t in tasks)

    def acc(t, length, m, b):
        return mean([r["score"] for r in cell(t, length, m, b)])

    rows = [(m, b) for m, b in ROWS if any(cell(t, L, m, b) for t in tasks for L in lengths)]
    names = [f"{L // 1024}K" for L in lengths]
    def samples_note(L):
        tens = [t for t in tasks if samples_of(t, L) == 10]
        if len(tens) in (0, len(tasks)):
            return f"all {10 if tens else 5}"
        return ", ".join(tens) + " 10, the others 5"

    print("Samples per task: " + "; ".join(f"{n}: {samples_note(L)}" for n, L in zip(names, lengths)))
    print()
    print("| method | budget | " + " | ".join(f"{n} acc % | {n} attended %" for n in names) + " |")
    print("| --- | --- |" + " ---: |" * (2 * len(lengths)))
    for m, b in rows:
        out = []
        for L in lengths:
            if not complete(L, m, b):
                out += ["–", "–"]
                continue
            a = mean([acc(t, L, m, b) for t in tasks])
            att = mean([r.get("prefill_kv_read", r["kv_read"]) for t in tasks
                        for r in cell(t, L, m, b)])
            out += [f"{100 * a:.1f}", f"{100 * att:.1f}"]
        print(f"| {m} | {b} | " + " | ".join(out) + " |")
    print()
    print("| length | cells with dense ≥ 20% | " + " | ".join(f"{m} {b}" for m, b in rows) + " |")
    print("| --- | ---: |" + " ---: |" * len(rows))
    for L in lengths:
        cells = [t for t in tasks if acc(t, L, "dense", "-") >= 0.2]
        out = []
        for m, b in rows:
            if not cells or not complete(L, m, b):
                out.append("–")
                continue
            out.append(f"{100 * mean([acc(t, L, m, b) for t in cells]):.1f}")
        print(f"| {L // 1024}K | {len(cells)} | " + " | ".join(out) + " |")
    print()
    print("Attention each task needs: per cell where dense scores ≥ 20%, the token oracle's "
          "accuracy % at each budget run, and the smallest budget that scores at least dense's "
          "accuracy ('> b': none of the budgets run, up to b). One sample moves a cell by "
          "100/n points (n: 5 or 10 samples), so this is coarse.")
    print()
    print("| task | length | dense | " + " | ".join(f"token {b}" for b in BUDGETS) + " | needs |")
    print("| --- | --- | ---: |" + " ---: |" * len(BUDGETS) + " --- |")
    for t in tasks:
        for L in lengths:
            d = acc(t, L, "dense", "-")
            if d < 0.2:
                continue
            out, need = [], None
            for b in BUDGETS:
                if len(cell(t, L, "prefill_token", b)) != samples_of(t, L):
                    out.append("–")
                    continue
                a = acc(t, L, "prefill_token", b)
                out.append(f"{100 * a:.0f}")
                if need is None and a >= d - 1e-9:
                    need = b
            ran = [b for b in BUDGETS if len(cell(t, L, "prefill_token", b)) == samples_of(t, L)]
            need = need or (f"> {ran[-1]}" if ran else "–")
            print(f"| {t} | {L // 1024}K | {100 * d:.0f} | " + " | ".join(out) + f" | {need} |")
    if args.plot:
        plot(args.plot, lengths, tasks, acc, complete)


if __name__ == "__main__":
    main()
