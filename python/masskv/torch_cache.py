"""A paged KV cache over PyTorch CUDA tensors: every layer's K/V pool, page summaries and bf16
bound store on the GPU, the page allocation on the host (docs/torch.md).

One object holds all layers of a model: the sequences, their pages and the page table are the
same in every layer, so the host work of a step (taking pages, writing the page table) is done
once per step (``begin_step``) and each layer then appends, selects and decodes on the device
through the ``torch.ops.masskv`` operators (masskv.ops), with no host round trip::

    cache = TorchPagedCache(num_layers, num_kv_heads, head_dim, capacity_pages=4096)
    seqs = [cache.create() for _ in range(B)]
    cache.begin_step(seqs, T)                  # host: pages for T new tokens per sequence
    for layer in range(num_layers):
        cache.append(layer, k, v)              # (B, T, H_kv, d) each
        ids, count = cache.select(layer, q, budget_tokens=2048)
        out, lse = cache.decode(layer, q, (ids, count))

The page table and the positions of a step live in buffers that are kept per batch size, so a
decode step of a fixed batch (begin_step outside, the layers inside) can be captured in a CUDA
graph; give ``max_pages_per_seq`` then, so that the kernels' grids do not change between steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import masskv
from masskv import ops

__all__ = ["TorchPagedCache"]

_POOL_DTYPES = (torch.bfloat16, torch.float16)
GROUP_PAGES = 16  # pages per group of the hierarchical selection (the GPU serves 16)
# The per-page tensors, (layers, pages, ...) each, in the operators' argument order (the bound
# store last, absent when not kept).
_PAGE_STORES = ("k_pool", "v_pool", "min", "max", "mean", "m2", "count", "max_vnorm",
                "bound_min", "bound_max", "bound_wmax")


@dataclass
class _Seq:
    pages: list[int] = field(default_factory=list)
    length: int = 0
    groups: list[int] = field(default_factory=list)  # group-store slots, one per 16 pages
    reserved: list[int] = field(default_factory=list)   # static steps: pages taken ahead
    greserved: list[int] = field(default_factory=list)  # and group slots


@dataclass
class _Static:
    """Device state of static decode steps (begin_static): each row's pages and group slots up
    to max_tokens, taken ahead, and its length, advanced on the device."""
    rows: list[_Seq]
    lengths: torch.Tensor     # int32 (B,)
    start: list[int]          # the host lengths when it began
    row_pages: torch.Tensor   # int32 (B, pages a row)
    row_groups: torch.Tensor | None
    iota: torch.Tensor        # int32 arange(B * pages a row)
    over: torch.Tensor        # int32 (1,): a step ran past max_tokens


@dataclass
class _Step:
    seqs: list[int]
    tokens: int              # the most new tokens of any row: append's k, v are (B, tokens, ...)
    counts: list[int]        # new tokens of each row, right-aligned in those tensors
    page: torch.Tensor       # int32 (sum(counts),) physical page of each new token, row-major (b, t)
    slot: torch.Tensor       # int32 (sum(counts),)
    touched: torch.Tensor    # int32 pages the step wrote (distinct), for the summary refresh
    touched_tokens: torch.Tensor  # int32 tokens each of them holds after the step
    indptr: torch.Tensor
    indices: torch.Tensor     # the whole index buffer; its first `used` entries are the table
    last_page_len: torch.Tensor
    used: int
    max_pages: int
    group_indptr: torch.Tensor | None = None
    group_indices: torch.Tensor | None = None
    mean_seq: torch.Tensor | None = None  # page codes: the batch's f64 key moments
    m2_seq: torch.Tensor | None = None
    src: torch.Tensor | None = None  # int64 rows of the (B * tokens) new rows that are written
    #                                  (None: every row: all counts equal tokens)
    counts_dev: torch.Tensor | None = None  # int32 counts on the device (with src)

    @property
    def uniform(self) -> bool:
        return self.src is None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fill_csr(lists: list[list[int]], indptr: torch.Tensor, indices: torch.Tensor) -> int:
    """Writes lists back to back into the CSR buffers (indptr (len + 1,), the index buffer's
    prefix); returns how many indices that is."""
    ptr, ids = [0], []
    for ls in lists:
        ids.extend(ls)
        ptr.append(len(ids))
    indptr.copy_(torch.tensor(ptr, dtype=torch.int32))
    indices[:len(ids)].copy_(torch.tensor(ids, dtype=torch.int32))
    return len(ids)


def _fill_rows(counts: torch.Tensor, indptr: torch.Tensor, out: torch.Tensor,
               rows: torch.Tensor, iota: torch.Tensor) -> None:
    """On the device, no host sync: the CSR of the first counts[b] entries of each row of
    `rows` (B, W): indptr (B + 1,), out's first B * W entries (past indptr[B]: filler)."""
    B, W = rows.shape
    # Every read is of fresh tensors, never of indptr after its write: torch 2.11's inductor
    # searched the view indptr[1:] from its storage's start under reduce-overhead (row 0 got
    # row 1's pages on an H100), which eager and torch 2.15's CPU inductor did not show.
    ends = counts.cumsum(0, dtype=torch.int32)
    row = torch.searchsorted(ends, iota, right=True).clamp_(max=B - 1)
    col = (iota - (ends - counts)[row]).clamp_(0, W - 1)
    indptr[1:].copy_(ends)
    out[:B * W].copy_(rows.view(-1)[row.long() * W + col.long()])


def _error(msg: str, code: str, argument: str) -> masskv.Error:
    e = masskv.Error(msg)
    e.code, e.argument = code, argument
    return e


