#!/usr/bin/env python3
"""Selection quality of the entmax-aware (Gaussian-τ) hierarchical selector on real keys, under
1.5-entmax attention of the dumped scores, against Quest (flat and hierarchical).

Reads `masskv dump` files (tools/masskv/qkv_dump.hpp) and, per layer, query token and kv head,
selects pages (page 16, sink page 1, the last page kept; budget a fraction of the pages) with
  flat Quest   the bf16-rounded min/max bound, max over the kv group's q heads;
  flat gauss   every page ranked by max_i((α−1)·U_i − τ̂_i) (the ranking without the hierarchy);
  hier Quest   groups of 16 pages scanned first, the last group and the best
               ceil(cover·budget/16) others, then Quest on their pages (select::hier_select);
  gauss        the same hierarchy ranked by max_i((α−1)·U_i − τ̂_i), τ̂_i the §2.4 Gaussian
               estimate of head i's threshold from moments pooled over 64 pages
               (select::MomentStore, select::group_tau_hat; docs/design.md §2.4);
  gauss adapt  gauss, keeping only pages whose rank is > 0 (margin 0; the budget is a cap);
  top-p p      hier Quest's groups (cover 4), then the pages by §2.4 softmax mass (their own
               moments, normalised by the pooled groups: select::hier_top_p) until the mass
               reaches p, at most the budget.
Bounds are f64 sums (the C++ adds a ~1e-5 relative slack: near-ties may rank differently).

Per selector, mean over (layer, query, kv head, q head): pages held; the softmax mass of the
selected pages (the model's own attention); the 1.5-entmax mass the
selected pages hold (exact threshold over every key of the head: 1 means nothing dropped);
the recall of the entmax support's tokens; and the fraction of heads whose selection is
certified exact by the §2.2 rule ((α−1)·max over unselected pages of U ≤ τ(S), τ(S) the exact
threshold of the selected tokens; unscored pages of the hierarchy count with their group
bound).

Usage: gauss_tau_study.py OUT.md DUMP.mkvd [DUMP.mkvd ...]
"""
import math
import sys

import numpy as np

from compact_summaries_study import PAGE, SINKS, bf16_down, bf16_up, page_minmax, read_dump

ALPHA = 1.5
GROUP = 16           # pages per bound group
MOMENT_PAGES = 64    # pages per pooled moment group
_erfc = np.vectorize(math.erfc)


def entmax15_tau(z):
    """Exact threshold of 1.5-entmax on z = (α−1)·s: Σ (z − τ)_+² = 1 (sort-based)."""
    zs = np.sort(z)[::-1]
    k = np.arange(1, len(zs) + 1)
    mean = np.cumsum(zs) / k
    mean_sq = np.cumsum(zs * zs) / k
    ss = k * (mean_sq - mean * mean)
    delta = (1 - ss) / k
    ok = delta >= 0
    tau_k = np.where(ok, mean - np.sqrt(np.maximum(delta, 0)), np.inf)
    support = np.nonzero(ok & (tau_k <= zs))[0]
    return tau_k[support[-1]]


def gauss_tau(a, b, n):
    """τ̂ with Σ n E[(Y − τ)_+²] = 1, Y ~ N(a, b²) (α = 1.5 closed form), by bisection."""
    def f(t):
        d = a - t
        bb = np.maximum(b, 1e-300)
        x = d / bb
        P = 0.5 * _erfc(-x / math.sqrt(2))
        ph = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        val = np.where(b > 0, (d * d + b * b) * P + d * b * ph, np.maximum(d, 0) ** 2)
        return float(np.sum(n * val))
    lo, hi = float(np.max(a - 1)), float(np.max(a + 40 * b + 1))
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) >= 1 else (lo, mid)
    return 0.5 * (lo + hi)


def quest_bounds(q, mn, mx):
    """Per q head bounds [g][rows]: scale · Σ_c max(q m, q M)."""
    qp, qn = np.maximum(q, 0), np.minimum(q, 0)
    return (qp @ mx.T + qn @ mn.T) / math.sqrt(q.shape[1])


def pick(rank, n, budget, eligible=None):
    """Sinks, the last page, and the best of the rest by rank (ties to the lower id)."""
    kept = set(range(min(SINKS, n))) | {n - 1}
    need = max(0, min(n, budget) - len(kept))
    cand = [j for j in range(SINKS, n - 1)
            if np.isfinite(rank[j]) and (eligible is None or eligible[j])]
    cand.sort(key=lambda j: (-rank[j], j))
    return sorted(kept | set(cand[:need]))


