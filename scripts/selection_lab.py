#!/usr/bin/env python3
"""The selection-quality lab: page and token rankings scored against the attention-mass oracle
on real q/k from `masskv dump` (issue 30, part 2).

    scripts/selection_lab.py DUMP_DIR... [--budgets 1/16,1/32] [-o OUT_DIR] [--methods ...]

Each DUMP_DIR holds layerNN.mkvd files (tools/masskv/qkv_dump.hpp); `masskv dump --task ...`
writes one per eval prompt, whose queries are the gold answer's tokens: the decode steps that
must find the needle. Per (query step, layer, q head) it computes the true softmax attention over
the context and, for every ranking, the mass its selection holds at the same budget as the oracle.

The selection rule is the library's (src/select/selectors.cpp): the first page (sink) and the
last page always kept; one shared list per kv group, filled round robin from the q heads' own
rankings (GroupRule::union_heads) up to the budget. Token-level methods select tokens (the first
and last page's tokens kept) with a budget of the same number of rows.

Metrics (per head, then averaged):
  mass        attention mass inside the selection (1 - δ)
  recall      (mass - kept mass) / (oracle mass - kept mass): the share of what the oracle finds
              outside the always-kept rows that the method finds too. The oracle is the token
              oracle (the most mass any selection of that many rows holds), so recall <= 1;
              the page oracle (what the eval's `oracle` rows run) is a row of its own
  p10         the 10th percentile of recall over (step, head): the heads a ranking fails
  miss        the share of (step, head) where a page outside the kept rows holding >= 10% of the
              head's attention is left out (for token methods: any of its tokens holding >= 1%)
  sel_bytes   what the ranking itself reads per token and kv head, as a fraction of the dense f16
              K+V bytes (budgets count these on top of the rows read)
The rankings are prototypes written for this loop (numpy); a winner becomes a library selector
and is judged by `masskv eval`, never by this table alone.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab_dump import read_dump  # noqa: E402  (the one reader of the dump format)

PAGE = 16


# ---- key sketches: what a token-level ranking reads instead of the f16 key -----------------

def quant_sym(k: np.ndarray, bits: int, group: int = 32) -> np.ndarray:
    """Symmetric round-to-nearest with one scale per `group` values of a row (INT4 as in
    kv/key_formats.hpp for bits 4: max|x| / 7)."""
    t, h, d = k.shape
    g = k.reshape(t, h, d // group, group)
    qmax = 2 ** (bits - 1) - 1
    s = np.abs(g).max(axis=-1, keepdims=True) / qmax
    s[s == 0] = 1
    return (np.clip(np.round(g / s), -qmax, qmax) * s).reshape(t, h, d)


def round_ranges8(lo: np.ndarray, hi: np.ndarray, levels: int = 255):
    """The ranges on one 8-bit affine grid per (group, kv head) over its channels (the
    BoundStore8 layout of select/compact_bounds.hpp): mins rounded down, maxes up."""
    g_lo = lo.min(axis=-1, keepdims=True)
    g_hi = hi.max(axis=-1, keepdims=True)
    step = (g_hi - g_lo) / levels
    step[step == 0] = 1
    return (g_lo + np.floor((lo - g_lo) / step) * step,
            g_lo + np.minimum(np.ceil((hi - g_lo) / step), levels) * step)


def quant_channel_page(k: np.ndarray, bits: int, group: int = PAGE, r8: bool = False,
                       range_levels: int = 255) -> np.ndarray:
    """Per (group of tokens, kv head, channel) asymmetric quantisation (KIVI's key layout): the
    group's min/max per channel are the scale, `bits` codes per value; r8: those ranges stored
    on an 8-bit grid (round_ranges8)."""
    t, h, d = k.shape
    n = (t + group - 1) // group
    pad = np.repeat(k[-1:], n * group, axis=0)  # pad with a real row: no fake range
    pad[:t] = k
    pg = pad.reshape(n, group, h, d)
    lo = pg.min(axis=1, keepdims=True)
    hi = pg.max(axis=1, keepdims=True)
    if r8:
        lo, hi = round_ranges8(lo, hi, range_levels)
    levels = 2 ** bits - 1
    s = (hi - lo) / levels
    s[s == 0] = 1
    out = (np.round((pg - lo) / s) * s + lo).reshape(n * group, h, d)[:t]
    return out


def quant_channel_static(k: np.ndarray, bits: int, clip: float = 0.0) -> np.ndarray:
    """Per (kv head, channel) asymmetric quantisation with one range for the whole context (the
    [clip, 1 - clip] quantiles of the channel): no per-page scale is stored or read."""
    lo = np.quantile(k, clip, axis=0, keepdims=True) if clip > 0 else k.min(0, keepdims=True)
    hi = np.quantile(k, 1 - clip, axis=0, keepdims=True) if clip > 0 else k.max(0, keepdims=True)
    levels = 2 ** bits - 1
    s = (hi - lo) / levels
    s[s == 0] = 1
    return np.clip(np.round((k - lo) / s), 0, levels) * s + lo


def sign_sketch(k: np.ndarray) -> np.ndarray:
    """1 bit a value: sign(k - page mean) scaled by the page's mean |deviation| per channel,
    plus the page mean (the page summary already holds it)."""
    t, h, d = k.shape
    n = (t + PAGE - 1) // PAGE
    out = np.empty_like(k)
    for j in range(n):
        pg = k[j * PAGE:(j + 1) * PAGE]
        mu = pg.mean(axis=0, keepdims=True)
        dev = pg - mu
        a = np.abs(dev).mean(axis=0, keepdims=True)
        out[j * PAGE:(j + 1) * PAGE] = mu + np.sign(dev) * a
    return out


def pca_sketch(k: np.ndarray, r: int) -> np.ndarray:
    """Keys projected on the top-r principal directions of this layer's keys (per kv head)."""
    out = np.empty_like(k)
    for h in range(k.shape[1]):
        x = k[:, h]
        mu = x.mean(axis=0)
        _, _, vt = np.linalg.svd(x - mu, full_matrices=False)
        p = vt[:r]
        out[:, h] = mu + (x - mu) @ p.T @ p
    return out


# ---- the methods --------------------------------------------------------------------------

@dataclass
class Method:
    name: str
    unit: str          # "page" or "token"
    sel_bytes: float   # selector reads per token and kv head / dense f16 K+V bytes
    prepare: object    # (k) -> state per layer
    score: object      # (state, q[g][d], kv head, ctx) -> scores per item [g][items]


def page_stats(k: np.ndarray):
    t, h, d = k.shape
    n = (t + PAGE - 1) // PAGE
    mn = np.empty((n, h, d)); mx = np.empty((n, h, d)); mu = np.empty((n, h, d)); var = np.empty((n, h, d))
    cnt = np.empty(n)
    for j in range(n):
        pg = k[j * PAGE:(j + 1) * PAGE]
        mn[j], mx[j], mu[j], var[j] = pg.min(0), pg.max(0), pg.mean(0), pg.var(0)
        cnt[j] = pg.shape[0]
    return dict(min=mn, max=mx, mean=mu, var=var, count=cnt)


def m_quest(state, q, h):
    s = state["stats"]
    return np.maximum(q[:, None, :] * s["min"][None, :, h], q[:, None, :] * s["max"][None, :, h]).sum(-1)


def m_mean(state, q, h):
    return q @ state["stats"]["mean"][:, h].T


def make_gauss(z):
    def f(state, q, h):
        s = state["stats"]
        m = q @ s["mean"][:, h].T
        sd = np.sqrt((q ** 2) @ s["var"][:, h].T)
        return m + z * sd
    return f


def make_gauss_lse():
    """log n + m + v/2: the log of the Gaussian page model's softmax mass (top_p's estimate)."""
    def f(state, q, h):
        s = state["stats"]
        m = q @ s["mean"][:, h].T
        v = (q ** 2) @ s["var"][:, h].T
        return np.log(s["count"])[None, :] + m + v / 2
    return f


def make_min_quest_gauss(z):
    g = make_gauss(z)
    def f(state, q, h):
        return np.minimum(m_quest(state, q, h), g(state, q, h))
    return f


def token_scores(state, key, q, h):
    return q @ state[key][:, h].T  # [g][ctx]


def paged_scores(state, key, q, h):
    """Token scores [g][ctx] as [g][pages][PAGE], the last page padded with -inf."""
    s = token_scores(state, key, q, h)
    t = s.shape[1]
    n = (t + PAGE - 1) // PAGE
    pad = np.full((s.shape[0], n * PAGE), -np.inf)
    pad[:, :t] = s
    return pad.reshape(s.shape[0], n, PAGE)


def make_page_max(key):
    def f(state, q, h):
        return paged_scores(state, key, q, h).max(-1)
    return f


def make_page_lse(key):
    def f(state, q, h):
        r = paged_scores(state, key, q, h)
        m = r.max(-1, keepdims=True)
        return (m + np.log(np.exp(r - m).sum(-1, keepdims=True)))[..., 0]
    return f


def make_token(key):
    def f(state, q, h):
        return token_scores(state, key, q, h)
    return f


def make_token_q8(key):
    """Tokens on the sketch with each q head quantised to int8 (round(127 q / max|q|)): the
    integer form a fast scorer would use."""
    def f(state, q, h):
        m = np.abs(q).max(-1, keepdims=True)
        m[m == 0] = 1
        return token_scores(state, key, np.round(127 * q / m), h)
    return f


def make_token_pooled(key, how):
    """One query per kv group (g times fewer scores): the mean of the heads' q (`mean`), or of
    their unit vectors scaled by the mean norm (`unit`); every head gets that ranking."""
    def f(state, q, h):
        if how == "mean":
            qp = q.mean(0, keepdims=True)
        else:
            n = np.linalg.norm(q, axis=-1, keepdims=True)
            n[n == 0] = 1
            qp = (q / n).mean(0, keepdims=True) * n.mean()
        s = token_scores(state, key, qp, h)
        return np.repeat(s, q.shape[0], axis=0)
    return f


def make_token_agg(key, how):
    """Every head's scores on the sketch, pooled into one ranking per kv group before the fill
    (no round robin): the max over heads of the logit (`max`), or of the logit minus the head's
    own log-sum-exp over the context, i.e. each head's log-probability (`lse`), or minus the
    head's own best logit (`top`)."""
    def f(state, q, h):
        s = token_scores(state, key, q, h)
        if how == "lse":
            m = s.max(-1, keepdims=True)
            s = s - (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))
        elif how == "top":  # the logit minus the head's own best: no exp, no sum
            s = s - s.max(-1, keepdims=True)
        return np.repeat(s.max(0, keepdims=True), q.shape[0], axis=0)
    return f


