"""The CUDA path of masskv.hf.MasskvAttention: tensors on a GPU stay there.

Each model (its config object) gets one masskv.torch_cache.TorchPagedCache holding every
layer. The first layer of a forward call that sees new tokens begins the step (the host takes
the pages once for all layers); every layer appends its new keys and values on the device.
T > 1 (a prefill chunk): dense causal attention by transformers' own SDPA function over the
history it hands over, or with prefill="masskv" masskv's CUDA prefill over the paged cache
(dense or block-sparse). T == 1 (decode): GPU selection — Quest over the bf16 page bounds, or
token_codes over the page codes (tokens) — then sparse decode (masskv's CUDA kernels), or dense
decode for method "dense". When the model runs
with masskv.hf_cache.MasskvCache, the keys are in the paged cache already and nothing is
appended here.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

import masskv
from masskv.hf_mask import real_counts
from masskv.torch_cache import TorchPagedCache

try:  # transformers' Cache subclass (no dense copy); absent with an old transformers
    from masskv.hf_cache import MasskvCache
except ImportError:
    MasskvCache = None

GPU_METHODS = ("dense", "quest", "token_codes")


@dataclass
class _ModelState:
    cache: TorchPagedCache
    seqs: list[int]
    columns: int = 0  # key columns of transformers' history mirrored (padding included)


class CudaLayers:
    """Per-model GPU caches of one MasskvAttention. Keyed by the identity of the model's config
    (shared by its layers; transformers' configs define __eq__, so they cannot be dict keys
    themselves), and dropped when that config is collected, so a cache goes with its model."""

    def __init__(self) -> None:
        self._states: dict[int, _ModelState] = {}
        self._watched: set[int] = set()  # configs with a finalizer that forgets their state

    def clear(self) -> None:
        self._states.clear()

    def _forget(self, key: int) -> None:
        self._states.pop(key, None)
        self._watched.discard(key)

    def __call__(self, attn: Any, module: Any, query, key, value, attention_mask,
                 scale: float, counts: list[int] | None = None, **kwargs):
        """counts: masskv.hf_mask.real_counts of a prefill chunk (None: no padding)."""
        if attn.method not in GPU_METHODS:
            raise ValueError(f"masskv attention: on CUDA tensors the methods are "
                             f"{', '.join(GPU_METHODS)}; got {attn.method!r} (the CPU path "
                             "serves every selector)")
        if attn.method != "dense" and attn.budget_tokens <= 0:
            raise ValueError(f"masskv attention: method {attn.method!r} on the GPU needs "
                             "budget_tokens > 0")
        if attn.prefill not in ("sdpa", "masskv"):
            raise ValueError(f"masskv attention: prefill is 'sdpa' or 'masskv', got "
                             f"{attn.prefill!r}")
        if attn.prefill == "masskv" and query.shape[-1] not in (64, 128):
            raise ValueError(f"masskv attention: masskv's CUDA prefill serves head_dim 64 and "
                             f"128, got {query.shape[-1]} (use prefill='sdpa')")
        if attn.budget != "fixed":
            raise ValueError(f"masskv attention: on the GPU the budget is 'fixed' (got "
                             f"{attn.budget!r})")
        B, T = query.shape[0], query.shape[2]
        layer = int(getattr(module, "layer_idx", 0))
        owner = MasskvCache.owning(key) if MasskvCache is not None else None
        if owner is not None:  # transformers' cache is masskv's: it holds the keys
            if T > 1:
                owner.commit(layer, counts)  # a prefill chunk's tokens, padding left out
            state = _ModelState(owner.paged, owner.seqs)
        else:
            state = self._sync(attn, module, key, value, T, counts, attention_mask)
        if T > 1:
            if counts is not None and max(counts) == 0:  # a chunk of padding alone
                return torch.zeros_like(query).transpose(1, 2), None
            if attn.alpha != 1.0:
                raise ValueError("masskv attention: an entmax (alpha != 1) prefill on the GPU is "
                                 "not served yet; run the CPU path")
            if attn.prefill == "masskv":
                # The step's tokens are the last step_tokens columns (fewer than T when every
                # row of a padded batch has padding in this chunk).
                n = state.cache.step_tokens
                q = query[:, :, T - n:].transpose(1, 2).to(state.cache.dtype)
                out, _ = state.cache.prefill(layer, q, budget_tokens=attn.prefill_budget_tokens,
                                             scale=scale)
                if n < T:
                    out = torch.cat([out.new_zeros((B, T - n, *out.shape[2:])), out], 1)
                return out.to(query.dtype), None
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            if owner is not None and owner.get_seq_length(layer) > T:
                # A chunk after earlier ones: SDPA reads the history, gathered from the pool.
                key, value = (t.to(query.dtype) for t in owner.history(layer))
            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          scaling=scale, **kwargs)
        q = query[:, :, 0, :].float().contiguous()
        cache = state.cache
        selection = None
        if attn.method != "dense":
            selection = cache.select(layer, q, budget_tokens=attn.budget_tokens,
                                     sink_pages=attn.sink_pages,
                                     window_tokens=attn.window_tokens, scale=scale,
                                     hierarchical=attn.hierarchical, method=attn.method,
                                     code_channels=attn.code_channels)
            attn.last_selection[layer] = selection
        out, _ = cache.decode(layer, q, selection, alpha=attn.alpha, scale=scale,
                              unit="token" if attn.method == "token_codes" else "page")
        return out[:, None].to(query.dtype), None

    def _sync(self, attn: Any, module: Any, key, value, new_tokens: int, counts,
              mask) -> _ModelState:
        """Appends this layer's new keys/values ([B, Hkv, S, d], the full history) to the model's
        GPU cache, beginning the step when this layer is the first to see them. counts: how
        many of the new columns of each row are tokens (the last ones; None: all)."""
        B, Hkv, S, d = key.shape
        config = getattr(module, "config", None)
        layers = getattr(config, "num_hidden_layers", None)
        if config is None or not isinstance(layers, int):
            raise ValueError("masskv attention: on the GPU the module must carry its model's "
                             "config (module.config.num_hidden_layers)")
        layer = int(getattr(module, "layer_idx", 0))
        state = self._states.get(id(config))
        if state is not None:
            # Holds the history but this call's new columns (an earlier layer may have
            # appended them already: then columns == S); anything else is a new generation:
            # start over.
            if len(state.seqs) != B or state.columns not in (S - new_tokens, S):
                del self._states[id(config)]
                state = None
        if state is None:
            state = self._new_state(attn, config, layers, key)
            if new_tokens < S:  # the whole history: its padding from the mask
                counts, new_tokens = real_counts(mask, B, S, S), S
        cache = state.cache
        n = [new_tokens] * B if counts is None else counts
        if max(n) == 0:  # a chunk of padding alone: nothing to add
            state.columns = S
            return state
        if state.columns < S:
            try:
                cache.begin_step(state.seqs, n)
            except masskv.Error as e:
                if e.code != "out_of_memory":
                    raise
                # Pool full: a cache twice as large, filled from the full history of every
                # layer (this is the step's first layer; the others append key[:, :, :S] too).
                full = [cache.length(s) + c for s, c in zip(state.seqs, n)]
                attn.max_tokens = 2 * max(attn.max_tokens, S)
                del self._states[id(config)], state, cache
                state = self._new_state(attn, config, layers, key)
                cache = state.cache
                cache.begin_step(state.seqs, full)
            state.columns = S
        T = cache.step_tokens
        k = key[:, :, S - T:S].transpose(1, 2)
        v = value[:, :, S - T:S].transpose(1, 2)
        cache.append(layer, k, v)
        return state

    def _new_state(self, attn: Any, config: Any, layers: int, key) -> _ModelState:
        B, Hkv, S, d = key.shape
        P = attn.page_size
        pages = B * (-(-max(S, attn.max_tokens) // P) + 1)
        dtype = key.dtype if key.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        cache = TorchPagedCache(layers, Hkv, d, pages, page_size=P, dtype=dtype,
                                device=key.device,
                                **TorchPagedCache.stores_for(attn.method, attn.hierarchical))
        state = _ModelState(cache, [cache.create() for _ in range(B)])
        key = id(config)
        if key not in self._watched:  # forget the state when the config (the model) goes
            self._watched.add(key)
            weakref.finalize(config, self._forget, key)
        self._states[key] = state
        return state
