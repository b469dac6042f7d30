"""Long-term drift: a pair's RTT over a later period against a log-normal
fitted to its reference period, for every pair at once, with the false
discovery rate controlled across pairs (a million healthy pairs tested at
alpha 0.01 would otherwise raise ten thousand alarms).

The test is one-sample Kolmogorov-Smirnov against the fitted log-normal
(scipy.stats.kstest with 'lognorm' is the per-pair reference in tests,
its tail probability `ks_sf`);
estimating the parameters from the reference, not from the tested period,
keeps the test honest."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from netskel.arrays import row_nanmedian


@dataclass
class DriftResult:
    pvalue: np.ndarray  # (P,) NaN where untested
    shift: np.ndarray   # (P,) median of the period over the reference median, minus 1


def fit_lognormal(values: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-likelihood (mu, sigma) of log values, per row (NaN if < 2 values)."""
    logs = np.where(valid, np.log(np.where(valid, values, 1.0)), 0.0)
    n = valid.sum(axis=1)
    safe = np.maximum(n, 1)
    mu = logs.sum(axis=1) / safe
    var = (np.where(valid, (logs - mu[:, None]) ** 2, 0.0)).sum(axis=1) / safe
    bad = n < 2
    return np.where(bad, np.nan, mu), np.where(bad, np.nan, np.sqrt(var))


def ks_lognormal(mu: np.ndarray, sigma: np.ndarray, values: np.ndarray, valid: np.ndarray,
                 min_values: int = 10) -> DriftResult:
    """Two-sided one-sample KS of each row's valid values against LogNormal(mu, sigma)."""
    p, m = values.shape
    n = valid.sum(axis=1)
    x = np.sort(np.where(valid, values, np.inf), axis=1)
    sig = np.maximum(sigma, 1e-9)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.log(x) - mu[:, None]) / sig[:, None]
    cdf = special.ndtr(z)
    i = np.arange(1, m + 1)[None, :]
    inside = i <= n[:, None]
    nn = np.maximum(n, 1)[:, None]
    d_plus = np.where(inside, i / nn - cdf, -np.inf).max(axis=1)
    d_minus = np.where(inside, cdf - (i - 1) / nn, -np.inf).max(axis=1)
    d = np.maximum(d_plus, d_minus)
    tested = (n >= min_values) & np.isfinite(mu) & np.isfinite(sigma)
    pv = np.full(p, np.nan)
    if tested.any():
        pv[tested] = ks_sf(d[tested], n[tested])
    med = np.full(p, np.nan)
    some = n > 0  # a row with no valid value has no median (and numpy would warn)
    if m and some.any():
        med[some] = row_nanmedian(np.where(valid[some], values[some], np.nan))
    shift = np.where(tested, med / np.exp(mu) - 1.0, np.nan)
    return DriftResult(pvalue=pv, shift=shift)


def ks_sf(d: np.ndarray, n: np.ndarray) -> np.ndarray:
    """P(D_n >= d) for the two-sided KS statistic, as twice the one-sided
    (Smirnov) tail, capped at 1. Where a p-value can decide anything (its
    tail) this is what scipy.stats.kstwo computes itself (Simard &
    L'Ecuyer: 2 x smirnov once n d^2 >= 2.2 to 4); elsewhere it is the
    union bound, never below the exact value, so it can only withhold a
    discovery, never make one (tests hold it to kstwo). scipy.stats cost
    0.65-1.6 s to import, a tenth of analysing an hour of probes."""
    return np.asarray(np.minimum(1.0, 2.0 * special.smirnov(n, d)))


def benjamini_hochberg(pvalues: np.ndarray, q: float) -> np.ndarray:
    """Discoveries at false discovery rate q; NaN p-values are never discoveries."""
    p = np.asarray(pvalues, dtype=np.float64)
    ok = np.isfinite(p)
    out = np.zeros(len(p), dtype=bool)
    m = int(ok.sum())
    if m == 0:
        return out
    idx = np.flatnonzero(ok)
    order = np.argsort(p[ok])
    ranked = p[ok][order]
    below = ranked <= q * np.arange(1, m + 1) / m
    if below.any():
        cut = int(np.flatnonzero(below).max())
        out[idx[order[:cut + 1]]] = True
    return out