def make_two_stage(key, c):
    def f(state, q, h, cap_pages=None):
        pages = m_quest(state, q, h)
        n = pages.shape[1]
        want = min(n, c * state["cap_pages"])
        cand = union_fill(pages, np.zeros(n, bool), want)
        s = token_scores(state, key, q, h)
        mask = np.repeat(cand, PAGE)[: s.shape[1]]
        return np.where(mask[None, :], s, -np.inf)
    return f


def make_two_token(lo_key, hi_key, c):
    def f(state, q, h):
        s_lo = token_scores(state, lo_key, q, h)             # [g][ctx]
        cap = state["cap_pages"] * PAGE
        cand = union_fill(s_lo, np.zeros(s_lo.shape[1], bool), min(s_lo.shape[1], c * cap))
        s = token_scores(state, hi_key, q, h)
        return np.where(cand[None, :], s, -np.inf)
    return f


def make_token_channels(key, frac, how, agg="lse"):
    """Tokens scored on a subset of each kv group's channels (a fraction `frac` of d), so the
    codes and ranges of the other channels are never read: chosen every step from the group's
    query, by sum over heads of |q_c| (`q`, SparQ's rule) or of |q_c| times the channel's mean
    page range over the context (`qr`); or once per layer and head from the keys alone, by the
    mean page range (`r`, a static store). Pooled across heads by `agg` as make_token_agg."""
    def f(state, q, h):
        k = state[key][:, h]                                   # [ctx][d]
        d = k.shape[1]
        r = max(1, int(round(d * frac)))
        rng = state["stats"]["max"][:, h] - state["stats"]["min"][:, h]
        spread = rng.mean(0)                                   # [d]
        if how == "q":
            imp = np.abs(q).sum(0)
        elif how == "qr":
            imp = np.abs(q).sum(0) * spread
        else:
            imp = spread
        ch = np.argsort(-imp, kind="stable")[:r]
        s = q[:, ch] @ k[:, ch].T
        if agg == "lse":
            m = s.max(-1, keepdims=True)
            s = s - (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))
            return np.repeat(s.max(0, keepdims=True), q.shape[0], axis=0)
        return s
    return f


