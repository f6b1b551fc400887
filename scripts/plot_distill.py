#!/usr/bin/env python3
"""Loss curves of `masskv distill` (called by the CLI): one panel per layer, the minibatch KL
(train) and the held-out KL against the Adam step.  usage: plot_distill.py curves.csv OUT.png"""
import csv
import math
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out):
    curves = defaultdict(list)
    with open(path) as f:
        for r in csv.DictReader(f):
            curves[int(r["layer"])].append(
                (int(r["step"]), float(r["train_kl"]), float(r["heldout_kl"])))
    layers = sorted(curves)
    cols = min(6, len(layers))
    rows = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.1 * rows), squeeze=False,
                             sharex=True)
    for i, layer in enumerate(layers):
        ax = axes[i // cols][i % cols]
        pts = sorted(curves[layer])
        steps = [p[0] for p in pts]
        ax.plot(steps[1:], [p[1] for p in pts][1:], ls="--", lw=1, marker=".", ms=3, label="train (minibatch)")
        ax.plot(steps, [p[2] for p in pts], lw=1.5, label="held-out")
        ax.set_title(f"layer {layer}", fontsize=8)
        ax.tick_params(labelsize=7)
        if i % cols == 0:
            ax.set_ylabel("KL(p ‖ softmax ŝ)", fontsize=7)
        if i // cols == rows - 1:
            ax.set_xlabel("step", fontsize=7)
    for j in range(len(layers), rows * cols):
        axes[j // cols][j % cols].axis("off")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
