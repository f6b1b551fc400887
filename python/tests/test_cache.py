import numpy as np
import pytest

import masskv
from conftest import random_cache


def test_append_fork_free_and_lengths(rng):
    cache = masskv.PagedKVCache(2, 64, 8, page_size=4, dtype="f32")
    a = cache.create()
    k = rng.standard_normal((6, 2, 64), dtype=np.float32)
    cache.append(a, k, k)
    b = cache.fork(a)
    cache.append(b, k[:1], k[:1])
    assert (cache.length(a), cache.length(b)) == (6, 7)
    t = cache.page_table([a, b])
    assert t["indptr"].tolist() == [0, 2, 4]
    assert t["indices"][0] == t["indices"][2]  # the full page is shared
    assert t["indices"][1] != t["indices"][3]  # the partial page was copied on write
    assert t["last_page_len"].tolist() == [2, 3]
    free_before = cache.free_pages
    cache.free(b)
    assert not cache.alive(b) and cache.free_pages == free_before + 1
    with pytest.raises(masskv.Error, match="seq") as e:
        cache.length(b)
    assert e.value.code == "out_of_range"


def test_pool_view_is_zero_copy_and_stable(rng):
    cache, seqs = random_cache(rng, [5], dtype="f32")
    k_pool = cache.k_pool
    ptr = k_pool.__array_interface__["data"][0]
    assert not k_pool.flags.writeable
    k = rng.standard_normal((3, 2, 64), dtype=np.float32)
    cache.append(seqs[0], k, k)
    assert cache.k_pool.__array_interface__["data"][0] == ptr
    page = cache.page_table(seqs)["indices"][1]
    # tokens 5..7 sit in slots 1..3 of the second page: the old view sees them (same memory)
    assert np.array_equal(k_pool[page, :, 1:4, :], k.transpose(1, 0, 2))
    assert masskv._data_ptr(k_pool) == ptr
    del cache  # the view keeps the cache alive
    assert np.array_equal(k_pool[page, :, 1:4, :], k.transpose(1, 0, 2))


def test_summaries_match_stored_keys(rng):
    cache, seqs = random_cache(rng, [11], dtype="f16", page_size=4)
    s = cache.summaries()
    pages = cache.page_table(seqs)["indices"]
    keys = cache.k_pool.astype(np.float32)
    for j, p in enumerate(pages):
        n = 4 if j < 2 else 3
        assert s["count"][p] == n
        np.testing.assert_array_equal(s["min"][p], keys[p, :, :n].min(1))
        np.testing.assert_array_equal(s["max"][p], keys[p, :, :n].max(1))
        np.testing.assert_allclose(s["mean"][p], keys[p, :, :n].mean(1), atol=1e-6)
        vn = np.linalg.norm(cache.v_pool[p, :, :n].astype(np.float64), axis=-1).max(1)
        np.testing.assert_allclose(s["max_vnorm"][p], vn, rtol=1e-6)


def test_stale_view_is_rejected(rng):
    cache, seqs = random_cache(rng, [5])
    kv = cache.view(seqs)
    q = np.zeros((1, 2, 64), np.float32)
    masskv.decode(q, kv)
    cache.append(seqs[0], np.zeros((1, 2, 64), np.float32), np.zeros((1, 2, 64), np.float32))
    with pytest.raises(ValueError, match="stale view"):
        masskv.decode(q, kv)
    masskv.decode(q, cache.view(seqs))


def test_cache_errors(rng):
    with pytest.raises(masskv.Error, match="page_size"):
        masskv.PagedKVCache(2, 64, 4, page_size=3)
    with pytest.raises(masskv.Error, match="dtype"):
        masskv.PagedKVCache(2, 64, 4, dtype="f64")
    with pytest.raises(masskv.Error, match="layout"):
        masskv.PagedKVCache(2, 64, 4, layout="XYZ")
    cache = masskv.PagedKVCache(2, 64, 1, page_size=4, dtype="f32")
    s = cache.create()
    k = np.zeros((5, 2, 64), np.float32)
    with pytest.raises(masskv.Error) as e:
        cache.append(s, k, k)
    assert e.value.code == "out_of_memory" and cache.length(s) == 0
    with pytest.raises(ValueError, match=r"expected shape \(n, 2, 64\)"):
        cache.append(s, np.zeros((1, 3, 64), np.float32), np.zeros((1, 3, 64), np.float32))
    with pytest.raises(TypeError, match="k: expected dtype float32"):
        cache.append(s, k.astype(np.float16), k)
    with pytest.raises(ValueError, match="not C-contiguous"):
        big = np.zeros((2, 2, 128), np.float32)
        cache.append(s, big[:, :, ::2], big[:, :, ::2])
    nan = np.full((1, 2, 64), np.nan, np.float32)
    with pytest.raises(masskv.Error, match="k") as e:
        cache.append(s, nan, nan)
    assert e.value.code == "non_finite"
    with pytest.raises(masskv.Error, match="empty"):
        cache.view([s])