def cascade_bytes(d, r, cand_tokens, cand_groups, ctx, n_groups, group):
    """What a two-pass code ranking reads with the layouts that make each pass contiguous, as a
    fraction of the dense f16 K+V: pass 1 the r chosen channels' codes and 8-bit ranges of
    every token from a channel-major copy ([kv head][channel][page]: each channel's words in a
    row), and every page's grid (lo, step); pass 2 the candidates' whole token-major code rows
    (d / 4 bytes each) and the whole 8-bit ranges (2 d bytes) of every page holding one."""
    pass1 = r * (ctx / 4 + 2 * n_groups) + 8 * n_groups
    pass2 = cand_tokens * d / 4 + cand_groups * 2 * d
    return (pass1 + pass2) / (4.0 * d * ctx)


def channel_importance(state, q, h, how):
    """Each channel's weight in the first pass's choice: Σ_h |q_c| (`q`, SparQ's rule), times the
    channel's mean page range (`qr`) or its standard deviation over the context (`qs`): a channel
    whose keys barely vary moves no token's rank, however large q is on it."""
    imp = np.abs(q).sum(0)
    if how == "qr":
        imp = imp * (state["stats"]["max"][:, h] - state["stats"]["min"][:, h]).mean(0)
    elif how == "qs":
        imp = imp * state["k"][:, h].std(0)
    return imp


