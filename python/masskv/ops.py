"""masskv's kernels as PyTorch custom operators (``torch.ops.masskv.*``), for torch.compile and
CUDA graphs.

Importing this module registers the operators (it needs torch). Each one takes tensors and plain
scalars only (no masskv objects cross the graph), and each has a fake implementation that
gives the output shapes without running anything, so ``torch.compile`` can trace through it:

* ``masskv::decode(q, k_pool, v_pool, indptr, indices, last_page_len, sel_ids, sel_count,
  layout, alpha, scale, max_pages_per_seq) -> (out, lse_or_tau)``: decode attention of one
  query token per sequence over a paged pool (dense when ``sel_ids`` is None, else over the
  page lists); CPU tensors run the CPU kernels, CUDA tensors the CUDA ones.
* ``masskv::quest_select(q, k_pool, v_pool, indptr, indices, last_page_len, bound_min,
  bound_max, layout, budget_tokens, sink_pages, window_tokens, scale, max_pages_per_seq)
  -> (ids, count)``: Quest page selection on the GPU (CUDA tensors only).
* ``masskv::hier_select(..., group_min, group_max, group_indptr, group_indices, ...)``:
  hierarchical Quest (groups of 16 pages first), and ``masskv::update_groups(...)`` that keeps
  the group store (CUDA tensors only).
* ``masskv::append(...)`` / ``masskv::summarize_pages(...)``: the GPU append of a decode step
  and the summary refresh of pages written elsewhere, in place (CUDA tensors only).
* ``masskv::encode_page_codes(...)`` / ``masskv::update_spread(...)`` keep token_codes' page
  codes and spread rows on the GPU; ``masskv::token_codes_select(...) -> (ids, count)`` is
  token_codes' selection there (token lists; CUDA tensors only).
* ``masskv::prefill(q, k_pool, v_pool, indptr, indices, last_page_len, q_indptr,
  q_block_indptr, layout, max_q_per_seq, scale, budget_blocks, ...) -> (out, lse)``: causal
  prefill of the new tokens, dense or block-sparse with the block indexer (CUDA tensors only).

Errors: in eager mode each CUDA call waits and raises ``masskv.Error`` for what its kernel
flagged (a page id outside the pool, a non-finite key). While a CUDA graph is being captured
the calls do not wait (a wait would break the capture); call ``masskv.ops.check(stream)`` after
replaying the graph to raise what the kernels flagged. The kernels' workspaces are per
(device, stream) and grow on the first call of a shape: warm up on the stream you then capture
on (``torch.cuda.graph(g, stream=s)``), and pass that stream to ``check``.

See docs/torch.md.
"""

from typing import Optional

import torch

import masskv

__all__ = ["append", "check", "decode", "encode_page_codes", "hier_select", "prefill",
           "quest_select", "summarize_pages", "token_codes_select", "update_groups",
           "update_spread"]

_SUMMARY_KEYS = ("min", "max", "mean", "m2", "count", "max_vnorm")
_BOUND_KEYS = ("bound_min", "bound_max", "bound_wmax")


def _eager_check(t: torch.Tensor) -> bool:
    """Whether a CUDA call on t's device may wait for its result (not while capturing)."""
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _require_cuda(op: str, t: torch.Tensor, name: str) -> None:
    if not masskv.has_cuda:
        raise RuntimeError(f"masskv::{op}: this masskv build has no CUDA kernels "
                           "(pip install . -C cmake.define.MASSKV_CUDA=ON)")
    if not t.is_cuda:
        raise ValueError(f"masskv::{op}: {name} is on {t.device}; this operator runs on CUDA "
                         "tensors")


def _kv(k_pool, v_pool, indptr, indices, last_page_len, layout: str):
    return masskv.KV.from_arrays(k_pool, v_pool, indptr, indices, last_page_len, layout=layout)


