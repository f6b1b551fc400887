"""torch.ops.masskv (masskv.ops): the operators against masskv.decode / the float64 reference,
their fake implementations (torch.library.opcheck, torch.compile tracing), and on a CUDA build
with a GPU the append / summary / selection operators against the CPU cache. Skipped where
torch is absent (CI)."""

import numpy as np
import pytest

import masskv
from conftest import random_cache

torch = pytest.importorskip("torch")
ops = pytest.importorskip("masskv.ops")

cuda = pytest.mark.skipif(not (masskv.has_cuda and torch.cuda.is_available()),
                          reason="needs a CUDA build of masskv and a GPU")


def torch_table(cache, seqs, device="cpu"):
    t = cache.page_table(seqs)
    return [torch.from_numpy(t[k]).to(device) for k in ("indptr", "indices", "last_page_len")]


def torch_pools(cache, device="cpu"):
    k, v = (torch.from_numpy(a.copy()) for a in (cache.k_pool, cache.v_pool))
    if cache.dtype == "bf16":
        k, v = k.view(torch.bfloat16), v.view(torch.bfloat16)
    return k.to(device), v.to(device)


@pytest.mark.parametrize("dtype,layout", [("f32", "HND"), ("bf16", "NHD"), ("f16", "HND")])
@pytest.mark.parametrize("selected", [False, True])
def test_decode_op_matches_reference(rng, dtype, layout, selected):
    cache, seqs = random_cache(rng, [37, 5, 64], num_kv_heads=2, head_dim=64, page_size=8,
                               dtype=dtype, layout=layout)
    kv = cache.view(seqs)
    q = torch.randn(3, 6, 64)
    sel = None
    if selected:
        sel = masskv.select(q.numpy(), kv, method="quest", budget_tokens=16).selection
    ref, ref_lse = masskv.decode_reference(q.numpy(), kv, selection=sel)
    ids = None if sel is None else torch.from_numpy(np.array(sel.ids))
    cnt = None if sel is None else torch.from_numpy(np.array(sel.count))
    k, v = torch_pools(cache)
    out, lse = torch.ops.masskv.decode(q, k, v, *torch_table(cache, seqs), ids, cnt, layout,
                                       1.0, 0.0, 0)
    np.testing.assert_allclose(out.numpy(), ref, atol=3e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=3e-5)


def test_decode_op_entmax(rng):
    cache, seqs = random_cache(rng, [29, 40], page_size=4)
    q = torch.randn(2, 4, 64) * 3
    ref, ref_tau = masskv.decode_reference(q.numpy(), cache.view(seqs), alpha=1.5)
    k, v = torch_pools(cache)
    out, tau = torch.ops.masskv.decode(q, k, v, *torch_table(cache, seqs), None, None, "HND",
                                       1.5, 0.0, 0)
    np.testing.assert_allclose(out.numpy(), ref, atol=3e-5)
    np.testing.assert_allclose(tau.numpy(), ref_tau, atol=3e-5)


def test_decode_op_opcheck(rng):
    """The schema, the fake implementation and autograd registration agree with the kernel."""
    cache, seqs = random_cache(rng, [21, 9], page_size=4)
    k, v = torch_pools(cache)
    q = torch.randn(2, 4, 64)
    torch.library.opcheck(torch.ops.masskv.decode.default,
                          (q, k, v, *torch_table(cache, seqs), None, None, "HND", 1.0, 0.0, 0))


def test_decode_op_traces_under_compile(rng):
    """torch.compile traces through the fake implementation (no graph break) and the compiled
    call gives the eager result."""
    cache, seqs = random_cache(rng, [33], page_size=4)
    k, v = torch_pools(cache)
    table = torch_table(cache, seqs)

    def step(q):
        out, _ = torch.ops.masskv.decode(q * 2, k, v, *table, None, None, "HND", 1.0, 0.0, 0)
        return out + 1

    q = torch.randn(1, 4, 64)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q), step(q))


def test_decode_op_bad_inputs(rng):
    cache, seqs = random_cache(rng, [10], page_size=4)
    k, v = torch_pools(cache)
    table = torch_table(cache, seqs)
    q = torch.randn(1, 4, 64)
    with pytest.raises(ValueError, match="sel_ids and sel_count together"):
        torch.ops.masskv.decode(q, k, v, *table, torch.zeros(1, 2, 1, dtype=torch.int32), None,
                                "HND", 1.0, 0.0, 0)
    with pytest.raises(TypeError, match="q: expected dtype float32"):
        torch.ops.masskv.decode(q.double(), k, v, *table, None, None, "HND", 1.0, 0.0, 0)
    with pytest.raises(masskv.Error, match="alpha"):
        torch.ops.masskv.decode(q, k, v, *table, None, None, "HND", 3.0, 0.0, 0)


