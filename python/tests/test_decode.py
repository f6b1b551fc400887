import numpy as np
import pytest

import masskv
from conftest import numpy_decode, random_cache

# f32 kernels against f64 references: scores and outputs of N(0, 1) data are O(1..10).
ATOL = 3e-5


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_dense_decode_equals_references(rng, alpha, dtype, layout):
    cache, seqs = random_cache(rng, [1, 17, 40], num_kv_heads=2, head_dim=64, page_size=8,
                               dtype=dtype, layout=layout)
    q = rng.standard_normal((3, 6, 64), dtype=np.float32)  # GQA 3
    kv = cache.view(seqs)
    out, lse = masskv.decode(q, kv, alpha=alpha)
    ref_out, ref_lse = masskv.decode_reference(q, kv, alpha=alpha)
    np_out, np_lse = numpy_decode(q, cache, seqs, alpha)
    np.testing.assert_allclose(out, ref_out, atol=ATOL)
    np.testing.assert_allclose(lse, ref_lse, atol=ATOL)
    np.testing.assert_allclose(ref_out, np_out, atol=1e-9)
    np.testing.assert_allclose(ref_lse, np_lse, atol=1e-9)


@pytest.mark.parametrize("alpha", [1.0, 1.5])
@pytest.mark.parametrize("unit", ["page", "token"])
def test_sparse_decode_equals_references(rng, alpha, unit):
    cache, seqs = random_cache(rng, [30, 9], num_kv_heads=2, page_size=4)
    q = rng.standard_normal((2, 4, 64), dtype=np.float32)
    kv = cache.view(seqs)
    per = 3
    ids = np.full((2, 2, per), -1, np.int32)
    count = np.zeros((2, 2), np.int32)
    for b, n in enumerate([30, 9]):
        limit = -(-n // 4) if unit == "page" else n
        for h in range(2):
            chosen = np.sort(rng.choice(limit, size=min(per, limit), replace=False))
            ids[b, h, :len(chosen)] = chosen
            count[b, h] = len(chosen)
    sel = masskv.Selection(ids, count, unit)
    out, lse = masskv.decode(q, kv, alpha=alpha, selection=sel)
    ref_out, ref_lse = masskv.decode_reference(q, kv, alpha=alpha, selection=sel)
    np_out, np_lse = numpy_decode(q, cache, seqs, alpha, (ids, count, unit))
    np.testing.assert_allclose(out, ref_out, atol=ATOL)
    np.testing.assert_allclose(ref_out, np_out, atol=1e-9)
    np.testing.assert_allclose(lse, np_lse, atol=ATOL)


def test_impls_agree_and_chunking_is_fixed(rng):
    cache, seqs = random_cache(rng, [200], page_size=4)
    q = rng.standard_normal((1, 4, 64), dtype=np.float32)
    kv = cache.view(seqs)
    fast, _ = masskv.decode(q, kv, chunk_pages=5, impl="fast")
    simd, _ = masskv.decode(q, kv, chunk_pages=5, impl="simd")
    scalar, _ = masskv.decode(q, kv, chunk_pages=5, impl="scalar")
    assert np.array_equal(fast, simd)  # simd and fast: same bits (decode.hpp)
    np.testing.assert_allclose(scalar, fast, atol=ATOL)


def test_strided_q_and_out_are_used_in_place(rng):
    cache, seqs = random_cache(rng, [20, 5])
    kv = cache.view(seqs)
    big = rng.standard_normal((2, 8, 64), dtype=np.float32)
    q = big[:, ::2, :]  # strided view, not contiguous
    assert not q.flags.c_contiguous
    assert masskv._data_ptr(q) == q.__array_interface__["data"][0]  # imported without a copy
    out_big = np.zeros((2, 4, 128), np.float32)
    out = out_big[:, :, :64]
    lse = np.zeros((2, 4), np.float32)
    o, l = masskv.decode(q, kv, out=out, lse_or_tau=lse)
    assert o is out and l is lse
    ref, ref_lse = masskv.decode_reference(np.ascontiguousarray(q), kv)
    np.testing.assert_allclose(out_big[:, :, :64], ref, atol=ATOL)
    np.testing.assert_allclose(lse, ref_lse, atol=ATOL)
    assert np.all(out_big[:, :, 64:] == 0)  # nothing written outside the view


def test_kv_from_arrays_is_zero_copy_and_matches_cache_view(rng):
    cache, seqs = random_cache(rng, [13, 30], dtype="f16", layout="NHD")
    t = cache.page_table(seqs)
    ext = masskv.KV.from_arrays(cache.k_pool, cache.v_pool, t["indptr"], t["indices"],
                                t["last_page_len"], layout="NHD")
    q = rng.standard_normal((2, 2, 64), dtype=np.float32)
    a, _ = masskv.decode(q, ext, alpha=1.5)
    b, _ = masskv.decode(q, cache.view(seqs), alpha=1.5)
    assert np.array_equal(a, b)
    assert ext.batch == 2 and ext.dtype == "f16" and not ext.has_summaries
    assert ext.lengths() == [13, 30]


def test_kv_from_bf16_bits(rng):
    cache, seqs = random_cache(rng, [10], dtype="bf16")
    t = cache.page_table(seqs)
    assert cache.k_pool.dtype == np.uint16
    ext = masskv.KV.from_arrays(cache.k_pool, cache.v_pool, t["indptr"], t["indices"],
                                t["last_page_len"], dtype="bf16")
    q = rng.standard_normal((1, 2, 64), dtype=np.float32)
    assert np.array_equal(masskv.decode(q, ext)[0], masskv.decode(q, cache.view(seqs))[0])


def test_decode_errors(rng):
    cache, seqs = random_cache(rng, [10])
    kv = cache.view(seqs)
    q = rng.standard_normal((1, 2, 64), dtype=np.float32)
    with pytest.raises(TypeError, match="q: expected dtype float32, got float64"):
        masskv.decode(q.astype(np.float64), kv)
    with pytest.raises(TypeError, match="q: expected dtype float32, got float16"):
        masskv.decode(q.astype(np.float16), kv)
    with pytest.raises(ValueError, match="3-d"):
        masskv.decode(q[0], kv)
    with pytest.raises(ValueError, match="last axis must be contiguous"):
        masskv.decode(np.zeros((1, 2, 128), np.float32)[:, :, ::2], kv)
    with pytest.raises(masskv.Error, match="q") as e:
        masskv.decode(np.zeros((2, 2, 64), np.float32), kv)  # batch 2 vs 1 sequence
    assert e.value.code == "shape_mismatch"
    with pytest.raises(masskv.Error, match="head"):
        masskv.decode(np.zeros((1, 3, 64), np.float32), kv)  # 3 q heads, 2 kv heads
    with pytest.raises(masskv.Error, match="alpha"):
        masskv.decode(q, kv, alpha=0.5)
    with pytest.raises(masskv.Error, match="impl"):
        masskv.decode(q, kv, impl="gpu")
    with pytest.raises(masskv.Error, match="chunk_pages"):
        masskv.decode(q, kv, chunk_pages=0)
    with pytest.raises(ValueError, match="lse_or_tau: expected 2 elements"):
        masskv.decode(q, kv, lse_or_tau=np.zeros(3, np.float32))
    bad = masskv.Selection(np.array([[[5, -1]]], np.int32), np.array([[1]], np.int32))
    bad2 = masskv.Selection(np.full((1, 2, 2), 5, np.int32), np.ones((1, 2), np.int32))
    with pytest.raises(masskv.Error, match="selection"):
        masskv.decode(q, kv, selection=bad)
    with pytest.raises(masskv.Error, match="selection"):
        masskv.decode(q, kv, selection=bad2)
    with pytest.raises(TypeError, match="ids: expected dtype int32"):
        masskv.Selection(np.zeros((1, 2, 2), np.int64), np.zeros((1, 2), np.int32))
