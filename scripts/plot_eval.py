#!/usr/bin/env python3
"""Plots of `masskv eval` (called by the CLI) from its results.csv:
accuracy_vs_budget.png  accuracy (mean over tasks) against the KV fraction read, one panel per
                        prompt length, one line per method through its budgets, dense dashed;
accuracy_vs_length.png  accuracy against the prompt length, one panel per budget, one line per
                        method (dense in every panel).
usage: plot_eval.py results.csv OUT_DIR"""
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DENSE = ("dense", "dense_entmax")


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def load(path):
    """(method, budget, length) -> (mean accuracy over tasks, mean KV read)."""
    acc, kv = defaultdict(list), defaultdict(list)
    with open(path) as f:
        for r in csv.DictReader(f):
            if float(r["n"]) == 0:
                continue
            key = (r["method"], r["budget"], int(r["length"]))
            acc[key].append(float(r["accuracy"]))
            kv[key].append(float(r["kv_read"]))
    return {k: (mean(acc[k]), mean(kv[k])) for k in acc}


def style(method):
    return "--" if method in DENSE else "-"


def accuracy_vs_budget(cells, out_dir):
    lengths = sorted({k[2] for k in cells})
    methods = sorted({k[0] for k in cells})
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.4), squeeze=False,
                             sharey=True)
    for ax, length in zip(axes[0], lengths):
        for m in methods:
            pts = sorted((v[1], v[0]) for k, v in cells.items() if k[0] == m and k[2] == length)
            if not pts:
                continue
            if m in DENSE:
                ax.axhline(100 * pts[0][1], ls="--", lw=1, label=m,
                           color="black" if m == "dense" else "grey")
            else:
                ax.plot([100 * p[0] for p in pts], [100 * p[1] for p in pts], "o-", label=m)
        ax.set_xscale("log")
        ax.set_title(f"{length} tokens")
        ax.set_xlabel("KV read per step (% of dense)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy % (mean over tasks)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "accuracy_vs_budget.png"), dpi=120)
    plt.close(fig)


def accuracy_vs_length(cells, out_dir):
    budgets = sorted({k[1] for k in cells if k[0] not in DENSE})
    methods = sorted({k[0] for k in cells})
    fig, axes = plt.subplots(1, max(1, len(budgets)), figsize=(4.2 * max(1, len(budgets)), 3.4),
                             squeeze=False, sharey=True)
    for ax, budget in zip(axes[0], budgets or ["-"]):
        for m in methods:
            want = "-" if m in DENSE else budget
            pts = sorted((k[2], v[0]) for k, v in cells.items() if k[0] == m and k[1] == want)
            if pts:
                ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "o" + style(m), label=m)
        ax.set_xscale("log", base=2)
        ax.set_title(f"budget {budget}")
        ax.set_xlabel("prompt tokens")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy % (mean over tasks)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "accuracy_vs_length.png"), dpi=120)
    plt.close(fig)


def main(path, out_dir):
    cells = load(path)
    if not cells:
        print(f"plot_eval.py: no results in {path}", file=sys.stderr)
        return 1
    accuracy_vs_budget(cells, out_dir)
    accuracy_vs_length(cells, out_dir)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