@pytest.mark.skipif(masskv.has_cuda, reason="a CPU-only build")
def test_cuda_ops_need_a_cuda_build(rng):
    cache, seqs = random_cache(rng, [10], page_size=4)
    k, v = torch_pools(cache)
    with pytest.raises(RuntimeError, match="no CUDA kernels"):
        torch.ops.masskv.quest_select(torch.randn(1, 4, 64), k, v, *torch_table(cache, seqs),
                                      k, k, "HND", 8, 1, 0, 0.0, 4)


# -- CUDA: the stores operators against the CPU cache --------------------------------------------

def assert_same_lists(ids, count, ref):
    """GPU lists (torch ids (B, H, K), count (B, H)) equal to a CPU Selection's, entry for entry
    within each list's count."""
    got_count, got_ids = count.cpu().numpy(), ids.cpu().numpy()
    assert np.array_equal(got_count, ref.count)
    for b, h in np.ndindex(*got_count.shape):
        n = int(ref.count[b, h])
        assert np.array_equal(got_ids[b, h, :n], ref.ids[b, h, :n]), (b, h)


def cpu_cache_like(tc, lengths, rng):
    """A CPU PagedKVCache with tc's shape filled with the same random tokens appended to tc by
    begin_step/append in chunks; returns (cpu cache, its seqs, tc seqs)."""
    cpu = masskv.PagedKVCache(tc.num_kv_heads, tc.head_dim, tc.capacity_pages,
                              page_size=tc.page_size, dtype="bf16", layout=tc.layout)
    cpu_seqs = [cpu.create() for _ in lengths]
    gpu_seqs = [tc.create() for _ in lengths]
    return cpu, cpu_seqs, gpu_seqs


@cuda
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_torch_cache_append_matches_cpu_cache(rng, layout):
    """Prefill chunks (summarize_pages) then decode tokens (append) give the CPU cache's bits:
    pools, min/max, count, and the bf16 bound store the GPU selector scans."""
    from masskv.torch_cache import TorchPagedCache

    H, d, P = 2, 64, 16
    tc = TorchPagedCache(1, H, d, 64, page_size=P, layout=layout)
    cpu, cs, gs = cpu_cache_like(tc, [0, 0], rng)
    for T in (37, 1, 1, 20, 1):
        k = rng.standard_normal((2, T, H, d), dtype=np.float32)
        v = rng.standard_normal((2, T, H, d), dtype=np.float32)
        tc.begin_step(gs, T)
        tc.append(0, torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda())
        for b, s in enumerate(cs):
            cpu.append(s, k[b], v[b])
    torch.cuda.synchronize()
    t = cpu.page_table(cs)
    gi, _, gl = (x.cpu().numpy() for x in tc.table())
    assert np.array_equal(gi, t["indptr"]) and np.array_equal(gl, t["last_page_len"])
    g_pages = tc.table()[1][:gi[-1]].cpu().numpy()
    c_pages = t["indices"]
    k_gpu = tc.k_pool[0].view(torch.int16).cpu().numpy()[g_pages]
    k_cpu = cpu.k_pool.view(np.int16)[c_pages]
    if layout == "HND":  # compare as [page][slot][head][d]
        k_gpu, k_cpu = k_gpu.transpose(0, 2, 1, 3), k_cpu.transpose(0, 2, 1, 3)
    for b in range(2):  # the written slots only (a last page's others are unspecified)
        for j in range(gi[b], gi[b + 1]):
            n = P if j + 1 < gi[b + 1] else int(gl[b])
            assert np.array_equal(k_gpu[j, :n], k_cpu[j, :n]), (b, j)
    lo, hi = cpu.bf16_bounds()
    assert np.array_equal(tc.bound_min[0].view(torch.int16).cpu().numpy()[g_pages],
                          lo.view(np.int16)[c_pages])
    assert np.array_equal(tc.bound_max[0].view(torch.int16).cpu().numpy()[g_pages],
                          hi.view(np.int16)[c_pages])


