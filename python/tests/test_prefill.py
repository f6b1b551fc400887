import numpy as np
import pytest

import masskv
from conftest import attend, random_cache, sequence_kv


def numpy_prefill(q, q_indptr, cache, seqs, alpha, mask=None):
    table = cache.page_table(seqs)
    _, Hq, d = q.shape
    group = Hq // cache.num_kv_heads
    out = np.zeros(q.shape)
    lse = np.zeros(q.shape[:2])
    for b in range(len(seqs)):
        lo, hi = q_indptr[b], q_indptr[b + 1]
        for h in range(Hq):
            K, V = sequence_kv(cache, table, b, h // group)
            first = len(K) - (hi - lo)
            for i in range(hi - lo):
                keys = np.arange(first + i + 1)
                if mask is not None:
                    keys = keys[mask(b, i, keys)]
                s = (K[keys] @ q[lo + i, h].astype(np.float64)) / np.sqrt(d)
                out[lo + i, h], lse[lo + i, h] = attend(s, V[keys], alpha)
    return out, lse


@pytest.mark.parametrize("alpha", [1.0, 1.5])
def test_causal_prefill_equals_references(rng, alpha):
    cache, seqs = random_cache(rng, [12, 7], num_kv_heads=1, page_size=4)
    q_indptr = np.array([0, 5, 12], np.int32)  # the last 5 of 12 and all 7 tokens
    q = rng.standard_normal((12, 2, 64), dtype=np.float32)
    kv = cache.view(seqs)
    out, lse = masskv.prefill(q, q_indptr, kv, alpha=alpha)
    ref, ref_lse = masskv.prefill_reference(q, q_indptr, kv, alpha=alpha)
    np_out, np_lse = numpy_prefill(q, q_indptr, cache, seqs, alpha)
    np.testing.assert_allclose(out, ref, atol=3e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=3e-5)
    np.testing.assert_allclose(ref, np_out, atol=1e-9)
    np.testing.assert_allclose(ref_lse, np_lse, atol=1e-9)


def test_block_sparse_prefill_equals_numpy(rng):
    cache, seqs = random_cache(rng, [8], num_kv_heads=1, page_size=4)
    q_indptr = np.array([0, 8], np.int32)
    q = rng.standard_normal((8, 1, 64), dtype=np.float32)
    # 2x2 blocks of 4: query block 1 skips key block 0.
    mask = np.array([1, 0, 0, 1], np.uint8)
    offset = np.array([0], np.int64)
    out, _ = masskv.prefill(q, q_indptr, cache.view(seqs), block_mask=mask, mask_offset=offset,
                            q_block=4, k_block=4)
    np_out, _ = numpy_prefill(q, q_indptr, cache, seqs, 1.0,
                              mask=lambda b, i, keys: mask[(i // 4) * 2 + keys // 4] == 1)
    np.testing.assert_allclose(out, np_out, atol=3e-5)


def test_prefill_errors(rng):
    cache, seqs = random_cache(rng, [4])
    q = np.zeros((4, 2, 64), np.float32)
    with pytest.raises(TypeError, match="q_indptr: expected dtype int32"):
        masskv.prefill(q, np.array([0, 4], np.int64), cache.view(seqs))
    with pytest.raises(masskv.Error, match="q_indptr"):
        masskv.prefill(q, np.array([0, 5], np.int32), cache.view(seqs))
    with pytest.raises(ValueError, match="both"):
        masskv.prefill(q, np.array([0, 4], np.int32), cache.view(seqs),
                       block_mask=np.ones(1, np.uint8))
