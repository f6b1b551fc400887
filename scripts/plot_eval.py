#!/usr/bin/env python3
"""Plots of `masskv eval` (called by the CLI) from its results.csv:
accuracy_vs_budget.png  accuracy (mean over tasks, 95 % Wilson bars) against the budget (1/32,
                        1/16, ... as categories), one panel per prompt length (and protocol),
                        dense as a dashed line with its interval as a band;
accuracy_vs_length.png  accuracy against the prompt length (1K, 2K, ...), one panel per budget
                        (and protocol), dense in every panel.
A method has one colour in every plot of every run (scripts/plot_style.py).
usage: plot_eval.py results.csv OUT_DIR"""
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_style import DENSE, budget_value, color, length_label, linestyle, marker, wilson  # noqa: E402,E501


def load(path):
    """(protocol, method, budget, length) -> (accuracy, n): the tasks' cells pooled (a mean
    over every sample of the tasks, so its Wilson interval uses all of them)."""
    n, hits = defaultdict(float), defaultdict(float)
    with open(path) as f:
        for r in csv.DictReader(f):
            k = float(r["n"])
            if k == 0:
                continue
            key = (r.get("protocol", "strict"), r["method"], r["budget"], int(r["length"]))
            n[key] += k
            hits[key] += k * float(r["accuracy"])
    return {key: (hits[key] / n[key], n[key]) for key in n}


def offsets(methods, width=0.5):
    """Horizontal offsets that keep the methods' interval bars of one category apart."""
    if len(methods) <= 1:
        return {m: 0.0 for m in methods}
    step = width / (len(methods) - 1)
    return {m: -width / 2 + i * step for i, m in enumerate(methods)}


def draw_dense(ax, m, acc, n):
    lo, hi = wilson(acc, n)
    ax.axhline(100 * acc, ls=linestyle(m), lw=1.2, color=color(m), label=m)
    ax.axhspan(100 * lo, 100 * hi, color=color(m), alpha=0.08, lw=0)


def draw_method(ax, m, xs, pts):
    ys = [100 * a for a, _ in pts]
    lo = [100 * max(0.0, a - wilson(a, k)[0]) for a, k in pts]  # rounding: never < 0
    hi = [100 * max(0.0, wilson(a, k)[1] - a) for a, k in pts]
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt=marker(m) + linestyle(m), color=color(m), ms=4, lw=1.2,
                elinewidth=0.8, capsize=2, label=m)


def grid(n_rows, n_cols):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.6 * n_cols + 1.6, 3.2 * n_rows),
                             squeeze=False, sharey=True)
    for ax in axes.flat:
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    return fig, axes


def finish(fig, axes, ylabel, path):
    for row in axes:
        row[0].set_ylabel(ylabel)
    handles, labels = {}, []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.legend([handles[lab] for lab in labels], labels, loc="center right", fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - 1.5 / fig.get_size_inches()[0], 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def accuracy_vs_budget(cells, out_dir):
    protocols = sorted({k[0] for k in cells})
    lengths = sorted({k[3] for k in cells})
    budgets = sorted({k[2] for k in cells if k[1] not in DENSE}, key=budget_value)
    methods = sorted({k[1] for k in cells})
    sparse = [m for m in methods if m not in DENSE]
    dx = offsets(sparse)
    fig, axes = grid(len(protocols), len(lengths))
    for row, protocol in zip(axes, protocols):
        for ax, length in zip(row, lengths):
            for m in methods:
                if m in DENSE:
                    if (protocol, m, "-", length) in cells:
                        draw_dense(ax, m, *cells[(protocol, m, "-", length)])
                    continue
                xs, pts = [], []
                for i, b in enumerate(budgets):
                    if (protocol, m, b, length) in cells:
                        xs.append(i + dx[m])
                        pts.append(cells[(protocol, m, b, length)])
                if pts:
                    draw_method(ax, m, xs, pts)
            ax.set_xticks(range(len(budgets)), budgets)
            ax.set_xlim(-0.6, len(budgets) - 0.4)
            title = f"{length_label(length)} tokens"
            ax.set_title(title if len(protocols) == 1 else f"{title}, {protocol}", fontsize=10)
            ax.set_xlabel("KV budget (of the prompt, or tokens)")
    finish(fig, axes, "accuracy % (mean over tasks)", os.path.join(out_dir, "accuracy_vs_budget.png"))


def accuracy_vs_length(cells, out_dir):
    protocols = sorted({k[0] for k in cells})
    lengths = sorted({k[3] for k in cells})
    budgets = sorted({k[2] for k in cells if k[1] not in DENSE}, key=budget_value) or ["-"]
    methods = sorted({k[1] for k in cells})
    dx = offsets([m for m in methods if m not in DENSE], width=0.4)
    fig, axes = grid(len(protocols), len(budgets))
    for row, protocol in zip(axes, protocols):
        for ax, budget in zip(row, budgets):
            for m in methods:
                want = "-" if m in DENSE else budget
                xs, pts = [], []
                for i, length in enumerate(lengths):
                    if (protocol, m, want, length) in cells:
                        xs.append(i + dx.get(m, 0.0))
                        pts.append(cells[(protocol, m, want, length)])
                if pts:
                    draw_method(ax, m, xs, pts)
            ax.set_xticks(range(len(lengths)), [length_label(n) for n in lengths])
            ax.set_xlim(-0.5, len(lengths) - 0.5)
            title = f"budget {budget}"
            ax.set_title(title if len(protocols) == 1 else f"{title}, {protocol}", fontsize=10)
            ax.set_xlabel("prompt tokens")
    finish(fig, axes, "accuracy % (mean over tasks)", os.path.join(out_dir, "accuracy_vs_length.png"))


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
