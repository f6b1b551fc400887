"""masskv.torch_cache.TorchPagedCache's host side on the CPU: page allocation, the page table of
a step, fork with copy-on-write, free, capacity errors, and decode over pool rows written by
hand against the float64 reference. The device side (append, summaries, selection) runs in
test_ops.py on the GPU machine. Skipped where torch is absent (CI)."""

import numpy as np
import pytest

import masskv

torch = pytest.importorskip("torch")
from masskv.torch_cache import TorchPagedCache  # noqa: E402


def cpu_cache(**kw):
    args = dict(page_size=4, device="cpu", bounds=False)
    args.update(kw)
    return TorchPagedCache(2, 2, 64, 16, **args)


def table(c):
    indptr, indices, last = (t.numpy().copy() for t in c.table())
    return indptr, indices[:indptr[-1]], last


def test_a_step_takes_pages_and_writes_the_page_table():
    c = cpu_cache()
    a, b = c.create(), c.create()
    c.begin_step([a, b], 6)                     # 2 pages each (4 + 2)
    indptr, indices, last = table(c)
    assert indptr.tolist() == [0, 2, 4] and last.tolist() == [2, 2]
    assert sorted(indices.tolist()) == [0, 1, 2, 3]
    assert c.step_tokens == 6 and c.step_max_pages == 2 and c.free_pages == 12
    c.begin_step([b], 3)                        # b: 9 tokens, 3 pages; the batch is [b] now
    indptr, indices, last = table(c)
    assert indptr.tolist() == [0, 3] and last.tolist() == [1]
    assert c.length(a) == 6 and c.length(b) == 9


def test_fork_shares_pages_and_copies_a_partial_last_page_on_write():
    c = cpu_cache()
    a = c.create()
    c.begin_step([a], 6)
    c.k_pool[:, :2] = torch.arange(2 * 4 * 2 * 64, dtype=torch.float32).view(2, 4, 2, 64).to(
        torch.bfloat16)[None]
    b = c.fork(a)
    assert c.free_pages == 14                   # nothing new yet: both share 2 pages
    c.begin_step([b], 1)                        # b writes into its partial page: a copy first
    assert c.free_pages == 13
    pa, pb = c._seqs[a].pages, c._seqs[b].pages
    assert pa[0] == pb[0] and pa[1] != pb[1]
    assert torch.equal(c.k_pool[:, pb[1]], c.k_pool[:, pa[1]])   # every layer copied
    c.free(a)
    c.free(b)
    assert c.free_pages == 16


def test_capacity_is_checked_before_anything_changes():
    c = cpu_cache()
    s = c.create()
    with pytest.raises(masskv.Error, match="needs 17 new pages") as e:
        c.begin_step([s], 65)
    assert e.value.code == "out_of_memory" and c.length(s) == 0 and c.free_pages == 16
    c = cpu_cache(max_pages_per_seq=2)
    s = c.create()
    with pytest.raises(masskv.Error, match="max_pages_per_seq"):
        c.begin_step([s], 9)


def test_bad_arguments_are_named():
    c = cpu_cache()
    s = c.create()
    with pytest.raises(ValueError, match="seq: no sequence 7"):
        c.begin_step([7], 1)
    with pytest.raises(ValueError, match="appears twice"):
        c.begin_step([s, s], 1)
    with pytest.raises(ValueError, match="tokens: must be a positive int"):
        c.begin_step([s], 0)
    with pytest.raises(RuntimeError, match="no step begun"):
        c.table()
    c.begin_step([s], 2)
    with pytest.raises(ValueError, match=r"k: expected shape \(1, 2, 2, 64\)"):
        c.append(0, torch.zeros(1, 3, 2, 64), torch.zeros(1, 3, 2, 64))
    with pytest.raises(ValueError, match="layer: expected an int in"):
        c.decode(5, torch.zeros(1, 4, 64))
    with pytest.raises(TypeError, match="dtype"):
        TorchPagedCache(1, 2, 64, 4, device="cpu", dtype=torch.float32)