def rescore_candidates(state, q, h, cand, key, name, group=PAGE, first_pass_bytes=0.0):
    """The second pass of a cascade: the candidates (bool [ctx]) scored on every channel of the
    `key` codes, each head's log-probabilities over the candidates, pooled by the max over heads
    (the library's rule); the others -inf. Counts its reads (plus `first_pass_bytes`, per kv
    head and context token) under `name`."""
    k = state[key][:, h]
    n_groups = (k.shape[0] + group - 1) // group
    touched = np.unique(np.nonzero(cand)[0] // group).size
    state.setdefault("dyn_bytes", {}).setdefault(name, []).append(
        first_pass_bytes
        + cascade_bytes(k.shape[1], 0, int(cand.sum()), touched, k.shape[0], n_groups, group))
    s2 = q @ k[cand].T
    m2 = s2.max(-1, keepdims=True)
    lse2 = m2 + np.log(np.exp(s2 - m2).sum(-1, keepdims=True))
    out = np.full(k.shape[0], -np.inf)
    out[cand] = (s2 - lse2).max(0)
    return np.repeat(out[None, :], q.shape[0], axis=0)


def make_token_cascade(key, frac, c, lse_from, block=1, pages=False, name=None, group=PAGE,
                       how="q", reuse=1, pool1="lse"):
    """Two passes on the same codes: every token on the group's `frac` of channels with the
    largest sum over heads of |q_c| (make_token_channels), pooled by the heads'
    log-probabilities; its best c x budget tokens rescored on all channels (the other
    channels' codes and ranges read for those tokens only) and pooled again, the heads'
    log-sum-exp taken over the candidates (`cand`) or from the first pass (`first`). reuse R:
    the first pass runs at every R-th decode step only, its candidates serving the next R - 1
    steps (the second pass is fresh every step): what amortising the first pass would cost.
    pool1: how the first pass pools the heads — `lse` (each head's log-probabilities, the
    library's rule), `max` (each head's score less its own maximum: no exponentials), `sum` (one
    score per token from the group's summed query, its channels chosen by |Σ_h q_c| · σ_c: a
    g-th of the multiply-adds and no exponentials)."""
    def f(state, q, h):
        if reuse > 1 and state["step"] % reuse:
            cand = state["cand_cache"][(name, h)]
            return second_pass(state, q, h, cand)
        out, cand = first_pass(state, q, h)
        if reuse > 1:
            state.setdefault("cand_cache", {})[(name, h)] = cand
        return out

    def second_pass(state, q, h, cand):
        return rescore_candidates(state, q, h, cand, key, name, group)

    def first_pass(state, q, h):
        k = state[key][:, h]
        d = k.shape[1]
        r = max(1, int(round(d * frac)))
        # Channels chosen in blocks of `block` adjacent channels (a block's codes of a page
        # are contiguous in a block-major layout), by the block's sum of |q|.
        q1 = q.sum(0, keepdims=True) if pool1 == "sum" else q
        imp = channel_importance(state, q1, h, how).reshape(d // block, block).sum(1)
        blocks = np.argsort(-imp, kind="stable")[:max(1, r // block)]
        ch = (blocks[:, None] * block + np.arange(block)[None, :]).ravel()
        s1 = q1[:, ch] @ k[:, ch].T                             # [g or 1][ctx]
        m1 = s1.max(-1, keepdims=True)
        if pool1 == "lse":
            lse1 = m1 + np.log(np.exp(s1 - m1).sum(-1, keepdims=True))
        else:
            lse1 = m1
        pooled = (s1 - lse1).max(0)
        kept = kept_mask(k.shape[0], k.shape[0], "token")
        want = min(k.shape[0], c * state["cap_pages"] * PAGE)
        if pages:  # whole pages by their best token: c x the budget's pages
            n = (k.shape[0] + PAGE - 1) // PAGE
            pp = np.full(n * PAGE, -np.inf)
            pp[:k.shape[0]] = pooled
            pin = union_fill(pp.reshape(n, PAGE).max(1)[None, :], kept_mask(n, k.shape[0], "page"),
                             min(n, 2 + c * state["cap_pages"]))
            cand = np.repeat(pin, PAGE)[:k.shape[0]]
        else:
            cand = union_fill(pooled[None, :], kept, want)
        if name:  # bytes as stored (see cascade_bytes), per kv head and token of the context
            n_groups = (k.shape[0] + group - 1) // group
            touched = np.unique(np.nonzero(cand)[0] // group).size
            state.setdefault("dyn_bytes", {}).setdefault(name, []).append(
                cascade_bytes(d, r, int(cand.sum()), touched, k.shape[0], n_groups, group))
        s2 = q @ k[cand].T
        if lse_from == "cand":
            m2 = s2.max(-1, keepdims=True)
            lse2 = m2 + np.log(np.exp(s2 - m2).sum(-1, keepdims=True))
        else:
            lse2 = lse1
        out = np.full(k.shape[0], -np.inf)
        out[cand] = (s2 - lse2).max(0)
        return np.repeat(out[None, :], q.shape[0], axis=0), cand
    return f


SKETCHES = {
    "k": lambda k: k,
    "int4": lambda k: quant_sym(k, 4),
    "int2": lambda k: quant_sym(k, 2),
    "kivi2": lambda k: quant_channel_page(k, 2),
    "kivi1": lambda k: quant_channel_page(k, 1),
    "kivi2g64": lambda k: quant_channel_page(k, 2, 64),
    "kivi2r8": lambda k: quant_channel_page(k, 2, PAGE, True),
    "kivi1r8": lambda k: quant_channel_page(k, 1, PAGE, True),
    "kivi2g64r8": lambda k: quant_channel_page(k, 2, 64, True),
    "kivi2g32r8": lambda k: quant_channel_page(k, 2, 32, True),
    "kivi2r4": lambda k: quant_channel_page(k, 2, PAGE, True, 15),
    "kivi2r5": lambda k: quant_channel_page(k, 2, PAGE, True, 31),
    "kivi1g64r8": lambda k: quant_channel_page(k, 1, 64, True),
    "st2": lambda k: quant_channel_static(k, 2),
    "st2c": lambda k: quant_channel_static(k, 2, 0.005),
    "st3c": lambda k: quant_channel_static(k, 3, 0.005),
    "st1c": lambda k: quant_channel_static(k, 1, 0.005),
    "kivi3g64": lambda k: quant_channel_page(k, 3, 64),
    "sign": sign_sketch,
    "pca8": lambda k: pca_sketch(k, 8),
    "pca4": lambda k: pca_sketch(k, 4),
}


def sketch_bytes(name: str, d: int) -> float:
    """Selector bytes per token and kv head over dense f16 K+V (4 d bytes)."""
    dense = 4.0 * d
    per = {
        "k": 2.0 * d,                       # f16 keys: the oracle-like reference, not realisable
        "int4": d / 2 + 2 * d / 32,
        "int2": d / 4 + 2 * d / 32,
        "kivi2": d / 4 + 2 * 2 * d / PAGE,  # codes + f16 min/max per channel and page
        "kivi1": d / 8 + 2 * 2 * d / PAGE,
        "kivi2g64": d / 4 + 2 * 2 * d / 64,
        "kivi2r8": d / 4 + (2 * d + 8) / PAGE,   # codes + 8-bit ranges and their grid
        "kivi1r8": d / 8 + (2 * d + 8) / PAGE,
        "kivi2g64r8": d / 4 + (2 * d + 8) / 64,
        "kivi2g32r8": d / 4 + (2 * d + 8) / 32,
        "kivi2r4": d / 4 + (d + 8) / PAGE,
        "kivi2r5": d / 4 + (10 * d / 8 + 8) / PAGE,
        "kivi1g64r8": d / 8 + (2 * d + 8) / 64,
        "st2": d / 4, "st2c": d / 4, "st3c": 3 * d / 8, "st1c": d / 8,
        "kivi3g64": 3 * d / 8 + 2 * 2 * d / 64,
        "sign": d / 8 + 2 * 2 * d / PAGE,   # signs + f16 mean and |dev| per channel and page
        "pca8": 2 * 8.0,
        "pca4": 2 * 4.0,
    }[name]
    return per / dense


def build_methods(d: int) -> dict[str, Method]:
    bf16_bounds = 2 * 2 * d / PAGE / (4.0 * d)   # bf16 min+max per page
    bf16_moments = 2 * 2 * d / PAGE / (4.0 * d)  # bf16 mean+var per page
    M = {}
    def add(name, unit, b, score, sk=None):
        M[name] = Method(name, unit, b, sk, score)
    add("quest", "page", bf16_bounds, m_quest)
    add("mean", "page", bf16_moments / 2, m_mean)
    for z in (1.0, 2.0, 3.0):
        add(f"gauss{z:g}", "page", bf16_moments, make_gauss(z))
    add("gauss_lse", "page", bf16_moments, make_gauss_lse())
    add("min_quest_gauss2", "page", bf16_bounds + bf16_moments, make_min_quest_gauss(2.0))
    for sk in ("kivi2", "int4", "kivi2g64"):
        for c in (2, 4, 8, 16):
            # candidates: the top c x budget pages by the bf16 bound (Quest), then tokens by
            # the sketch inside them; reads the bounds of every page and the codes of c/16
            # kivi2's range is the page's min/max, which the bound already read: codes only
            # (the library's two_stage, select/read_cost.hpp).
            codes = (d / 4) / (4.0 * d) if sk == "kivi2" else sketch_bytes(sk, d)
            M[f"two{c}_{sk}"] = Method(f"two{c}_{sk}", "token", bf16_bounds + c / 16 * codes,
                                       sk, make_two_stage(sk, c))
    # Two token stages: every token on a cheap sketch, its best c x budget tokens on a finer
    # one (reads the cheap sketch of every token and the fine codes of the candidates).
    for lo_sk, hi_sk in (("kivi1r8", "kivi2r8"), ("kivi1g64r8", "kivi2g64r8")):
        for c in (2, 4, 8):
            M[f"tt{c}_{lo_sk}_{hi_sk}"] = Method(
                f"tt{c}_{lo_sk}_{hi_sk}", "token",
                sketch_bytes(lo_sk, d) + c / 16 * (d / 8) / (4.0 * d), (lo_sk, hi_sk),
                make_two_token(lo_sk, hi_sk, c))
    for c in (2, 3, 4, 6):
        for frac in (0.5, 0.375, 0.25):
            nm = f"phys{c}c{int(frac * 1000)}_kivi2r8"
            add(nm, "token", float("nan"), make_token_cascade("kivi2r8", frac, c, "cand", name=nm),
                "kivi2r8")
            for how in ("qr", "qs"):
                nm2 = f"phys{c}c{int(frac * 1000)}{how}_kivi2r8"
                add(nm2, "token", float("nan"),
                    make_token_cascade("kivi2r8", frac, c, "cand", name=nm2, how=how),
                    ("kivi2r8", "k") if how == "qs" else "kivi2r8")
                for p1 in ("max", "sum"):  # a cheaper first pass (CPU cost)
                    nm4 = f"{nm2}_p1{p1}"
                    add(nm4, "token", float("nan"),
                        make_token_cascade("kivi2r8", frac, c, "cand", name=nm4, how=how,
                                           pool1=p1),
                        ("kivi2r8", "k") if how == "qs" else "kivi2r8")
                for R in (2, 4, 8, 16):  # the first pass amortised over R steps
                    nm3 = f"{nm2}_reuse{R}"
                    add(nm3, "token", float("nan"),
                        make_token_cascade("kivi2r8", frac, c, "cand", name=nm3, how=how,
                                           reuse=R),
                        ("kivi2r8", "k") if how == "qs" else "kivi2r8")
    for sk, grp in (("kivi2g32r8", 32), ("kivi2r4", PAGE), ("kivi2r5", PAGE)):
        full = sketch_bytes(sk, d) - 8 / grp / (4.0 * d)
        for c in (2, 4):
            for frac in (0.5, 0.25):
                add(f"cas{c}cand{int(frac * 1000)}_{sk}", "token",
                    frac * full + 8 / grp / (4.0 * d) + c / 16 * (1 - frac) * full,
                    make_token_cascade(sk, frac, c, "cand"), sk)
    for sk in ("kivi2", "kivi2r8", "kivi2g32r8", "kivi2r4", "kivi2r5", "k"):
        b = sketch_bytes(sk, d)
        add(f"tok_{sk}_q8", "token", b, make_token_q8(sk), sk)
        add(f"tok_{sk}_pool", "token", b, make_token_pooled(sk, "mean"), sk)
        add(f"tok_{sk}_poolu", "token", b, make_token_pooled(sk, "unit"), sk)
        add(f"tok_{sk}_aggmax", "token", b, make_token_agg(sk, "max"), sk)
        add(f"tok_{sk}_agglse", "token", b, make_token_agg(sk, "lse"), sk)
        add(f"tok_{sk}_aggtop", "token", b, make_token_agg(sk, "top"), sk)
    full = sketch_bytes("kivi2r8", d) - 8 / PAGE / (4.0 * d)     # codes + ranges, no grid
    for frac in (0.5, 0.25):
        for c in (2, 4, 8):
            b = frac * full + 8 / PAGE / (4.0 * d) + c / 16 * (1 - frac) * full
            for lf in ("cand", "first"):
                add(f"cas{c}{lf}{int(frac * 1000)}_kivi2r8", "token", b,
                    make_token_cascade("kivi2r8", frac, c, lf), "kivi2r8")
            add(f"cas{c}pg{int(frac * 1000)}_kivi2r8", "token", b,
                make_token_cascade("kivi2r8", frac, c, "cand", 1, True), "kivi2r8")
            for blk in (4, 8, 16):
                add(f"cas{c}cand{int(frac * 1000)}b{blk}_kivi2r8", "token", b,
                    make_token_cascade("kivi2r8", frac, c, "cand", blk), "kivi2r8")
    for frac in (0.5, 0.375, 0.25):
        b = frac * sketch_bytes("kivi2r8", d) + (1 - frac) * 8 / PAGE / (4.0 * d)
        for how in ("q", "qr", "r"):
            add(f"tokch{how}{int(frac * 1000)}_kivi2r8", "token", b,
                make_token_channels("kivi2r8", frac, how), "kivi2r8")
            add(f"tokch{how}{int(frac * 1000)}_kivi2r8_rr", "token", b,
                make_token_channels("kivi2r8", frac, how, "rr"), "kivi2r8")
    for sk in ("st2", "st2c", "st3c", "st1c", "int4", "int2", "kivi2", "kivi1", "kivi2g64", "kivi3g64", "sign", "pca8", "pca4", "k",
               "kivi2r8", "kivi1r8", "kivi2g64r8", "kivi1g64r8"):
        b = sketch_bytes(sk, d)
        add(f"pmax_{sk}", "page", b, make_page_max(sk), sk)
        add(f"plse_{sk}", "page", b, make_page_lse(sk), sk)
        add(f"tok_{sk}", "token", b, make_token(sk), sk)
    return M


def make_indexer_method(path: Path, d: int, hkv: int, cascade: int = 0, key_bits: int = 0) -> Method:
    """A learned token indexer from scripts/indexer_lab.py (method idx_<file stem>): its scores s_t of every token, one
    ranking per kv group (mode group) or per layer (mode layer, shared by the kv heads). Reads
    counted as its key rows in bf16 (DS values a token per kv head, or per layer). cascade c > 0:
    the indexer as the first pass of the default's cascade instead (method idx_<stem>_cas<c>).
    key_bits 4: its keys stored in INT4 (a scale per 32 values or per row if shorter: quant_sym),
    counted as stored (method idx_<stem>_k4...)."""
    from indexer_lab import index_scores, parse_shape
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    shape = parse_shape(meta["shape"])
    mode = meta["mode"]
    W = {k: z[k] for k in z.files if k != "meta"}
    name = f"idx_{path.stem}" + (f"_k{key_bits}" if key_bits else "")  # one shape, several trainings
    ds = shape["ds"]
    group = min(32, ds)

    def stored(kp):  # the indexer's keys [ctx][ds] as an INT cache holds them
        return quant_sym(kp[:, None, :], key_bits, group=group)[:, 0]
    quant = stored if key_bits else None
    # Bytes a row: the codes and an f16 scale per group, or bf16.
    row = ds * key_bits / 8 + 2 * ds / group if key_bits else 2 * ds
    per_token = row / (hkv if mode == "layer" else 1)

    def scores(state, h):
        """The indexer's s [ctx] at this step for kv head h, made once per step and file (the
        layer mode's ranking is shared by its kv heads; a cascade reuses the plain method's)."""
        part = "all" if mode == "layer" else f"h{h}"
        key = ("idx", name, state["step"], part)
        if key not in state:
            L = state["layer"]
            prm = {n: W[f"L{L}_{part}_{n}"] for n in ("A", "B", "W", "b", "P", "a")
                   if f"L{L}_{part}_{n}" in W}
            if mode == "layer":
                qs, kk = state["q_step"].reshape(1, -1), state["k"].reshape(state["k"].shape[0], -1)
            else:
                g = state["hq"] // state["hkv"]
                qs, kk = state["q_step"][h * g:(h + 1) * g].reshape(1, -1), state["k"][:, h]
            state[key] = index_scores(prm, shape["kind"], qs, kk, np, quant)[0]
        return state[key]

    def f(state, q, h):
        return np.repeat(scores(state, h)[None, :], q.shape[0], axis=0)
    if not cascade:
        return Method(name, "token", per_token / (4.0 * d), None, f)
    # As a cascade's first pass: its best c x budget tokens (after the kept rows) rescored on the
    # default's codes (rescore_candidates); reads its keys (as stored with key_bits, else counted
    # at 4 bits without scales, the layout's size: DS / 2 bytes a token) plus the candidates' codes.
    cname = f"{name}_cas{cascade}"

    def g(state, q, h):
        s = scores(state, h)[None, :]
        ctx = s.shape[1]
        cand = union_fill(s, kept_mask(ctx, ctx, "token"), min(ctx, cascade * state["cap_pages"] * PAGE))
        first = (per_token if key_bits else per_token / 4) / (4.0 * d)
        return rescore_candidates(state, q, h, cand, "kivi2r8", cname, first_pass_bytes=first)
    return Method(cname, "token", float("nan"), "kivi2r8", g)


# ---- selection rule -------------------------------------------------------------------------

def union_fill(scores: np.ndarray, kept: np.ndarray, cap: int) -> np.ndarray:
    """Round robin over the heads' rankings (ties: lower id), after the kept items, to `cap`."""
    n = scores.shape[1]
    inn = kept.copy()
    count = int(inn.sum())
    if count >= cap:
        return inn
    orders = [np.lexsort((np.arange(n), -s))[: cap + 1] for s in scores]
    pos = [0] * len(orders)
    progress = True
    while count < cap and progress:
        progress = False
        for i, o in enumerate(orders):
            if count >= cap:
                break
            while pos[i] < len(o) and inn[o[pos[i]]]:
                pos[i] += 1
            if pos[i] == len(o):
                continue
            inn[o[pos[i]]] = True
            pos[i] += 1
            count += 1
            progress = True
    return inn


def kept_mask(n_items: int, ctx: int, unit: str) -> np.ndarray:
    m = np.zeros(n_items, bool)
    if unit == "page":
        m[0] = True
        m[-1] = True
    else:
        m[: min(PAGE, ctx)] = True
        m[((ctx - 1) // PAGE) * PAGE:] = True
    return m


def page_mass(p: np.ndarray) -> np.ndarray:
    t = p.shape[-1]
    n = (t + PAGE - 1) // PAGE
    pad = np.zeros(p.shape[:-1] + (n * PAGE,))
    pad[..., :t] = p
    return pad.reshape(p.shape[:-1] + (n, PAGE)).sum(-1)


def parse_budget(s: str) -> Fraction:
    return Fraction(s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: scripts/selection_lab.py out/lab/* --budgets 1/16 -o out/lab_report")
    ap.add_argument("dirs", nargs="+", type=Path, help="dump folders (layerNN.mkvd inside)")
    ap.add_argument("--budgets", default="1/16", help="fractions of the context, comma-separated")
    ap.add_argument("--methods", default="", help="comma-separated subset (default: all)")
    ap.add_argument("--layers", default="", help="comma-separated layer subset (default: all)")
    ap.add_argument("-o", "--out-dir", type=Path, default=None, help="write lab.md / lab.json / PNGs here")
    ap.add_argument("--indexers", default="", help="learned indexers (scripts/indexer_lab.py .npz files, "
                    "comma-separated): each a method idx_FILESTEM")
    ap.add_argument("--indexer-key-bits", type=int, default=0, choices=(0, 4, 8),
                    help="store the indexers' keys in INT4 / INT8 (quant_sym) before scoring, "
                         "counted as stored (method names get _k4 / _k8; 0: float)")
    ap.add_argument("--indexer-cascade", default="", help="candidate factors C (comma-separated): each "
                    "indexer also as the first pass of the default's cascade, its best C x budget "
                    "tokens rescored on the codes (method idx_FILESTEM_casC)")
    a = ap.parse_args()
    budgets = [parse_budget(b) for b in a.budgets.split(",")]
    try:
        cascades = [int(x) for x in a.indexer_cascade.split(",") if x]
    except ValueError:
        ap.error(f"--indexer-cascade: expected whole numbers, got {a.indexer_cascade!r}")
    if any(c < 1 for c in cascades):
        ap.error("--indexer-cascade: factors must be >= 1")
    if cascades and not a.indexers:
        ap.error("--indexer-cascade needs --indexers")
    for b in budgets:
        if not (0 < b <= 1):
            ap.error(f"--budgets: {b} is not in (0, 1]")
    files = []
    for d in a.dirs:
        if not d.is_dir():
            ap.error(f"{d}: not a folder")
        fs = sorted(d.glob("layer*.mkvd"))
        if not fs:
            ap.error(f"{d}: no layerNN.mkvd inside")
        files += fs
    layer_filter = {int(x) for x in a.layers.split(",") if x}
    files = [f for f in files if not layer_filter or int(f.stem[5:]) in layer_filter]
    # rows[(method, budget)][layer] -> list of (mass, oracle mass, kept mass) per head-step
    acc: dict = {}
    t0 = time.time()
    methods = None
    dyn_bytes: dict = {}
    for fi, path in enumerate(files):
        h, q, k = read_dump(path)
        d, hq, hkv, ctx = h["head_dim"], h["hq"], h["hkv"], h["context"]
        g = hq // hkv
        if methods is None:
            methods = build_methods(d)
            if a.methods:
                unknown = [m for m in a.methods.split(",") if m not in methods and m != "oracle"]
                if unknown:
                    ap.error(f"--methods: unknown {unknown}; known: {sorted(methods)}")
                methods = {m: methods[m] for m in a.methods.split(",") if m in methods}
            for path_i in [x for x in a.indexers.split(",") if x]:
                for c in [0] + cascades:
                    m = make_indexer_method(Path(path_i), d, hkv, c, a.indexer_key_bits)
                    methods[m.name] = m
        scale = 1.0 / math.sqrt(d)
        state = {"stats": page_stats(k), "dyn_bytes": dyn_bytes, "layer": h["layer"], "k": k,
                 "hq": hq, "hkv": hkv}
        for m in methods.values():
            for sk in (m.prepare if isinstance(m.prepare, tuple) else (m.prepare,)):
                if sk and sk not in state:
                    state[sk] = SKETCHES[sk](k)
        n_pages = (ctx + PAGE - 1) // PAGE
        for b in budgets:
            tokens = max(1, int(math.ceil(ctx * b)))
            cap_pages = max(2, (tokens + PAGE - 1) // PAGE)
            cap_tokens = cap_pages * PAGE
            state["cap_pages"] = cap_pages
            for s in range(q.shape[0]):
                state["step"] = s
                state["q_step"] = q[s]                            # [hq][d], unscaled
                for kh in range(hkv):
                    qs = q[s, kh * g:(kh + 1) * g] * scale      # [g][d]
                    logits = qs @ k[:, kh].T                      # [g][ctx]
                    p = np.exp(logits - logits.max(-1, keepdims=True))
                    p /= p.sum(-1, keepdims=True)
                    pm = page_mass(p)
                    keptp = kept_mask(n_pages, ctx, "page")
                    keptt = kept_mask(ctx, ctx, "token")
                    orc = {"page": union_fill(pm, keptp, cap_pages),
                           "token": union_fill(p, keptt, cap_tokens)}
                    kept_mass = {"page": (pm * keptp).sum(-1), "token": (p * keptt).sum(-1)}
                    orc_mass = {"page": (pm * orc["page"]).sum(-1), "token": (p * orc["token"]).sum(-1)}
                    for u in ("page", "token"):
                        key = (f"oracle_{u}", str(b))
                        sel = orc[u]
                        if u == "page":
                            miss = ((pm >= 0.1) & ~keptp[None, :] & ~sel[None, :]).any(-1)
                        else:
                            th = np.repeat((pm >= 0.1) & ~keptp[None, :], PAGE, axis=1)[:, :ctx] & (p >= 0.01)
                            miss = (th & ~sel[None, :]).any(-1)
                        acc.setdefault(key, {}).setdefault(h["layer"], []).append(
                            np.stack([orc_mass[u], orc_mass["token"], kept_mass[u],
                                      miss.astype(float)], -1))
                    heavy = pm >= 0.1
                    heavy[:, keptp] = False
                    for m in methods.values():
                        sc = m.score(state, qs, kh)
                        kept = keptp if m.unit == "page" else keptt
                        cap = cap_pages if m.unit == "page" else cap_tokens
                        sel = union_fill(sc, kept, cap)
                        w = pm if m.unit == "page" else p
                        mass = (w * sel).sum(-1)
                        if m.unit == "page":
                            miss = (heavy & ~sel[None, :]).any(-1)
                        else:  # a heavy page's tokens holding >= 1% each must all be in
                            tok_heavy = np.repeat(heavy, PAGE, axis=1)[:, :ctx] & (p >= 0.01)
                            miss = (tok_heavy & ~sel[None, :]).any(-1)
                        # Recall is measured against the token oracle for every method: the
                        # best selection of that many rows.
                        acc.setdefault((m.name, str(b)), {}).setdefault(h["layer"], []).append(
                            np.stack([mass, orc_mass["token"], kept_mass[m.unit],
                                      miss.astype(float)], -1))
        el = time.time() - t0
        # A bar on a terminal; in a log, a line every 10 files.
        if sys.stderr.isatty() or (fi + 1) % 10 == 0 or fi + 1 == len(files):
            lead = "\r" if sys.stderr.isatty() else ""
            print(f"{lead}[{fi + 1}/{len(files)}] "
                  f"{path.parent.name}/{path.name}  {el:.0f}s, "
                  f"ETA {el / (fi + 1) * (len(files) - fi - 1):.0f}s",
                  end="" if sys.stderr.isatty() else "\n", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    sel_bytes = {m.name: m.sel_bytes for m in methods.values()}
    for name, xs in dyn_bytes.items():  # measured per selection where a method counts its reads
        sel_bytes[name] = float(np.mean(xs))
    sel_bytes["oracle_page"] = sel_bytes["oracle_token"] = 0.5
    rows = []
    for (name, b), per_layer in acc.items():
        layers = sorted(per_layer)
        mass_l, rec_l, all_rec, miss_l = [], [], [], []
        for L in layers:
            x = np.concatenate(per_layer[L])
            mass, om, km = x[:, 0], x[:, 1], x[:, 2]
            denom = np.maximum(om - km, 1e-12)
            rec = np.minimum(np.clip((mass - km) / denom, 0, None), 2)
            mass_l.append(mass.mean())
            rec_l.append(np.mean(rec))
            all_rec.append(rec)
            miss_l.append(x[:, 3].mean())
        rows.append(dict(method=name, budget=b, mass=float(np.mean(mass_l)), recall=float(np.mean(rec_l)),
                         recall_min_layer=float(np.min(rec_l)),
                         p10=float(np.percentile(np.concatenate(all_rec), 10)),
                         miss=float(np.mean(miss_l)), sel_bytes=sel_bytes.get(name, float("nan")),
                         per_layer_recall=[float(r) for r in rec_l], per_layer_mass=[float(m) for m in mass_l],
                         per_layer_miss=[float(m) for m in miss_l],
                         layers=layers))
    rows.sort(key=lambda r: (r["budget"], -r["recall"]))
    lines = ["| method | budget | mass | recall of oracle | worst layer | p10 | miss | selector bytes |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['budget']} | {r['mass']:.3f} | {r['recall']:.3f} | "
                     f"{r['recall_min_layer']:.3f} | {r['p10']:.3f} | {r['miss']:.3f} | {r['sel_bytes']:.3f} |")
    table = "\n".join(lines)
    print(table)
    if a.out_dir:
        a.out_dir.mkdir(parents=True, exist_ok=True)
        (a.out_dir / "lab.md").write_text(
            f"# Selection lab\n\n`{' '.join(sys.argv)}`\n\n{len(files)} layer files.\n\n{table}\n")
        (a.out_dir / "lab.json").write_text(json.dumps(dict(command=sys.argv, rows=rows), indent=1))
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            for b in sorted({r["budget"] for r in rows}):
                at = [r for r in rows if r["budget"] == b]
                keep = {"oracle_page", "quest", "gauss3"}
                shown = [r for r in at if r["method"] in keep]
                shown += [r for r in at if r["method"] not in keep and r["method"] != "oracle_token"][:6]
                fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
                cmap = plt.get_cmap("tab10")
                for i, r in enumerate(shown):
                    style = dict(marker=".", color=cmap(i % 10), lw=2 if r["method"] == "quest" else 1.3,
                                 ls="--" if r["method"].startswith("oracle") else "-")
                    ax1.plot(r["layers"], r["per_layer_recall"], label=f"{r['method']} ({r['recall']:.2f})", **style)
                    ax2.plot(r["layers"], [100 * m for m in r["per_layer_miss"]],
                             label=f"{r['method']} ({100 * r['miss']:.1f}%)", **style)
                ax1.set_ylabel("recall of the token oracle's mass outside the kept rows")
                ax1.set_ylim(0, 1.02)
                ax2.set_ylabel("% of (step, head) missing a page with >= 10% of the attention")
                ax2.set_ylim(bottom=0)
                for ax in (ax1, ax2):
                    ax.set_xlabel("layer"); ax.grid(alpha=.3); ax.legend(fontsize=8)
                fig.suptitle(f"Selection lab: {len(files)} layer files, budget {b} (mean over steps and heads)")
                fig.tight_layout()
                fig.savefig(a.out_dir / f"lab_recall_{str(b).replace('/', '_')}.png", dpi=110)
                plt.close(fig)
        except ImportError:
            print("selection_lab: matplotlib missing, plots skipped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
