"""The numpy clustering and assignment against SciPy's, the slow reference
they replace on the start-up path."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.cluster import hierarchy
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import pdist, squareform

from controller import grouping
from controller.grouping import _scipy_merges, average_linkage, cut, max_assignment


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    pairs = {(int(x), int(y)) for x, y in zip(a, b, strict=True)}
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


@pytest.mark.parametrize("n,dim,seed", [(4, 3, 0), (8, 5, 1), (16, 2, 2), (37, 6, 3), (64, 4, 4)])
def test_average_linkage_cuts_match_scipy(n, dim, seed):
    rng = np.random.default_rng(seed)
    # Points around a few centres, so every cut has structure to find.
    x = rng.normal(size=(n, dim)) + 4 * rng.integers(0, 4, size=(n, 1))
    d = squareform(pdist(x))
    z = hierarchy.linkage(pdist(x), method="average")
    merges = average_linkage(d)
    for g in range(1, n + 1):
        ref = hierarchy.fcluster(z, g, criterion="maxclust") - 1
        assert _same_partition(cut(merges, n, g), ref), g
    # The SciPy path (large inputs) reads its linkage matrix the same way.
    np.testing.assert_array_equal(_scipy_merges(z, n), merges)


@pytest.mark.parametrize("n,seed", [(2, 0), (5, 1), (8, 2), (8, 3), (16, 4)])
def test_tiny_linkage_merges_as_the_numpy_one(n, seed, monkeypatch):
    """The plain-Python linkage for a handful of points takes the same
    merges as the numpy one, ties (repeated points) included."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    x[n // 2:] = x[: n - n // 2] if seed % 2 else x[n // 2:]  # repeated points: tied distances
    d = squareform(pdist(x))
    tiny = average_linkage(d)
    monkeypatch.setattr(grouping, "LINKAGE_TINY", 0)
    np.testing.assert_array_equal(tiny, average_linkage(d))


@pytest.mark.parametrize("r,c,seed", [(1, 1, 0), (3, 3, 1), (8, 8, 2), (5, 9, 3), (40, 40, 4)])
def test_max_assignment_matches_scipy_total(r, c, seed):
    s = np.random.default_rng(seed).normal(size=(r, c))
    rows, cols = max_assignment(s)
    rr, rc = linear_sum_assignment(-s)
    np.testing.assert_array_equal(rows, np.arange(r))
    assert len(set(cols.tolist())) == r
    assert s[rows, cols].sum() == pytest.approx(s[rr, rc].sum())


def test_max_assignment_refuses_more_rows_than_columns():
    with pytest.raises(ValueError):
        max_assignment(np.zeros((3, 2)))


@pytest.mark.parametrize("n,seed", [(2, 0), (4, 1), (8, 2), (8, 3), (12, 4), (16, 5), (40, 6)])
def test_stacked_linkage_and_cuts_are_each_matrix_s_own(n, seed):
    """Thousands of containers' matrices are clustered in one stack: each
    gets the merges and cuts the one-matrix functions give it, ties
    (repeated points) and unequal clusters included."""
    from controller.grouping import average_linkage_stack, cut_stack, largest_after

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(30, n, 3)) + 3 * rng.integers(0, 3, size=(30, n, 1))
    x[::3, n // 2:] = x[::3, : n - n // 2]  # every third stack member has tied distances
    d = np.sqrt(((x[:, :, None, :] - x[:, None, :, :]) ** 2).sum(axis=3))
    merges = average_linkage_stack(d)
    for c in range(len(d)):
        one = average_linkage(d[c])
        np.testing.assert_array_equal(merges[c], one)
        largest = largest_after(one, n)
        for g in range(1, n + 1):
            labels = cut(one, n, g)
            np.testing.assert_array_equal(cut_stack(merges[c:c + 1], n, g)[0], labels)
            sizes = np.bincount(labels)
            # The one-pass size test says which cuts are of equal sizes.
            assert (largest[n - g] == n // g and n % g == 0) == (len(set(sizes.tolist())) == 1)