@cuda
def test_torch_cache_select_and_decode_match_cpu(rng):
    from masskv.torch_cache import TorchPagedCache

    H, d, P = 2, 128, 16
    tc = TorchPagedCache(2, H, d, 256, page_size=P)
    cpu, cs, gs = cpu_cache_like(tc, [0, 0, 0], rng)
    k = rng.standard_normal((3, 900, H, d), dtype=np.float32)
    v = rng.standard_normal((3, 900, H, d), dtype=np.float32)
    tc.begin_step(gs, 900)
    for layer in range(2):
        tc.append(layer, torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda())
    for b, s in enumerate(cs):
        cpu.append(s, k[b], v[b])
    q = torch.randn(3, 8, d, device="cuda")
    ids, count = tc.select(1, q, budget_tokens=128)
    ref = masskv.select(q.cpu().numpy(), cpu.view(cs), method="quest", group="aggregate",
                        bf16_bounds=True, budget_tokens=128).selection
    assert_same_lists(ids, count, ref)
    out, lse = tc.decode(1, q, (ids, count))
    ref_out, ref_lse = masskv.decode_reference(q.cpu().numpy(), cpu.view(cs), selection=ref)
    np.testing.assert_allclose(out.cpu().numpy(), ref_out, atol=2e-3)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=2e-3)


@cuda
@pytest.mark.parametrize("chunks", [(900,), (300, 1, 1, 250, 1)])
def test_torch_cache_token_codes_match_cpu(rng, chunks):
    """codes=True: page codes kept on the GPU (encode_page_codes, update_spread) after chunks
    and single tokens; token_codes' GPU lists equal the CPU selector's on a CPU cache with the
    same tokens (PagedKVCache(page_codes=True)), and decode over them matches the reference."""
    from masskv.torch_cache import TorchPagedCache

    H, d, P = 2, 128, 16
    tc = TorchPagedCache(2, H, d, 256, page_size=P, bounds=False, codes=True)
    cpu = masskv.PagedKVCache(H, d, 256, page_size=P, dtype="bf16", layout=tc.layout,
                              page_codes=True)
    cs = [cpu.create() for _ in range(3)]
    gs = [tc.create() for _ in range(3)]
    for T in chunks:
        k = rng.standard_normal((3, T, H, d), dtype=np.float32)
        v = rng.standard_normal((3, T, H, d), dtype=np.float32)
        tc.begin_step(gs, T)
        for layer in range(2):
            tc.append(layer, torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda())
        for b, s in enumerate(cs):
            cpu.append(s, k[b], v[b])
    q = torch.randn(3, 8, d, device="cuda")
    ids, count = tc.select(1, q, budget_tokens=128, method="token_codes")
    ref = masskv.select(q.cpu().numpy(), cpu.view(cs), method="token_codes",
                        budget_tokens=128).selection
    assert_same_lists(ids, count, ref)
    out, lse = tc.decode(1, q, (ids, count), unit="token")
    ref_out, ref_lse = masskv.decode_reference(q.cpu().numpy(), cpu.view(cs), selection=ref)
    np.testing.assert_allclose(out.cpu().numpy(), ref_out, atol=2e-3)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=2e-3)
    # One pass (every token on every channel): the CPU's one-pass lists too.
    ids1, count1 = tc.select(1, q, budget_tokens=128, method="token_codes", code_channels=1.0)
    ref1 = masskv.select(q.cpu().numpy(), cpu.view(cs), method="token_codes",
                         budget_tokens=128, code_channels=1.0).selection
    assert_same_lists(ids1, count1, ref1)


@cuda
def test_torch_cache_fork_copies_on_write(rng):
    from masskv.torch_cache import TorchPagedCache

    tc = TorchPagedCache(1, 1, 64, 8, page_size=16)
    a = tc.create()
    tc.begin_step([a], 20)
    tc.append(0, torch.randn(1, 20, 1, 64, device="cuda"), torch.randn(1, 20, 1, 64, device="cuda"))
    b = tc.fork(a)
    before = tc.k_pool[0].clone()
    tc.begin_step([b], 1)
    tc.append(0, torch.randn(1, 1, 1, 64, device="cuda"), torch.randn(1, 1, 1, 64, device="cuda"))
    # a's pages are untouched; b wrote into a copy of the shared last page.
    a_pages = tc._seqs[a].pages
    assert torch.equal(tc.k_pool[0][a_pages], before[a_pages])
    assert tc._seqs[b].pages[0] == a_pages[0] and tc._seqs[b].pages[1] != a_pages[1]
    tc.free(a)
    tc.free(b)
    assert tc.free_pages == 8


