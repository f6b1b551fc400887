#!/usr/bin/env python3
"""Writes a lab indexer (`scripts/indexer_lab.py -o IDX.npz`) as a masskv selector file (the GGUF of
docs/learned.md, qk input), so that the library's learned methods (`--selector learned_codes`,
`masskv eval --methods learned_codes --selector-file OUT.gguf`) run it.

    scripts/indexer_export.py IDX.npz --model MODEL.gguf -o OUT.gguf

Shapes: projDS (group mode: per kv group, s_t = (P Σ_h a_h q_h) · (P k_t), written as
W_q = [a_0 P | a_1 P | ...] over the group's concatenated q heads and W_k = P) and bilDS
(group mode: W_q = A, W_k = B per kv group; layer mode: one head-collapsed selector, groups 1).
The DSA shape (ReLU heads weighted by the query) is not a bilinear selector and is refused.
The model's shape (architecture, layers, heads, kv heads, head_dim) comes from MODEL.gguf; the
library checks it again on load. Needs numpy and the `gguf` package (pip install gguf).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def model_shape(path: Path) -> dict:
    """architecture, block_count, embedding_length, head_count, head_count_kv, head_dim."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def field(key: str, default=None):
        f = r.fields.get(key)
        if f is None:
            if default is None:
                raise SystemExit(f"--model: {path} has no {key}")
            return default
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types and f.types[0].name == "STRING" else int(v[0])

    arch = field("general.architecture")
    n_embd = field(f"{arch}.embedding_length")
    n_head = field(f"{arch}.attention.head_count")
    return dict(architecture=arch, block_count=field(f"{arch}.block_count"),
                embedding_length=n_embd, head_count=n_head,
                head_count_kv=field(f"{arch}.attention.head_count_kv"),
                head_dim=field(f"{arch}.attention.key_length", n_embd // n_head))


def layer_weights(z, L: int, meta: dict, m: dict):
    """(groups, dim, W_q [groups][dim][q_in], W_k [groups][dim][k_in]) of layer L."""
    hq, hkv, d = m["head_count"], m["head_count_kv"], m["head_dim"]
    g = hq // hkv
    kind = meta["shape"].rstrip("0123456789")
    if meta["mode"] == "layer":
        if kind != "bil":
            raise SystemExit(f"layer mode exports bilDS only, not {meta['shape']}")
        A, B = z[f"L{L}_all_A"], z[f"L{L}_all_B"]
        if A.shape[1] != hq * d or B.shape[1] != hkv * d:
            raise SystemExit(f"layer {L}: A {A.shape} / B {B.shape} do not fit {hq} x {hkv} heads of {d}")
        return 1, A.shape[0], A[None], B[None]
    wq, wk = [], []
    for h in range(hkv):
        if kind == "proj":
            P, a = z[f"L{L}_h{h}_P"], z[f"L{L}_h{h}_a"]
            if P.shape[1] != d or a.shape != (g,):
                raise SystemExit(f"layer {L} group {h}: P {P.shape}, a {a.shape} do not fit "
                                 f"{g} heads of {d}")
            wq.append(np.concatenate([a[j] * P for j in range(g)], axis=1))
            wk.append(P)
        elif kind == "bil":
            A, B = z[f"L{L}_h{h}_A"], z[f"L{L}_h{h}_B"]
            if A.shape[1] != g * d or B.shape[1] != d:
                raise SystemExit(f"layer {L} group {h}: A {A.shape} / B {B.shape} do not fit")
            wq.append(A)
            wk.append(B)
        else:
            raise SystemExit(f"{meta['shape']}: not a bilinear selector (projDS or bilDS only)")
    return hkv, wq[0].shape[0], np.stack(wq), np.stack(wk)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("indexer", type=Path, help="IDX.npz written by scripts/indexer_lab.py")
    ap.add_argument("--model", type=Path, required=True, help="the model's GGUF (its shape)")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the selector file to write")
    a = ap.parse_args(argv)
    try:
        from gguf import GGUFWriter
    except ImportError:
        raise SystemExit("indexer_export.py needs the gguf package (pip install gguf)") from None
    if not a.indexer.is_file() or not a.model.is_file():
        raise SystemExit(f"no such file: {a.indexer if not a.indexer.is_file() else a.model}")

    z = np.load(a.indexer)
    meta = json.loads(str(z["meta"]))
    m = model_shape(a.model)
    w = GGUFWriter(str(a.out), "masskv-selector")
    w.add_string("masskv.selector.input", "qk")
    w.add_string("masskv.model.architecture", m["architecture"])
    for key in ("block_count", "embedding_length", "head_count", "head_count_kv", "head_dim"):
        w.add_uint32(f"masskv.model.{key}", m[key])
    layers = sorted(int(x) for x in meta["layers"])
    w.add_uint32("masskv.selector.layer_count", len(layers))
    for i, L in enumerate(layers):
        groups, dim, wq, wk = layer_weights(z, L, meta, m)
        w.add_uint32(f"masskv.selector.{i}.layer", L)
        w.add_uint32(f"masskv.selector.{i}.groups", groups)
        w.add_uint32(f"masskv.selector.{i}.dim", dim)
        w.add_bool(f"masskv.selector.{i}.rope", False)
        # numpy [groups][dim][in] is GGUF dims {in, dim, groups} (fastest first).
        w.add_tensor(f"blk.{L}.sel_q.weight", np.ascontiguousarray(wq, dtype=np.float32))
        w.add_tensor(f"blk.{L}.sel_k.weight", np.ascontiguousarray(wk, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    worst = check_scores(a.out, z, meta, m, layers)
    print(f"wrote {a.out}: {len(layers)} layers of {meta['shape']} ({meta['mode']} mode); "
          f"scores read back within {worst:.1e} of the lab's (relative)")
    return 0


def check_scores(path: Path, z, meta: dict, m: dict, layers) -> float:
    """Reads the file back and compares ŝ = (W_q x_q) · (W_k x_k) on random q heads and keys
    with the lab's own index_scores for every layer and group; raises on a mismatch (a layout
    error: heads, groups or sides swapped). Returns the worst relative difference."""
    from gguf import GGUFReader

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from indexer_lab import groups_of, index_scores

    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in GGUFReader(str(path)).tensors}
    rng = np.random.default_rng(0)
    hq, hkv, d = m["head_count"], m["head_count_kv"], m["head_dim"]
    kind = meta["shape"].rstrip("0123456789")
    h = dict(hq=hq, hkv=hkv)
    worst = 0.0
    for L in layers:
        q = rng.standard_normal((4, hq * d))
        k = rng.standard_normal((7, hkv * d))
        wq, wk = tensors[f"blk.{L}.sel_q.weight"], tensors[f"blk.{L}.sel_k.weight"]
        for gi, (name, qh, kh) in enumerate(groups_of(h, meta["mode"])):
            params = {n[len(f"L{L}_{name}_"):]: z[n] for n in z.files if n.startswith(f"L{L}_{name}_")}
            qx = q.reshape(4, hq, d)[:, qh].reshape(4, -1)
            kx = k.reshape(7, hkv, d)[:, kh].reshape(7, -1)
            want = index_scores(params, kind, qx, kx, np)
            got = (qx @ wq[gi].T) @ (kx @ wk[gi].T).T
            err = float(np.abs(got - want).max() / max(1e-30, np.abs(want).max()))
            if err > 1e-5:
                raise SystemExit(f"{path}: layer {L} {name}: scores differ from the lab's by {err:.2e}")
            worst = max(worst, err)
    return worst


if __name__ == "__main__":
    sys.exit(main())
