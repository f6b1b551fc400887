"""PyTorch tensors through DLPack: CPU tensors zero-copy, CUDA tensors rejected clearly by a
CPU-only build (a CUDA build runs them: test_cuda.py). Skipped where torch is absent (CI); run
on the GPU machine."""

import numpy as np
import pytest

import masskv
from conftest import random_cache

torch = pytest.importorskip("torch")


def test_cpu_tensors_are_used_in_place(rng):
    cache, seqs = random_cache(rng, [21, 8])
    kv = cache.view(seqs)
    q = torch.randn(2, 4, 64, dtype=torch.float32)
    assert masskv._data_ptr(q) == q.data_ptr()
    out = torch.zeros(2, 4, 64)
    lse = torch.zeros(2, 4)
    o, l = masskv.decode(q, kv, out=out, lse_or_tau=lse)
    assert o is out and l is lse
    ref, ref_lse = masskv.decode_reference(q.numpy(), kv)
    np.testing.assert_allclose(out.numpy(), ref, atol=3e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=3e-5)


def test_strided_torch_q(rng):
    cache, seqs = random_cache(rng, [9])
    big = torch.randn(1, 4, 64)
    q = big[:, ::2]
    a, _ = masskv.decode(q, cache.view(seqs))
    b, _ = masskv.decode(q.contiguous(), cache.view(seqs))
    assert np.array_equal(a, b)


def test_torch_append_and_kv_from_tensors(rng):
    cache = masskv.PagedKVCache(2, 64, 8, page_size=4, dtype="bf16")
    s = cache.create()
    k = torch.randn(7, 2, 64)
    cache.append(s, k, k)
    t = cache.page_table([s])
    pool_k = torch.from_numpy(cache.k_pool.copy()).view(torch.bfloat16)
    pool_v = torch.from_numpy(cache.v_pool.copy()).view(torch.bfloat16)
    ext = masskv.KV.from_arrays(pool_k, pool_v, torch.from_numpy(t["indptr"]),
                                torch.from_numpy(t["indices"]),
                                torch.from_numpy(t["last_page_len"]))
    assert ext.dtype == "bf16"
    q = torch.randn(1, 2, 64)
    assert np.array_equal(masskv.decode(q, ext)[0], masskv.decode(q, cache.view([s]))[0])


def test_wrong_torch_dtype_is_a_type_error(rng):
    cache, seqs = random_cache(rng, [5])
    with pytest.raises(TypeError, match="q: expected dtype float32, got bfloat16"):
        masskv.decode(torch.zeros(1, 2, 64, dtype=torch.bfloat16), cache.view(seqs))


@pytest.mark.skipif(not torch.cuda.is_available() or masskv.has_cuda,
                    reason="a CPU-only build on a machine with a CUDA device")
def test_cuda_tensors_are_rejected_clearly(rng):
    cache, seqs = random_cache(rng, [5])
    q = torch.zeros(1, 2, 64, device="cuda")
    assert not masskv.has_cuda
    with pytest.raises(ValueError, match="q: array is on cuda:0; this masskv build has CPU"):
        masskv.decode(q, cache.view(seqs))
    with pytest.raises(ValueError, match="on cuda"):
        masskv.softmax(torch.zeros(4, device="cuda"))