@cuda
def test_captured_step_defers_errors_to_check(rng):
    """Under CUDA graph capture the operators do not wait; a bad page id in the table is then
    raised by masskv.ops.check() after the replay."""
    from masskv.torch_cache import TorchPagedCache

    tc = TorchPagedCache(1, 2, 64, 16, page_size=16, max_pages_per_seq=4)
    s = tc.create()
    tc.begin_step([s], 30)
    tc.append(0, torch.randn(1, 30, 2, 64, device="cuda"), torch.randn(1, 30, 2, 64, device="cuda"))
    q = torch.randn(1, 4, 64, device="cuda")
    side = torch.cuda.Stream()  # warm-up and capture on one stream: its workspace is sized
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ref, _ = tc.decode(0, q)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        out, _ = tc.decode(0, q)
    g.replay()
    ops.check(side)
    assert torch.equal(out, ref)
    tc.table()[1][0] = 999  # a page id outside the pool
    g.replay()
    with pytest.raises(masskv.Error, match="indices"):
        ops.check(side)


@cuda
def test_hierarchical_selection_with_every_group_is_flat_quest(rng):
    """With cover large enough to keep every group, hierarchical Quest reads every page and must
    give flat Quest's lists; with a small cover it still fills the budget."""
    from masskv.torch_cache import TorchPagedCache

    H, d = 2, 128
    tc = TorchPagedCache(1, H, d, 512, page_size=16, groups=True)
    seqs = [tc.create() for _ in range(2)]
    tc.begin_step(seqs, 3000)
    k = torch.randn(2, 3000, H, d, device="cuda")
    tc.append(0, k, torch.randn_like(k))
    tc.begin_step(seqs, 1)  # a decode step: the last group refreshed by the append kernel path
    tc.append(0, torch.randn(2, 1, H, d, device="cuda"), torch.randn(2, 1, H, d, device="cuda"))
    q = torch.randn(2, 8, d, device="cuda")
    flat_ids, flat_count = tc.select(0, q, budget_tokens=256)
    ids, count = tc.select(0, q, budget_tokens=256, hierarchical=True, cover=1000.0)
    assert torch.equal(count, flat_count) and torch.equal(ids, flat_ids)
    ids, count = tc.select(0, q, budget_tokens=256, hierarchical=True, cover=2.0)
    assert int(count.min()) >= 256 // 16


@cuda
def test_decode_steps_keep_the_group_store_as_update_groups_rebuilds_it():
    """Decode steps refresh each sequence's last group inside the append kernel (no
    update_groups launch): after steps that cross group boundaries (16 pages of 4 tokens),
    every group equals update_groups' rebuild of all groups from the bound store, bit for bit."""
    from masskv.torch_cache import TorchPagedCache

    H, d = 2, 64
    tc = TorchPagedCache(1, H, d, 256, page_size=4, groups=True)
    seqs = [tc.create() for _ in range(3)]
    tc.begin_step(seqs, [50, 61, 3])
    k = torch.randn(3, 61, H, d, device="cuda")
    tc.append(0, k, torch.randn_like(k))
    for _ in range(90):  # 50 + 90 = 140 tokens: 35 pages, groups 0..2 of row 0
        tc.begin_step(seqs, 1)
        tc.append(0, torch.randn(3, 1, H, d, device="cuda"), torch.randn(3, 1, H, d, device="cuda"))
    got_min, got_max = tc.group_min[0].clone(), tc.group_max[0].clone()
    st = tc._current()
    tc.group_min[0].fill_(7.0)
    tc.group_max[0].fill_(7.0)
    torch.ops.masskv.update_groups(tc.k_pool[0], tc.v_pool[0], *tc.table(full=True),
                                   tc.bound_min[0], tc.bound_max[0], tc.group_min[0],
                                   tc.group_max[0], st.group_indptr, st.group_indices, "NHD",
                                   False, tc.step_max_pages)
    used = st.group_indices[:int(st.group_indptr[-1])].long()
    assert used.numel() == 3 + 3 + 2 and used.unique().numel() == used.numel()  # 35, 38, 24 pages
    for got, want in ((got_min, tc.group_min[0]), (got_max, tc.group_max[0])):
        assert torch.equal(got[used].view(torch.int16), want[used].view(torch.int16))


def prefill_reference(k, v, q, history, allowed=None, block=64):
    """f32 causal softmax attention of q (T, Hq, d) at positions history.. over k, v (S, Hkv,
    d); allowed: bool (query blocks, Hkv, key blocks) or None (every causal key)."""
    T, Hq, d = q.shape
    S, Hkv, _ = k.shape
    g = Hq // Hkv
    s = torch.einsum("thd,shd->hts", q.float(), k.float().repeat_interleave(g, 1)) / d ** 0.5
    pos = torch.arange(history, history + T, device=q.device)
    mask = torch.arange(S, device=q.device)[None, :] <= pos[:, None]           # (T, S)
    mask = mask[None].expand(Hq, T, S).clone()
    if allowed is not None:
        a = allowed.repeat_interleave(g, 1)                                     # (qb, Hq, kb)
        a = a.repeat_interleave(block, 0)[:T].repeat_interleave(block, 2)[..., :S]
        mask &= a.permute(1, 0, 2)
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v.float().repeat_interleave(g, 1))
    return out, lse.T