def test_decode_over_hand_written_rows_matches_the_reference():
    rng = np.random.default_rng(3)
    c = cpu_cache(layout="HND")
    a, b = c.create(), c.create()
    c.begin_step([a, b], 7)
    kv_pages = torch.from_numpy(rng.standard_normal((2, 16, 2, 4, 64), dtype=np.float32))
    c.k_pool.copy_(kv_pages.to(torch.bfloat16))
    c.v_pool.copy_((kv_pages * 0.5).to(torch.bfloat16))
    q = torch.randn(2, 4, 64)
    out, lse = c.decode(1, q)
    ref, ref_lse = masskv.decode_reference(q.numpy(), c.kv(1))
    np.testing.assert_allclose(out.numpy(), ref, atol=3e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=3e-5)


def test_group_slots_follow_the_pages_and_forks_copy_them():
    c = TorchPagedCache(2, 2, 64, 64, page_size=4, device="cpu", groups=True)
    a = c.create()
    c.begin_step([a], 40)                       # 10 pages: 1 group of 16
    st = c._current()
    assert st.group_indptr.tolist() == [0, 1] and len(c._seqs[a].groups) == 1
    c.begin_step([a], 30)                       # 70 tokens, 18 pages: 2 groups
    g = c._seqs[a].groups
    assert len(g) == 2 and c._current().group_indices[:2].tolist() == g
    c.group_min[:, g] = torch.randn(2, 2, 2, 64).to(torch.bfloat16)
    b = c.fork(a)
    gb = c._seqs[b].groups
    assert set(gb).isdisjoint(g) and torch.equal(c.group_min[:, gb], c.group_min[:, g])
    c.begin_step([a, b], 1)
    assert c._current().group_indptr.tolist() == [0, 2, 4]
    free = len(c._gfree)
    c.free(b)
    assert len(c._gfree) == free + 2
    with pytest.raises(ValueError, match="bounds=True"):
        TorchPagedCache(1, 2, 64, 8, device="cpu", bounds=False, groups=True)
    c = TorchPagedCache(1, 2, 64, 8, device="cpu")
    s = c.create()
    c.begin_step([s], 3)
    with pytest.raises(ValueError, match="groups=True"):
        c.select(0, torch.zeros(1, 4, 64), budget_tokens=16, hierarchical=True)


