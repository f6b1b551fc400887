"""Time to first token of a whole-model prefill (tools/gpu_bench/e2e.py's model code): dense
attention against masskv's CUDA prefill, in the same run on the same card.

* dense: the prompt's K/V written into a static cache [layers][B][H_kv][T][d], then torch SDPA
  causal with native GQA (enable_gqa, no mask), the faster of the flash and cuDNN backends;
* masskv: masskv.torch_cache.TorchPagedCache (page 16, with the summaries and the bf16 bound
  store a sparse decode then reads): per layer the pool write and the pages' summaries, then
  masskv's CUDA prefill, block-sparse from the mean-pooled block indexer (`budget` key tokens
  per 64-query block: the sink block, the diagonal, the best others) or dense (budget 0).

Eager (a prefill is one long call: launch overhead is noise), the median of `iters` runs after
one warm-up, the host work (taking the pages) included. Logits of each sequence's last token
only (logits_to_keep=1). Random-init weights: speed only.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

PAGE = 16


class DensePrefill:
    def __init__(self, s, B: int, T: int, device, backend, dtype=torch.bfloat16):
        self.s, self.B, self.T, self.backend = s, B, T, backend
        dims = (s.layers, B, s.kv_heads, T, s.head_dim)
        self.k = torch.empty(dims, device=device, dtype=dtype)
        self.v = torch.empty_like(self.k)

    def reset(self) -> None:
        pass

    def __call__(self, layer, q, k, v):
        from torch.nn.attention import sdpa_kernel

        s, B, T = self.s, self.B, self.T
        self.k[layer].copy_(k.view(B, T, s.kv_heads, s.head_dim).transpose(1, 2))
        self.v[layer].copy_(v.view(B, T, s.kv_heads, s.head_dim).transpose(1, 2))
        with sdpa_kernel([self.backend]):
            o = F.scaled_dot_product_attention(
                q.view(B, T, s.heads, s.head_dim).transpose(1, 2), self.k[layer], self.v[layer],
                is_causal=True, enable_gqa=True)
        return o.transpose(1, 2).reshape(B * T, s.heads, s.head_dim)


class MasskvPrefill:
    def __init__(self, s, B: int, T: int, device, budget: int):
        from masskv.torch_cache import TorchPagedCache

        self.s, self.B, self.T, self.budget = s, B, T, budget
        self.cache = TorchPagedCache(s.layers, s.kv_heads, s.head_dim, B * (-(-T // PAGE) + 1),
                                     page_size=PAGE, device=device, bounds=True)
        self.seqs: list[int] = []

    def reset(self) -> None:
        """An empty batch, the prompt's pages taken (the host part of the prefill)."""
        for sid in self.seqs:
            self.cache.free(sid)
        self.seqs = [self.cache.create() for _ in range(self.B)]
        self.cache.begin_step(self.seqs, self.T)

    def __call__(self, layer, q, k, v):
        s, B, T = self.s, self.B, self.T
        c = self.cache
        c.append(layer, k.view(B, T, s.kv_heads, s.head_dim), v.view(B, T, s.kv_heads, s.head_dim))
        out, _ = c.prefill(layer, q.view(B, T, s.heads, s.head_dim), budget_tokens=self.budget)
        return out.view(B * T, s.heads, s.head_dim)


def prompt_inputs(model, B: int, T: int):
    tokens = torch.randint(0, model.s.vocab, (B * T,), device=model.device)
    pos = torch.arange(T, device=model.device).repeat(B)
    keep = torch.arange(T - 1, B * T, T, device=model.device)
    return tokens, pos, keep


def ttft_ms(model, attention, inputs, iters: int) -> float:
    ts = []
    for i in range(iters + 1):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        attention.reset()
        model.step(*inputs[:2], attention, keep=inputs[2])
        b.record()
        torch.cuda.synchronize()
        if i:  # the first run warms up (workspaces, autotuning)
            ts.append(a.elapsed_time(b))
    from masskv import ops

    ops.check()
    return statistics.median(ts)


def attention_tflop(s, B: int, T: int, keys_per_query: float) -> float:
    """Q·Kᵀ and P·V multiply-adds of every layer: 4 · layers · heads · d · T · keys."""
    return 4 * s.layers * s.heads * s.head_dim * B * T * keys_per_query / 1e12


def run_prefill_cell(model, B: int, T: int, budgets, iters: int, ceiling: float, log,
                     backends) -> list[dict]:
    s, dev = model.s, model.device
    inputs = prompt_inputs(model, B, T)
    rows, best = [], None
    with torch.no_grad():
        for name, be in backends:
            try:
                dense = DensePrefill(s, B, T, dev, be)
                ms = ttft_ms(model, dense, inputs, iters)
            except RuntimeError as e:
                log(f"  prefill dense {name}: not served ({str(e).splitlines()[0][:120]})")
                continue
            finally:
                dense = None
                torch.cuda.empty_cache()
            log(f"  prefill dense SDPA {name}: TTFT {ms:.1f} ms")
            if best is None or ms < best[1]:
                best = (name, ms)
        if best is None:
            log(f"  prefill: no SDPA backend served B {B} T {T}")
            return rows
        kv_bytes = B * T * s.kv_bytes_per_token()
        for budget in budgets:
            try:
                mk = MasskvPrefill(s, B, T, dev, budget)
                ms = ttft_ms(model, mk, inputs, iters)
            except RuntimeError as e:  # one budget's failure leaves the others' rows
                log(f"  prefill masskv {budget}: failed ({str(e).splitlines()[0][:160]})")
                continue
            finally:
                mk = None
                torch.cuda.empty_cache()
            keys = T / 2 if budget == 0 else min(T / 2, budget)
            row = dict(model=s.name, phase="prefill", batch=B, ctx=T, budget=budget,
                       method="dense" if budget == 0 else "block-indexer",
                       dense_ms=round(best[1], 2), masskv_ms=round(ms, 2),
                       bytes_bound_ms=round((model.weight_bytes() + kv_bytes) / ceiling * 1e3, 3),
                       speedup=round(best[1] / ms, 3), dense_backend=best[0],
                       dense_attention_tflop=round(attention_tflop(s, B, T, T / 2), 1),
                       masskv_attention_tflop=round(attention_tflop(s, B, T, keys), 1))
            log(f"  prefill masskv {row['method']} {budget}: TTFT {ms:.1f} ms "
                f"({row['speedup']:.2f}x dense)")
            rows.append(row)
    return rows


def markdown(rows) -> list[str]:
    if not rows:
        return []
    out = ["", "## Prefill (TTFT, eager)", "",
           "| model | B | prompt | masskv prefill | budget | dense TTFT ms (SDPA) | masskv TTFT ms "
           "| × | attention TFLOP dense / masskv |",
           "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        out.append(f"| {r['model']} | {r['batch']} | {r['ctx']} | {r['method']} | {r['budget']} | "
                   f"{r['dense_ms']:.1f} ({r['dense_backend']}) | {r['masskv_ms']:.1f} | "
                   f"{r['speedup']:.2f} | {r['dense_attention_tflop']} / "
                   f"{r['masskv_attention_tflop']} |")
    return out