@cuda
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cuda_prefill_dense_and_sparse_match_reference(rng, layout):
    """masskv's CUDA prefill over a TorchPagedCache after earlier tokens: dense against an f32
    torch reference on the same bf16 keys; block-sparse with a budget covering every block gives
    the dense output; with a small budget, the reference restricted to the listed blocks (the
    sink and diagonal blocks always among them)."""
    from masskv.torch_cache import TorchPagedCache

    B, H, Hq, d, P, hist, T = 2, 2, 8, 64, 16, 100, 150
    tc = TorchPagedCache(1, H, d, 64, page_size=P, layout=layout)
    seqs = [tc.create() for _ in range(B)]
    for n in (hist, T):
        tc.begin_step(seqs, n)
        tc.append(0, torch.randn(B, n, H, d, device="cuda"), torch.randn(B, n, H, d, device="cuda"))
    q = torch.randn(B, T, Hq, d, device="cuda").to(torch.bfloat16)
    k_all, v_all = tc.history(0)
    out, lse = tc.prefill(0, q)
    for b in range(B):
        ref, ref_lse = prefill_reference(k_all[b], v_all[b], q[b], hist)
        torch.testing.assert_close(out[b].float(), ref, atol=1e-2, rtol=0)
        torch.testing.assert_close(lse[b], ref_lse, atol=5e-3, rtol=0)
    full, _ = tc.prefill(0, q, budget_tokens=64 * 8)
    torch.testing.assert_close(full.float(), out.float(), atol=1e-2, rtol=0)
    last, _ = tc.prefill(0, q[:, -50:].contiguous())  # only the last 50 tokens' queries
    torch.testing.assert_close(last.float(), out[:, -50:].float(), atol=1e-2, rtol=0)
    # Small budget: 4 key blocks of 64 per query block and kv head (the sink, the one or two
    # diagonal blocks, the best others).
    nqb = -(-T // 64)
    q_indptr = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device="cuda")
    qb_indptr = torch.arange(0, (B + 1) * nqb, nqb, dtype=torch.int32, device="cuda")
    o2, l2, ids, count = masskv.cuda_prefill(
        q.reshape(B * T, Hq, d), q_indptr, tc.kv(0), budget_blocks=4, q_block_indptr=qb_indptr,
        q_blocks=B * nqb, max_q_per_seq=T, max_kv_len=hist + T)
    kb = -(-(hist + T) // 64)
    for b in range(B):
        allowed = torch.zeros(nqb, H, kb, dtype=torch.bool, device="cuda")
        for i in range(nqb):
            for h in range(H):
                lst = ids[b * nqb + i, h, :int(count[b * nqb + i, h])].long()
                assert int(count[b * nqb + i, h]) <= 4 and bool((lst[1:] > lst[:-1]).all())
                assert 0 in lst.tolist() and (hist + 64 * i) // 64 in lst.tolist()
                allowed[i, h, lst] = True
        ref, ref_lse = prefill_reference(k_all[b], v_all[b], q[b], hist, allowed)
        got = o2.view(B, T, Hq, d)[b]
        torch.testing.assert_close(got.float(), ref, atol=1e-2, rtol=0)
        torch.testing.assert_close(l2.view(B, T, Hq)[b], ref_lse, atol=5e-3, rtol=0)


@cuda
def test_cuda_prefill_bad_inputs_are_named():
    from masskv.torch_cache import TorchPagedCache

    tc = TorchPagedCache(1, 2, 64, 16, page_size=16)
    s = tc.create()
    tc.begin_step([s], 20)
    with pytest.raises(TypeError, match="q: expected torch.bfloat16"):
        tc.prefill(0, torch.randn(1, 20, 4, 64, device="cuda"))
    with pytest.raises(ValueError, match="q: expected a"):
        tc.prefill(0, torch.randn(1, 21, 4, 64, device="cuda").to(torch.bfloat16))
    q = torch.randn(20, 4, 64, device="cuda").to(torch.bfloat16)
    qi = torch.tensor([0, 20], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="q_block_indptr"):
        masskv.cuda_prefill(q, qi, tc.kv(0), budget_blocks=2, max_q_per_seq=20, max_kv_len=20)
    with pytest.raises(masskv.Error, match="max_q_per_seq"):
        masskv.cuda_prefill(q, qi, tc.kv(0))
    with pytest.raises(TypeError, match="q"):
        masskv.cuda_prefill(q.float(), qi, tc.kv(0), max_q_per_seq=20)