@torch.library.custom_op("masskv::decode", mutates_args=())
def decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, indptr: torch.Tensor,
           indices: torch.Tensor, last_page_len: torch.Tensor, sel_ids: Optional[torch.Tensor],
           sel_count: Optional[torch.Tensor], layout: str = "NHD", alpha: float = 1.0,
           scale: float = 0.0, max_pages_per_seq: int = 0,
           sel_unit: str = "page") -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention (masskv.decode) as an operator: q float32 (B, Hq, d); the pool
    (pages, page_size, H_kv, d) for NHD or (pages, H_kv, page_size, d) for HND; the int32
    page table; sel_ids / sel_count int32 (B, H_kv, K) / (B, H_kv) lists of sel_unit ("page"
    or "token" ids) or None (dense). Returns float32 out (B, Hq, d) and lse_or_tau (B, Hq)."""
    kv = _kv(k_pool, v_pool, indptr, indices, last_page_len, layout)
    if (sel_ids is None) != (sel_count is None):
        raise ValueError("masskv::decode: pass sel_ids and sel_count together (or neither)")
    sel = None if sel_ids is None else masskv.Selection(sel_ids, sel_count, sel_unit)
    if q.is_cuda:
        return masskv.decode(q, kv, alpha=alpha, scale=scale, selection=sel,
                             max_pages_per_seq=max_pages_per_seq, check=_eager_check(q))
    out = torch.empty(q.shape, dtype=torch.float32)
    lse = torch.empty(q.shape[:2], dtype=torch.float32)
    masskv.decode(q, kv, alpha=alpha, scale=scale, selection=sel, out=out, lse_or_tau=lse)
    return out, lse


@decode.register_fake
def _decode_fake(q, k_pool, v_pool, indptr, indices, last_page_len, sel_ids, sel_count,
                 layout="NHD", alpha=1.0, scale=0.0, max_pages_per_seq=0, sel_unit="page"):
    return (q.new_empty(q.shape, dtype=torch.float32),
            q.new_empty(q.shape[:2], dtype=torch.float32))


def _page_size(k_pool: torch.Tensor, layout: str) -> int:
    return int(k_pool.shape[1] if layout == "NHD" else k_pool.shape[2])


def _lists_fake(q: torch.Tensor, indptr: torch.Tensor, heads: int, cap: int):
    """A selection's outputs for the fake implementations: int32 ids (B, heads, cap), count
    (B, heads), B from the page table."""
    B = int(indptr.shape[0]) - 1
    return (q.new_empty((B, heads, cap), dtype=torch.int32),
            q.new_empty((B, heads), dtype=torch.int32))


@torch.library.custom_op("masskv::quest_select", mutates_args=())
def quest_select(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                 bound_min: torch.Tensor, bound_max: torch.Tensor, layout: str,
                 budget_tokens: int, sink_pages: int = 1, window_tokens: int = 0,
                 scale: float = 0.0,
                 max_pages_per_seq: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Quest page selection on the GPU (masskv.cuda_quest_select) as an operator. Returns int32
    ids (B, H_kv, capacity) -1 padded and count (B, H_kv); capacity is
    masskv.cuda_select_capacity(max_pages_per_seq, page_size, budget_tokens, sink_pages,
    window_tokens), so max_pages_per_seq must be given (> 0)."""
    _require_cuda("quest_select", q, "q")
    if max_pages_per_seq <= 0:
        raise ValueError("masskv::quest_select: max_pages_per_seq must be > 0 (it fixes the "
                         "output's shape)")
    kv = _kv(k_pool, v_pool, indptr, indices, last_page_len, layout)
    sel = masskv.cuda_quest_select(q, kv, bound_min, bound_max, budget_tokens=budget_tokens,
                                   sink_pages=sink_pages, window_tokens=window_tokens,
                                   scale=scale, max_pages_per_seq=max_pages_per_seq,
                                   check=_eager_check(q))
    return sel.ids, sel.count


