"""Long-term drift tests against scipy's, and false discoveries kept in check."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from analyzer.drift import benjamini_hochberg, fit_lognormal, ks_lognormal, ks_sf


def test_vectorized_ks_agrees_with_scipy_kstest():
    rng = np.random.default_rng(1)
    p, m = 50, 60
    ref = rng.lognormal(np.log(100), 0.05, (p, m))
    new = rng.lognormal(np.log(100), 0.05, (p, m)) * np.linspace(1.0, 1.1, p)[:, None]
    valid = np.ones((p, m), dtype=bool)
    valid[:10, 40:] = False
    mu, sigma = fit_lognormal(ref, np.ones_like(valid))
    got = ks_lognormal(mu, sigma, new, valid)
    for i in range(p):
        s, loc, scale = sigma[i], 0.0, np.exp(mu[i])
        assert stats.lognorm.fit(ref[i], floc=0)[0] == pytest.approx(s, rel=1e-3)
        want = stats.kstest(new[i][valid[i]], "lognorm", args=(s, loc, scale)).pvalue
        # Exact where it can decide (below 5 %), never below scipy's anywhere.
        if want < 0.05:
            assert got.pvalue[i] == pytest.approx(want, rel=1e-4, abs=1e-12)
        assert got.pvalue[i] >= want - 1e-9
    assert (got.pvalue < 0.05).sum() >= 10, "the shifted rows must reach the tail"
    assert got.shift[-1] == pytest.approx(0.1, abs=0.03)


def test_ks_tail_is_scipys_and_never_below_it():
    """The two-sided KS tail without importing scipy.stats: scipy's own
    value where p < 5 % (what FDR control decides on), an upper bound
    elsewhere (conservative: it can only withhold a discovery)."""
    for n in (10, 23, 60, 141, 400, 3000):
        d = np.linspace(0.002, 0.998, 2000)
        exact = stats.kstwo.sf(d, n)
        got = ks_sf(d, np.full(len(d), n))
        tail = exact < 0.05
        np.testing.assert_allclose(got[tail], exact[tail], rtol=1e-4, atol=1e-300)
        assert np.all(got >= exact - 1e-6) and np.all(got <= 1.0)


def test_benjamini_hochberg_matches_scipy_and_controls_scale():
    rng = np.random.default_rng(2)
    null = rng.uniform(size=200_000)
    assert benjamini_hochberg(null, 0.01).sum() <= 5, "scale alone must not create discoveries"
    p = np.concatenate([null[:1000], rng.uniform(0, 1e-7, 20), [np.nan]])
    mine = benjamini_hochberg(p, 0.05)
    ref = stats.false_discovery_control(p[:-1], method="bh") <= 0.05
    np.testing.assert_array_equal(mine[:-1], ref)
    assert not mine[-1]


def test_a_row_without_valid_values_is_untested_quietly():
    """A pair silent for the whole period (every probe lost, or none sent)
    has no median: it is untested, without numpy warning about it (the
    warning escaped into a testbed run's log)."""
    rng = np.random.default_rng(3)
    ref = rng.lognormal(np.log(100), 0.05, (3, 20))
    mu, sigma = fit_lognormal(ref, np.ones(ref.shape, dtype=bool))
    valid = np.ones(ref.shape, dtype=bool)
    valid[1] = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ks_lognormal(mu, sigma, ref, valid)
    assert np.isnan(got.pvalue[1]) and np.isnan(got.shift[1])
    assert np.isfinite(got.pvalue[[0, 2]]).all() and np.isfinite(got.shift[[0, 2]]).all()
