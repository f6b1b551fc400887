#!/usr/bin/env python3
"""Selection quality of the compact page summaries (select/compact_bounds.hpp) on real keys:
8-bit min/max codes and hierarchical group summaries against flat bf16 Quest.

Reads `masskv dump` files (tools/masskv/qkv_dump.hpp) and, per layer, query token and kv head,
selects pages (page 16, sink page 1, the last page kept, budget a fraction of the pages) with
  flat   Quest on the outward-rounded bf16 min/max (select::quest_select with bounds_bf16),
  8-bit  Quest on the 8-bit codes (select::BoundStore8: per (page, head) grid lo + step·code,
         min rounded down, max rounded up),
  hier   groups of G pages scanned first, the last group and the best ceil(cover·budget/G)
         others kept, then Quest on their pages (select::hier_select),
ranking by the max over the kv group's q heads, ties to the lower page id. Bounds here are
f64 sums (the C++ adds a rounding slack of ~1e-5 relative: ranking ties aside, the same order).
Reports per selector: recall of flat Quest's pages, identical lists, and the softmax attention
mass (exact scores of every key) the selected pages hold, against flat Quest's.

Usage: compact_summaries_study.py OUT.md DUMP.mkvd [DUMP.mkvd ...]
"""
import json
import math
import struct
import sys

import numpy as np

PAGE = 16
SINKS = 1


