"""Hugging Face transformers integration: masskv attention for Llama-family models.

Register once, then select it by name::

    import masskv.hf
    attn = masskv.hf.MasskvAttention(method="quest", budget_tokens=512)
    attn.register("masskv")                      # AttentionInterface.register
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="masskv")
    # or: model.set_attn_implementation("masskv") / model.config._attn_implementation = "masskv"

What happens per attention layer call (query [B, Hq, T, d], key/value [B, Hkv, S, d], the full
history that transformers' own cache hands over):

* the S - (tokens already mirrored) new keys/values of each batch row are appended to that
  layer's masskv.PagedKVCache (page summaries updated on append);
* T > 1 (prefill): dense causal prefill over the paged cache (masskv.prefill);
* T == 1 (decode): the selector picks pages (masskv.select), then sparse decode reads only them
  (masskv.decode with the selection). method="dense" reproduces transformers' attention.

Padded batches: rows padded on the left (transformers' way for generation, tokenizer
padding_side="left") keep only their tokens in masskv's caches; the padding columns are read
from the attention mask of each prefill chunk (a host read; a decode step appends one token to
every row and reads no mask). Limits (checked, never silently wrong): no padding anywhere but
on the left, no attention dropout, no logit soft-capping or sliding window. CPU tensors run the CPU
kernels. CUDA tensors (a CUDA build of masskv) stay on the GPU (masskv.hf_cuda): one
masskv.torch_cache.TorchPagedCache per model holds every layer in bf16/f16, the prefill is
transformers' own SDPA (or masskv's, prefill="masskv"), and decode is GPU selection + masskv's
CUDA decode (methods "dense", "quest" and "token_codes"); the selection of each layer is left in `last_selection[layer]` as device
tensors (ids, count), with no host sync. Either way transformers' own cache still holds the
dense KV (masskv mirrors it; the reading is sparse), unless the model runs with
masskv.hf_cache.MasskvCache (GPU): then the paged cache is the only copy.

Lifetime: the mirrored caches belong to the model's attention modules, not to this object:
register() puts this object into transformers' process-wide registry, which lives until the
interpreter exits (past the point where nanobind checks that every masskv object was freed), so
the caches are kept in a WeakKeyDictionary keyed by the module and go when the model goes.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import masskv
from masskv.hf_mask import real_counts

__all__ = ["MasskvAttention", "real_counts"]


@dataclass
class _LayerState:
    cache: masskv.PagedKVCache
    seqs: list[int]
    columns: int = 0  # key columns of transformers' history mirrored (padding included)


@dataclass
class MasskvAttention:
    """A transformers attention function backed by masskv's paged cache and selectors.

    method / alpha / budget / budget_tokens / top_p / sink_pages / window_tokens are passed to
    masskv.select (alpha 1 = softmax, (1, 2] = alpha-entmax attention). page_size and dtype
    configure the per-layer PagedKVCache; max_tokens sizes its pool (it grows on demand).
    After each decode step `last_selected_fraction[layer]` holds the fraction of tokens read.
    hierarchical: on CUDA tensors, method "quest" selects hierarchically (groups of 16 pages
    first: the cheaper scan at long contexts; docs/torch.md).
    prefill: on CUDA tensors, who attends a prefill chunk: "sdpa" (transformers' own SDPA) or
    "masskv" (masskv's CUDA prefill over the paged cache: dense, or block-sparse with
    prefill_budget_tokens > 0 key tokens per 64-query block; head_dim 64 or 128).
    code_channels: token_codes' first pass's share of the channels (0.375: two passes, the
    CPU's default; 1: one pass, every token on every channel — as accurate in the eval and
    about half the GPU's selection time).
    """

    method: str = "dense"
    alpha: float = 1.0
    budget: str = "fixed"
    budget_tokens: int = 0
    top_p: float = 0.9
    sink_pages: int = 1
    window_tokens: int = 0
    hierarchical: bool = False
    prefill: str = "sdpa"
    prefill_budget_tokens: int = 0
    code_channels: float = 0.375
    page_size: int = 16
    dtype: str = "f32"
    max_tokens: int = 4096
    last_selected_fraction: dict[int, float] = field(default_factory=dict)
    last_selection: dict[int, Any] = field(default_factory=dict)
    # attention module -> its mirrored cache; weak keys, so that a cache lives as long as the
    # model that fills it and not as long as transformers' registry (see the module docstring).
    _states: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary,
                                               init=False, repr=False, compare=False)
    _cuda: Any = field(default=None, init=False, repr=False, compare=False)

    def register(self, name: str = "masskv") -> str:
        """Registers this object under `name` with transformers' AttentionInterface."""
        from transformers import AttentionInterface

        AttentionInterface.register(name, self)
        try:  # transformers >= 4.53 builds masks per implementation; ours ignores the mask
            from transformers import AttentionMaskInterface
            from transformers.masking_utils import sdpa_mask

            AttentionMaskInterface.register(name, sdpa_mask)
        except ImportError:
            pass
        return name

    def reset(self) -> None:
        """Forgets every mirrored sequence (a new generate() call does this by itself)."""
        self._states.clear()
        self.last_selected_fraction.clear()
        self.last_selection.clear()
        if self._cuda is not None:
            self._cuda.clear()

    # -- the attention function -------------------------------------------------------------
    def __call__(self, module: Any, query, key, value, attention_mask, scaling=None,
                 dropout: float = 0.0, **kwargs):
        import torch

        if dropout:
            raise ValueError("masskv attention: dropout is not supported (inference only)")
        if kwargs.get("sliding_window") or kwargs.get("softcap"):
            raise ValueError("masskv attention: sliding window / soft-capping not supported")
        B, Hq, T, d = query.shape
        layer = int(getattr(module, "layer_idx", 0))
        # With masskv.hf_cache.MasskvCache the keys of a decode step are the new token's alone;
        # the mask spans the whole history.
        owner = getattr(key, "_masskv_cache", None)
        S = owner.get_seq_length(layer) if owner is not None else key.shape[2]
        scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(d)
        # A decode step appends one token to every row and reads no mask (no host sync).
        counts = real_counts(attention_mask, B, T, S) if T > 1 else None

        if (query.is_cuda and masskv.has_cuda) or owner is not None:
            if self._cuda is None:
                from masskv.hf_cuda import CudaLayers

                self._cuda = CudaLayers()
            with torch.no_grad():
                return self._cuda(self, module, query, key, value, attention_mask, scale,
                                  counts, **kwargs)
        with torch.no_grad():
            state = self._sync(module, key, value, T, counts, attention_mask)
            q = query.detach().to("cpu", torch.float32)
            if T == 1:
                out = self._decode(layer, state, q[:, :, 0, :].contiguous(), scale)
                out = out[:, None]  # [B, 1, Hq, d]
            else:
                rows = q.permute(0, 2, 1, 3).reshape(B * T, Hq, d)
                # Each row's own queries (its last n[b] columns), rows without any left out.
                n = [T] * B if counts is None else counts
                rows_in = [b for b in range(B) if n[b] > 0]
                if not rows_in:  # a chunk of padding alone: no token attends
                    return torch.zeros_like(query).transpose(1, 2), None
                keep = torch.cat([torch.arange(b * T + T - n[b], b * T + T) for b in rows_in])
                q_indptr = np.concatenate([[0], np.cumsum([n[b] for b in rows_in])]).astype(
                    np.int32)
                res = torch.empty((int(q_indptr[-1]), Hq, d), dtype=torch.float32)
                masskv.prefill(rows[keep].contiguous(), q_indptr,
                               state.cache.view([state.seqs[b] for b in rows_in]),
                               alpha=self.alpha, scale=scale, out=res)
                out = torch.zeros((B * T, Hq, d), dtype=torch.float32)
                out[keep] = res  # padding rows' outputs: 0 (no token reads them)
                out = out.reshape(B, T, Hq, d)
        return out.to(device=query.device, dtype=query.dtype), None

    # -- pieces -----------------------------------------------------------------------------
    def _new_cache(self, num_kv_heads: int, d: int, tokens: int, B: int) -> _LayerState:
        pages = B * (-(-max(tokens, self.max_tokens) // self.page_size) + 1)
        cache = masskv.PagedKVCache(num_kv_heads, d, pages, page_size=self.page_size,
                                    dtype=self.dtype)
        return _LayerState(cache, [cache.create() for _ in range(B)])

    def _sync(self, module: Any, key, value, new_tokens: int, counts, mask) -> _LayerState:
        """Mirrors key/value ([B, Hkv, S, d], the full history) into the module's paged cache.

        The cache must hold exactly the first S - new_tokens columns (the previous call's);
        otherwise a new generation started (or the history changed) and the layer's cache is
        rebuilt from the full history, so it never drifts from what transformers holds.
        counts: real_counts of the new columns (None: all are tokens); each row appends its
        own, the last of the new columns.
        """
        import torch

        B, Hkv, S, d = key.shape
        try:
            state = self._states.get(module)
        except TypeError:  # None or an object without weak references: nothing to tie it to
            raise ValueError("masskv attention: the module argument must be the model's "
                             f"attention module (an nn.Module), got {type(module).__name__}") from None
        if state is not None and (len(state.seqs) != B or state.columns != S - new_tokens):
            state = None
        if state is None:
            state = self._new_cache(Hkv, d, S, B)
            self._states[module] = state
            if new_tokens < S:  # the whole history: its padding from the mask
                counts, new_tokens = real_counts(mask, B, S, S), S
        n = [new_tokens] * B if counts is None else counts
        k = key[:, :, S - new_tokens:S].detach().to("cpu", torch.float32).permute(0, 2, 1, 3)
        v = value[:, :, S - new_tokens:S].detach().to("cpu", torch.float32).permute(0, 2, 1, 3)
        try:
            for b, s in enumerate(state.seqs):
                if n[b]:
                    state.cache.append(s, k[b, new_tokens - n[b]:].contiguous(),
                                       v[b, new_tokens - n[b]:].contiguous())
        except masskv.Error as e:
            if e.code != "out_of_memory":
                raise
            # Pool full: rebuild twice as large from the full history transformers holds.
            self.max_tokens = 2 * max(self.max_tokens, S)
            del self._states[module]
            return self._sync(module, key, value, S, real_counts(mask, B, S, S), mask)
        state.columns = S
        return state

    def _decode(self, layer: int, state: _LayerState, q, scale: float):
        import torch

        kv = state.cache.view(state.seqs)
        selection = None
        if self.method != "dense":
            r = masskv.select(q, kv, method=self.method, alpha=self.alpha, budget=self.budget,
                              budget_tokens=self.budget_tokens, top_p=self.top_p,
                              sink_pages=self.sink_pages, window_tokens=self.window_tokens,
                              scale=scale, code_channels=self.code_channels)
            selection = r.selection
            total = sum(kv.lengths()) * kv.num_kv_heads
            pages = int(selection.count.sum())
            self.last_selected_fraction[layer] = min(1.0, pages * kv.page_size / max(total, 1))
        out = torch.empty(q.shape, dtype=torch.float32)
        masskv.decode(q, kv, alpha=self.alpha, scale=scale, selection=selection, out=out)
        return out
