"""Local Outlier Factor of each pair's newest window against that pair's own
recent windows, for every pair in one numpy pass.

scikit-learn's LocalOutlierFactor(novelty=True) computes the same thing for
one pair at a time; tests hold this to it. Here histories of different
lengths sit in one (pairs, H, features) array with a validity mask, and each
pair uses k = min(k, its history - 1) neighbours, as scikit-learn does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from netskel.arrays import row_nanmedian

EPS = 1e-10  # scikit-learn's guard against a zero reachability mean


@dataclass
class LofResult:
    score: np.ndarray    # (P,) LOF of the query; NaN where the history is too short
    outside: np.ndarray  # (P,) bool: its k nearest history windows are farther, on
    #                      average, than a typical history window's k-th neighbour


def _pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched Euclidean distances: (P, N, F) x (P, M, F) -> (P, N, M)."""
    aa = np.einsum("pnf,pnf->pn", a, a)
    bb = np.einsum("pmf,pmf->pm", b, b)
    d2 = aa[:, :, None] + bb[:, None, :] - 2.0 * np.einsum("pnf,pmf->pnm", a, b)
    return np.asarray(np.sqrt(np.maximum(d2, 0.0)))


def lof_novelty(history: np.ndarray, valid: np.ndarray, query: np.ndarray, k: int,
                chunk: int = 16384) -> LofResult:
    """history (P, H, F), valid (P, H) bool, query (P, F)."""
    p_all = history.shape[0]
    score = np.full(p_all, np.nan)
    outside = np.zeros(p_all, dtype=bool)
    for lo in range(0, p_all, chunk):
        hi = min(p_all, lo + chunk)
        s, o = _lof_chunk(history[lo:hi].astype(np.float64), valid[lo:hi],
                          query[lo:hi].astype(np.float64), k)
        score[lo:hi], outside[lo:hi] = s, o
    return LofResult(score, outside)


def _lof_chunk(hist: np.ndarray, valid: np.ndarray, q: np.ndarray, k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    p, h, _ = hist.shape
    n = valid.sum(axis=1)
    kk = np.clip(np.minimum(k, n - 1), 1, None)
    usable = n >= 2
    hist = np.where(valid[:, :, None], hist, 0.0)
    d = _pairwise(hist, hist)
    pair_ok = valid[:, :, None] & valid[:, None, :]
    d = np.where(pair_ok, d, np.inf)
    idx = np.arange(h)
    d[:, idx, idx] = np.inf  # a window is not its own neighbour
    order = np.argsort(d, axis=2, kind="stable")
    sorted_d = np.take_along_axis(d, order, axis=2)
    kdist = np.take_along_axis(sorted_d, (kk - 1)[:, None, None].repeat(h, axis=1), axis=2)[:, :, 0]
    in_k = idx[None, :] < kk[:, None]  # (p, h): rank < k
    # Reachability of history window i from its neighbours o: max(kdist[o], d(i, o)).
    kd_of_nb = np.take_along_axis(np.broadcast_to(kdist[:, None, :], d.shape), order, axis=2)
    reach = np.maximum(kd_of_nb, sorted_d)
    reach_mean = np.where(in_k[:, None, :], reach, 0.0).sum(axis=2) / kk[:, None]
    lrd = 1.0 / (reach_mean + EPS)
    # The query against the history.
    dq = np.sqrt(np.maximum(((hist - q[:, None, :]) ** 2).sum(axis=2), 0.0))
    dq = np.where(valid, dq, np.inf)
    qo = np.argsort(dq, axis=1, kind="stable")
    qd = np.take_along_axis(dq, qo, axis=1)
    q_reach = np.maximum(np.take_along_axis(kdist, qo, axis=1), qd)
    q_reach = np.where(in_k, q_reach, 0.0).sum(axis=1) / kk
    lrd_q = 1.0 / (q_reach + EPS)
    nb_lrd = np.where(in_k, np.take_along_axis(lrd, qo, axis=1), 0.0).sum(axis=1) / kk
    with np.errstate(invalid="ignore", divide="ignore"):  # unusable rows: inf / inf
        score = np.where(usable, nb_lrd / lrd_q, np.nan)
    # Outside the history's cluster: the query's neighbours are farther from
    # it than history windows typically are from theirs (one stray history
    # window next to it does not pull it in).
    q_knn = np.where(in_k, np.where(np.isfinite(qd), qd, 0.0), 0.0).sum(axis=1) / kk
    typical = row_nanmedian(np.where(valid, kdist, np.nan))  # NaN: rows without history
    outside = usable & (q_knn > typical)
    return score, outside
