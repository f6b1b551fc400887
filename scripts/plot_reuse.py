#!/usr/bin/env python3
"""Plots of `masskv reuse` (called by the CLI): dropped mass, absolute and relative to a fresh
selection's, and the overlap with a fresh selection, against the age of a reused selection (decode steps), one panel per
mapping, one line per selector and budget; the previous layer's selection as a dashed line.
usage: plot_reuse.py reuse.csv OUT_DIR"""
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def layer_sums(rows):
    """(mapping, selector, budget, age) -> sums of delta, delta_fresh, overlap and a count."""
    acc = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        a = acc[(r["mapping"], r["selector"], r["budget"], int(r["age"]))]
        a[0] += float(r["delta"])
        a[1] += float(r["delta_fresh"])
        a[2] += float(r["overlap"])
        a[3] += 1
    return acc


def main(path, out_dir):
    with open(path) as f:
        acc = layer_sums(csv.DictReader(f))
    maps = sorted({k[0] for k in acc}, key=lambda m: (m != "softmax", m))
    metrics = [
        ("delta", "dropped mass δ (mean)", lambda a: max(a[0] / a[3], 1e-7), True),
        ("delta_ratio", "δ / δ of a fresh selection", lambda a: a[0] / a[1] if a[1] > 0 else 1.0,
         True),
        ("overlap", "share of the fresh selection's pages", lambda a: a[2] / a[3], False),
    ]
    for key, label, value, log in metrics:
        fig, axes = plt.subplots(1, len(maps), figsize=(4.2 * len(maps), 3.2), squeeze=False)
        for ax, m in zip(axes[0], maps):
            configs = sorted({(k[1], k[2]) for k in acc if k[0] == m})
            for i, (sel, budget) in enumerate(configs):
                color = f"C{i % 10}"
                pts = sorted((k[3], value(a)) for k, a in acc.items()
                             if k[:3] == (m, sel, budget) and k[3] >= 0)
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, color=color,
                        label=f"{sel} {budget}")
                prev = acc.get((m, sel, budget, -1))
                if prev:
                    ax.axhline(value(prev), color=color, ls="--", lw=0.8)
            ax.set_xscale("symlog", base=2, linthresh=1)
            if log:
                ax.set_yscale("log")
            ax.set_title(f"{m} (dashed: previous layer's selection)", fontsize=8)
            ax.set_xlabel("age of the selection (decode steps)", fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7)
        fig.tight_layout()
        out = os.path.join(out_dir, f"reuse_{key}.png")
        fig.savefig(out, dpi=110)
        plt.close(fig)
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
