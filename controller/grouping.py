"""Average-linkage clustering and one-to-one assignment for the small
matrices skeleton inference meets (a container's NICs, a data-parallel
group's members, a stage's replicas).

Why not SciPy's: `scipy.cluster` and `scipy.optimize` take a quarter of a
second to import, half of `netskel infer`'s start-up budget, for matrices
of a few to a few dozen rows. These are the textbook algorithms with the
inner loop in numpy; tests hold them to SciPy's answers. Above a few dozen
rows SciPy's compiled code is worth its import, and is imported then.
"""

from __future__ import annotations

import math

import numpy as np

LINKAGE_SMALL = 256  # points up to which the numpy linkage runs (5 ms at 256)
LINKAGE_TINY = 16  # points up to which plain Python floats beat numpy's per-call cost
ASSIGN_SMALL = 64  # rows up to which the numpy assignment runs (5 ms at 64)


def average_linkage(d: np.ndarray) -> np.ndarray:
    """The merge order of average-linkage (UPGMA) clustering of a distance
    matrix: (n - 1, 2) pairs of point indices, each the smallest point of
    the two clusters merged, closest first."""
    n = len(d)
    if n > LINKAGE_SMALL:
        from scipy.cluster import hierarchy
        from scipy.spatial.distance import squareform

        z = hierarchy.linkage(squareform(d, checks=False), method="average")
        return _scipy_merges(z, n)
    if n <= LINKAGE_TINY and np.isfinite(d).all():
        return _average_linkage_tiny(d)
    dist = np.array(d, dtype=np.float64)
    np.fill_diagonal(dist, np.inf)
    size = np.ones(n)
    alive = np.ones(n, dtype=bool)
    out = np.empty((max(n - 1, 0), 2), dtype=np.int64)
    for k in range(n - 1):
        flat = int(np.argmin(dist))
        i, j = divmod(flat, n)
        i, j = min(i, j), max(i, j)
        out[k] = (i, j)
        # Lance-Williams for the average: the merged cluster's distance to
        # every other is the size-weighted mean of its parts'.
        merged = (size[i] * dist[i] + size[j] * dist[j]) / (size[i] + size[j])
        size[i] += size[j]
        alive[j] = False
        merged[~alive] = np.inf
        merged[i] = np.inf
        dist[i, :] = merged
        dist[:, i] = merged
        dist[j, :] = np.inf
        dist[:, j] = np.inf
    return out


def _average_linkage_tiny(d: np.ndarray) -> np.ndarray:
    """average_linkage in plain Python floats for a handful of points (a
    container's NICs: thousands of 8 x 8 matrices at 32,768 endpoints,
    where numpy's per-call overhead was most of the time). The same scan
    order (first minimum, row by row) and the same arithmetic, so the same
    merges."""
    n = len(d)
    dist = [[float(v) for v in row] for row in np.asarray(d, dtype=np.float64)]
    for i in range(n):
        dist[i][i] = math.inf
    size = [1.0] * n
    alive = [True] * n
    out = np.empty((max(n - 1, 0), 2), dtype=np.int64)
    for k in range(n - 1):
        best, i, j = math.inf, 0, 0
        for a in range(n):
            row = dist[a]
            for b in range(n):
                if row[b] < best:
                    best, i, j = row[b], a, b
        i, j = min(i, j), max(i, j)
        out[k] = (i, j)
        si, sj = size[i], size[j]
        merged = [(si * x + sj * y) / (si + sj) for x, y in zip(dist[i], dist[j], strict=True)]
        size[i] = si + sj
        alive[j] = False
        for c in range(n):
            if not alive[c] or c == i:
                merged[c] = math.inf
        dist[i] = merged
        dist[j] = [math.inf] * n
        for c in range(n):
            dist[c][i] = merged[c]
            dist[c][j] = math.inf
    return out


def average_linkage_stack(d: np.ndarray) -> np.ndarray:
    """average_linkage of many small matrices at once: d (C, n, n) ->
    merges (C, n - 1, 2). One numpy step per merge across all C (thousands
    of containers' 8 x 8 matrices at 32,768 endpoints: a Python linkage
    each cost ~0.1 ms); the same scan order (first minimum, row by row) and
    the same arithmetic as average_linkage, so the same merges."""
    c, n = d.shape[0], d.shape[1]
    out = np.empty((c, max(n - 1, 0), 2), dtype=np.int64)
    if not c or n < 2:
        return out
    dist = np.array(d, dtype=np.float64)
    dist[:, np.arange(n), np.arange(n)] = np.inf
    size = np.ones((c, n))
    alive = np.ones((c, n), dtype=bool)
    at = np.arange(c)
    for k in range(n - 1):
        i, j = np.divmod(np.argmin(dist.reshape(c, n * n), axis=1), n)
        i, j = np.minimum(i, j), np.maximum(i, j)
        out[:, k, 0], out[:, k, 1] = i, j
        si, sj = size[at, i][:, None], size[at, j][:, None]
        merged = (si * dist[at, i] + sj * dist[at, j]) / (si + sj)
        size[at, i] += size[at, j]
        alive[at, j] = False
        merged[~alive] = np.inf
        merged[at, i] = np.inf
        dist[at, i, :] = merged
        dist[at, :, i] = merged
        dist[at, j, :] = np.inf
        dist[at, :, j] = np.inf
    return out


