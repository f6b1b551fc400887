import numpy as np
import pytest

import masskv
from conftest import random_cache


def check_selection(sel, cache, seqs):
    table = cache.page_table(seqs)
    for b in range(len(seqs)):
        pages = table["indptr"][b + 1] - table["indptr"][b]
        for h in range(cache.num_kv_heads):
            n = sel.count[b, h]
            ids = sel.ids[b, h]
            assert np.all(np.diff(ids[:n]) > 0) and np.all(ids[n:] == -1)
            if sel.unit == "page":
                assert ids[n - 1] == pages - 1  # the last page is always kept
                assert ids[n - 1] < pages


@pytest.mark.parametrize("method", masskv.METHODS)
@pytest.mark.parametrize("alpha", [1.0, 1.5])
def test_every_selector_gives_a_valid_selection(rng, method, alpha):
    cache, seqs = random_cache(rng, [70, 33], num_kv_heads=2, page_size=4, page_codes=True)
    q = rng.standard_normal((2, 4, 64), dtype=np.float32)
    kv = cache.view(seqs)
    budget = "adaptive" if method in ("entmax_support", "gaussian_tau") else "fixed"
    if method in ("entmax_support", "gaussian_tau") and alpha == 1.0:
        with pytest.raises(masskv.Error, match="entmax"):  # they serve entmax only
            masskv.select(q, kv, method=method, alpha=alpha, budget=budget)
        return
    r = masskv.select(q, kv, method=method, alpha=alpha, budget=budget, budget_tokens=16)
    check_selection(r.selection, cache, seqs)
    assert r.estimate.shape == (2, 4) and r.certified.shape == (2, 2)
    out, _ = masskv.decode(q, kv, alpha=alpha, selection=r.selection)
    ref, _ = masskv.decode_reference(q, kv, alpha=alpha, selection=r.selection)
    np.testing.assert_allclose(out, ref, atol=3e-5)
    d = masskv.diagnose(q, kv, r.selection, alpha=alpha, study=True)
    assert d["bounds_held"].dtype == bool and d["bounds_held"].all()
    assert np.all(d["delta"] <= d["delta_bound"])


def test_dense_selector_equals_dense_decode(rng):
    cache, seqs = random_cache(rng, [50], page_size=4)
    q = rng.standard_normal((1, 2, 64), dtype=np.float32)
    kv = cache.view(seqs)
    r = masskv.select(q, kv, method="dense")
    assert r.selection.count.tolist() == [[13, 13]]
    a, _ = masskv.decode(q, kv, alpha=1.5, selection=r.selection)
    b, _ = masskv.decode(q, kv, alpha=1.5)
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_certified_entmax_selection_is_exact(rng):
    # Peaked queries: the entmax support is small, so the certificate can hold.
    cache, seqs = random_cache(rng, [120], num_kv_heads=1, page_size=4)
    keys = cache.k_pool.astype(np.float32)[cache.page_table(seqs)["indices"][3], 0, 1]
    q = (keys * 3).reshape(1, 1, 64).astype(np.float32)
    kv = cache.view(seqs)
    r = masskv.select(q, kv, method="entmax_support", alpha=1.5, budget="adaptive")
    d = masskv.diagnose(q, kv, r.selection, alpha=1.5, study=True)
    assert r.certified[0, 0] == 1 and d["certified"][0, 0]
    sparse, tau_s = masskv.decode(q, kv, alpha=1.5, selection=r.selection)
    dense, tau_d = masskv.decode(q, kv, alpha=1.5)
    assert r.selection.count[0, 0] < 30
    np.testing.assert_allclose(sparse, dense, atol=1e-5)
    np.testing.assert_allclose(tau_s, tau_d, atol=1e-5)


def test_code_selectors_need_a_cache_with_page_codes(rng):
    cache, seqs = random_cache(rng, [40], page_size=4)
    q = rng.standard_normal((1, 2, 64), dtype=np.float32)
    for method in ("token_codes", "two_stage"):
        with pytest.raises(masskv.Error, match="page codes"):
            masskv.select(q, cache.view(seqs), method=method, budget_tokens=12)


def test_bf16_bounds_and_selector_errors(rng):
    cache, seqs = random_cache(rng, [40], page_size=4)
    q = rng.standard_normal((1, 2, 64), dtype=np.float32)
    kv = cache.view(seqs)
    a = masskv.select(q, kv, method="quest", budget_tokens=12, bf16_bounds=True)
    check_selection(a.selection, cache, seqs)
    with pytest.raises(masskv.Error, match="method"):
        masskv.select(q, kv, method="magic")
    with pytest.raises(masskv.Error, match="budget"):
        masskv.select(q, kv, budget="most")
    t = cache.page_table(seqs)
    ext = masskv.KV.from_arrays(cache.k_pool, cache.v_pool, t["indptr"], t["indices"],
                                t["last_page_len"])
    with pytest.raises(ValueError, match="summaries"):
        masskv.select(q, ext)


def test_log_prob_group_rule_selects_the_budget_and_refuses_unknown_rules(rng):
    cache, seqs = random_cache(rng, [70, 33], num_kv_heads=2, page_size=4, page_codes=True)
    q = rng.standard_normal((2, 4, 64), dtype=np.float32)
    kv = cache.view(seqs)
    r = masskv.select(q, kv, method="token_codes", group="log_prob", budget_tokens=16)
    check_selection(r.selection, cache, seqs)
    u = masskv.select(q, kv, method="token_codes", group="union", budget_tokens=16)
    # the same count (the budget and the kept tokens), possibly other tokens
    np.testing.assert_array_equal(r.selection.count, u.selection.count)
    # token_codes' own rule is log_prob
    d = masskv.select(q, kv, method="token_codes", budget_tokens=16)
    np.testing.assert_array_equal(d.selection.ids, r.selection.ids)
    with pytest.raises(masskv.Error, match="group"):
        masskv.select(q, kv, method="token_codes", group="median", budget_tokens=16)


def test_token_codes_two_passes_are_the_default_and_one_pass_stays_reachable(rng):
    cache, seqs = random_cache(rng, [300, 77], num_kv_heads=2, page_size=16, page_codes=True)
    q = rng.standard_normal((2, 4, 64), dtype=np.float32)
    kv = cache.view(seqs)
    two = masskv.select(q, kv, method="token_codes", budget_tokens=32)
    spelled = masskv.select(q, kv, method="token_codes", budget_tokens=32, code_channels=0.375,
                            code_candidates=2, code_channel_spread=True)
    np.testing.assert_array_equal(two.selection.ids, spelled.selection.ids)
    by_q = masskv.select(q, kv, method="token_codes", budget_tokens=32, code_channel_spread=False)
    check_selection(by_q.selection, cache, seqs)
    one = masskv.select(q, kv, method="token_codes", budget_tokens=32, code_channels=1.0)
    check_selection(one.selection, cache, seqs)
    # every token a candidate: the second pass ranks as one pass does
    spare = masskv.select(q, kv, method="token_codes", budget_tokens=32, code_candidates=1000)
    np.testing.assert_array_equal(spare.selection.ids, one.selection.ids)
    with pytest.raises(masskv.Error, match="code_channels"):
        masskv.select(q, kv, method="token_codes", budget_tokens=32, code_channels=0.0)
    with pytest.raises(masskv.Error, match="code_candidates"):
        masskv.select(q, kv, method="token_codes", budget_tokens=32, code_candidates=0)