def read_dump(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"MKVDUMP1", path
        (hlen,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(hlen))
        s, hq, hkv, d, n = hdr["steps"], hdr["hq"], hdr["hkv"], hdr["head_dim"], hdr["context"]
        q = np.frombuffer(f.read(4 * s * hq * d), dtype="<f4").reshape(s, hq, d)
        k = np.frombuffer(f.read(4 * n * hkv * d), dtype="<f4").reshape(n, hkv, d)
    return hdr, q.astype(np.float64), k


def bf16_down(x):
    u = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    t = u.view(np.float32)
    u = np.where(t > x, u + np.uint32(0x10000), u)  # negative: one bf16 step more negative
    return u.view(np.float32).astype(np.float64)


def bf16_up(x):
    return -bf16_down(-x)


def page_minmax(k):
    """[pages][hkv][d] f32 min/max of the keys of every page (last page partial)."""
    n = k.shape[0]
    pages = (n + PAGE - 1) // PAGE
    pad = pages * PAGE - n
    lo = np.concatenate([k, np.repeat(k[-1:], pad, 0)]).reshape(pages, PAGE, *k.shape[1:])
    return lo.min(1).astype(np.float64), lo.max(1).astype(np.float64)


def quant8(mn, mx):
    """Dequantised 8-bit codes of every (page, head): outward on a per-(page, head) grid."""
    lo = mn.min(-1, keepdims=True)
    hi = mx.max(-1, keepdims=True)
    step = (hi - lo) / 255.0
    step = np.where(step > 0, step * (1 + 1e-7), 1.0)
    cm = np.clip(np.floor((mn - lo) / step), 0, 255)
    cM = np.clip(np.ceil((mx - lo) / step), 0, 255)
    m8, M8 = lo + cm * step, lo + cM * step
    m8 = np.minimum(m8, mn)  # guard f64 rounding at the edges (the C++ checks each code)
    M8 = np.maximum(M8, mx)
    return m8, M8


def bounds(q, mn, mx):
    """Quest bound of q [g][d] against rows [n][d]: max over the g heads of sum max(q m, q M)."""
    qp, qn = np.maximum(q, 0), np.minimum(q, 0)
    return (qp @ mx.T + qn @ mn.T).max(0)


def select(rank, n, budget):
    """Sinks, the last page, and the best of the rest by rank (ties to the lower id)."""
    kept = set(range(min(SINKS, n))) | {n - 1}
    need = max(0, min(n, budget) - len(kept))
    cand = [j for j in range(SINKS, n - 1)]
    cand.sort(key=lambda j: (-rank[j], j))
    return sorted(kept | set(cand[:need]))


def mass(scores, sel, n_tokens):
    p = np.exp(scores - scores.max())
    p /= p.sum()
    return sum(p[j * PAGE:min(n_tokens, (j + 1) * PAGE)].sum() for j in sel)


def main():
    out_path, paths = sys.argv[1], sys.argv[2:]
    fracs = [1 / 32, 1 / 16]
    covers = [1.0, 2.0, 4.0, 8.0]
    group_sizes = [8, 16]
    acc = {}  # (frac, selector) -> [recall hits, ref pages, identical, lists, mass, flat mass]
    layers = []
    for path in paths:
        hdr, q, k = read_dump(path)
        layers.append(hdr["layer"])
        n_tok, hkv, d = k.shape
        g = q.shape[1] // hkv
        fmn, fmx = page_minmax(k)
        mn, mx = bf16_down(fmn), bf16_up(fmx)
        m8, M8 = quant8(fmn, fmx)
        pages = mn.shape[0]
        gstores = {}
        for G in group_sizes:
            ng = (pages + G - 1) // G
            gstores[G] = (np.stack([mn[i * G:(i + 1) * G].min(0) for i in range(ng)]),
                          np.stack([mx[i * G:(i + 1) * G].max(0) for i in range(ng)]))
        for s in range(q.shape[0]):
            for h in range(hkv):
                qg = q[s, h * g:(h + 1) * g]
                scores_all = (qg @ k[:, h].astype(np.float64).T) / math.sqrt(d)  # [g][tokens]
                uf = bounds(qg, mn[:, h], mx[:, h])
                u8 = bounds(qg, m8[:, h], M8[:, h])
                ugs = {G: bounds(qg, gm[:, h], gM[:, h]) for G, (gm, gM) in gstores.items()}
                for frac in fracs:
                    budget = max(2, round(frac * pages))
                    flat = select(uf, pages, budget)
                    sels = {"8-bit": select(u8, pages, budget)}
                    for G, ug in ugs.items():
                        ng = len(ug)
                        for cover in covers:
                            m = min(ng, 1 + math.ceil(cover * budget / G))
                            order = sorted(range(ng - 1), key=lambda i: (-ug[i], i))
                            chosen = set(order[:m - 1]) | {ng - 1}
                            rank = np.where([j // G in chosen for j in range(pages)], uf, -np.inf)
                            sels[f"hier G{G} cover {cover:g}"] = select(rank, pages, budget)
                    fm = np.mean([mass(scores_all[i], flat, n_tok) for i in range(g)])
                    for name, sel in sels.items():
                        a = acc.setdefault((frac, name), [0, 0, 0, 0, 0.0, 0.0])
                        a[0] += len(set(sel) & set(flat))
                        a[1] += len(flat)
                        a[2] += sel == flat
                        a[3] += 1
                        a[4] += np.mean([mass(scores_all[i], sel, n_tok) for i in range(g)])
                        a[5] += fm
    bf16_b = 4 * d
    q8_b = 2 * d + 8
    lines = [f"Compact page summaries vs flat bf16 Quest on real keys ({hdr['model']}, layers "
             f"{','.join(map(str, layers))}, context {n_tok} tokens = {pages} pages of {PAGE}, "
             f"{q.shape[0]} query tokens, {hkv} kv heads x {g} q heads, d {d}; sink page 1 and "
             f"the last page kept).", "",
             f"Bytes per (page, kv head): bf16 min/max {bf16_b}, 8-bit {q8_b} "
             f"({q8_b / bf16_b:.2f}x); groups of G pages: {bf16_b}/G per page for the group "
             f"scan + {bf16_b} per page of the chosen groups (1 + ceil(cover x budget / G) "
             f"groups).", "",
             "| budget (pages) | selector | recall of flat Quest | identical lists | attention "
             "mass held | flat Quest's mass |", "|---|---|---|---|---|---|"]
    for (frac, name), a in sorted(acc.items(), key=lambda x: (x[0][0], x[0][1].replace(
            "G8 ", "G08 "))):
        budget = max(2, round(frac * pages))
        lines.append(f"| {budget} (1/{round(1 / frac)}) | {name} | {a[0] / a[1]:.4f} | "
                     f"{a[2] / a[3]:.3f} | {a[4] / a[3]:.4f} | {a[5] / a[3]:.4f} |")
    open(out_path, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
