import numpy as np
import pytest

import masskv
from conftest import entmax_tau


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 300])
def test_softmax_equals_numpy(rng, dtype, n):
    s = (rng.standard_normal((3, n)) * 10).astype(dtype)
    p, lse = masskv.softmax(s)
    ref = np.exp(s - s.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(p, ref, atol=tol)
    m = s.astype(np.float64).max(1)
    np.testing.assert_allclose(lse, m + np.log(np.exp(s - m[:, None]).sum(1)), atol=1e-5)
    assert p.dtype == dtype and lse.shape == (3,)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_entmax_equals_numpy_bisection(rng, alpha, dtype):
    s = (rng.standard_normal((4, 50)) * 3).astype(dtype)
    p, tau, support = masskv.entmax(s, alpha)
    for i in range(4):
        z = (alpha - 1) * s[i].astype(np.float64)
        t = entmax_tau(z, alpha)
        ref = np.maximum(z - t, 0) ** (1 / (alpha - 1))
        np.testing.assert_allclose(p[i], ref / ref.sum(), atol=2e-6)
        assert abs(tau[i] - t) < 1e-5
        assert support[i] == np.count_nonzero(p[i])
        assert np.all(p[i][ref == 0] == 0)  # exact zeros outside the support


def test_entmax_threshold_brackets_tau(rng):
    s = rng.standard_normal(100).astype(np.float32)
    t = masskv.entmax_threshold(s, 1.5)
    assert t.tau_lo <= t.tau <= t.tau_hi
    assert t.support == masskv.entmax(s, 1.5)[2]


def test_mapping_writes_into_out_without_copy(rng):
    s = rng.standard_normal((2, 9)).astype(np.float32)
    out = np.empty_like(s)
    p, _ = masskv.softmax(s, out=out)
    assert p is out
    np.testing.assert_allclose(out.sum(1), 1, rtol=1e-6)
    p, _, _ = masskv.entmax(s, 2.0, out=out)
    assert p is out


def test_mapping_errors(rng):
    with pytest.raises(TypeError, match="float32 or float64"):
        masskv.softmax(np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="1-d or 2-d"):
        masskv.softmax(np.zeros((2, 2, 2), np.float32))
    with pytest.raises(ValueError, match="not C-contiguous"):
        masskv.softmax(np.zeros((4, 4), np.float32)[:, ::2])
    with pytest.raises(masskv.Error, match="alpha") as e:
        masskv.entmax(np.zeros(4, np.float32), 2.5)
    assert e.value.argument == "alpha" and isinstance(e.value, ValueError)
    with pytest.raises(masskv.Error, match="scores"):
        masskv.softmax(np.array([1.0, np.nan], np.float32))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        masskv.softmax(np.zeros(4, np.float32), out=np.zeros(4, np.float64))
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        masskv.softmax(np.zeros(4, np.float32), out=ro)
    with pytest.raises(TypeError, match="expected an array"):
        masskv.softmax(np.zeros(4, np.float32), out=[0.0] * 4)