def cut_stack(merges: np.ndarray, n: int, groups: int) -> np.ndarray:
    """cut() of each of a stack of merge orders (C, n - 1, 2): labels (C, n),
    clusters numbered by their first point."""
    c = merges.shape[0]
    rep = np.tile(np.arange(n), (c, 1))  # each point's cluster, named by its smallest point
    at = np.arange(c)
    for k in range(max(0, n - groups)):
        i, j = merges[:, k, 0], merges[:, k, 1]
        # The merges join clusters by their smallest points (i < j): j's
        # cluster takes i's name.
        ri, rj = rep[at, i], rep[at, j]
        np.copyto(rep, ri[:, None], where=rep == rj[:, None])
    first = rep == np.arange(n)[None, :]
    return np.asarray(np.cumsum(first, axis=1)[at[:, None], rep] - 1, dtype=np.int64)


def _scipy_merges(z: np.ndarray, n: int) -> np.ndarray:
    """SciPy's linkage matrix as merges of representative points."""
    rep = list(range(n))
    out = []
    for a, b in z[:, :2].astype(np.int64).tolist():
        i, j = sorted((rep[a], rep[b]))
        out.append((i, j))
        rep.append(i)
    return np.array(out, dtype=np.int64).reshape(max(n - 1, 0), 2)


def largest_after(merges: np.ndarray, n: int) -> np.ndarray:
    """largest[k]: the largest cluster's size after the first k merges
    (k = 0..n-1). A cut into g clusters is of equal sizes exactly when
    largest[n - g] == n / g (g clusters of n points, none above n / g), so
    the cuts worth making are known from one pass."""
    parent = list(range(n))
    size = [1] * n
    largest = [1] * n
    top = 1
    for k, (i, j) in enumerate(merges.tolist(), start=1):
        ri, rj = find_root(parent, i), find_root(parent, j)
        parent[rj] = ri
        size[ri] += size[rj]
        top = max(top, size[ri])
        largest[k] = top
    return np.array(largest[:n], dtype=np.int64)


def find_root(parent: list[int], x: int) -> int:
    """Union-find: x's set representative, halving the path on the way."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def cut(merges: np.ndarray, n: int, groups: int) -> np.ndarray:
    """Cluster labels 0..groups-1 (numbered by first point) after all but
    the last groups - 1 merges."""
    parent = list(range(n))
    for i, j in merges[: max(0, n - groups)].tolist():
        parent[find_root(parent, j)] = find_root(parent, i)
    roots = [find_root(parent, x) for x in range(n)]
    label = {r: k for k, r in enumerate(sorted(set(roots)))}
    return np.array([label[r] for r in roots], dtype=np.int64)


def max_assignment(score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the one-to-one assignment of rows to columns with the
    largest total score, rows in order (rows <= columns): the Hungarian
    method with shortest augmenting paths, one numpy pass per step."""
    r, c = score.shape
    if r > c:
        raise ValueError("more rows than columns")
    if r > ASSIGN_SMALL:
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(-score)
        return np.asarray(rows), np.asarray(cols)
    cost = -np.asarray(score, dtype=np.float64)
    u = np.zeros(r + 1)
    v = np.zeros(c + 1)
    owner = np.zeros(c + 1, dtype=np.int64)  # owner[j]: row (1-based) holding column j; 0 free
    way = np.zeros(c + 1, dtype=np.int64)
    for i in range(1, r + 1):
        owner[0] = i
        j0 = 0
        minv = np.full(c + 1, np.inf)
        used = np.zeros(c + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = owner[j0]
            free = ~used[1:]
            cur = cost[i0 - 1] - u[i0] - v[1:]
            better = free & (cur < minv[1:])
            minv[1:][better] = cur[better]
            way[1:][better] = j0
            cand = np.where(free, minv[1:], np.inf)
            j1 = int(np.argmin(cand)) + 1
            delta = cand[j1 - 1]
            u[owner[used]] += delta
            v[used] -= delta
            minv[1:][free] -= delta
            j0 = j1
            if owner[j0] == 0:
                break
        while j0:
            j1 = int(way[j0])
            owner[j0] = owner[j1]
            j0 = j1
    cols = np.empty(r, dtype=np.int64)
    for j in range(1, c + 1):
        if owner[j]:
            cols[owner[j] - 1] = j - 1
    return np.arange(r, dtype=np.int64), cols
