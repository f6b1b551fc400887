#!/usr/bin/env python3
"""Learned token indexers for the selection lab (the learned-indexer issue, part 2): fit small
per-layer indexers on a model's real q/k (`masskv dump` of real text), then score them with
`scripts/selection_lab.py --indexers FILE.npz` on other prompts (the eval-style dumps).

    scripts/indexer_lab.py TRAIN_DIR... --shape bil16 [--mode group|layer] -o idx.npz

Shapes (q = the q heads' vectors concatenated, k a key; both as the dump stores them, after RoPE):
  bilDS        s_t = (A q) · (B k_t), A: DS × |q|, B: DS × |k| (today's distilled selector's form)
  projDS       s_t = (P Σ_h a_h q_h) · (P k_t): one projection for both sides, started from the keys'
               top-DS principal directions (group mode only)
  dsaNHxDS     s_t = Σ_j w_j(q) ReLU((A_j q) · (B k_t)), w(q) = W q + b: NH small heads sharing one
               key projection, each weighted by the query (DeepSeek's DSA lightning indexer form)
Modes: `group` fits one indexer per kv group (its g q heads, its kv head's keys: one ranking per kv
head); `layer` one per layer (every q head, every kv head's key concatenated: one ranking shared by
the layer's kv heads, DS values a token instead of DS per kv head).
Target and loss: the mean over the ranked q heads of their softmax attention p (scale 1/sqrt(d)),
KL(p || softmax(s)) over the context, summed over query steps (--loss kl), or the mass that scores
below a cascade's candidate cut (--loss mass, --cut), or both; Adam, full batch. The lab then ranks
tokens by s (the kept rows as every method) and measures recall of the token oracle's mass.
A prototype loop (torch on the CPU); a winner becomes a library selector trained by
`masskv distill` and is judged by `masskv eval`.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab_dump import read_dump  # noqa: E402  (the one reader of the dump format)


def parse_shape(s: str) -> dict:
    m = re.fullmatch(r"bil(\d+)", s)
    if m:
        return dict(kind="bil", nh=1, ds=int(m.group(1)))
    m = re.fullmatch(r"proj(\d+)", s)
    if m:
        return dict(kind="proj", nh=1, ds=int(m.group(1)))
    m = re.fullmatch(r"dsa(\d+)x(\d+)", s)
    if m:
        return dict(kind="dsa", nh=int(m.group(1)), ds=int(m.group(2)))
    raise SystemExit(f"--shape: {s!r} is not bilDS, projDS or dsaNHxDS (e.g. bil16, proj32, dsa4x16)")


def index_scores(params: dict, kind: str, q, k, xp, key_quant=None):
    """s [steps][ctx] from q [steps][|q|] and k [ctx][|k|] (numpy or torch arrays). key_quant:
    applied to the indexer's keys [ctx][ds] (what a cache of them would store), e.g. 4-bit."""
    if kind == "proj":  # one projection P for both sides, of the heads' weighted query sum
        d = params["P"].shape[1]
        qbar = (q.reshape(q.shape[0], -1, d) * params["a"][None, :, None]).sum(1)
        kp = k @ params["P"].T
        if key_quant is not None:
            kp = key_quant(kp)
        return (qbar @ params["P"].T) @ kp.T
    kp = k @ params["B"].T                                        # [ctx][ds]
    if key_quant is not None:
        kp = key_quant(kp)
    if kind == "bil":
        return (q @ params["A"].T) @ kp.T
    nh = params["W"].shape[0]
    qa = (q @ params["A"].T).reshape(q.shape[0], nh, -1)          # [steps][nh][ds]
    w = q @ params["W"].T + params["b"]                           # [steps][nh]
    dots = xp.einsum("sjd,td->sjt", qa, kp)
    relu = xp.maximum(dots, 0) if xp is np else dots.clamp(min=0)
    return xp.einsum("sj,sjt->st", w, relu)