class TorchPagedCache:
    """Paged K/V of every layer on one CUDA device, with the summary stores the GPU selectors read.

    num_layers, num_kv_heads, head_dim: the model's; capacity_pages: physical pages per layer
    (page_size tokens each; all layers take the same pages); dtype: torch.bfloat16 or
    torch.float16; layout: "NHD" (pool (layers, pages, page_size, H_kv, d)) or "HND" (layers,
    pages, H_kv, page_size, d); bounds: keep the bf16 bound store that ``select`` (GPU Quest)
    scans; groups: also keep the group store of hierarchical selection (``select(...,
    hierarchical=True)``: 16 pages a group, refreshed on every append); max_pages_per_seq: a fixed bound on the pages of any sequence for the kernels' grids
    (None: the current longest sequence, recomputed each step). On a CPU device only the page
    bookkeeping, the page table and ``decode`` run (the append and selection operators are CUDA
    kernels; masskv.PagedKVCache is the CPU cache).
    """

    # False: a decode step's append leaves the group store to update_groups (one launch more a
    # layer; the bench's before / after of the refresh inside the append kernel).
    refresh_groups_in_append = True

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity_pages: int,
                 *, page_size: int = 16, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | int | None = None, layout: str = "NHD",
                 bounds: bool = True, groups: bool = False, codes: bool = False,
                 max_pages_per_seq: int | None = None):
        for name, val in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                          ("head_dim", head_dim), ("capacity_pages", capacity_pages),
                          ("page_size", page_size)):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"{name}: must be a positive int, got {val!r}")
        if dtype not in _POOL_DTYPES:
            raise TypeError(f"dtype: expected torch.bfloat16 or torch.float16, got {dtype}")
        if groups and not bounds:
            raise ValueError("groups: the group store is built from the bound store (bounds=True)")
        if layout not in ("NHD", "HND"):
            raise ValueError(f'layout: expected "NHD" or "HND", got {layout!r}')
        if max_pages_per_seq is not None and (not isinstance(max_pages_per_seq, int)
                                              or max_pages_per_seq < 1):
            raise ValueError(f"max_pages_per_seq: must be None or a positive int, got "
                             f"{max_pages_per_seq!r}")
        dev = torch.device("cuda") if device is None else torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type not in ("cuda", "cpu"):
            raise ValueError(f"device: a CUDA device (or the CPU, where only the page "
                             f"bookkeeping and decode run), got {dev}")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.capacity_pages, self.page_size = capacity_pages, page_size
        self.dtype, self.device, self.layout = dtype, dev, layout
        self.max_pages_per_seq = max_pages_per_seq
        L, N, P, H, d = num_layers, capacity_pages, page_size, num_kv_heads, head_dim
        pool = (L, N, P, H, d) if layout == "NHD" else (L, N, H, P, d)
        f32 = dict(dtype=torch.float32, device=dev)
        self.k_pool = torch.zeros(pool, dtype=dtype, device=dev)
        self.v_pool = torch.zeros(pool, dtype=dtype, device=dev)
        self.min = torch.zeros((L, N, H, d), **f32)
        self.max = torch.zeros((L, N, H, d), **f32)
        self.mean = torch.zeros((L, N, H, d), **f32)
        self.m2 = torch.zeros((L, N, H, d), **f32)
        self.count = torch.zeros((L, N), dtype=torch.int32, device=dev)
        self.max_vnorm = torch.zeros((L, N, H), **f32)
        self.bound_min = self.bound_max = self.bound_wmax = None
        if bounds:
            self.bound_min = torch.zeros((L, N, H, d), dtype=torch.bfloat16, device=dev)
            self.bound_max = torch.zeros((L, N, H, d), dtype=torch.bfloat16, device=dev)
            self.bound_wmax = torch.zeros((L, N, H), **f32)
        self.group_min = self.group_max = None
        # Group slots: every sequence's pages in groups of 16, plus a partial last group each
        # (64 sequences' worth of headroom).
        self.group_slots = -(-N // GROUP_PAGES) + 64 if groups else 0
        if groups:
            self.group_min = torch.zeros((L, self.group_slots, H, d), dtype=torch.bfloat16,
                                         device=dev)
            self.group_max = torch.zeros_like(self.group_min)
        # token_codes' page codes (kv::PageCodesView's layout per layer; ops.encode_page_codes
        # keeps them from the pool and min/max, ops.update_spread the spread rows from each
        # sequence's f64 key moments, kept per sequence in self._moments).
        self.code_stores: dict[str, torch.Tensor] | None = None
        if codes:
            if head_dim not in (64, 128):
                raise ValueError(f"codes: token_codes on the GPU serves head_dim 64 and 128, got "
                                 f"{head_dim}")
            u8 = dict(dtype=torch.uint8, device=dev)
            cb, wb = -(-d // 4), -(-P // 4)
            self.code_stores = dict(
                codes=torch.zeros((L, N, H, P, cb), **u8),
                range_min=torch.zeros((L, N, H, d), **u8),
                range_max=torch.zeros((L, N, H, d), **u8),
                grid=torch.zeros((L, N, H, 2), **f32),
                chan_codes=torch.zeros((L, H, d, N, wb), **u8),
                chan_ranges=torch.zeros((L, H, d, N, 2), **u8),
                chan_spread=torch.zeros((L, N, H, d), **f32))
        self._moments: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._gfree = list(range(self.group_slots - 1, -1, -1))
        self._free = list(range(N - 1, -1, -1))  # a stack: page 0 is taken first
        self._refs = [0] * N
        self._seqs: dict[int, _Seq] = {}
        self._next_id = 0
        self._step: _Step | None = None
        self._static: _Static | None = None
        self._bufs: dict[tuple, tuple[torch.Tensor, ...]] = {}

    @staticmethod
    def stores_for(method: str, hierarchical: bool = False) -> dict:
        """The constructor's store options a selection method reads: "quest" the bound store
        (and with hierarchical the group store), "token_codes" the page codes, "dense" none."""
        quest = method == "quest"
        return dict(bounds=quest, groups=quest and hierarchical, codes=method == "token_codes")

    # -- sequences (host) --------------------------------------------------------------------
    def create(self) -> int:
        """A new empty sequence; returns its id."""
        sid = self._next_id
        self._next_id += 1
        self._seqs[sid] = _Seq()
        if self.code_stores is not None:
            shape = (self.num_layers, self.num_kv_heads, self.head_dim)
            self._moments[sid] = (torch.zeros(shape, dtype=torch.float64, device=self.device),
                                  torch.zeros(shape, dtype=torch.float64, device=self.device))
        return sid

    def _seq(self, sid: int) -> _Seq:
        try:
            return self._seqs[sid]
        except (KeyError, TypeError):
            raise ValueError(f"seq: no sequence {sid!r} in this cache") from None

    def length(self, sid: int) -> int:
        """Tokens of a sequence (after static steps: read from the device, which ends them)."""
        self.end_static()
        return self._seq(sid).length

    def free(self, sid: int) -> None:
        """Forgets a sequence; its pages return to the pool when no fork shares them."""
        self.end_static()
        s = self._seq(sid)
        for p in s.pages:
            self._release(p)
        self._gfree.extend(reversed(s.groups))
        self._end_moments()
        del self._seqs[sid]
        self._moments.pop(sid, None)
        self._step = None

    def fork(self, sid: int) -> int:
        """A new sequence sharing sid's tokens (its pages, copy-on-write). With codes=True it
        ends the current step (begin the next one)."""
        self.end_static()
        src = self._seq(sid)
        if len(src.groups) > len(self._gfree):
            raise _error(f"group slots: the fork needs {len(src.groups)}, "
                         f"{len(self._gfree)} are free", "out_of_memory", "capacity_pages")
        new = self.create()
        groups = [self._gfree.pop() for _ in src.groups]
        if groups:  # a sequence's groups are its own (its last one changes on append): copy
            to = torch.tensor(groups, device=self.device)
            fr = torch.tensor(src.groups, device=self.device)
            self.group_min[:, to] = self.group_min[:, fr]
            self.group_max[:, to] = self.group_max[:, fr]
        self._seqs[new] = _Seq(list(src.pages), src.length, groups)
        if self.code_stores is not None:  # the key moments so far are the source's
            self._end_moments()
            self._moments[new] = tuple(t.clone() for t in self._moments[sid])
            self._step = None  # as free(): the next step is begun anew
        for p in src.pages:
            self._refs[p] += 1
        return new

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def grow(self, capacity_pages: int) -> None:
        """Enlarges the pool to capacity_pages pages per layer (and the group store to match),
        keeping every sequence, page id and stored value. The tensors are new, so a CUDA graph
        captured before must be captured again, and the current step ends (begin the next one)."""
        self.end_static()
        if not isinstance(capacity_pages, int) or capacity_pages < self.capacity_pages:
            raise ValueError(f"capacity_pages: must be an int >= the current "
                             f"{self.capacity_pages}, got {capacity_pages!r}")
        N, old_n = capacity_pages, self.capacity_pages

        def larger(t: torch.Tensor, n: int) -> torch.Tensor:
            out = torch.zeros((t.shape[0], n, *t.shape[2:]), dtype=t.dtype, device=t.device)
            out[:, :t.shape[1]].copy_(t)
            return out

        for name in _PAGE_STORES:
            if getattr(self, name) is not None:
                setattr(self, name, larger(getattr(self, name), N))
        self._free = list(range(N - 1, old_n - 1, -1)) + self._free
        self._refs += [0] * (N - old_n)
        self.capacity_pages = N
        if self.group_min is not None:
            slots = -(-N // GROUP_PAGES) + 64
            self.group_min = larger(self.group_min, slots)
            self.group_max = larger(self.group_max, slots)
            self._gfree = list(range(slots - 1, self.group_slots - 1, -1)) + self._gfree
            self.group_slots = slots
        if self.code_stores is not None:
            self._end_moments()
            for name, t in self.code_stores.items():
                if name.startswith("chan_") and name != "chan_spread":  # [L][H][d][page][...]
                    out = torch.zeros((*t.shape[:3], N, *t.shape[4:]), dtype=t.dtype,
                                      device=t.device)
                    out[:, :, :, :t.shape[3]].copy_(t)
                    self.code_stores[name] = out
                else:
                    self.code_stores[name] = larger(t, N)
        self._bufs.clear()  # the page table's index buffer is capacity_pages long
        self._step = None

    def _take(self) -> int:
        if not self._free:
            raise _error(f"capacity_pages: all {self.capacity_pages} pages are in use",
                         "out_of_memory", "capacity_pages")
        p = self._free.pop()
        self._refs[p] = 1
        return p

    def _release(self, p: int) -> None:
        self._refs[p] -= 1
        if self._refs[p] == 0:
            self._free.append(p)

    def _shared_last(self, s: _Seq) -> bool:
        """Whether s's last page is partly filled and shared with a fork (an append copies it
        first: one page more)."""
        return bool(s.pages) and s.length % self.page_size != 0 and self._refs[s.pages[-1]] > 1

    def _own_last_page(self, s: _Seq) -> None:
        """Copy-on-write: a partly filled last page that a fork shares is copied before an
        append writes into it (every layer's tokens and summaries)."""
        if not self._shared_last(s):
            return
        old = s.pages[-1]
        new = self._take()
        for t in self._stores_all():
            t[:, new].copy_(t[:, old])
        self._release(old)
        s.pages[-1] = new

    def _stores_all(self) -> list[torch.Tensor]:
        """Every layer's pool and stores, in the operators' argument order (the bound store
        last, when kept)."""
        return [t for t in (getattr(self, n) for n in _PAGE_STORES) if t is not None]

    # -- a step (host, once for all layers) ----------------------------------------------------
    def begin_step(self, seqs: list[int], tokens: int | list[int] = 1) -> None:
        """Takes the pages for `tokens` new tokens of each sequence in `seqs` (the batch rows, in
        order) and writes the step's positions and page table to the device. The lengths
        advance now; every layer then appends its keys and values with ``append``.

        tokens: one count for every row, or a list of counts per row (rows of a padded batch:
        each >= 0, at least one > 0). With a list, ``append`` takes (B, max(tokens), H_kv, d)
        tensors whose row b holds its tokens[b] new tokens at the end (left padding, as
        transformers pads a batch for generation); the rest of the row is not stored."""
        self.end_static()
        rows = self._batch(seqs)
        counts = self._step_counts(tokens, len(rows))
        tokens = max(counts)
        P = self.page_size
        # New pages, plus a copy of each partly filled last page a fork still shares.
        need = sum(_cdiv(s.length + n, P) - len(s.pages) + (n > 0 and self._shared_last(s))
                   for s, n in zip(rows, counts))
        if need > len(self._free):
            raise _error(f"capacity_pages: the step needs {need} new pages, {len(self._free)} "
                         f"of {self.capacity_pages} are free", "out_of_memory", "capacity_pages")
        gneed = (sum(_cdiv(_cdiv(s.length + n, P), GROUP_PAGES) - len(s.groups)
                     for s, n in zip(rows, counts)) if self.group_min is not None else 0)
        if gneed > len(self._gfree):
            raise _error(f"group slots: the step needs {gneed} new group slots, "
                         f"{len(self._gfree)} of {self.group_slots} are free", "out_of_memory",
                         "capacity_pages")
        page, slot, touched, touched_tokens = [], [], [], []
        for s, n in zip(rows, counts):
            if n == 0:
                continue
            self._own_last_page(s)
            first_page = s.length // P
            for pos in range(s.length, s.length + n):
                if pos // P == len(s.pages):
                    s.pages.append(self._take())
                page.append(s.pages[pos // P])
                slot.append(pos % P)
            s.length += n
            while self.group_min is not None and \
                    len(s.groups) * GROUP_PAGES < len(s.pages):
                s.groups.append(self._gfree.pop())
            for j in range(first_page, len(s.pages)):
                touched.append(s.pages[j])
                touched_tokens.append(min(P, s.length - j * P))
        B = len(rows)
        max_pages = max(len(s.pages) for s in rows)
        if self.max_pages_per_seq is not None and max_pages > self.max_pages_per_seq:
            raise _error(f"max_pages_per_seq: a sequence holds {max_pages} pages, more than "
                         f"the fixed bound {self.max_pages_per_seq}", "out_of_range",
                         "max_pages_per_seq")
        i32 = dict(dtype=torch.int32)
        indptr, indices, last = self._buffers(("table", B), [(B + 1, 0),
                                                            (self.capacity_pages, -1), (B, 1)])
        used = _fill_csr([s.pages for s in rows], indptr, indices)
        last.copy_(torch.tensor([s.length - (len(s.pages) - 1) * P for s in rows], **i32))
        src = None
        if any(n != tokens for n in counts):  # which of the (B * tokens) rows are new tokens
            src = torch.tensor([b * tokens + t for b, n in enumerate(counts)
                                for t in range(tokens - n, tokens)], dtype=torch.long,
                               device=self.device)
            pg = torch.tensor(page, **i32).to(self.device)
            sl = torch.tensor(slot, **i32).to(self.device)
        else:  # buffers kept per shape: a captured decode step reads them on every replay
            pg, sl = self._buffers(("pos", B, tokens), [(B * tokens, 0), (B * tokens, 0)])
            pg.copy_(torch.tensor(page, **i32))
            sl.copy_(torch.tensor(slot, **i32))
        self._end_moments()
        # The touched pages in buffers kept per shape too: a captured decode step (one page a
        # sequence) reads them on every replay.
        tp, tt = self._buffers(("touched", B, tokens, len(touched)),
                               [(len(touched), 0), (len(touched), 0)])
        tp.copy_(torch.tensor(touched, **i32))
        tt.copy_(torch.tensor(touched_tokens, **i32))
        self._step = _Step(list(seqs), tokens, counts, pg, sl, tp, tt, indptr, indices, last,
                           used, max_pages, src=src)
        if src is not None:
            self._step.counts_dev = torch.tensor(counts, **i32).to(self.device)
        if self.code_stores is not None:
            # The batch's key moments, [layer][b][H][d], in buffers kept per batch size (the
            # storage a captured step keeps, as the page table's).
            key = ("moments", B)
            if key not in self._bufs:
                shape = (self.num_layers, B, self.num_kv_heads, self.head_dim)
                self._bufs[key] = tuple(torch.zeros(shape, dtype=torch.float64,
                                                    device=self.device) for _ in range(2))
            mean_b, m2_b = self._bufs[key]
            for i, sid in enumerate(seqs):
                mean_b[:, i].copy_(self._moments[sid][0])
                m2_b[:, i].copy_(self._moments[sid][1])
            self._step.mean_seq, self._step.m2_seq = mean_b, m2_b
        if self.group_min is not None:
            gptr, gids = self._buffers(("groups", B), [(B + 1, 0), (self.group_slots, -1)])
            _fill_csr([s.groups for s in rows], gptr, gids)
            self._step.group_indptr, self._step.group_indices = gptr, gids

    def _batch(self, seqs: list[int]) -> list[_Seq]:
        rows = [self._seq(s) for s in seqs]
        if not rows:
            raise ValueError("seqs: empty batch")
        if len(set(seqs)) != len(seqs):
            raise ValueError("seqs: a sequence appears twice in one step")
        return rows

    # -- static decode steps (device only, for CUDA graphs of a whole model step) -------------
    @property
    def static_active(self) -> bool:
        return self._static is not None

    def begin_static(self, seqs: list[int], max_tokens: int) -> None:
        """Decode steps of a fixed batch that run on the device alone: takes each row's pages
        and group slots up to max_tokens tokens now, so that ``static_step`` (one token a row,
        no host work, no host sync) can begin every later step inside a captured graph. The
        grids are fixed (max_pages_per_seq = ceil(max_tokens / page_size)). The host's
        lengths catch up when the static steps end (``end_static``, which every host-side
        method calls first); the pages not used go back then. Not with codes=True."""
        if self.code_stores is not None:
            raise ValueError("begin_static: token_codes' key moments (codes=True) are kept on "
                             "the host each step; static steps serve dense and quest")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: must be a positive int, got {max_tokens!r}")
        self.end_static()
        rows = self._batch(seqs)
        P = self.page_size
        Pm = _cdiv(max_tokens, P)
        if self.max_pages_per_seq is not None and self.max_pages_per_seq < Pm:
            raise ValueError(f"max_tokens: {Pm} pages a row, more than max_pages_per_seq "
                             f"{self.max_pages_per_seq}")
        if max(s.length for s in rows) >= max_tokens:
            raise _error(f"max_tokens: a row holds {max(s.length for s in rows)} tokens, no room "
                         f"for a step within {max_tokens}", "out_of_range", "max_tokens")
        need = sum(Pm - len(s.pages) + self._shared_last(s) for s in rows)
        Gm = _cdiv(Pm, GROUP_PAGES) if self.group_min is not None else 0
        gneed = sum(Gm - len(s.groups) for s in rows) if Gm else 0
        if need > len(self._free) or gneed > len(self._gfree):
            raise _error(f"capacity_pages: static steps up to {max_tokens} tokens a row need "
                         f"{need} more pages ({len(self._free)} free) and {gneed} group slots "
                         f"({len(self._gfree)} free)", "out_of_memory", "capacity_pages")
        for s in rows:
            self._own_last_page(s)
            s.reserved = [self._take() for _ in range(Pm - len(s.pages))]
            s.greserved = [self._gfree.pop() for _ in range(Gm - len(s.groups))] if Gm else []
        i32 = dict(dtype=torch.int32)
        B = len(rows)
        # The same tensors for every run of static steps of this shape (kept like the page
        # table's buffers): a graph captured for one turn replays on the next.
        (lengths, row_pages, row_groups, iota, page, slot, touched, ones, indptr, indices, last,
         gptr, gids, over) = self._buffers(("static", B, Pm, Gm), [
             (B, 0), (B * Pm, 0), (B * max(Gm, 1), 0), (B * Pm, 0), (B, 0), (B, 0), (B, 0),
             (B, 1), (B + 1, 0), (B * Pm, 0), (B, 0), (B + 1, 0), (B * max(Gm, 1), 0), (1, 0)])
        lengths.copy_(torch.tensor([s.length for s in rows], **i32))
        row_pages.copy_(torch.tensor([p for s in rows for p in s.pages + s.reserved], **i32))
        if Gm:
            row_groups.copy_(torch.tensor([g for s in rows for g in s.groups + s.greserved],
                                          **i32))
        iota.copy_(torch.arange(B * Pm, **i32))
        over.zero_()
        self._static = _Static(rows, lengths, [s.length for s in rows], row_pages.view(B, Pm),
                               row_groups.view(B, Gm) if Gm else None, iota, over)
        self._step = _Step(list(seqs), 1, [1] * B, page, slot, touched, ones, indptr, indices,
                           last, B * Pm, Pm)
        if Gm:
            self._step.group_indptr, self._step.group_indices = gptr, gids

    def static_step(self) -> None:
        """Begins a decode step of the static batch on the device (one token a row): its page
        and slot, the lengths, the page table and the group table, all in the same tensors
        every step (what a captured graph replays). Call before the step's first append."""
        sc, st = self._static, self._step
        if sc is None:
            raise RuntimeError("static_step: no static steps begun (begin_static)")
        P = self.page_size
        pos = sc.lengths
        Pm = sc.row_pages.shape[1]
        # Past max_tokens: flagged (end_static raises), the index kept inside the row's pages.
        # Functional until the writes at the end (no read of a tensor this step wrote; see
        # _fill_rows).
        torch.logical_or(sc.over, (pos >= Pm * P).any(), out=sc.over)
        st.page.copy_(sc.row_pages.gather(1, (pos // P).clamp(max=Pm - 1).long()[:, None])[:, 0])
        st.slot.copy_(pos % P)
        n = pos + 1
        pages = (n + P - 1) // P
        st.last_page_len.copy_(n - (pages - 1) * P)
        pos.copy_(n)
        _fill_rows(pages, st.indptr, st.indices, sc.row_pages, sc.iota)
        if sc.row_groups is not None:
            groups = (pages + GROUP_PAGES - 1) // GROUP_PAGES
            _fill_rows(groups, st.group_indptr, st.group_indices, sc.row_groups,
                       sc.iota[:sc.row_groups.numel()])

    def end_static(self) -> None:
        """Ends static steps: reads the lengths from the device (a host sync), gives the pages
        and group slots taken ahead but not used back, and ends the step."""
        sc = self._static
        if sc is None:
            return
        self._static = None
        P = self.page_size
        cap = sc.row_pages.shape[1] * P
        over = bool(sc.over.any())
        for s, n in zip(sc.rows, sc.lengths.tolist()):
            n = min(n, cap)
            pages, groups = s.pages + s.reserved, s.groups + s.greserved
            k = _cdiv(n, P)
            s.length, s.pages, s.reserved = n, pages[:k], []
            for p in pages[k:]:
                self._release(p)
            if groups:
                g = _cdiv(k, GROUP_PAGES)
                s.groups, s.greserved = groups[:g], []
                self._gfree.extend(reversed(groups[g:]))
        self._step = None
        if over:
            raise _error(f"max_tokens: static steps ran past {cap} tokens a row (begin_static's "
                         "max_tokens); the steps past it overwrote the row's last page",
                         "out_of_range", "max_tokens")

    def static_tensors(self) -> list[torch.Tensor]:
        """Every tensor a static step reads or writes (the pool, the stores, the step's
        buffers): torch.compile's CUDA graphs need their addresses fixed
        (torch._dynamo.mark_static_address)."""
        st, sc = self._current(), self._static
        out = [*self._stores_all(), st.page, st.slot, st.indptr, st.indices, st.last_page_len]
        if self.group_min is not None:
            out += [self.group_min, self.group_max, st.group_indptr, st.group_indices]
        if sc is not None:
            out += [sc.lengths, sc.row_pages, sc.iota, sc.over]
            if sc.row_groups is not None:
                out.append(sc.row_groups)
        return out

    def static_steps(self) -> int:
        """Static decode steps run since begin_static (a host read of the device lengths; 0
        when none are active)."""
        sc = self._static
        return 0 if sc is None else int(sc.lengths[0]) - sc.start[0]

    def _step_counts(self, tokens, B: int) -> list[int]:
        """begin_step's tokens as a count per row (checked before anything changes)."""
        if isinstance(tokens, bool) or not isinstance(tokens, (int, list, tuple)):
            raise TypeError(f"tokens: expected an int or a list of ints, got "
                            f"{type(tokens).__name__}")
        if isinstance(tokens, int):
            if tokens < 1:
                raise ValueError(f"tokens: must be a positive int, got {tokens!r}")
            return [tokens] * B
        counts = list(tokens)
        if len(counts) != B:
            raise ValueError(f"tokens: {len(counts)} counts for a batch of {B} rows")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts) or \
                max(counts) < 1:
            raise ValueError(f"tokens: counts must be ints >= 0, at least one > 0; got {counts}")
        return counts

    def _buffers(self, key: tuple, specs: list[tuple[int, int]]) -> tuple[torch.Tensor, ...]:
        """Device int32 buffers (size, fill value) kept per key (a batch size, a step's shape):
        every step of that shape writes the same storage, which a captured graph keeps."""
        if key not in self._bufs:
            self._bufs[key] = tuple(torch.full((n,), v, dtype=torch.int32, device=self.device)
                                    for n, v in specs)
        return self._bufs[key]

    def _current(self) -> _Step:
        if self._step is None:
            raise RuntimeError("TorchPagedCache: no step begun (call begin_step(seqs, tokens) "
                               "first; free() ends the current step)")
        return self._step

    @property
    def step_tokens(self) -> int:
        """New tokens per sequence of the current step."""
        return self._current().tokens

    @property
    def step_counts(self) -> list[int]:
        """New tokens of each row of the current step."""
        return list(self._current().counts)

    @property
    def step_max_pages(self) -> int:
        """The grid bound the step's kernels get: max_pages_per_seq, else the longest sequence."""
        st = self._current()
        return self.max_pages_per_seq or st.max_pages

    def table(self, full: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's page table (FlashInfer's CSR): int32 indptr (B + 1,), indices, last_page_len
        (B,), on the cache's device. indices holds indptr[B] entries, or with full=True the whole
        (capacity_pages,) buffer whose prefix they are: the same storage every step, which a
        captured CUDA graph keeps (the CUDA kernels read only the prefix indptr gives)."""
        st = self._current()
        if full:
            return st.indptr, st.indices, st.last_page_len
        # Static steps write the table on the device: its length is read back (a host sync).
        used = st.used if self._static is None else int(st.indptr[-1])
        return st.indptr, st.indices[:used], st.last_page_len

    def _kernel_table(self):
        # CUDA: the whole buffer (graph-safe); the CPU's checks want the exact prefix.
        return self.table(full=self.device.type == "cuda")

    # -- per layer (device) --------------------------------------------------------------------
    def _store_args(self, layer: int) -> tuple:
        """Layer `layer`'s pool and stores as the operators take them (None for a bound store
        not kept)."""
        ts = [t[layer] for t in self._stores_all()]
        return (*ts, *[None] * (len(ops._STORE_ARGS) - len(ts)))

    def _check_layer(self, layer: int) -> None:
        if not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer: expected an int in [0, {self.num_layers}), got {layer!r}")

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes the step's new keys and values of `layer`: k, v (B, tokens, H_kv, d) float
        tensors on the cache's device, and updates the page summaries. One token per sequence
        folds it into its page (masskv::append, the decode step); more rewrite the pool rows
        and rebuild the touched pages' summaries (masskv::summarize_pages): the same bits
        either way."""
        st = self._current()
        self._check_layer(layer)
        B, T, H, d = len(st.seqs), st.tokens, self.num_kv_heads, self.head_dim
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != (B, T, H, d):
                raise ValueError(f"{name}: expected shape {(B, T, H, d)} (batch, the step's "
                                 f"tokens, H_kv, d), got {tuple(t.shape)}")
            if t.device != self.device:
                raise ValueError(f"{name}: on {t.device}, the cache on {self.device}")
            if not t.dtype.is_floating_point:
                raise TypeError(f"{name}: expected a floating dtype, got {t.dtype}")
        args = self._store_args(layer)
        if T == 1 and st.uniform:
            # The group store's last groups are refreshed by the append kernel itself (one
            # launch fewer a layer than update_groups after it; the same bits).
            fused = self.group_min is not None and self.refresh_groups_in_append
            gmin, gmax = ((self.group_min[layer], self.group_max[layer]) if fused
                          else (None, None))
            tables = ((*self._kernel_table()[:2], st.group_indptr, st.group_indices) if fused
                      else ())
            torch.ops.masskv.append(*args, k[:, 0].float().contiguous(),
                                    v[:, 0].float().contiguous(), st.page, st.slot, gmin, gmax,
                                    self.layout, *tables)
            if not fused:
                self._update_groups(layer, last_only=True)
            self._update_codes(layer)
            return
        # Many tokens (a prefill): the pool rows by index, then the touched pages' summaries
        # from the stored tokens. A value that overflows the pool's dtype is stored as inf and
        # then flagged by the refresh (masskv.Error non_finite).
        self._write_rows(layer, k, v)
        torch.ops.masskv.summarize_pages(*args, st.touched, st.touched_tokens, self.layout)
        self._update_groups(layer, last_only=False)
        self._update_codes(layer)

    def _write_rows(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The step's tokens k, v (B, T, H_kv, d) into their pool slots of `layer`, rounded to the
        pool's dtype by torch's round-to-nearest-even, as the append kernel rounds."""
        st = self._current()
        B, T, H, d = k.shape
        kp, vp = self.k_pool[layer], self.v_pool[layer]
        if self.layout == "HND":
            kp, vp = kp.transpose(1, 2), vp.transpose(1, 2)  # views: [page][slot][head][d]
        idx = (st.page.long(), st.slot.long())
        k, v = k.reshape(B * T, H, d), v.reshape(B * T, H, d)
        if not st.uniform:  # a padded batch: the rows' new tokens only
            k, v = k[st.src], v[st.src]
        kp[idx] = k.to(self.dtype)
        vp[idx] = v.to(self.dtype)

    def _end_moments(self) -> None:
        """The current step's batch moments back into each sequence's (page codes)."""
        st = self._step
        if st is None or st.mean_seq is None:
            return
        for i, sid in enumerate(st.seqs):
            if sid in self._moments:
                self._moments[sid][0].copy_(st.mean_seq[:, i])
                self._moments[sid][1].copy_(st.m2_seq[:, i])
        st.mean_seq = st.m2_seq = None

    def _update_codes(self, layer: int) -> None:
        """Layer `layer`'s page codes of the step's pages and its spread rows."""
        if self.code_stores is None:
            return
        st = self._current()
        stores = self._store_args(layer)[:8]
        codes = [self.code_stores[n][layer] for n in ops._CODE_ARGS]
        torch.ops.masskv.encode_page_codes(*stores, *codes, st.touched, st.touched_tokens,
                                           self.layout)
        torch.ops.masskv.update_spread(*stores, *codes, *self._kernel_table(), st.tokens,
                                       st.mean_seq[layer], st.m2_seq[layer], self.layout,
                                       st.counts_dev)

    def history(self, layer: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every stored key and value of the step's sequences in layer `layer`, as (B, S, H_kv,
        d) tensors of the pool's dtype (a copy): what a prefill chunk after earlier tokens
        attends to. Sequences of one length S; or, with `width` >= the longest, each row's
        tokens at the end of a (B, width, H_kv, d) tensor whose other entries are 0 (a
        left-padded batch, the padding columns being masked by the caller)."""
        st = self._current()
        self._check_layer(layer)
        rows = [self._seq(s) for s in st.seqs]
        longest = max(r.length for r in rows)
        if width is None:
            if any(r.length != longest for r in rows):
                raise ValueError("history: the step's sequences differ in length "
                                 f"({sorted({r.length for r in rows})}); give width")
            width = longest
        elif not isinstance(width, int) or width < longest:
            raise ValueError(f"width: must be an int >= the longest sequence ({longest}), got "
                             f"{width!r}")
        H, d = self.num_kv_heads, self.head_dim
        pages = [torch.tensor(r.pages, dtype=torch.long, device=self.device) for r in rows]
        out = []
        for pool in (self.k_pool[layer], self.v_pool[layer]):
            if self.layout == "HND":
                pool = pool.transpose(1, 2)  # [page][slot][head][d]
            t = torch.zeros((len(rows), width, H, d), dtype=pool.dtype, device=self.device)
            for b, r in enumerate(rows):  # row b's tokens in its last r.length columns
                if r.length:
                    t[b, width - r.length:] = pool[pages[b]].reshape(-1, H, d)[:r.length]
            out.append(t)
        return out[0], out[1]

    def _update_groups(self, layer: int, last_only: bool) -> None:
        """The group store of `layer` from its page store: each sequence's last group after a
        token was folded in, every group after a chunk (a decode step touches only the last)."""
        if self.group_min is None:
            return
        st = self._current()
        torch.ops.masskv.update_groups(
            self.k_pool[layer], self.v_pool[layer], *self._kernel_table(), self.bound_min[layer],
            self.bound_max[layer], self.group_min[layer], self.group_max[layer], st.group_indptr,
            st.group_indices, self.layout, last_only, self.step_max_pages)

    def kv(self, layer: int) -> masskv.KV:
        """Layer `layer` as a masskv.KV over the step's page table (for masskv.decode etc.)."""
        self._check_layer(layer)
        return masskv.KV.from_arrays(self.k_pool[layer], self.v_pool[layer],
                                     *self._kernel_table(), layout=self.layout)

    def select(self, layer: int, q: torch.Tensor, *, budget_tokens: int, sink_pages: int = 1,
               window_tokens: int = 0, scale: float = 0.0, hierarchical: bool = False,
               cover: float = 2.0, method: str = "quest",
               code_channels: float = 0.375) -> tuple[torch.Tensor, torch.Tensor]:
        """GPU selection for the step's queries q (float32 (B, Hq, d)): int32 lists ids (B,
        H_kv, capacity) -1 padded and count (B, H_kv). method "quest": pages by the bf16 bound
        store (hierarchical: the group store first, the cache needs groups=True, then only the
        chosen groups' pages); "token_codes": tokens ranked on the page codes (codes=True),
        the lists decode takes with unit="token" — in two passes (code_channels 0.375: the
        CPU's default) or one (1: every token on every channel; as accurate in the eval,
        docs/results/eval-standard-smollm2/, and about half the GPU's selection time)."""
        if method == "token_codes":
            if self.code_stores is None:
                raise ValueError("select: token_codes reads the page codes "
                                 "(TorchPagedCache(..., codes=True))")
            self._check_layer(layer)
            return torch.ops.masskv.token_codes_select(
                q, self.k_pool[layer], self.v_pool[layer], *self._kernel_table(),
                *[self.code_stores[n][layer] for n in ops._CODE_ARGS], self.layout,
                budget_tokens, sink_pages, window_tokens, scale, self.step_max_pages,
                code_channels)
        if method != "quest":
            raise ValueError(f'select: method is "quest" or "token_codes", got {method!r}')
        if self.bound_min is None:
            raise ValueError("select: this cache keeps no bound store (bounds=False)")
        self._check_layer(layer)
        if hierarchical:
            if self.group_min is None:
                raise ValueError("select: hierarchical selection needs the group store "
                                 "(TorchPagedCache(..., groups=True))")
            st = self._current()
            return torch.ops.masskv.hier_select(
                q, self.k_pool[layer], self.v_pool[layer], *self._kernel_table(),
                self.bound_min[layer], self.bound_max[layer], self.group_min[layer],
                self.group_max[layer], st.group_indptr, st.group_indices, self.layout,
                budget_tokens, sink_pages, window_tokens, scale, cover, self.step_max_pages)
        return torch.ops.masskv.quest_select(
            q, self.k_pool[layer], self.v_pool[layer], *self._kernel_table(), self.bound_min[layer],
            self.bound_max[layer], self.layout, budget_tokens, sink_pages, window_tokens, scale,
            self.step_max_pages)

    def prefill(self, layer: int, q: torch.Tensor, *, budget_tokens: int = 0,
                block: int = 64, sink_blocks: int = 1,
                scale: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal prefill over layer `layer` of the last T tokens of each of the step's
        sequences (after ``append``; usually the step's own tokens): q (B, T, Hq, d) in the
        pool's dtype. budget_tokens 0: dense; > 0: block-sparse, each block of `block` queries
        (64 or 128) reads the sink blocks, its own block and the best others by the mean-pooled
        indexer, ceil(budget_tokens / block) key blocks in all. Returns out (B, T, Hq, d) in the
        pool's dtype and float32 lse (B, T, Hq). After a step of a padded batch (begin_step
        with a count per row), T is the step's tokens and row b's queries are its last
        counts[b] rows of q, as append took them; the other rows of out are 0, of lse -inf."""
        st = self._current()
        self._check_layer(layer)
        if self._static is not None:
            raise RuntimeError("prefill: static decode steps are running (begin_step ends them)")
        B = len(st.seqs)
        shortest = min(self._seq(s).length for s in st.seqs)
        if not st.uniform:
            if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[0] != B or \
                    q.shape[1] != st.tokens:
                raise ValueError(f"q: expected a (B={B}, T={st.tokens}, Hq, d) tensor (the "
                                 "step's tokens; each row's own at its end)")
        elif not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[0] != B or \
                not 1 <= q.shape[1] <= shortest:
            raise ValueError(f"q: expected a (B={B}, T, Hq, d) tensor, 1 <= T <= {shortest} "
                             "(the shortest sequence)")
        T = int(q.shape[1])
        if q.dtype != self.dtype:
            raise TypeError(f"q: expected {self.dtype} (the pool's dtype), got {q.dtype}")
        if not isinstance(budget_tokens, int) or budget_tokens < 0:
            raise ValueError(f"budget_tokens: must be an int >= 0, got {budget_tokens!r}")
        Hq, d = q.shape[2], q.shape[3]
        rows = q.reshape(B * T, Hq, d)
        counts = [T] * B if st.uniform else st.counts
        if st.uniform:
            nqb = _cdiv(T, block)
            q_indptr, qb_indptr = self._buffers(("prefill", B, T, block),
                                                [(B + 1, 0), (B + 1, 0)])
            q_indptr.copy_(torch.arange(0, (B + 1) * T, T, dtype=torch.int32))
            qb_indptr.copy_(torch.arange(0, (B + 1) * nqb, nqb, dtype=torch.int32))
        else:  # only each row's own queries, back to back
            rows = rows[st.src]
            ptr = torch.tensor([0] + counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            bptr = torch.tensor([0] + [_cdiv(n, block) for n in counts],
                                dtype=torch.int32).cumsum(0, dtype=torch.int32)
            q_indptr, qb_indptr = ptr.to(self.device), bptr.to(self.device)
        q_blocks = sum(_cdiv(n, block) for n in counts)
        max_len = max(self._seq(s).length for s in st.seqs)
        blocks = _cdiv(budget_tokens, block) if budget_tokens else 0
        out, lse = torch.ops.masskv.prefill(
            rows, self.k_pool[layer], self.v_pool[layer],
            *self._kernel_table(), q_indptr, qb_indptr if blocks else None, self.layout, T,
            scale, blocks, q_blocks, block, block, sink_blocks, max_len)
        if not st.uniform:
            full = torch.zeros((B * T, Hq, d), dtype=out.dtype, device=out.device)
            full_lse = torch.full((B * T, Hq), -float("inf"), dtype=lse.dtype, device=lse.device)
            full[st.src], full_lse[st.src] = out, lse
            out, lse = full, full_lse
        return out.view(B, T, Hq, d), lse.view(B, T, Hq)

    def decode(self, layer: int, q: torch.Tensor,
               selection: tuple[torch.Tensor, torch.Tensor] | None = None, *,
               alpha: float = 1.0, scale: float = 0.0,
               unit: str = "page") -> tuple[torch.Tensor, torch.Tensor]:
        """Decode attention of the step's queries q (float32 (B, Hq, d)) over layer `layer`:
        dense, or over selection = (ids, count) from ``select`` (unit "token" for
        method="token_codes"'s lists). Returns float32 out (B, Hq, d) and lse_or_tau (B, Hq)."""
        self._check_layer(layer)
        ids, count = (None, None) if selection is None else selection
        return torch.ops.masskv.decode(q, self.k_pool[layer], self.v_pool[layer],
                                       *self._kernel_table(), ids, count, self.layout, alpha,
                                       scale, self.step_max_pages, unit)
