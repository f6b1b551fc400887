"""Whole-model decode on one GPU: dense attention against masskv's sparse decode, in the same
model code, both captured in one CUDA graph per step, in the same run on the same card.

Random-init weights (bf16): these figures are speed only, never quality (the quality tables are
the CPU eval's). The model is a plain PyTorch Llama-style decoder written here (RMSNorm, RoPE,
GQA attention, SwiGLU; Qwen3's q/k norms), shaped as Llama-3.1-8B or Qwen3-8B. The KV of the
decode rows is filled with random values instead of a prefill, and only the last token's logits
are computed. A step at context `ctx` appends token ctx (the first slot of a fresh page, so the
replayed step is idempotent) and attends over ctx + 1 tokens:

* dense: a static cache [layers][B][H_kv][ctx + 1][d], torch SDPA with native GQA
  (enable_gqa=True, no mask), the faster of the cuDNN and flash backends;
* masskv: masskv.torch_cache.TorchPagedCache (page 16), per layer the append kernel, a fresh GPU
  selection every step (budget tokens, 1 sink page, no window) — hierarchical Quest (`hier`:
  groups of 16 pages first, cover 2), flat Quest (`quest`) or token_codes (`codes`: tokens on
  the page codes, refreshed after each append; the CPU eval's quality default) — and masskv's
  CUDA decode over the selected pages (or tokens).

Printed beside each ratio: the bytes bound of each path (the weights read once, the embedding
table excluded; the KV read; masskv: the selected pages plus the bf16 bound store the selection
scans) at the read ceiling measured in the same run, and the attention µs per layer (the
attention of every layer alone in one graph). `--check` first compares one eager step of masskv
(dense decode, then a budget covering every page) against SDPA on the same KV (a 4K context).

Usage:
  python3 tools/gpu_bench/e2e.py OUT_PREFIX [--models llama8b,qwen8b]
      [--cells 1x32768,1x131072,1x262144,8x32768] [--budgets 2048,4096] [--methods hier,quest]
      [--iters 20] [--check] [--prefill-cells 1x32768,1x131072 --prefill-budgets 4096,0]
  python3 tools/gpu_bench/e2e.py OUT_PREFIX --tiny --device cpu   (the dense path's self-test)
Writes OUT_PREFIX.json ({card, date, command, rows: [{model, phase, batch, ctx, budget,
dense_ms, masskv_ms, bytes_bound_ms, ...}]}; prefill rows: TTFT in the ms fields, e2e_prefill.py)
and OUT_PREFIX.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import e2e_prefill


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    qk_norm: bool
    rope_theta: float

    def kv_bytes_per_token(self) -> int:  # K and V of every layer, bf16
        return self.layers * 2 * self.kv_heads * self.head_dim * 2


SHAPES = {
    "llama8b": Shape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, False, 500000.0),
    "qwen8b": Shape("Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, True, 1000000.0),
    "tiny": Shape("tiny", 2, 256, 4, 2, 64, 512, 1000, True, 10000.0),
}
PAGE = 16
MLP_ROWS = 16384


class Model:
    """Random bf16 weights of `shape` and its decode step with a pluggable attention."""

    def __init__(self, shape: Shape, device: torch.device, dtype=torch.bfloat16, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        s = shape
        self.s, self.device, self.dtype = s, device, dtype

        def w(*dims, scale=None):
            t = torch.randn(*dims, generator=g, device=device, dtype=dtype)
            return t.mul_(scale if scale is not None else 1.0 / math.sqrt(dims[-1]))

        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.embed = w(s.vocab, s.hidden, scale=1.0)
        self.layers = []
        for _ in range(s.layers):
            self.layers.append(dict(
                ln1=torch.ones(s.hidden, device=device, dtype=dtype),
                wqkv=w(qkv, s.hidden), wo=w(s.hidden, s.heads * s.head_dim),
                qn=torch.ones(s.head_dim, device=device, dtype=dtype),
                kn=torch.ones(s.head_dim, device=device, dtype=dtype),
                ln2=torch.ones(s.hidden, device=device, dtype=dtype),
                wgu=w(2 * s.inter, s.hidden), wdown=w(s.hidden, s.inter)))
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.vocab, s.hidden)
        half = s.head_dim // 2
        self.inv_freq = 1.0 / (s.rope_theta ** (torch.arange(half, device=device,
                                                             dtype=torch.float32) / half))
        self._fused, self.fused = None, False

    def weight_bytes(self) -> int:
        """Bytes a step reads of the weights (the embedding table excluded: one row a token)."""
        n = sum(t.numel() for layer in self.layers for t in layer.values())
        return 2 * (n + self.norm.numel() + self.lm_head.numel())

    @staticmethod
    def rms(x, wt, eps=1e-6):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * wt

    def rope(self, x, cos, sin, dtype=None):  # x [B, H, d]; cos, sin [B, 1, d/2]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).to(dtype or x.dtype)

    def qkv(self, h, L, cos, sin, out_dtype=None):
        """Attention input of one layer (weights L): RMS norm, the fused q/k/v projection,
        q/k norm where the shape has it, RoPE; q, k, v in out_dtype (None: the model's), the
        attention's input type written by the same kernels (no cast kernels after them)."""
        s = self.s
        B = h.shape[0]
        qkv = self.rms(h, L["ln1"]) @ L["wqkv"].T
        q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim,
                             s.kv_heads * s.head_dim], -1)
        q = q.view(B, s.heads, s.head_dim)
        k = k.view(B, s.kv_heads, s.head_dim)
        v = v.view(B, s.kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = self.rms(q, L["qn"]), self.rms(k, L["kn"])
        t = out_dtype or h.dtype
        return self.rope(q, cos, sin, t), self.rope(k, cos, sin, t), v.to(t)

    def mlp(self, x, L):
        g, u = (self.rms(x, L["ln2"]) @ L["wgu"].T).chunk(2, -1)
        return (F.silu(g) * u) @ L["wdown"].T

    def post(self, h, o, L):
        """The rest of one layer after attention (o [N, H * d]): output projection, MLP."""
        h = h + o.to(h.dtype) @ L["wo"].T
        return h + self.mlp(h, L)

    def fuse(self, on: bool = True) -> None:
        """Decode steps through torch.compile'd qkv() and post(): the ~45 element-wise kernels
        a layer (norms, RoPE, SiLU, casts) fused into a few, for both paths alike — eager, they
        cost more than the attention at B 1 (bench/results/2026-12-07-h100-e2e.md). Compiled
        per decode shape at the first call (the graph's warm-up); prefill stays eager."""
        if on and self._fused is None:
            self._fused = (torch.compile(self.qkv, fullgraph=True, dynamic=False),
                           torch.compile(self.post, fullgraph=True, dynamic=False))
        self.fused = on

    def step(self, tokens, pos, attention, keep=None):
        """Logits of token rows: tokens, pos int64 [N] (a decode step: one row per sequence; a
        prefill: every prompt token); attention(layer, q, k, v) -> [N, H, d] (q [N, H, d], k
        and v [N, H_kv, d], the rows'). keep: the rows whose logits are computed (None: all;
        a prefill keeps each sequence's last, as logits_to_keep=1 does)."""
        s = self.s
        N = tokens.shape[0]
        qkv, post = self._fused if self.fused else (self.qkv, self.post)
        h = self.embed[tokens]
        ang = pos.float()[:, None, None] * self.inv_freq
        cos, sin = ang.cos(), ang.sin()
        # masskv's kernels take float32 q / k / v (MasskvKV.qkv_dtype), SDPA the model's dtype.
        out_dtype = getattr(attention, "qkv_dtype", None)
        for i, L in enumerate(self.layers):
            q, k, v = qkv(h, L, cos, sin, out_dtype)
            o = attention(i, q, k, v).reshape(N, s.heads * s.head_dim)
            if N <= MLP_ROWS:
                h = post(h, o, L)
                continue
            # A prefill: the MLP in row chunks (a 128K-token prompt's [N, 2 * inter] is 7 GB).
            h = h + o.to(h.dtype) @ L["wo"].T
            for r in range(0, N, MLP_ROWS):
                x = h[r:r + MLP_ROWS]
                x += self.mlp(x, L)
        if keep is not None:
            h = h[keep]
        return self.rms(h, self.norm) @ self.lm_head.T


class DenseKV:
    """A static cache of ctx + 1 tokens per layer; the step writes token ctx and attends."""

    def __init__(self, shape: Shape, B: int, ctx: int, device, kv=None, backend=None):
        s = shape
        self.ctx, self.backend = ctx, backend
        dims = (s.layers, B, s.kv_heads, ctx + 1, s.head_dim)
        if kv is None:
            self.k = torch.randn(dims, device=device, dtype=torch.bfloat16)
            self.v = torch.randn(dims, device=device, dtype=torch.bfloat16)
        else:
            self.k, self.v = kv

    def __call__(self, layer, q, k, v):
        self.k[layer][:, :, self.ctx] = k
        self.v[layer][:, :, self.ctx] = v
        return self.attend(layer, q)

    def attend(self, layer, q):
        from torch.nn.attention import sdpa_kernel

        ctx = sdpa_kernel([self.backend]) if self.backend is not None else _null()
        with ctx:
            o = F.scaled_dot_product_attention(q[:, :, None], self.k[layer], self.v[layer],
                                               enable_gqa=True)
        return o[:, :, 0]


class ExactKV(DenseKV):
    """DenseKV's step with the attention in float32 (the math kernel on upcast rows): the
    yardstick that tells a bf16 decoder's rounding from an error (check())."""

    def attend(self, layer, q):
        o = F.scaled_dot_product_attention(q[:, :, None].float(), self.k[layer].float(),
                                           self.v[layer].float(), enable_gqa=True)
        return o[:, :, 0].to(q.dtype)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class MasskvKV:
    """masskv's paged cache filled with ctx random tokens per sequence; the step appends token
    ctx (slot 0 of a fresh page), selects (fresh, every step) and decodes."""

    qkv_dtype = torch.float32  # what append, selection and decode take: no casts in the step

    def __init__(self, shape: Shape, B: int, ctx: int, device, budget: int | None,
                 kv=None, method: str = "hier"):
        from masskv.torch_cache import TorchPagedCache

        s = shape
        if ctx % PAGE:
            raise ValueError(f"ctx must be a multiple of {PAGE} (the step's token opens a page)")
        pages = B * (ctx // PAGE + 1)
        self.hier = method == "hier"
        self.codes = method in ("codes", "codes1")
        self.code_channels = 1.0 if method == "codes1" else 0.375  # codes1: one pass
        sparse = budget is not None
        self.cache = TorchPagedCache(s.layers, s.kv_heads, s.head_dim, pages, page_size=PAGE,
                                     device=device, bounds=sparse and not self.codes,
                                     groups=sparse and self.hier, codes=sparse and self.codes,
                                     max_pages_per_seq=ctx // PAGE + 1)
        self.budget = budget
        self.stop = None  # "append" / "select": the step ends there (run_cell's phase split)
        self.seqs = [self.cache.create() for _ in range(B)]
        self.cache.begin_step(self.seqs, ctx)
        for layer in range(s.layers):
            if kv is None:
                k = torch.randn(B, ctx, s.kv_heads, s.head_dim, device=device,
                                dtype=torch.bfloat16)
                v = torch.randn_like(k)
            else:  # the dense cache's values, [B][H_kv][ctx][d] -> [B][ctx][H_kv][d]
                k = kv[0][layer][:, :, :ctx].transpose(1, 2)
                v = kv[1][layer][:, :, :ctx].transpose(1, 2)
            self.cache.append(layer, k, v)
            del k, v
        self.cache.begin_step(self.seqs, 1)

    def __call__(self, layer, q, k, v):
        c = self.cache
        c.append(layer, k[:, None], v[:, None])
        if self.stop == "append":
            return None
        qf = q.float().contiguous()
        sel = None
        if self.budget is not None:
            sel = c.select(layer, qf, budget_tokens=self.budget, hierarchical=self.hier,
                           method="token_codes" if self.codes else "quest",
                           code_channels=self.code_channels)
        if self.stop == "select":
            return None
        out, _ = c.decode(layer, qf, sel, unit="token" if self.codes else "page")
        return out

    def pages_read_bound(self, shape: Shape, B: int, ctx: int) -> int:
        """Bytes a step reads besides the weights: the selected pages' K/V (the budget plus the
        sink page and the last page, at most every page) and the bound store scanned (bf16
        min + max of every page)."""
        s = shape
        pages = ctx // PAGE + 1
        per_page_kv = 2 * PAGE * s.kv_heads * s.head_dim * 2
        per_page_bounds = 2 * s.kv_heads * s.head_dim * 2 + 4 * s.kv_heads
        if self.budget is None:
            return s.layers * B * pages * per_page_kv
        if self.codes:
            # token_codes' two passes: 3/8 of every token's 2-bit codes and of every page's
            # 8-bit ranges, then 2 x the budget's tokens' whole codes (and their pages' ranges,
            # at most one page a token); the budget's K/V rows. One pass: every token's whole
            # codes and every page's ranges.
            d, tokens = s.head_dim, ctx + 1
            share = self.code_channels
            first = share * (tokens * d / 4 + pages * 2 * d) + pages * 8
            second = 2 * self.budget * (d / 4 + 2 * d) if share < 1 else 0
            kv_rows = min(tokens, self.budget + 2 * PAGE) * 2 * d * 2
            return int(s.layers * B * s.kv_heads * (first + second + kv_rows))
        sel = min(pages, -(-self.budget // PAGE) + 2)
        if not self.hier:
            return s.layers * B * (sel * per_page_kv + pages * per_page_bounds)
        # Hierarchical: every group's bounds, then the pages of the kept groups (cover 2: about
        # twice the budget's pages, plus the last group).
        groups = -(-pages // 16)
        scanned = min(pages, 2 * (sel - 2) + 16 + 16)
        return s.layers * B * (sel * per_page_kv + (groups + scanned) * per_page_bounds)


def transformers_ms(shape: Shape, B: int, ctx: int, device, iters: int,
                    masskv_budget: int | None = None, compiled: bool = False) -> float:
    """transformers' own decode step of the same shape (random bf16 init, eager, SDPA, its
    DynamicCache filled with ctx random tokens): median ms per token over `iters` steps, each
    appending one token (its cache concatenates, as in generate()). masskv_budget: the same
    model with masskv.hf's attention (hierarchical Quest at that budget) and its
    masskv.hf_cache.MasskvCache instead (no dense copy): what a transformers user gets.
    compiled: the model under torch.compile(mode="reduce-overhead") (CUDA graphs) with static
    shapes: transformers' StaticCache (its SDPA gets a mask), or MasskvCache(static=True)."""
    import transformers

    s = shape
    cls, cfg_cls = ((transformers.Qwen3ForCausalLM, transformers.Qwen3Config) if s.qk_norm
                    else (transformers.LlamaForCausalLM, transformers.LlamaConfig))
    cfg = cfg_cls(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.inter,
                  num_hidden_layers=s.layers, num_attention_heads=s.heads,
                  num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
                  max_position_embeddings=ctx + iters + 16)
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if masskv_budget is not None:
        import masskv.hf
        from masskv.hf_cache import MasskvCache

        attn = masskv.hf.MasskvAttention(method="quest", budget_tokens=masskv_budget,
                                         hierarchical=True, page_size=PAGE)
        cfg._attn_implementation = attn.register("masskv_e2e")
    with torch.device(device):
        model = cls(cfg).to(dtype).eval()
    warm = 4 if compiled else 2  # reduce-overhead records its graphs after a warm-up
    room = ctx + iters + warm + 16
    if masskv_budget is not None:
        cache = MasskvCache(attn, cfg, max_tokens=room, static=compiled)
    elif compiled:
        cache = transformers.StaticCache(config=cfg, max_cache_len=room)
    else:
        cache = transformers.DynamicCache(config=cfg)
    for layer in range(s.layers):
        k = torch.randn(B, s.kv_heads, ctx, s.head_dim, device=device, dtype=dtype)
        cache.update(k, torch.randn_like(k), layer,
                     {"cache_position": torch.arange(ctx, device=device)})
        if masskv_budget is not None:
            cache.commit(layer, None)  # no attention call here to commit the chunk
    step = model
    if compiled:
        if masskv_budget is not None:
            cache.begin_static()  # the static steps' pages, before the step is traced
        step = torch.compile(model, mode="reduce-overhead")
    tok = torch.randint(0, s.vocab, (B, 1), device=device)
    ts = []
    with torch.no_grad():
        for i in range(iters + warm):
            pos = torch.full((B, 1), ctx + i, device=device, dtype=torch.long)
            kw = {"cache_position": pos[0]} if compiled and masskv_budget is None else {}
            t0 = time.perf_counter()
            step(input_ids=tok, position_ids=pos, past_key_values=cache, use_cache=True,
                 logits_to_keep=1, **kw)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= warm:
                ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def read_ceiling_gbs(device) -> float:
    """Bytes per second of a read-bound reduction over 4 GiB (the bytes bounds' denominator)."""
    x = torch.ones(2 ** 31, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        x.sum(dtype=torch.float32)
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum(dtype=torch.float32)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    del x
    return 2 ** 32 / statistics.median(ts)


def graph_ms(fn, iters: int) -> float:
    """Median ms of one replay of a CUDA graph of fn() (warm-up and capture on one side stream,
    as masskv's workspaces are per stream); masskv's deferred checks run after the replays."""
    from masskv import ops

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        fn()
    for _ in range(3):
        g.replay()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ops.check(side)
    del g
    return statistics.median(ts)


def step_inputs(model: Model, B: int, ctx: int):
    tokens = torch.randint(0, model.s.vocab, (B,), device=model.device)
    pos = torch.full((B,), ctx, device=model.device, dtype=torch.long)
    return tokens, pos


def attention_only(model: Model, attn, B: int):
    """fn() running every layer's attention on fixed q, k, v (the model's shapes, in the type
    the model code hands that attention)."""
    s = model.s
    t = getattr(attn, "qkv_dtype", None) or torch.bfloat16
    q = torch.randn(B, s.heads, s.head_dim, device=model.device, dtype=t)
    k = torch.randn(B, s.kv_heads, s.head_dim, device=model.device, dtype=t)
    v = torch.randn_like(k)
    return lambda: [attn(i, q, k, v) for i in range(s.layers)]


def dense_backends():
    from torch.nn.attention import SDPBackend

    return [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]


def check(model: Model, log, methods) -> list:
    """One eager step at a 4K context: masskv dense decode, and each selection of `methods` with
    a budget covering every token, against the same step with float32 attention on the same KV.
    A bf16 decoder's rounding grows through the layers of a random-weight model, so the bar is
    SDPA's own distance from that step: masskv may be at most twice as far (and always passes
    within 2e-2 of the largest logit). Dense, flat and hierarchical Quest must pass (else the
    run stops); a failing `codes` is left out of the table. Returns the methods that passed."""
    B, ctx = 2, 4096
    tokens, pos = step_inputs(model, B, ctx)
    dense = DenseKV(model.s, B, ctx, model.device)

    def distance(got, ref):
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        return err, (got.argmax(-1) == ref.argmax(-1)).float().mean().item()

    passed = []
    with torch.no_grad():
        exact = model.step(tokens, pos, ExactKV(model.s, B, ctx, model.device,
                                                kv=(dense.k, dense.v))).float()
        sdpa = model.step(tokens, pos, dense).float()
        sdpa_err, sdpa_same = distance(sdpa, exact)
        if model.fused:  # the compiled model code: as near the float32 step as the eager one
            model.fused = False
            eager_err, _ = distance(model.step(tokens, pos, dense).float(), exact)
            model.fused = True
            log(f"check {model.s.name} compiled model code vs float32 attention: {sdpa_err:.2e} "
                f"(eager {eager_err:.2e})")
            sdpa_err = max(sdpa_err, eager_err)
        bar = max(2e-2, 2 * sdpa_err)
        log(f"check {model.s.name} SDPA (bf16) vs float32 attention: max |Δlogit| / max |logit| "
            f"= {sdpa_err:.2e}, same argmax {sdpa_same:.0%}; masskv's bar {bar:.2e}")
        cases = [(None, "dense")] + [(ctx + PAGE, m)
                                     for m in dict.fromkeys(("quest", "hier", *methods))]
        for budget, method in cases:
            try:
                got = model.step(tokens, pos, MasskvKV(model.s, B, ctx, model.device, budget,
                                                       kv=(dense.k, dense.v),
                                                       method=method)).float()
                err, same = distance(got, exact)
            except RuntimeError as e:  # masskv.Error is a RuntimeError too
                err, same = float("inf"), 0.0
                log(f"check {model.s.name} masskv {method}: {str(e).splitlines()[0][:160]}")
            log(f"check {model.s.name} masskv {method} (all tokens) vs float32 attention: "
                f"max |Δlogit| / max |logit| = {err:.2e}, same argmax {same:.0%}")
            if err <= bar:
                passed.append(method)
            elif method not in ("codes", "codes1"):
                raise SystemExit(f"check failed: masskv {method}: relative logit error "
                                 f"{err:.2e} > {bar:.2e}")
    return passed


def run_cell(model: Model, B: int, ctx: int, budgets, methods, iters: int, ceiling: float,
             log, hf: bool = False, phases: bool = False):
    s, dev = model.s, model.device
    tokens, pos = step_inputs(model, B, ctx)
    wbytes = model.weight_bytes()
    dense_bytes = wbytes + B * (ctx + 1) * s.kv_bytes_per_token()
    best = None
    hf_ms = {}   # compiled (False / True) -> ms
    hf_mk = {}   # (budget, compiled) -> ms
    modes = {False: "eager, SDPA, DynamicCache", True: "reduce-overhead, SDPA, StaticCache"}
    mk_modes = {False: "eager, MasskvCache", True: "reduce-overhead, MasskvCache(static=True)"}
    for compiled in (False, True) if hf else ():
        try:
            hf_ms[compiled] = transformers_ms(s, B, ctx, dev, 5, compiled=compiled)
            log(f"  transformers ({modes[compiled]}): {hf_ms[compiled]:.2f} ms/token")
        except Exception as e:  # noqa: BLE001 -- a bench row, not a check: say why, go on
            log(f"  transformers ({modes[compiled]}): not run "
                f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})")
        torch.cuda.empty_cache()
        for budget in budgets:
            try:
                hf_mk[budget, compiled] = transformers_ms(s, B, ctx, dev, 5, masskv_budget=budget,
                                                          compiled=compiled)
                log(f"  transformers + masskv (hierarchical Quest {budget}, "
                    f"{mk_modes[compiled]}): {hf_mk[budget, compiled]:.2f} ms/token")
            except Exception as e:  # noqa: BLE001
                log(f"  transformers + masskv ({mk_modes[compiled]}): not run "
                    f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})")
            torch.cuda.empty_cache()
    with torch.no_grad():
        dense = DenseKV(s, B, ctx, dev)
        for name, be in dense_backends():
            dense.backend = be
            try:
                ms = graph_ms(lambda: model.step(tokens, pos, dense), iters)
                att = graph_ms(attention_only(model, dense, B), iters) * 1e3 / s.layers
            except RuntimeError as e:  # a backend that does not serve the shape
                log(f"  dense {name}: not served ({str(e).splitlines()[0][:120]})")
                continue
            log(f"  dense SDPA {name}: {ms:.3f} ms/token, attention {att:.1f} us/layer")
            if best is None or ms < best[1]:
                best = (name, ms, att)
        dense = None  # free the dense cache before the paged one is filled
        torch.cuda.empty_cache()
        rows = []
        if best is None:
            log(f"  no SDPA backend served B {B} ctx {ctx}: the cell is left out")
            return rows
        for method, budget in [(m, b) for m in methods for b in budgets]:
            try:
                mk = MasskvKV(s, B, ctx, dev, budget, method=method)
                ms = graph_ms(lambda: model.step(tokens, pos, mk), iters)
                att = graph_ms(attention_only(model, mk, B), iters) * 1e3 / s.layers
            except RuntimeError as e:  # one method's failure leaves the others' rows
                log(f"  masskv {method} {budget}: failed ({str(e).splitlines()[0][:160]})")
                mk = None
                torch.cuda.empty_cache()
                continue
            phase_us = {}
            if phases:  # graphs that stop after the append and after the selection
                upto = {}
                try:
                    for stop in ("append", "select"):
                        mk.stop = stop
                        upto[stop] = graph_ms(attention_only(model, mk, B), iters) * 1e3 / s.layers
                finally:
                    mk.stop = None
                phase_us = dict(append=upto["append"], select=upto["select"] - upto["append"],
                                decode=att - upto["select"])
                log("    phases: " + ", ".join(f"{k} {v:.1f}" for k, v in phase_us.items())
                    + " us/layer")
            sparse_bytes = wbytes + mk.pages_read_bound(s, B, ctx)
            row = dict(model=s.name, phase="decode", batch=B, ctx=ctx, budget=budget,
                       method=method,
                       dense_ms=round(best[1], 4), masskv_ms=round(ms, 4),
                       bytes_bound_ms=round(sparse_bytes / ceiling * 1e3, 4),
                       dense_bytes_bound_ms=round(dense_bytes / ceiling * 1e3, 4),
                       speedup=round(best[1] / ms, 3), dense_backend=best[0],
                       dense_attention_us_per_layer=round(best[2], 2),
                       masskv_attention_us_per_layer=round(att, 2),
                       **{f"masskv_{k}_us_per_layer": round(v, 2) for k, v in phase_us.items()},
                       transformers_ms=_ms(hf_ms.get(False)),
                       transformers_masskv_ms=_ms(hf_mk.get((budget, False))),
                       transformers_compiled_ms=_ms(hf_ms.get(True)),
                       transformers_masskv_compiled_ms=_ms(hf_mk.get((budget, True))),
                       weights_gb=round(wbytes / 1e9, 3),
                       dense_kv_gb=round((dense_bytes - wbytes) / 1e9, 3),
                       masskv_read_gb=round((sparse_bytes - wbytes) / 1e9, 3))
            log(f"  masskv {method} {budget}: {ms:.3f} ms/token ({row['speedup']:.2f}x dense), "
                f"attention {att:.1f} us/layer; bounds dense {row['dense_bytes_bound_ms']} ms, "
                f"masskv {row['bytes_bound_ms']} ms")
            rows.append(row)
            mk = None
            torch.cuda.empty_cache()
    return rows


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def markdown(meta, rows) -> str:
    out = [f"# Whole-model decode, dense vs masskv ({meta['card']}, {meta['date']})", "",
           "Random-init bf16 weights: speed only. Both paths one CUDA graph per step, the "
           + ("model code torch.compile'd (norms, RoPE, MLP fused)" if meta.get("compiled")
              else "model code eager (not compiled)")
           + ", fresh selection every step; bytes bounds at the measured read ceiling "
           f"({meta['read_ceiling_tbs']:.2f} TB/s).", "", f"`{meta['command']}`", "",
           "| model | B | ctx | selection | budget | dense ms/token (SDPA) | masskv ms/token | × | "
           "dense bound ms | masskv bound ms | attention µs/layer dense / masskv | transformers "
           "ms/token (eager / reduce-overhead) | transformers + masskv ms/token (eager / "
           "reduce-overhead, static) |",
           "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in (r for r in rows if r["phase"] == "decode"):
        out.append(f"| {r['model']} | {r['batch']} | {r['ctx']} | {r['method']} | {r['budget']} | "
                   f"{r['dense_ms']:.3f} ({r['dense_backend']}) | {r['masskv_ms']:.3f} | "
                   f"{r['speedup']:.2f} | {r['dense_bytes_bound_ms']:.3f} | "
                   f"{r['bytes_bound_ms']:.3f} | {r['dense_attention_us_per_layer']:.1f} / "
                   f"{r['masskv_attention_us_per_layer']:.1f} | "
                   f"{_pair(r, 'transformers_ms', 'transformers_compiled_ms')} | "
                   f"{_pair(r, 'transformers_masskv_ms', 'transformers_masskv_compiled_ms')} |")
    out += e2e_prefill.markdown([r for r in rows if r["phase"] == "prefill"])
    return "\n".join(out) + "\n"


def _pair(r: dict, a: str, b: str) -> str:
    x, y = r.get(a), r.get(b)
    if x is None and y is None:
        return "-"
    return f"{'-' if x is None else x} / {'-' if y is None else y}"


def parse_cells(text: str):
    cells = []
    for c in text.split(","):
        try:
            b, ctx = c.lower().split("x")
            cells.append((int(b), int(ctx)))
        except ValueError:
            raise SystemExit(f"--cells: expected BxCTX items (1x131072), got {c!r}") from None
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output prefix: OUT.json and OUT.md")
    ap.add_argument("--models", default="llama8b,qwen8b")
    ap.add_argument("--cells", default="1x32768,1x131072,1x262144,8x32768")
    ap.add_argument("--budgets", default="2048,4096")
    ap.add_argument("--methods", default="hier,quest",
                    help="masskv selections: hier (hierarchical Quest), quest (flat), codes "
                         "(token_codes: the quality default, tokens on the page codes, two "
                         "passes), codes1 (token_codes in one pass: every token on every channel)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--prefill-cells", default="",
                    help="BxT prompts whose TTFT is timed (e2e_prefill.py), e.g. 1x32768,1x131072")
    ap.add_argument("--prefill-budgets", default="4096,0",
                    help="masskv prefill key tokens per query block (0: masskv's dense prefill)")
    ap.add_argument("--prefill-iters", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="masskv vs SDPA logits first")
    ap.add_argument("--transformers", action="store_true",
                    help="also time transformers' own model at each cell (eager, and under "
                         "torch.compile reduce-overhead with static shapes), and the same model "
                         "with masskv's attention and MasskvCache at each budget (eager; static "
                         "under reduce-overhead)")
    ap.add_argument("--compile", action="store_true",
                    help="decode steps of both paths through torch.compile'd model code (the "
                         "norms, RoPE and MLP fused; Model.fuse); prefill stays eager")
    ap.add_argument("--groups-separate", action="store_true",
                    help="a decode step's append leaves the hierarchical group store to "
                         "update_groups (the launch the append kernel's refresh saves: the "
                         "before row of that change)")
    ap.add_argument("--phases", action="store_true",
                    help="also split masskv's attention time a layer into append, selection and "
                         "decode (graphs that stop after each; row fields masskv_*_us_per_layer)")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape (self-test)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    if a.groups_separate:
        from masskv.torch_cache import TorchPagedCache

        TorchPagedCache.refresh_groups_in_append = False
    dev = torch.device(a.device)
    log = lambda m: print(m, flush=True)  # noqa: E731
    if dev.type == "cpu":  # the dense path's self-test: shapes, finite logits
        m = Model(SHAPES["tiny"], dev, torch.float32)
        tokens, pos = step_inputs(m, 2, 64)
        kv = DenseKV(m.s, 2, 64, dev)
        kv.k, kv.v = kv.k.float(), kv.v.float()
        logits = m.step(tokens, pos, kv)
        assert logits.shape == (2, m.s.vocab) and torch.isfinite(logits).all()
        log(f"cpu self-test: logits {tuple(logits.shape)} finite")
        # A 40-token prefill's last logits equal a decode step of its last token over the
        # K/V the prefill wrote (the model's row handling, the kept rows, the MLP chunks).
        from torch.nn.attention import SDPBackend

        B, T = 2, 40
        pre = e2e_prefill.DensePrefill(m.s, B, T, dev, SDPBackend.MATH, torch.float32)
        tokens, pos, keep = e2e_prefill.prompt_inputs(m, B, T)
        global MLP_ROWS
        MLP_ROWS, rows = 16, MLP_ROWS  # chunk boundaries inside the 80 rows
        got = m.step(tokens, pos, pre, keep=keep)
        MLP_ROWS = rows
        step = DenseKV(m.s, B, T - 1, dev, kv=(pre.k.clone(), pre.v.clone()))
        ref = m.step(tokens[keep], pos[keep], step)
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        log(f"cpu self-test: prefill's last logits = the decode step's ({tuple(got.shape)})")
        if a.transformers:
            log(f"cpu self-test: transformers {transformers_ms(m.s, 2, 64, dev, 2):.1f} ms/token")
        return 0
    models = ["tiny"] if a.tiny else [x for x in a.models.split(",") if x]
    for x in models:
        if x not in SHAPES:
            raise SystemExit(f"--models: unknown {x!r} (known: {', '.join(SHAPES)})")
    budgets = [int(x) for x in a.budgets.split(",")]
    methods = [x for x in a.methods.split(",") if x]
    for x in methods:
        if x not in ("hier", "quest", "codes", "codes1"):
            raise SystemExit(f"--methods: unknown {x!r} (hier, quest, codes, codes1)")
    cells = parse_cells(a.cells)
    prefill_cells = parse_cells(a.prefill_cells) if a.prefill_cells else []
    prefill_budgets = [int(x) for x in a.prefill_budgets.split(",") if x]
    ceiling = read_ceiling_gbs(dev)
    meta = dict(card=torch.cuda.get_device_name(dev),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                command="python3 " + " ".join(sys.argv), read_ceiling_tbs=ceiling / 1e12,
                torch=torch.__version__, compiled=a.compile)
    log(f"{meta['card']}: read ceiling {ceiling / 1e12:.2f} TB/s")
    rows = []

    def save() -> None:
        """OUT.json and OUT.md of the rows so far: after every cell, so that a run stopped at
        the device's time limit keeps what it measured."""
        with open(a.out + ".json", "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
        with open(a.out + ".md", "w") as f:
            f.write(markdown(meta, rows))
    for name in models:
        t0 = time.time()
        model = Model(SHAPES[name], dev)
        model.fuse(a.compile)
        if a.check:
            ok = check(model, log, methods)
            methods = [m for m in methods if m in ok]
        for B, ctx in cells:
            need = model.weight_bytes() + 1.5 * B * (ctx + 1) * model.s.kv_bytes_per_token()
            free = torch.cuda.mem_get_info(dev)[0] + model.weight_bytes()
            if need > 0.95 * free:
                log(f"{model.s.name} B {B} ctx {ctx}: skipped, needs ~{need / 2**30:.0f} GiB")
                continue
            log(f"{model.s.name} B {B} ctx {ctx}")
            rows += run_cell(model, B, ctx, budgets, methods, a.iters, ceiling, log,
                             hf=a.transformers, phases=a.phases)
            save()
        model.fuse(False)
        for B, T in prefill_cells:
            log(f"{model.s.name} prefill B {B} T {T}")
            try:
                rows += e2e_prefill.run_prefill_cell(model, B, T, prefill_budgets,
                                                     a.prefill_iters, ceiling, log,
                                                     dense_backends())
                save()
            except torch.cuda.OutOfMemoryError as e:
                log(f"  prefill B {B} T {T}: out of memory ({str(e).splitlines()[0][:100]})")
                torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
        log(f"{name}: {time.time() - t0:.0f} s")
    save()
    log(markdown(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
