"""Shared fixtures and the NumPy (float64) references the bindings are checked against."""

import numpy as np
import pytest

import masskv


def random_cache(rng, lengths, *, num_kv_heads=2, head_dim=64, page_size=4, dtype="f32",
                 layout="HND", capacity_pages=None, page_codes=False):
    """A cache holding one sequence per entry of `lengths`, filled with N(0, 1) keys/values."""
    pages = sum(-(-n // page_size) for n in lengths)
    cache = masskv.PagedKVCache(num_kv_heads, head_dim, capacity_pages or pages + 4,
                                page_size=page_size, dtype=dtype, layout=layout,
                                page_codes=page_codes)
    seqs = []
    for n in lengths:
        s = cache.create()
        k = rng.standard_normal((n, num_kv_heads, head_dim), dtype=np.float32)
        v = rng.standard_normal((n, num_kv_heads, head_dim), dtype=np.float32)
        cache.append(s, k, v)
        seqs.append(s)
    return cache, seqs


def pool_f64(cache):
    """K and V pools as float64 [page][head][slot][d] whatever the cache dtype and layout."""
    def conv(a):
        if cache.dtype == "bf16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        a = a.astype(np.float64)
        return a if cache.layout == "HND" else a.transpose(0, 2, 1, 3)
    return conv(cache.k_pool), conv(cache.v_pool)


def sequence_kv(cache, table, b, kv_head):
    """Keys and values [length][d] of sequence b of a page table, in token order."""
    k, v = pool_f64(cache)
    pages = table["indices"][table["indptr"][b]:table["indptr"][b + 1]]
    n = (len(pages) - 1) * cache.page_size + int(table["last_page_len"][b])
    d = cache.head_dim
    return (k[pages, kv_head].reshape(-1, d)[:n], v[pages, kv_head].reshape(-1, d)[:n])


def entmax_tau(z, alpha):
    """tau with sum [z - tau]_+^(1/(alpha-1)) = 1, by bisection in float64 (docs/design.md §2.1)."""
    lo, hi = z.max() - 1.0, z.max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if (np.maximum(z - mid, 0) ** (1 / (alpha - 1))).sum() >= 1:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def attend(scores, values, alpha):
    """(output, lse or tau) of one head over its scores."""
    if alpha == 1.0:
        m = scores.max()
        w = np.exp(scores - m)
        return (w / w.sum()) @ values, m + np.log(w.sum())
    z = (alpha - 1) * scores
    tau = entmax_tau(z, alpha)
    p = np.maximum(z - tau, 0) ** (1 / (alpha - 1))
    return (p / p.sum()) @ values, tau


def numpy_decode(q, cache, seqs, alpha=1.0, selection=None):
    """NumPy reference of masskv.decode; selection: (ids, count, unit) or None."""
    table = cache.page_table(seqs)
    B, Hq, d = q.shape
    group = Hq // cache.num_kv_heads
    scale = 1 / np.sqrt(d)
    out = np.zeros((B, Hq, d))
    lse = np.zeros((B, Hq))
    for b in range(B):
        for h in range(Hq):
            kh = h // group
            K, V = sequence_kv(cache, table, b, kh)
            if selection is not None:
                ids, count, unit = selection
                chosen = ids[b, kh, :count[b, kh]]
                if unit == "page":
                    rows = np.concatenate([np.arange(p * cache.page_size,
                                                     min((p + 1) * cache.page_size, len(K)))
                                           for p in chosen])
                else:
                    rows = chosen
                K, V = K[rows], V[rows]
            out[b, h], lse[b, h] = attend(scale * (K @ q[b, h].astype(np.float64)), V, alpha)
    return out, lse


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
