#!/usr/bin/env python3
"""Why token_codes' first pass weighs channels by the keys' spread (docs/results/lab-gemma3/):
per (query step, kv group) of `masskv dump` folders, the share of the score variance across
tokens, Σ_c Σ_h q_hc² σ_c², that the first pass's 3/8 of the channels hold when chosen by
Σ_h |q_hc| alone and by Σ_h |q_hc| · σ_c (σ_c: channel c's standard deviation over the keys).

    scripts/channel_share.py DUMP_DIR... [--layers 5,11,17] [--share 0.375]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from selection_lab import read_dump


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="dump folders (layerNN.mkvd inside)")
    ap.add_argument("--layers", default="", help="comma-separated layers (default: all)")
    ap.add_argument("--share", type=float, default=0.375, help="share of the channels chosen")
    a = ap.parse_args()
    want = {int(x) for x in a.layers.split(",") if x}
    by_q, by_qs, spread = [], [], []
    for d in a.dirs:
        files = sorted(d.glob("layer*.mkvd"))
        if not files:
            ap.error(f"{d}: no layerNN.mkvd inside")
        for f in files:
            if want and int(f.stem[5:]) not in want:
                continue
            h, q, k = read_dump(f)
            g, dim = h["hq"] // h["hkv"], h["head_dim"]
            r = max(1, round(a.share * dim))
            for kh in range(h["hkv"]):
                sd = k[:, kh].std(0)
                spread.append(sd.max() / np.median(sd))
                for s in range(q.shape[0]):
                    qs = q[s, kh * g:(kh + 1) * g]
                    var = (qs ** 2 * sd ** 2).sum(0)
                    wq = np.abs(qs).sum(0)
                    for w, out in ((wq, by_q), (wq * sd, by_qs)):
                        top = np.argsort(-w, kind="stable")[:r]
                        out.append(var[top].sum() / var.sum())
    if not by_q:
        ap.error("no layer matched --layers")
    print(f"{len(by_q)} (step, kv group) pairs; channel sd max/median (median over layers and "
          f"groups) {np.median(spread):.1f}")
    for name, v in (("|q|", by_q), ("|q|·sd", by_qs)):
        print(f"chosen by {name:7s}: share of the score variance {np.mean(v):.3f} "
              f"(10th percentile {np.percentile(v, 10):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
