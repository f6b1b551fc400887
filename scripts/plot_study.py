#!/usr/bin/env python3
"""Plots of `masskv study` (called by the CLI): one PNG per metric, δ / recall / output error /
certified-exact fraction / bound tightness against the budget, one panel per generator and
mapping, one line per selector.  usage: plot_study.py study.csv OUT_DIR"""
import csv
from fractions import Fraction
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_style import color, marker  # noqa: E402  (one colour per selector, every plot)

METRICS = [
    ("delta", "dropped mass δ", True),
    ("recall", "recall (entmax support / softmax 90% set)", False),
    ("rel_error", "‖o − ô‖ / ‖o‖", True),
    ("certified", "certified-exact fraction of heads", False),
    ("tightness", "Σδ / Σ certified δ bound", False),
]


def main(path, out_dir):
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r["selector"] != "dense"]
    gens = sorted({r["generator"] for r in rows})
    maps = sorted({r["mapping"] for r in rows}, key=lambda m: (m != "softmax", m))
    fracs = sorted({float(r["budget_frac"]) for r in rows})
    for key, label, log in METRICS:
        fig, axes = plt.subplots(len(maps), len(gens), figsize=(3.2 * len(gens), 2.6 * len(maps)),
                                 squeeze=False, sharex=True)
        for i, m in enumerate(maps):
            for j, g in enumerate(gens):
                ax = axes[i][j]
                lines = defaultdict(list)
                for r in rows:
                    if r["generator"] == g and r["mapping"] == m:
                        lines[r["selector"]].append((float(r["budget_frac"]), float(r[key])))
                for sel, pts in sorted(lines.items()):
                    pts.sort()
                    ys = [max(y, 1e-7) if log else y for _, y in pts]
                    ax.plot([x for x, _ in pts], ys, marker=marker(sel), ms=3, label=sel,
                            color=color(sel))
                ax.set_xscale("log", base=2)
                ax.set_xticks(fracs, [str(Fraction(x).limit_denominator(4096)) for x in fracs])
                ax.minorticks_off()
                if log:
                    ax.set_yscale("log")
                ax.set_title(f"{g} · {m}", fontsize=8)
                ax.tick_params(labelsize=7)
                if i == len(maps) - 1:
                    ax.set_xlabel("budget (fraction of context)", fontsize=7)
                if j == 0:
                    ax.set_ylabel(label, fontsize=7)
        handles, labels = axes[-1][-1].get_legend_handles_labels()
        for row in axes:
            for ax in row:
                h, l = ax.get_legend_handles_labels()
                if len(l) > len(labels):
                    handles, labels = h, l
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8)
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        out = os.path.join(out_dir, f"study_{key}.png")
        fig.savefig(out, dpi=110)
        plt.close(fig)
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