def test_transformers_gpu_layers_keep_one_cache_per_model(monkeypatch):
    """masskv.hf_cuda's bookkeeping on CPU tensors (the append operator is CUDA-only, so it is
    stubbed): one cache per model config, a step begun once for all layers, a new generation
    detected, the pool regrown from the full history when full, the state gone with the model."""
    import gc
    import types

    from masskv.hf_cuda import CudaLayers

    appended = []
    monkeypatch.setattr(TorchPagedCache, "append",
                        lambda self, layer, k, v: appended.append((layer, tuple(k.shape))))
    attn = types.SimpleNamespace(method="dense", page_size=4, max_tokens=16, hierarchical=False)

    class Config:  # transformers' configs define __eq__ and are unhashable: so is this one
        num_hidden_layers = 2

        def __eq__(self, other):
            return self is other

    cfg = Config()
    mods = [types.SimpleNamespace(config=cfg, layer_idx=i) for i in range(2)]
    layers = CudaLayers()

    def call(S, T, counts=None, mask=None):
        k = torch.zeros(2, 2, S, 64, dtype=torch.bfloat16)
        for m in mods:
            layers._sync(attn, m, k, k, T, counts, mask)

    call(10, 10)                                # prefill: one step for both layers
    state = layers._states[id(cfg)]
    assert state.cache.length(state.seqs[0]) == 10 and appended == [(0, (2, 10, 2, 64)),
                                                                   (1, (2, 10, 2, 64))]
    call(11, 1)                                 # a decode step
    assert layers._states[id(cfg)] is state and state.cache.length(state.seqs[1]) == 11
    call(24, 13)                                # beyond the pool (10 pages: 16 tokens + 1 a row)
    grown = layers._states[id(cfg)]
    assert grown is not state and grown.cache.length(grown.seqs[0]) == 24
    assert appended[-2:] == [(0, (2, 24, 2, 64)), (1, (2, 24, 2, 64))]  # the whole history
    call(5, 5)                                  # a new generation: a new cache
    assert layers._states[id(cfg)].cache.length(layers._states[id(cfg)].seqs[0]) == 5
    # A left-padded batch: row 1's first 3 columns are padding; only tokens are kept, also
    # when the pool is regrown from the full history (its padding read from the mask).
    mask = torch.ones(2, 60, dtype=torch.long)
    mask[1, :3] = 0
    call(6, 6, [6, 3])
    padded = layers._states[id(cfg)]
    assert [padded.cache.length(s) for s in padded.seqs] == [6, 3]
    call(7, 1, None, mask[:, :7])
    assert [padded.cache.length(s) for s in padded.seqs] == [7, 4]
    call(60, 53, [53, 53], mask)                # beyond the pool: the whole history again
    grown = layers._states[id(cfg)]
    assert grown is not padded and [grown.cache.length(s) for s in grown.seqs] == [60, 57]
    assert appended[-1] == (1, (2, 60, 2, 64))
    cfg = mods = state = grown = padded = None  # the model goes
    gc.collect()
    assert not layers._states and not layers._watched


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_a_chunk_lands_in_its_pages_and_slots(monkeypatch, layout):
    """append's chunk path writes token t of row b into its page and slot (the summaries'
    refresh after it is a CUDA operator, stubbed here: test_ops.py checks it on the GPU)."""
    calls = []
    monkeypatch.setattr(torch.ops.masskv, "summarize_pages",
                        lambda *a: calls.append((a[-3].tolist(), a[-2].tolist())))
    c = cpu_cache(layout=layout)
    a, b = c.create(), c.create()
    c.begin_step([a, b], 3)
    c.append(1, torch.randn(2, 3, 2, 64), torch.randn(2, 3, 2, 64))
    k = torch.randn(2, 6, 2, 64)
    c.begin_step([a, b], 6)
    c.append(1, k, -k)
    pool = c.k_pool[1] if layout == "NHD" else c.k_pool[1].transpose(1, 2)  # [page][slot][h][d]
    vpool = c.v_pool[1] if layout == "NHD" else c.v_pool[1].transpose(1, 2)
    for row, s in enumerate((a, b)):
        pages = c._seqs[s].pages
        for t in range(6):
            pos = 3 + t
            got = pool[pages[pos // 4], pos % 4]
            assert torch.equal(got, k[row, t].to(torch.bfloat16)), (row, t)
            assert torch.equal(vpool[pages[pos // 4], pos % 4], (-k[row, t]).to(torch.bfloat16))
    # The refresh covers the touched pages with their token counts: 3..8 -> pages 0 (4), 1 (4),
    # 2 (1) of each row.
    touched, tokens = calls[-1]
    assert tokens == [4, 4, 1, 4, 4, 1]
    assert touched == c._seqs[a].pages + c._seqs[b].pages


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_history_and_grow_keep_every_stored_row(layout):
    """history() gives back each row's tokens in order; grow() keeps the sequences, their pages
    and every stored value (pool and stores), adds free pages and group slots, and ends the
    step."""
    c = cpu_cache(layout=layout, bounds=True, groups=True)
    a, b = c.create(), c.create()
    k1, k2 = torch.randn(2, 5, 2, 64), torch.randn(2, 7, 2, 64)
    c.begin_step([a, b], 5)
    c._write_rows(0, k1, 2 * k1)
    c.begin_step([a, b], 7)
    c._write_rows(0, k2, 2 * k2)
    hk, hv = c.history(0)
    want = torch.cat([k1, k2], 1).to(torch.bfloat16)
    assert hk.shape == (2, 12, 2, 64) and torch.equal(hk, want) and torch.equal(hv, 2 * want)
    c.min[1, 3] = 7.0
    c.bound_max[0, 2] = 3.0
    pages, slots, used = c._seqs[a].pages[:], c.group_slots, 16 - c.free_pages
    c.grow(40)
    assert c.capacity_pages == 40 and c.free_pages == 40 - used and c.k_pool.shape[1] == 40
    assert c._seqs[a].pages == pages and c.group_slots > slots
    assert float(c.min[1, 3].max()) == 7.0 and float(c.bound_max[0, 2].max()) == 3.0
    with pytest.raises(RuntimeError, match="no step begun"):
        c.history(0)
    c.begin_step([a, b], 1)
    hk, _ = c.history(0)
    assert torch.equal(hk[:, :12], want)
    assert c._seqs[a].pages[-1] not in pages     # the new page comes from the pool (any free)
    with pytest.raises(ValueError, match="capacity_pages"):
        c.grow(10)
    c.begin_step([a], 2)
    with pytest.raises(ValueError, match="differ in length"):
        c.begin_step([a, b], 1) or c.history(0)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_a_padded_step_keeps_each_rows_own_tokens(monkeypatch, layout):
    """begin_step with a count per row (a left-padded batch): row b takes counts[b] tokens, the
    last of its columns in append's (B, max, H, d) tensors; pages, slots, the summaries'
    touched pages and the page table follow; history(width) right-aligns each row; prefill
    takes each row's own queries only; bad counts are named before anything changes."""
    calls = []
    monkeypatch.setattr(torch.ops.masskv, "summarize_pages",
                        lambda *a: calls.append((a[-3].tolist(), a[-2].tolist())))
    c = cpu_cache(layout=layout)
    a, b, e = c.create(), c.create(), c.create()
    k = torch.randn(3, 6, 2, 64)
    c.begin_step([a, b, e], [6, 2, 0])
    assert c.step_tokens == 6 and c.step_counts == [6, 2, 0]
    c.append(0, k, -k)
    assert [c.length(s) for s in (a, b, e)] == [6, 2, 0]
    assert calls[-1] == (c._seqs[a].pages + c._seqs[b].pages, [4, 2, 2])
    indptr, _, last = table(c)
    assert indptr.tolist() == [0, 2, 3, 3] and last[:2].tolist() == [2, 2]
    c.begin_step([a, b, e], 1)                  # a decode step: one token each (uniform)
    k1 = torch.randn(3, 1, 2, 64)
    c._write_rows(0, k1, k1)
    hk, hv = c.history(0, width=9)
    bf = torch.bfloat16
    want_b = torch.cat([torch.zeros(6, 2, 64), k[1, 4:], k1[1]]).to(bf)
    assert hk.shape == (3, 9, 2, 64) and torch.equal(hk[1], want_b)
    assert torch.equal(hk[0, 2:], torch.cat([k[0], k1[0]]).to(bf)) and not hk[0, :2].any()
    assert torch.equal(hk[2, 8], k1[2, 0].to(bf)) and not hk[2, :8].any()
    assert torch.equal(hv[0, 2:], torch.cat([-k[0], k1[0]]).to(bf))
    with pytest.raises(ValueError, match=r"differ in length \(\[1, 3, 7\]\); give width"):
        c.history(0)
    with pytest.raises(ValueError, match="width: must be an int >= the longest"):
        c.history(0, width=6)
    c.begin_step([a, b, e], [0, 3, 1])
    with pytest.raises(ValueError, match=r"q: expected a \(B=3, T=3, Hq, d\) tensor"):
        c.prefill(0, torch.randn(3, 2, 4, 64).to(bf))
    seen = {}

    def fake_prefill(q, *args):
        seen["q"], seen["indptr"], seen["blocks"] = q, args[5].tolist(), args[6].tolist()
        return torch.ones(q.shape), torch.zeros(q.shape[:2])

    monkeypatch.setattr(torch.ops.masskv, "prefill", fake_prefill)
    q = torch.randn(3, 3, 4, 64).to(bf)
    out, lse = c.prefill(0, q, budget_tokens=64)
    assert torch.equal(seen["q"], torch.cat([q[1], q[2, 2:]])) and seen["indptr"] == [0, 0, 3, 4]
    assert seen["blocks"] == [0, 0, 1, 2]
    assert not out[0].any() and out[1].all() and not out[2, :2].any() and out[2, 2].all()
    assert torch.isinf(lse[0]).all() and not lse[1].any()
    for bad, msg in (([1, 2], "2 counts for a batch of 3"), ([0, 0, 0], "at least one > 0"),
                     ([1, -1, 1], "counts must be ints >= 0"), ("3", "an int or a list")):
        with pytest.raises((ValueError, TypeError), match=msg):
            c.begin_step([a, b, e], bad)
    assert [c.length(s) for s in (a, b, e)] == [7, 6, 2]  # nothing changed


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_static_step_compiled_writes_the_tables_eager_writes(device):
    """static_step through torch.compile (inductor; what reduce-overhead compiles) writes the
    page, slot, lengths, page table and group table that eager writes, step after step:
    torch 2.11's inductor on an H100 once read a view of the page table's indptr from its
    storage's start, which handed row 0 row 1's pages."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")

    def make():
        c = TorchPagedCache(1, 2, 16, 64, page_size=4, device=device, bounds=True,
                            groups=True)
        seqs = [c.create(), c.create(), c.create()]
        c.begin_step(seqs, [5, 9, 1])
        c.begin_static(seqs, 80)                # 20 pages, 2 groups a row
        return c

    eager, comp = make(), make()
    step = torch.compile(comp.static_step, backend="inductor", fullgraph=True)
    for _ in range(11):                         # across page and group boundaries
        eager.static_step()
        step()
        a, b = eager._step, comp._step
        for name in ("page", "slot", "last_page_len", "indptr", "indices", "group_indptr",
                     "group_indices"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(eager._static.lengths, comp._static.lengths)
    assert eager.static_steps() == comp.static_steps() == 11


def test_static_steps_run_on_the_device_and_hand_back_to_the_host():
    """begin_static / static_step: decode steps whose page, slot, lengths, page table and group
    table are written by device ops alone (what a captured graph replays). The tables equal
    what the host would write for the same pages, decode over them equals decode over a twin
    cache stepped on the host, and end_static gives the unused pages back."""
    def make():
        return TorchPagedCache(2, 2, 64, 64, page_size=4, device="cpu", bounds=True,
                               groups=True)

    c, twin = make(), make()
    gen = torch.Generator().manual_seed(3)
    k0 = torch.randn(2, 9, 2, 64, generator=gen)
    seqs, tseqs = [c.create(), c.create()], [twin.create(), twin.create()]
    for cache, ss in ((c, seqs), (twin, tseqs)):
        cache.begin_step(ss, [5, 9])
        cache._write_rows(0, k0, -k0)
    free0 = c.free_pages
    c.begin_static(seqs, 24)                    # 6 pages a row: 4 + 3 taken ahead
    assert c.static_active and c.free_pages == free0 - 7 and c.step_max_pages == 6
    q = torch.randn(2, 4, 64, generator=gen)
    for step in range(6):
        k1 = torch.randn(2, 1, 2, 64, generator=gen)
        c.static_step()
        c._write_rows(0, k1, -k1)
        twin.begin_step(tseqs, 1)
        twin._write_rows(0, k1, -k1)
        n = [5 + step + 1, 9 + step + 1]
        pages = [-(-x // 4) for x in n]
        indptr, indices, last = table(c)
        rows = c._static.row_pages
        assert indptr.tolist() == [0, pages[0], sum(pages)]
        assert indices.tolist() == rows[0, :pages[0]].tolist() + rows[1, :pages[1]].tolist()
        assert last.tolist() == [x - (p - 1) * 4 for x, p in zip(n, pages)]
        assert c._step.group_indptr.tolist() == [0, 1, 2]
        assert c._step.group_indices[:2].tolist() == c._static.row_groups[:, 0].tolist()
        out, lse = c.decode(0, q)
        want, want_lse = twin.decode(0, q)
        torch.testing.assert_close(out, want, atol=0, rtol=0)
    assert c.static_steps() == 6
    with pytest.raises(RuntimeError, match="static decode steps are running"):
        c.prefill(0, torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16))
    assert [c.length(s) for s in seqs] == [11, 15] and not c.static_active
    assert c.free_pages == free0 - 2           # a: 2 -> 3 pages, b: 3 -> 4; the rest back
    c.begin_step(seqs, 1)                      # the host goes on from the device's lengths
    twin.begin_step(tseqs, 1)
    for got, want in zip(c.history(0, width=16), twin.history(0, width=16)):
        assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="no static steps begun"):
        c.static_step()
    # Steps past max_tokens: flagged on the device, raised when the steps end.
    c.begin_static(seqs, 24)                    # b holds 16: 8 steps fit
    for _ in range(9):
        c.static_step()
    with pytest.raises(masskv.Error, match="ran past 24 tokens"):
        c.end_static()
    assert not c.static_active and [c._seqs[s].length for s in seqs] == [21, 24]
    with pytest.raises(masskv.Error, match="no room"):
        c.begin_static(seqs, 12)
    coded = cpu_cache(codes=True)
    with pytest.raises(ValueError, match="static steps serve dense and quest"):
        coded.begin_static([coded.create()], 8)


def test_prefill_checks_its_query_before_any_kernel():
    c = cpu_cache()
    s = c.create()
    c.begin_step([s], 20)
    with pytest.raises(TypeError, match="q: expected torch.bfloat16"):
        c.prefill(0, torch.randn(1, 20, 4, 64))
    with pytest.raises(ValueError, match=r"q: expected a \(B=1, T, Hq, d\) tensor, 1 <= T <= 20"):
        c.prefill(0, torch.randn(1, 21, 4, 64).to(torch.bfloat16))
    with pytest.raises(ValueError, match="budget_tokens"):
        c.prefill(0, torch.randn(1, 20, 4, 64).to(torch.bfloat16), budget_tokens=-1)
    # The operator itself runs on CUDA tensors only.
    with pytest.raises((RuntimeError, ValueError), match="CUDA"):
        c.prefill(0, torch.randn(1, 20, 4, 64).to(torch.bfloat16))


def test_page_code_stores_follow_the_sequences():
    """codes=True: the page-code stores' shapes, each sequence's f64 key moments (a fork
    copies its source's; a step gathers the batch's and gives them back at the next step) and
    grow() enlarging the channel-major stores along their page axis."""
    c = cpu_cache(codes=True)
    st = c.code_stores
    assert st["codes"].shape == (2, 16, 2, 4, 16) and st["chan_codes"].shape == (2, 2, 64, 16, 1)
    a = c.create()
    c.begin_step([a], 5)
    c._step.mean_seq[:, 0] += 3.0                  # as update_spread would write
    b = c.fork(a)                                 # ends the step's moments first
    assert float(c._moments[b][0].min()) == 3.0 and float(c._moments[a][0].max()) == 3.0
    c.begin_step([a, b], 1)
    assert c._step.mean_seq.shape == (2, 2, 2, 64)
    c._step.m2_seq[:, 1] = 7.0
    c.begin_step([b], 1)
    assert float(c._moments[b][1].min()) == 7.0 and float(c._moments[a][1].max()) == 0.0
    c.grow(24)
    assert c.code_stores["chan_codes"].shape[3] == 24
    assert c.code_stores["chan_ranges"].shape == (2, 2, 64, 24, 2)
    assert c.code_stores["grid"].shape == (2, 24, 2, 2)
    c.free(a)
    assert a not in c._moments
    with pytest.raises(ValueError, match="head_dim 64 and 128"):
        TorchPagedCache(1, 1, 32, 4, device="cpu", bounds=False, codes=True)
    with pytest.raises(ValueError, match="codes=True"):
        cpu_cache().select(0, torch.zeros(1, 2, 64), budget_tokens=8, method="token_codes")
