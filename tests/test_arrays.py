"""The sort-based uniques, lookups and medians agree with numpy's."""

from __future__ import annotations

import numpy as np
import pytest

from netskel.arrays import (
    csr_rows,
    factorize,
    find_sorted,
    pair_order,
    row_nanmedian,
    unique,
    unique_inverse,
    unique_rows_inverse,
)


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_agree_with_numpy(n):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 50, n)
    np.testing.assert_array_equal(unique(x), np.unique(x))
    u, inv = unique_inverse(x)
    nu, ninv = np.unique(x, return_inverse=True)
    np.testing.assert_array_equal(u, nu)
    np.testing.assert_array_equal(inv, ninv)
    s = np.array([f"e{v}" for v in x], dtype=object)
    names, codes = factorize(s)
    nn, nc = np.unique(s, return_inverse=True)
    assert names == nn.tolist()
    np.testing.assert_array_equal(codes, nc)
    if n:
        for hi in (7, 2**40):  # mixed-radix key, and the lexsort fallback
            k = rng.integers(0, 3, (n, 4)) * np.array([1, 1, hi, 1])
            uk, ik = unique_rows_inverse(k)
            nk, nik = np.unique(k, axis=0, return_inverse=True)
            np.testing.assert_array_equal(uk, nk)
            np.testing.assert_array_equal(ik, nik.ravel())


@pytest.mark.parametrize("n", [7, 1 << 16, (1 << 16) + 5])
def test_pair_order_is_lexicographic_and_stable(n):
    """Both the radix path (ids below 2**16) and the wide-key path order
    pairs as numpy's lexsort does, ties kept in input order."""
    rng = np.random.default_rng(n)
    a = rng.integers(0, n, 50_000)
    b = rng.integers(0, min(n, 40), 50_000)  # many exact ties
    assert np.array_equal(pair_order(a, b, n), np.lexsort((b, a)))


@pytest.mark.parametrize("n_keys", [0, 1, 50])
def test_find_sorted_agrees_with_isin(n_keys):
    rng = np.random.default_rng(n_keys)
    keys = np.sort(rng.choice(200, n_keys, replace=False)).astype(np.int64)
    x = rng.integers(-5, 210, 500)
    found, at = find_sorted(keys, x)
    assert found.tolist() == np.isin(x, keys).tolist()
    assert (keys[at[found]] == x[found]).all()


@pytest.mark.parametrize("cols", [0, 1, 2, 7, 10, 31])
def test_row_nanmedian_agrees_with_nanmedian(cols):
    """Odd and even counts, rows with one value, rows with none (NaN, and no
    warning where numpy warns), infinities kept as values."""
    rng = np.random.default_rng(cols)
    x = rng.normal(size=(400, cols))
    x[rng.random(x.shape) < 0.4] = np.nan
    x[:5] = np.nan
    if cols:
        x[5:10, 0] = np.inf
        x[10:15, :] = 3.0
    with pytest.warns(RuntimeWarning) if cols else np.errstate():
        want = np.nanmedian(x, axis=1) if cols else np.full(400, np.nan)
    got = row_nanmedian(x)
    np.testing.assert_array_equal(got, want)


def test_csr_rows_gathers_each_rows_entries_in_order():
    """Rows taken in any order, repeated and empty ones included, give the
    entries a loop over the rows would."""
    rng = np.random.default_rng(7)
    lens = rng.integers(0, 4, 50)
    ptr = np.r_[0, np.cumsum(lens)]
    rows = np.array([3, 3, 0, 49, 17, 17, 8] + rng.integers(0, 50, 30).tolist())
    out, at = csr_rows(ptr, rows)
    want = [list(range(ptr[r], ptr[r + 1])) for r in rows]
    assert out.tolist() == np.r_[0, np.cumsum([len(w) for w in want])].tolist()
    assert at.tolist() == [x for w in want for x in w]
    empty_ptr, empty_at = csr_rows(ptr, np.zeros(0, dtype=np.int64))
    assert empty_ptr.tolist() == [0] and len(empty_at) == 0