def groups_of(h: dict, mode: str):
    """(name, q head indices, kv head indices) of each indexer of a layer."""
    hq, hkv = h["hq"], h["hkv"]
    g = hq // hkv
    if mode == "layer":
        return [("all", list(range(hq)), list(range(hkv)))]
    return [(f"h{kh}", list(range(kh * g, (kh + 1) * g)), [kh]) for kh in range(hkv)]


def mass_loss(s, p, cut: float):
    """The share of the attention mass p whose tokens score below the candidate cut: the cut is
    the score of rank cut x ctx / 16 (a cascade's first pass keeps that many), each token's miss
    softened by softplus((s_cut - s_t) / T), T a tenth of the scores' spread (detached, so
    scaling s changes nothing). What a first pass is for: the heavy tokens above the cut."""
    import torch
    m = max(1, min(s.shape[-1], int(round(cut * s.shape[-1] / 16))))
    kth = torch.topk(s, m, dim=-1).values[:, -1:].detach()
    T = 0.1 * s.std(-1, keepdim=True).detach().clamp_min(1e-6)
    return (p * torch.nn.functional.softplus((kth - s) / T)).sum(-1).mean()


def fit(examples, shape: dict, iters: int, lr: float, seed: int, verbose: bool = False,
        loss_kind: str = "kl", cut: float = 4.0):
    """examples: [(q [steps][|q|], k [ctx][|k|], p [steps][ctx])]; returns numpy params, loss.
    loss_kind: kl (KL(p || softmax(s))), mass (mass_loss at `cut`), kl+mass (their sum)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    dq, dk = examples[0][0].shape[1], examples[0][1].shape[1]
    ds, nh = shape["ds"], shape["nh"]
    data = [(torch.tensor(q, dtype=torch.float32), torch.tensor(k, dtype=torch.float32),
             torch.tensor(p, dtype=torch.float32)) for q, k, p in examples]
    # Inputs scaled to unit RMS once (a fixed factor per tensor, folded back into A and B).
    sq = float(np.sqrt(np.mean([np.mean(q ** 2) for q, _, _ in examples])))
    sk = float(np.sqrt(np.mean([np.mean(k ** 2) for _, k, _ in examples])))
    if shape["kind"] == "proj":
        # P starts as the keys' top-ds principal directions (the training-free PCA sketch),
        # the heads' weights at 1: s = Σ_h q_h · k restricted to those directions.
        kk = np.concatenate([k for _, k, _ in examples]) / sk
        _, _, vt = np.linalg.svd(kk - kk.mean(0), full_matrices=False)
        P = {"P": torch.tensor(vt[:ds], dtype=torch.float32),
             "a": torch.ones(dq // dk) * (sq * sk / math.sqrt(dk))}
    else:
        P = {"A": torch.randn(nh * ds, dq, generator=gen) * (0.1 / math.sqrt(dq)),
             "B": torch.randn(ds, dk, generator=gen) / math.sqrt(dk)}
    if shape["kind"] == "dsa":
        P["W"] = torch.randn(nh, dq, generator=gen) * 0.01
        P["b"] = torch.ones(nh)
    for t in P.values():
        t.requires_grad_(True)
    opt = torch.optim.Adam(P.values(), lr=lr)
    loss_v = float("nan")
    for it in range(iters):
        opt.zero_grad()
        loss = 0.0
        for q, k, p in data:
            s = index_scores(P, shape["kind"], q / sq, k / sk, torch)
            if loss_kind != "mass":
                logq = torch.log_softmax(s, -1)
                loss = loss - (p * logq).sum(-1).mean() + (p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()
            if loss_kind != "kl":
                loss = loss + mass_loss(s, p, cut)
        loss = loss / len(data)
        loss.backward()
        opt.step()
        loss_v = float(loss.detach())
        if verbose and (it % 50 == 0 or it == iters - 1):
            print(f"    iter {it}: loss {loss_v:.4f}", file=sys.stderr)
    out = {n: t.detach().numpy().astype(np.float64) for n, t in P.items()}
    if shape["kind"] == "proj":  # s(q/sq, k/sk) = s(q, k) with a / (sq sk)
        out["a"] = out["a"] / (sq * sk)
        return out, loss_v
    out["A"] = out["A"] / sq
    out["B"] = out["B"] / sk
    if "W" in out:
        out["W"] = out["W"] / sq
    return out, loss_v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="training dump folders (layerNN.mkvd)")
    ap.add_argument("--shape", default="bil16", help="bilDS, projDS or dsaNHxDS (default bil16)")
    ap.add_argument("--mode", choices=("group", "layer"), default="group")
    ap.add_argument("--iters", type=int, default=200, help="Adam steps per indexer (default 200)")
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--layers", default="", help="comma-separated layer subset (default: all)")
    ap.add_argument("--loss", choices=("kl", "mass", "kl+mass"), default="kl",
                    help="kl: KL(p || softmax(s)); mass: the attention mass scored below the "
                         "candidate cut (mass_loss); kl+mass: both (default kl)")
    ap.add_argument("--cut", type=float, default=4.0,
                    help="the mass loss's cut: rank CUT x ctx / 16, a cascade's candidates "
                         "(default 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-v", "--verbose", action="store_true", help="print the loss every 50 steps")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the indexers (.npz)")
    a = ap.parse_args()
    shape = parse_shape(a.shape)
    if shape["kind"] == "proj" and a.mode == "layer":
        # proj sums the q heads of one kv group against that kv head's keys: per group only.
        ap.error("--shape projDS needs --mode group")
    import torch
    torch.set_num_threads(a.threads)
    by_layer: dict[int, list[Path]] = {}
    for d in a.dirs:
        fs = sorted(d.glob("layer*.mkvd"))
        if not fs:
            ap.error(f"{d}: no layerNN.mkvd inside")
        for f in fs:
            by_layer.setdefault(int(f.stem[5:]), []).append(f)
    wanted = {int(x) for x in a.layers.split(",") if x}
    layers = sorted(L for L in by_layer if not wanted or L in wanted)
    arrays, losses = {}, {}
    t0 = time.time()
    for li, L in enumerate(layers):
        dumps = [read_dump(f) for f in by_layer[L]]
        h0 = dumps[0][0]
        for name, qh, kh in groups_of(h0, a.mode):
            ex = []
            for h, q, k in dumps:
                scale = 1.0 / math.sqrt(h["head_dim"])
                g = h["hq"] // h["hkv"]
                # Each q head against its own kv head's keys: [steps][heads][ctx].
                logits = np.stack([q[:, i] @ k[:, i // g].T for i in qh], 1) * scale
                p = np.exp(logits - logits.max(-1, keepdims=True))
                p /= p.sum(-1, keepdims=True)
                ex.append((q[:, qh].reshape(q.shape[0], -1), k[:, kh].reshape(k.shape[0], -1),
                           p.mean(1)))
            params, loss = fit(ex, shape, a.iters, a.lr, seed=L, verbose=a.verbose,
                               loss_kind=a.loss, cut=a.cut)
            for n, v in params.items():
                arrays[f"L{L}_{name}_{n}"] = v
            losses[f"L{L}_{name}"] = loss
        el = time.time() - t0
        print(f"[{li + 1}/{len(layers)}] layer {L}: loss {np.mean([v for k, v in losses.items() if k.startswith(f'L{L}_')]):.3f}"
              f"  {el:.0f}s, ETA {el / (li + 1) * (len(layers) - li - 1):.0f}s", file=sys.stderr, flush=True)
    meta = dict(shape=a.shape, mode=a.mode, iters=a.iters, lr=a.lr, train=[str(d) for d in a.dirs],
                layers=layers, loss=a.loss, cut=a.cut, final_loss=losses)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(a.out, meta=json.dumps(meta), **arrays)
    print(f"wrote {a.out}: {len(arrays)} arrays, mean {a.loss} loss {np.mean(list(losses.values())):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
