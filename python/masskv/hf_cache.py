"""A transformers ``Cache`` whose keys and values live only in masskv's paged GPU cache.

With ``MasskvAttention`` alone, transformers' own cache still holds the dense KV and masskv keeps
a paged copy beside it (twice the memory). ``MasskvCache`` replaces transformers' cache: each
layer's ``update`` appends the new keys and values to one ``masskv.torch_cache.TorchPagedCache``
(every layer, bf16/f16, page summaries for the selectors) and keeps nothing else::

    attn = masskv.hf.MasskvAttention(method="quest", budget_tokens=2048)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16,
                                                 attn_implementation=attn.register()).cuda()
    cache = masskv.hf_cache.MasskvCache(attn, model.config, max_tokens=prompt_len + 256)
    out = model.generate(prompt, past_key_values=cache, max_new_tokens=256)

What ``update`` hands to the attention function: the new keys/values for a decode step (the
attention reads the pool: selection + sparse decode), the full history for a prefill chunk (the
new tokens alone when there was none, else gathered from the pool) for transformers' SDPA, and
the new ones alone with ``prefill="masskv"`` (masskv's prefill reads the pool).
The tensors it returns carry the cache (attribute ``_masskv_cache``), which is how masskv's
attention function knows not to append them again; any other attention implementation sees
them as usual (the history for a prefill, the new token only for a decode step, which is not
what an eager/SDPA function expects: use the cache with masskv's attention only).

The pool grows when a step needs more pages (a copy of every layer's pool, so a captured CUDA
graph must be captured again); give ``max_tokens`` to size it once. Beam search (reordering the
batch), cropping and offloading are not served: they raise ``NotImplementedError``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

import masskv
from masskv.torch_cache import TorchPagedCache

__all__ = ["MasskvCache"]


class _Layer(CacheLayerMixin):
    """One layer's view of the shared paged cache: no tensors of its own."""

    is_sliding = False
    is_croppable = False

    @property
    def is_compileable(self) -> bool:  # generate() compiles the decode step of a static cache
        return self._owner().static

    def __init__(self, owner: MasskvCache, layer: int):
        super().__init__()
        self._owner = weakref.ref(owner)  # the Cache holds its layers, not the other way round
        self.layer = layer

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        self.is_initialized = True
        return self._owner()._update(self.layer, key_states, value_states)

    def get_mask_sizes(self, query_length, *args) -> tuple[int, int]:
        # transformers < 5.2x passed cache_position (a tensor of the new positions) here.
        if isinstance(query_length, torch.Tensor):
            query_length = int(query_length.shape[0])
        owner = self._owner()
        if owner.static and query_length == 1:  # one shape for every decode step
            return owner.max_tokens, 0
        return self.get_seq_length() + int(query_length), 0

    def get_seq_length(self) -> int:
        owner = self._owner()  # static steps are counted on the host as they run (no read)
        return owner._lengths[self.layer] + owner._static_steps

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self._owner().reset()

    def offload(self):
        raise NotImplementedError("MasskvCache: offloading is not served (the pool is on the GPU)")

    def prefetch(self):
        raise NotImplementedError("MasskvCache: offloading is not served (the pool is on the GPU)")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("MasskvCache: beam search (reordering the batch) is not served; "
                                  "use greedy or sampling")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("MasskvCache: cropping is not served (assisted decoding needs it)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("MasskvCache: expanding the batch is not served")

    def batch_select_indices(self, indices) -> None:
        raise NotImplementedError("MasskvCache: selecting batch rows is not served")


class MasskvCache(Cache):
    """transformers' cache for a model whose attention is ``MasskvAttention`` on CUDA tensors:
    the keys and values of every layer in one ``TorchPagedCache`` and nowhere else.

    attn: the MasskvAttention the model runs (its page_size, method and hierarchical decide the
    stores); config: the model's config (num_hidden_layers, num_key_value_heads, head_dim or
    hidden_size / num_attention_heads); max_tokens: tokens per sequence to size the pool for
    (it grows beyond); dtype / device: the pool's (default: those of the first keys appended).
    """

    def __init__(self, attn: Any, config: Any, *, max_tokens: int | None = None,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                 static: bool = False):
        layers = getattr(config, "num_hidden_layers", None)
        kv_heads = getattr(config, "num_key_value_heads", None) or \
            getattr(config, "num_attention_heads", None)
        if not isinstance(layers, int) or layers < 1 or not isinstance(kv_heads, int):
            raise ValueError("config: expected a transformers model config with "
                             "num_hidden_layers and num_key_value_heads")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"max_tokens: must be None or a positive int, got {max_tokens!r}")
        if static and max_tokens is None:
            raise ValueError("static: give max_tokens (the pool is sized once: a captured graph "
                             "keeps its tensors)")
        if static and attn.method == "token_codes":
            raise ValueError("static: token_codes keeps per-step key moments on the host; static "
                             "decode steps serve methods dense and quest")
        super().__init__(layers=[_Layer(self, i) for i in range(layers)])
        self.attn = attn
        self.num_kv_heads = kv_heads
        self.max_tokens = max_tokens or attn.max_tokens
        self.dtype = dtype
        self.device = None if device is None else torch.device(device)
        self.static = bool(static)
        self.paged: TorchPagedCache | None = None
        self.seqs: list[int] = []
        self._lengths = [0] * layers  # key columns each layer has seen (padding included)
        self._columns = 0             # key columns of the step begun last
        self._static_steps = 0        # static decode steps since the last sync (host count)
        self._longest = 0             # the longest row when the static steps began
        self._first_layer = None      # the lowest layer index that appends: begins a step
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    # -- what transformers asks ----------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return len(self.seqs) if self.paged is not None else -1

    def sync(self) -> None:
        """Ends static decode steps: the device's lengths read back (a host sync) and the pages
        taken ahead but not used given back; the layers' columns advance by the steps run.
        The steps are counted on the host as they run (get_seq_length() includes them); a
        graph replayed outside torch.compile runs no Python, so after such replays the device's
        count is the one taken."""
        steps = self._static_steps
        if self.paged is not None and self.paged.static_active:
            steps = self.paged.static_steps()
            self.paged.end_static()  # raises if a step ran past max_tokens
        self._static_steps = 0
        if steps:
            self._lengths = [n + steps for n in self._lengths]
            self._columns += steps

    def reset(self) -> None:
        """Forgets every sequence (the pool is kept for the next generation)."""
        self.sync()
        if self.paged is not None:
            for s in self.seqs:
                self.paged.free(s)
        self.seqs = []
        self._lengths = [0] * len(self.layers)
        self._columns = 0
        self._static_steps = 0
        self._pending.clear()

    # -- the work ----------------------------------------------------------------------------
    def _new_paged(self, B: int, Hkv: int, d: int, dtype, device) -> TorchPagedCache:
        P = self.attn.page_size
        if dtype not in (torch.bfloat16, torch.float16):
            dtype = torch.bfloat16
        return TorchPagedCache(len(self.layers), Hkv, d, B * (-(-self.max_tokens // P) + 1),
                               page_size=P, dtype=dtype, device=device,
                               **TorchPagedCache.stores_for(self.attn.method,
                                                            self.attn.hierarchical))

    def _update(self, layer: int, key: torch.Tensor, value: torch.Tensor):
        """key, value [B, Hkv, T, d]: this layer's new columns. A decode step (T == 1) appends
        them now (the first layer to see them takes the pages); a prefill chunk's wait for
        ``commit``, which masskv's attention calls with the chunk's padding. Returns the tensors
        the attention function gets."""
        B, Hkv, T, d = key.shape
        if Hkv != self.num_kv_heads:
            raise ValueError(f"MasskvCache: keys with {Hkv} kv heads, the config says "
                             f"{self.num_kv_heads}")
        if self.static and T == 1 and self.seqs:
            return self._static_update(layer, key, value)
        self.sync()
        if self._first_layer is None or layer < self._first_layer:
            self._first_layer = layer
        if self._pending:
            raise ValueError("MasskvCache: a prefill chunk was never committed (the cache serves "
                             "masskv's attention only: attn_implementation=attn.register())")
        if self.paged is None:
            self.paged = self._new_paged(B, Hkv, d, self.dtype or key.dtype,
                                         self.device or key.device)
        paged = self.paged
        if not self.seqs:
            self.seqs = [paged.create() for _ in range(B)]
        elif len(self.seqs) != B:
            raise ValueError(f"MasskvCache: a batch of {B} rows, the cache holds {len(self.seqs)} "
                             "(reset() it, or a new MasskvCache, for another batch)")
        have = self._lengths[layer]
        if have not in (self._columns, self._columns - T):
            raise ValueError(f"MasskvCache: layer {layer} holds {have} columns and adds {T}, "
                             f"the cache {self._columns}: the layers went out of step")
        if T == 1:
            self._append(layer, key, value, None, have + 1)
        else:
            self._pending[layer] = (key, value)
        self._lengths[layer] = have + T
        key._masskv_cache = self
        return key, value

    def _static_update(self, layer: int, key: torch.Tensor, value: torch.Tensor):
        """A static decode step: device work only (no host sync, no Python state that changes
        from step to step), so that the whole model step can be captured in a CUDA graph."""
        paged = self.paged
        if len(self.seqs) != key.shape[0]:
            raise ValueError(f"MasskvCache: a batch of {key.shape[0]} rows, the cache holds "
                             f"{len(self.seqs)}")
        if layer == self._first_layer:  # the step's first layer begins it
            if not paged.static_active:  # the first decode step after a prefill
                self.begin_static()
            if self._longest + self._static_steps >= self.max_tokens:
                raise ValueError(f"MasskvCache: a static step past max_tokens "
                                 f"({self.max_tokens}) tokens a row; sync() or reset()")
            paged.static_step()
            self._static_steps += 1
        paged.append(layer, key.transpose(1, 2), value.transpose(1, 2))
        key._masskv_cache = self
        return key, value

    @torch.compiler.disable
    def begin_static(self) -> None:
        """Takes the pages of the static decode steps up to max_tokens (host work, once after a
        prefill; the first decode step does it otherwise): call it before compiling or
        capturing the decode step, so that the traced step holds device work only."""
        if not self.static:
            raise ValueError("begin_static: this MasskvCache is not static (static=True)")
        if self.paged is None or not self.seqs:
            raise ValueError("begin_static: nothing prefilled yet")
        if self._pending:
            raise ValueError("begin_static: a prefill chunk was never committed")
        if self.paged.static_active:
            return
        self.sync()
        self._longest = max(self.paged.length(s) for s in self.seqs)  # before: length() ends it
        self.paged.begin_static(self.seqs, self.max_tokens)
        for t in self.paged.static_tensors():  # CUDA graphs of torch.compile need fixed addresses
            torch._dynamo.mark_static_address(t)

    def commit(self, layer: int, counts: list[int] | None) -> None:
        """Appends layer `layer`'s pending prefill chunk: counts[b] tokens of row b, the last
        of its columns (masskv.hf_mask.real_counts; None: every column)."""
        try:
            key, value = self._pending.pop(layer)
        except KeyError:
            raise ValueError(f"MasskvCache: layer {layer} has no prefill chunk to commit") from None
        self._append(layer, key, value, counts, self._lengths[layer])

    def history(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s keys and values [B, Hkv, S, d] over all S columns it has seen, each
        row's tokens at the end of its columns and 0 in its padding (what SDPA attends to in a
        prefill chunk after earlier ones; a copy from the pool)."""
        k, v = self.paged.history(layer, width=self._lengths[layer])
        return k.transpose(1, 2), v.transpose(1, 2)

    def _append(self, layer: int, key: torch.Tensor, value: torch.Tensor, counts,
                end: int) -> None:
        """Appends key, value [B, Hkv, T, d] of `layer`, whose columns end at `end`; the first
        layer to reach `end` begins the step."""
        T = key.shape[2]
        if counts is not None and max(counts) == 0:  # a chunk of padding alone: no token
            self._columns = max(self._columns, end)
            return
        if self._columns < end:
            self._begin(T if counts is None else counts)
            self._columns = end
        n = self.paged.step_tokens  # the step's tokens are the last n columns
        self.paged.append(layer, key[:, :, T - n:].transpose(1, 2),
                          value[:, :, T - n:].transpose(1, 2))

    def _begin(self, T: int | list[int]) -> None:
        """Takes the step's pages, growing the pool until they fit (begin_step raises before it
        changes anything when they do not)."""
        while True:
            try:
                self.paged.begin_step(self.seqs, T)
                return
            except masskv.Error as e:
                if e.code != "out_of_memory":
                    raise
                self.paged.grow(2 * self.paged.capacity_pages)

    @staticmethod
    def owning(key: torch.Tensor) -> MasskvCache | None:
        """The MasskvCache that returned `key` from its update, if any."""
        return getattr(key, "_masskv_cache", None)