@quest_select.register_fake
def _quest_select_fake(q, k_pool, v_pool, indptr, indices, last_page_len, bound_min, bound_max,
                       layout, budget_tokens, sink_pages=1, window_tokens=0, scale=0.0,
                       max_pages_per_seq=0):
    cap = masskv.cuda_select_capacity(max_pages_per_seq, _page_size(k_pool, layout),
                                      budget_tokens, sink_pages, window_tokens)
    return _lists_fake(q, indptr, int(bound_min.shape[1]), cap)


@torch.library.custom_op("masskv::hier_select", mutates_args=())
def hier_select(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                bound_min: torch.Tensor, bound_max: torch.Tensor, group_min: torch.Tensor,
                group_max: torch.Tensor, group_indptr: torch.Tensor, group_indices: torch.Tensor,
                layout: str, budget_tokens: int, sink_pages: int = 1, window_tokens: int = 0,
                scale: float = 0.0, cover: float = 2.0,
                max_pages_per_seq: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Hierarchical Quest on the GPU (masskv.cuda_hier_select): the group store (16 pages a
    group, masskv::update_groups keeps it) first, then the chosen groups' pages. Output as
    quest_select's."""
    _require_cuda("hier_select", q, "q")
    if max_pages_per_seq <= 0:
        raise ValueError("masskv::hier_select: max_pages_per_seq must be > 0 (it fixes the "
                         "output's shape)")
    kv = _kv(k_pool, v_pool, indptr, indices, last_page_len, layout)
    sel = masskv.cuda_hier_select(q, kv, bound_min, bound_max, group_min, group_max,
                                  group_indptr, group_indices, budget_tokens=budget_tokens,
                                  sink_pages=sink_pages, window_tokens=window_tokens,
                                  scale=scale, cover=cover,
                                  max_pages_per_seq=max_pages_per_seq, check=_eager_check(q))
    return sel.ids, sel.count


@hier_select.register_fake
def _hier_select_fake(q, k_pool, v_pool, indptr, indices, last_page_len, bound_min, bound_max,
                      group_min, group_max, group_indptr, group_indices, layout, budget_tokens,
                      sink_pages=1, window_tokens=0, scale=0.0, cover=2.0, max_pages_per_seq=0):
    return _quest_select_fake(q, k_pool, v_pool, indptr, indices, last_page_len, bound_min,
                              bound_max, layout, budget_tokens, sink_pages, window_tokens, scale,
                              max_pages_per_seq)


@torch.library.custom_op("masskv::update_groups", mutates_args=("group_min", "group_max"))
def update_groups(k_pool: torch.Tensor, v_pool: torch.Tensor, indptr: torch.Tensor,
                  indices: torch.Tensor, last_page_len: torch.Tensor, bound_min: torch.Tensor,
                  bound_max: torch.Tensor, group_min: torch.Tensor, group_max: torch.Tensor,
                  group_indptr: torch.Tensor, group_indices: torch.Tensor, layout: str,
                  last_only: bool, max_pages_per_seq: int = 0) -> None:
    """The group store recomputed from the page store (masskv.cuda_update_groups), in place:
    every group of the table's sequences, or each one's last group (last_only)."""
    _require_cuda("update_groups", group_min, "group_min")
    kv = _kv(k_pool, v_pool, indptr, indices, last_page_len, layout)
    masskv.cuda_update_groups(kv, bound_min, bound_max, group_min, group_max, group_indptr,
                              group_indices, last_only=last_only,
                              max_pages_per_seq=max_pages_per_seq,
                              check=_eager_check(group_min))


@update_groups.register_fake
def _update_groups_fake(*args, **kwargs) -> None:
    return None


def _stores(k_pool, v_pool, layout, mn, mx, mean, m2, count, max_vnorm, bound_min, bound_max,
            bound_wmax) -> dict:
    d = dict(k_pool=k_pool, v_pool=v_pool, layout=layout, min=mn, max=mx, mean=mean, m2=m2,
             count=count, max_vnorm=max_vnorm)
    if bound_min is not None:
        d.update(bound_min=bound_min, bound_max=bound_max, bound_wmax=bound_wmax)
    return d


_STORE_ARGS = ("k_pool", "v_pool", "mn", "mx", "mean", "m2", "count", "max_vnorm", "bound_min",
               "bound_max", "bound_wmax")


@torch.library.custom_op("masskv::append",
                         mutates_args=(*_STORE_ARGS, "group_min", "group_max"))
def append(k_pool: torch.Tensor, v_pool: torch.Tensor, mn: torch.Tensor, mx: torch.Tensor,
           mean: torch.Tensor, m2: torch.Tensor, count: torch.Tensor, max_vnorm: torch.Tensor,
           bound_min: Optional[torch.Tensor], bound_max: Optional[torch.Tensor],
           bound_wmax: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor,
           page: torch.Tensor, slot: torch.Tensor, group_min: Optional[torch.Tensor],
           group_max: Optional[torch.Tensor], layout: str = "NHD",
           indptr: Optional[torch.Tensor] = None, indices: Optional[torch.Tensor] = None,
           group_indptr: Optional[torch.Tensor] = None,
           group_indices: Optional[torch.Tensor] = None) -> None:
    """One decode step's append (masskv.cuda_append) in place: k, v float32 (B, H_kv, d) into
    physical page page[b], slot slot[b] (int32 (B,)), with every summary store updated; with
    group_min / group_max and the step's page and group tables, each sequence's last group of
    the group store refreshed too (update_groups' bits with last_only, one launch fewer), else
    None for both. They have no default on purpose: the dispatcher drops trailing arguments
    left at their defaults, and torch 2.11's in-place dispatch then indexes the mutated ones
    past the end (IndexError)."""
    _require_cuda("append", k, "k")
    groups = None
    if group_min is not None or group_max is not None:
        groups = dict(group_min=group_min, group_max=group_max, indptr=indptr, indices=indices,
                      group_indptr=group_indptr, group_indices=group_indices)
        if any(t is None for t in groups.values()):
            raise ValueError("masskv::append: the group refresh takes group_min, group_max, "
                             "indptr, indices, group_indptr and group_indices together")
    masskv.cuda_append(_stores(k_pool, v_pool, layout, mn, mx, mean, m2, count, max_vnorm,
                               bound_min, bound_max, bound_wmax),
                       k, v, page, slot, check=_eager_check(k), groups=groups)


@append.register_fake
def _append_fake(*args, **kwargs) -> None:
    return None


@torch.library.custom_op("masskv::summarize_pages", mutates_args=_STORE_ARGS[2:])
def summarize_pages(k_pool: torch.Tensor, v_pool: torch.Tensor, mn: torch.Tensor,
                    mx: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor, count: torch.Tensor,
                    max_vnorm: torch.Tensor, bound_min: Optional[torch.Tensor],
                    bound_max: Optional[torch.Tensor], bound_wmax: Optional[torch.Tensor],
                    pages: torch.Tensor, tokens: torch.Tensor, layout: str = "NHD") -> None:
    """The summaries of pages whose tokens were written into the pool directly
    (masskv.cuda_summarize_pages): page pages[i] holds tokens[i] tokens (int32)."""
    _require_cuda("summarize_pages", pages, "pages")
    masskv.cuda_summarize_pages(_stores(k_pool, v_pool, layout, mn, mx, mean, m2, count,
                                        max_vnorm, bound_min, bound_max, bound_wmax),
                                pages, tokens, check=_eager_check(pages))


@summarize_pages.register_fake
def _summarize_fake(*args, **kwargs) -> None:
    return None


_CODE_ARGS = ("codes", "range_min", "range_max", "grid", "chan_codes", "chan_ranges",
              "chan_spread")


def _codes(codes, range_min, range_max, grid, chan_codes, chan_ranges, chan_spread) -> dict:
    return dict(codes=codes, range_min=range_min, range_max=range_max, grid=grid,
                chan_codes=chan_codes, chan_ranges=chan_ranges, chan_spread=chan_spread)


@torch.library.custom_op("masskv::encode_page_codes", mutates_args=_CODE_ARGS[:6])
def encode_page_codes(k_pool: torch.Tensor, v_pool: torch.Tensor, mn: torch.Tensor,
                      mx: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor,
                      count: torch.Tensor, max_vnorm: torch.Tensor, codes: torch.Tensor,
                      range_min: torch.Tensor, range_max: torch.Tensor, grid: torch.Tensor,
                      chan_codes: torch.Tensor, chan_ranges: torch.Tensor,
                      chan_spread: torch.Tensor, pages: torch.Tensor, tokens: torch.Tensor,
                      layout: str = "NHD") -> None:
    """token_codes' page codes of the listed pages (masskv.cuda_encode_page_codes), in place:
    page pages[i] holds tokens[i] tokens (int32)."""
    _require_cuda("encode_page_codes", pages, "pages")
    masskv.cuda_encode_page_codes(
        _stores(k_pool, v_pool, layout, mn, mx, mean, m2, count, max_vnorm, None, None, None),
        _codes(codes, range_min, range_max, grid, chan_codes, chan_ranges, chan_spread),
        pages, tokens, check=_eager_check(pages))


@encode_page_codes.register_fake
def _encode_fake(*args, **kwargs) -> None:
    return None


@torch.library.custom_op("masskv::update_spread", mutates_args=("chan_spread", "mean_seq",
                                                                 "m2_seq"))
def update_spread(k_pool: torch.Tensor, v_pool: torch.Tensor, mn: torch.Tensor,
                  mx: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor, count: torch.Tensor,
                  max_vnorm: torch.Tensor, codes: torch.Tensor, range_min: torch.Tensor,
                  range_max: torch.Tensor, grid: torch.Tensor, chan_codes: torch.Tensor,
                  chan_ranges: torch.Tensor, chan_spread: torch.Tensor, indptr: torch.Tensor,
                  indices: torch.Tensor, last_page_len: torch.Tensor, tokens: int,
                  mean_seq: torch.Tensor, m2_seq: torch.Tensor, layout: str = "NHD",
                  counts: Optional[torch.Tensor] = None) -> None:
    """The spread rows of a step (masskv.cuda_update_spread), in place: each sequence's last
    `tokens` keys (counts: int32 (B,) per sequence instead) folded into its float64 moments
    mean_seq / m2_seq (B, H_kv, d)."""
    _require_cuda("update_spread", indptr, "indptr")
    masskv.cuda_update_spread(
        _stores(k_pool, v_pool, layout, mn, mx, mean, m2, count, max_vnorm, None, None, None),
        _codes(codes, range_min, range_max, grid, chan_codes, chan_ranges, chan_spread),
        indptr, indices, last_page_len, tokens, mean_seq, m2_seq, check=_eager_check(indptr),
        counts=counts)


@update_spread.register_fake
def _spread_fake(*args, **kwargs) -> None:
    return None


@torch.library.custom_op("masskv::token_codes_select", mutates_args=())
def token_codes_select(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                       indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                       codes: torch.Tensor, range_min: torch.Tensor, range_max: torch.Tensor,
                       grid: torch.Tensor, chan_codes: torch.Tensor, chan_ranges: torch.Tensor,
                       chan_spread: torch.Tensor, layout: str, budget_tokens: int,
                       sink_pages: int = 1, window_tokens: int = 0, scale: float = 0.0,
                       max_pages_per_seq: int = 0,
                       code_channels: float = 0.375) -> tuple[torch.Tensor, torch.Tensor]:
    """token_codes on the GPU (masskv.cuda_token_codes_select): int32 token lists ids (B, H_kv,
    capacity) -1 padded and count (B, H_kv); capacity from max_pages_per_seq (> 0);
    code_channels 1: one pass (every token on every channel)."""
    _require_cuda("token_codes_select", q, "q")
    if max_pages_per_seq <= 0:
        raise ValueError("masskv::token_codes_select: max_pages_per_seq must be > 0 (it fixes "
                         "the output's shape)")
    kv = _kv(k_pool, v_pool, indptr, indices, last_page_len, layout)
    sel = masskv.cuda_token_codes_select(
        q, kv, _codes(codes, range_min, range_max, grid, chan_codes, chan_ranges, chan_spread),
        budget_tokens=budget_tokens, sink_pages=sink_pages, window_tokens=window_tokens,
        scale=scale, max_pages_per_seq=max_pages_per_seq, check=_eager_check(q),
        code_channels=code_channels)
    return sel.ids, sel.count


@token_codes_select.register_fake
def _token_codes_fake(q, k_pool, v_pool, indptr, indices, last_page_len, codes, range_min,
                      range_max, grid, chan_codes, chan_ranges, chan_spread, layout,
                      budget_tokens, sink_pages=1, window_tokens=0, scale=0.0,
                      max_pages_per_seq=0, code_channels=0.375):
    cap = masskv.cuda_token_codes_capacity(max_pages_per_seq, _page_size(k_pool, layout),
                                           budget_tokens, sink_pages, window_tokens)
    return _lists_fake(q, indptr, int(range_min.shape[1]), cap)


@torch.library.custom_op("masskv::prefill", mutates_args=())
def prefill(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, indptr: torch.Tensor,
            indices: torch.Tensor, last_page_len: torch.Tensor, q_indptr: torch.Tensor,
            q_block_indptr: Optional[torch.Tensor], layout: str, max_q_per_seq: int,
            scale: float = 0.0, budget_blocks: int = 0, q_blocks: int = 0, q_block: int = 64,
            k_block: int = 64, sink_blocks: int = 1,
            max_kv_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax prefill on the GPU (masskv.cuda_prefill) as an operator: q (total_q, Hq,
    d) in the pool's dtype, sequence b's rows q_indptr[b]..q_indptr[b+1] (its last tokens,
    already in the pool); dense (budget_blocks 0) or block-sparse from the mean-pooled block
    indexer (budget_blocks key blocks per query block and kv head, with q_block_indptr,
    q_blocks and max_kv_len). Returns out (total_q, Hq, d) in q's dtype and float32 lse
    (total_q, Hq)."""
    _require_cuda("prefill", q, "q")
    kv = _kv(k_pool, v_pool, indptr, indices, last_page_len, layout)
    out, lse, _, _ = masskv.cuda_prefill(
        q, q_indptr, kv, scale=scale, budget_blocks=budget_blocks,
        q_block_indptr=q_block_indptr, q_blocks=q_blocks, q_block=q_block, k_block=k_block,
        sink_blocks=sink_blocks, max_q_per_seq=max_q_per_seq, max_kv_len=max_kv_len,
        check=_eager_check(q))
    return out, lse


@prefill.register_fake
def _prefill_fake(q, k_pool, v_pool, indptr, indices, last_page_len, q_indptr, q_block_indptr,
                  layout, max_q_per_seq, scale=0.0, budget_blocks=0, q_blocks=0, q_block=64,
                  k_block=64, sink_blocks=1, max_kv_len=0):
    return q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=torch.float32)


def check(stream=None) -> None:
    """Raises masskv.Error for what the CUDA kernels of captured (graph) calls flagged, and
    clears the flags. stream: the torch.cuda.Stream the graph was captured on (the kernels'
    workspaces, flags included, are per stream; default: the current stream). Waits for the
    whole device first, so that a replay on any stream has finished."""
    s = torch.cuda.current_stream() if stream is None else stream
    torch.cuda.synchronize(s.device)
    masskv.cuda_check(s.device.index, s.cuda_stream)