def main():
    out_path, paths = sys.argv[1], sys.argv[2:]
    fracs = [1 / 32, 1 / 16, 1 / 8, 1 / 4]
    covers = [2.0, 4.0]
    acc = {}  # (frac, selector) -> sums of [pages, mass, recall, certified, count]
    layers = []
    tau_err, tau_all = [], []  # τ̂ − τ and τ per (layer, query, q head), z units
    for path in paths:
        hdr, q, k = read_dump(path)
        layers.append(hdr["layer"])
        n_tok, hkv, d = k.shape
        g = q.shape[1] // hkv
        fmn, fmx = page_minmax(k)
        mn, mx = bf16_down(fmn), bf16_up(fmx)
        pages = mn.shape[0]
        ng = (pages + GROUP - 1) // GROUP
        gmn = np.stack([mn[i * GROUP:(i + 1) * GROUP].min(0) for i in range(ng)])
        gmx = np.stack([mx[i * GROUP:(i + 1) * GROUP].max(0) for i in range(ng)])
        # Pooled moments of every MOMENT_PAGES pages (exact from the keys: what pooling the
        # pages' Welford state gives up to rounding).
        nm = (n_tok + MOMENT_PAGES * PAGE - 1) // (MOMENT_PAGES * PAGE)
        kd = k.astype(np.float64)
        mom = [(kd[i * MOMENT_PAGES * PAGE:(i + 1) * MOMENT_PAGES * PAGE]) for i in range(nm)]
        mcount = np.array([len(x) for x in mom], dtype=np.float64)
        mmean = np.stack([x.mean(0) for x in mom])  # [nm][hkv][d]
        mvar = np.stack([x.var(0) for x in mom])
        # Page moments (exact from the keys), for the top-p masses.
        pages_t = (n_tok + PAGE - 1) // PAGE
        pcount = np.array([min(PAGE, n_tok - j * PAGE) for j in range(pages_t)], dtype=np.float64)
        pmean = np.stack([kd[j * PAGE:(j + 1) * PAGE].mean(0) for j in range(pages_t)])
        pvar = np.stack([kd[j * PAGE:(j + 1) * PAGE].var(0) for j in range(pages_t)])
        for s in range(q.shape[0]):
            for h in range(hkv):
                qg = q[s, h * g:(h + 1) * g]
                scores = (qg @ kd[:, h].T) / math.sqrt(d)  # [g][tokens]
                z = (ALPHA - 1) * scores
                tau_full = np.array([entmax15_tau(z[i]) for i in range(g)])
                p_full = np.maximum(z - tau_full[:, None], 0) ** 2
                up = quest_bounds(qg, mn[:, h], mx[:, h])   # [g][pages]
                ug = quest_bounds(qg, gmn[:, h], gmx[:, h])  # [g][groups]
                m = (qg @ mmean[:, h].T) / math.sqrt(d)      # [g][nm]
                v = ((qg * qg) @ mvar[:, h].T) / d
                tau_hat = np.array([gauss_tau((ALPHA - 1) * m[i], (ALPHA - 1) * np.sqrt(v[i]),
                                              mcount) for i in range(g)])
                tau_err.extend(tau_hat - tau_full)
                tau_all.extend(tau_full)
                rank_p = ((ALPHA - 1) * up - tau_hat[:, None]).max(0)
                p_soft = np.exp(scores - scores.max(1, keepdims=True))
                p_soft /= p_soft.sum(1, keepdims=True)
                # §2.4 softmax page masses: n e^{m + v/2}, normalised by the pooled groups.
                pm = (qg @ pmean[:, h].T) / math.sqrt(d)
                pv = ((qg * qg) @ pvar[:, h].T) / d
                lw = np.log(pcount)[None, :] + pm + 0.5 * pv
                lg = np.log(mcount)[None, :] + m + 0.5 * v
                logz = lg.max(1) + np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1))
                pmass = np.exp(lw - logz[:, None]).mean(0)
                rank_g = ((ALPHA - 1) * ug - tau_hat[:, None]).max(0)
                for frac in fracs:
                    budget = max(2, round(frac * pages))
                    sels = {"flat Quest": (pick(up.max(0), pages, budget), None),
                            "flat gauss": (pick(rank_p, pages, budget), None)}
                    for cover in covers:
                        mg = min(ng, 1 + math.ceil(cover * budget / GROUP))
                        for name, grank, prank in (("hier Quest", ug.max(0), up.max(0)),
                                                   ("gauss", rank_g, rank_p)):
                            order = sorted(range(ng - 1), key=lambda i: (-grank[i], i))
                            chosen = set(order[:mg - 1]) | {ng - 1}
                            inside = np.array([j // GROUP in chosen for j in range(pages)])
                            r = np.where(inside, prank, -np.inf)
                            sels[f"{name} cover {cover:g}"] = (pick(r, pages, budget), chosen)
                            if name == "gauss":
                                sels[f"gauss adapt cover {cover:g}"] = (
                                    pick(r, pages, budget, eligible=r > 0), chosen)
                            if name == "hier Quest" and cover == 4.0:
                                for pt in (0.9, 0.99):
                                    kept = sorted({0, pages - 1})
                                    held = sum(pmass[j] for j in kept)
                                    cand = sorted((j for j in range(SINKS, pages - 1) if inside[j]),
                                                  key=lambda j: (-np.float32(pmass[j]), j))
                                    taken = []
                                    for j in cand:
                                        if len(taken) >= budget - len(kept) or held >= pt:
                                            break
                                        taken.append(j)
                                        held += pmass[j]
                                    sels[f"top-p {pt:g} (cover 4)"] = (sorted(kept + taken), chosen)
                    for name, (sel, chosen) in sels.items():
                        in_sel = np.zeros(pages, bool)
                        in_sel[sel] = True
                        tok = np.repeat(in_sel, PAGE)[:n_tok]
                        a = acc.setdefault((frac, name), np.zeros(6))
                        a[5] += p_soft[:, tok].sum(1).mean()
                        a[0] += len(sel)
                        a[1] += p_full[:, tok].sum(1).mean()
                        support = p_full > 0
                        a[2] += (support & tok).sum() / support.sum()
                        # Certificate per q head: τ(S) from the selected tokens; unselected
                        # pages bound by their page bound, or their group's when the group
                        # was not scored.
                        cert = 0
                        for i in range(g):
                            tau_s = entmax15_tau(z[i, tok])
                            bound = up[i].copy()
                            if chosen is not None:
                                gb = np.repeat(ug[i], GROUP)[:pages]
                                unscored = np.array([j // GROUP not in chosen
                                                     for j in range(pages)])
                                bound = np.where(unscored, gb, bound)
                            out = bound[~in_sel]
                            cert += out.size == 0 or (ALPHA - 1) * out.max() <= tau_s
                        a[3] += cert / g
                        a[4] += 1
    lines = [f"Entmax-aware (Gaussian-τ) hierarchical selection vs Quest on real keys under "
             f"1.5-entmax attention of the dumped scores ({hdr['model']}, layers "
             f"{','.join(map(str, layers))}, context {n_tok} tokens = {pages} pages of {PAGE}, "
             f"{q.shape[0]} query tokens, {hkv} kv heads x {g} q heads, d {d}; sink page 1 and "
             f"the last page kept; groups of {GROUP} pages, moments pooled over "
             f"{MOMENT_PAGES} pages).", "",
             f"τ̂ − τ (exact 1.5-entmax threshold of all keys, z units) over "
             f"{len(tau_err)} (layer, query, q head): mean {np.mean(tau_err):+.3f}, median "
             f"{np.median(tau_err):+.3f}, 10th–90th percentile {np.percentile(tau_err, 10):+.3f} "
             f"to {np.percentile(tau_err, 90):+.3f} (τ itself: 10th–90th percentile "
             f"{np.percentile(tau_all, 10):+.3f} to {np.percentile(tau_all, 90):+.3f}).", "",
             "| budget (pages) | selector | pages held | softmax mass held | entmax mass held | "
             "support recall | heads certified exact |", "|---|---|---|---|---|---|---|"]
    for (frac, name), a in sorted(acc.items(), key=lambda x: (x[0][0], x[0][1])):
        budget = max(2, round(frac * pages))
        c = a[4]
        lines.append(f"| {budget} (1/{round(1 / frac)}) | {name} | {a[0] / c:.1f} | "
                     f"{a[5] / c:.4f} | {a[1] / c:.4f} | {a[2] / c:.4f} | {a[3] / c:.3f} |")
    open(out_path, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
