"""masskv.engine_pages (docs/engine.md): a selection's lists as an engine's physical page lists,
per kv head and per sequence, padded and as a FlashInfer page table, against a NumPy reference."""

import numpy as np
import pytest

import masskv
from conftest import random_cache


def reference(ids, count, indptr, indices, last, page_size, head_union):
    """Per list: the logical pages (a union over the kv heads), mapped through the table."""
    B, H, _ = ids.shape
    lists = []
    for b in range(B):
        heads = [set(ids[b, h, :count[b, h]].tolist()) for h in range(H)]
        groups = [set().union(*heads)] if head_union else heads
        for g in groups:
            logical = sorted(g)
            phys = [int(indices[indptr[b] + j]) for j in logical]
            pages = indptr[b + 1] - indptr[b]
            lpl = 0 if not logical else (int(last[b]) if logical[-1] == pages - 1 else page_size)
            lists.append((phys, lpl))
    return lists


@pytest.mark.parametrize("lists", ["per_kv_head", "head_union"])
def test_engine_pages_match_the_reference(rng, lists):
    cache, seqs = random_cache(rng, [40, 13, 29], page_size=4)
    q = rng.standard_normal((3, 4, 64), dtype=np.float32)
    sel = masskv.select(q, cache.view(seqs), method="quest", budget_tokens=12).selection
    # The engine's own table: the same sequences, their physical pages permuted.
    t = cache.page_table(seqs)
    perm = rng.permutation(cache.k_pool.shape[0]).astype(np.int32)
    indices = perm[t["indices"]]
    kv = masskv.KV.from_arrays(cache.k_pool, cache.v_pool, t["indptr"], indices,
                               t["last_page_len"])
    out = masskv.engine_pages(sel, kv, lists=lists)
    want = reference(np.asarray(sel.ids), np.asarray(sel.count), t["indptr"], indices,
                     t["last_page_len"], 4, lists == "head_union")
    assert out["ids"].shape[0] == len(want) and out["ids"].dtype == np.int32
    for i, (phys, lpl) in enumerate(want):
        n = len(phys)
        assert out["count"][i] == n
        assert out["ids"][i, :n].tolist() == phys and np.all(out["ids"][i, n:] == -1)
        assert out["indices"][out["indptr"][i]:out["indptr"][i + 1]].tolist() == phys
        assert out["last_page_len"][i] == lpl
    assert np.all(out["indices"][out["indptr"][-1]:] == -1)


def test_engine_pages_refuses_bad_input(rng):
    cache, seqs = random_cache(rng, [20, 9], page_size=4)
    q = rng.standard_normal((2, 2, 64), dtype=np.float32)
    kv = cache.view(seqs)
    sel = masskv.select(q, kv, method="quest", budget_tokens=8).selection
    with pytest.raises(masskv.Error, match="lists"):
        masskv.engine_pages(sel, kv, lists="per_head")
    with pytest.raises(masskv.Error, match="max_per_list"):
        masskv.engine_pages(sel, kv, lists="head_union", max_per_list=1)
    ids = np.asarray(sel.ids).copy()
    count = np.asarray(sel.count).copy()
    count[0, 0] = 2
    ids[0, 0, :2] = [3, 1]  # descending
    with pytest.raises(masskv.Error, match="selection"):
        masskv.engine_pages(masskv.Selection(ids, count, "page"), kv)
    no_csr = masskv.engine_pages(sel, kv, csr=False)
    assert set(no_csr) == {"ids", "count"}
