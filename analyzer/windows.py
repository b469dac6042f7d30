"""Probe records to window statistics, in one vectorized pass.

Windows align to multiples of the window length since the epoch, as the
agents' windows do, so offline and live analysis see the same windows."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from analyzer.records import ProbeRecords
from netskel.arrays import unique_rows_inverse
from netskel.model import TAIL_SHIFT_US, RouteStats, WindowStats

QUANTILES = (0.25, 0.5, 0.75)


def group_quantiles(values: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                    q: float) -> np.ndarray:
    """Linear-interpolated quantile of each group of an array sorted within
    groups (numpy's default method), for all groups at once."""
    pos = q * (counts - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, counts - 1)
    frac = pos - lo
    a = values[starts + lo]
    b = values[starts + hi]
    return np.asarray(a + (b - a) * frac, dtype=np.float64)


def received_by_group(group: np.ndarray, rtt: np.ndarray, g: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sent and received per group, the received RTTs sorted by (group,
    RTT) with their groups, each group's first index among them): what the
    order statistics of every group at once need."""
    sent = np.bincount(group, minlength=g)
    ok = np.isfinite(rtt)
    received = np.bincount(group[ok], minlength=g)
    gr, rt = group[ok], rtt[ok]
    # By group, then RTT: an RTT sort and then a stable sort of the groups
    # (a third faster than np.lexsort of the two keys on millions of rows).
    by_rtt = np.argsort(rt)
    key = gr[by_rtt]
    order = by_rtt[np.argsort(key.astype(np.int32) if g < 2**31 else key, kind="stable")]
    starts = np.zeros(g, dtype=np.int64)
    starts[1:] = np.cumsum(received)[:-1]
    return sent, received, gr[order], rt[order], starts


def compute_windows_parallel(rec: ProbeRecords, window_s: float = 30.0, parts: int = 2
                             ) -> list[WindowStats]:
    """compute_windows over time slices cut at window boundaries, one thread
    each: windows never span a cut, and the sorts (most of the time)
    release the GIL, so two cores take two slices at once."""
    if parts <= 1 or len(rec) < 200_000:
        return compute_windows(rec, window_s)
    widx = np.floor(rec.ts / window_s).astype(np.int64)
    cuts = np.unique(np.quantile(widx, np.linspace(0, 1, parts + 1)[1:-1]).astype(np.int64))
    bounds = [int(widx.min())] + [int(c) for c in cuts] + [int(widx.max()) + 1]
    slices = [rec.subset((widx >= lo) & (widx < hi)) for lo, hi in zip(bounds, bounds[1:], strict=False)
              if lo < hi]
    del widx
    with ThreadPoolExecutor(len(slices)) as pool:
        done = list(pool.map(lambda r: compute_windows(r, window_s), slices))
    return [w for part in done for w in part]


def compute_windows(rec: ProbeRecords, window_s: float = 30.0) -> list[WindowStats]:
    n = len(rec)
    if n == 0:
        return []
    src_names, src_code = rec.factorized("src")
    dst_names, dst_code = rec.factorized("dst")
    proto_names, proto_code = rec.factorized("proto")
    widx = np.floor(rec.ts / window_s).astype(np.int64)
    keys = np.stack([widx, src_code, dst_code, rec.size, proto_code], axis=1)
    uniq, group = unique_rows_inverse(keys)
    g = len(uniq)
    sent, received, gr, rt, starts = received_by_group(group, rec.rtt_us, g)
    has = received > 0
    safe_counts = np.maximum(received, 1)
    safe_starts = np.where(has, starts, 0)
    stats: dict[str, np.ndarray] = {}
    if len(rt):
        sums = np.bincount(gr, weights=rt, minlength=g)
        mean = sums / safe_counts
        dev = rt - mean[gr]
        stats["rtt_mean"] = mean
        stats["rtt_std"] = np.sqrt(np.bincount(gr, weights=dev * dev, minlength=g) / safe_counts)
        stats["rtt_min"] = rt[safe_starts]
        stats["rtt_max"] = rt[safe_starts + safe_counts - 1]
        for name, q in zip(("rtt_p25", "rtt_median", "rtt_p75"), QUANTILES, strict=True):
            stats[name] = group_quantiles(rt, safe_starts, safe_counts, q)
        # The slow tail: probes well above their window's own p25 (one slow
        # path among a pair's flows, while its median stays put).
        slow = np.bincount(gr, weights=rt >= stats["rtt_p25"][gr] + TAIL_SHIFT_US,
                           minlength=g).astype(np.int64)
    else:
        slow = np.zeros(g, dtype=np.int64)
    routes = np.full(g, "", dtype=object)
    by_route: list[tuple[RouteStats, ...]] = [()] * g
    if rec.has_route:  # a window's traced route: its probes' (the last one seen)
        names, code = rec.factorized("route")
        named = np.asarray(names + [""], dtype=object)
        traced = (code >= 0) & (named[code] != "")
        routes[group[traced]] = named[code[traced]]
        by_route = _route_stats(group[traced], names, code[traced], rec.rtt_us[traced], g)
    # One Python object per window is the output; build them from plain
    # lists (numpy scalars one by one cost several times more).
    nan = [math.nan] * g
    cols = [np.where(has, stats[k], np.nan).tolist() if k in stats else nan for k in _ORDER]
    src_s = np.asarray(src_names, dtype=object)[uniq[:, 1]].tolist()
    dst_s = np.asarray(dst_names, dtype=object)[uniq[:, 2]].tolist()
    proto_s = np.asarray(proto_names, dtype=object)[uniq[:, 4]].tolist()
    w0 = (uniq[:, 0] * window_s).tolist()
    w1 = ((uniq[:, 0] + 1) * window_s).tolist()
    return [WindowStats(a, b, s0, s1, size, n, n - r, mn, p25, med, p75, mean, std, mx, pr, rt, rs,
                        sl)
            for a, b, s0, s1, size, n, r, mn, p25, med, p75, mean, std, mx, pr, rt, rs, sl
            in zip(src_s, dst_s, w0, w1, uniq[:, 3].tolist(), sent.tolist(), received.tolist(),
                   *cols, proto_s, routes.tolist(), by_route, slow.tolist(), strict=True)]


# WindowStats' RTT fields in declaration order (after src..lost).
_ORDER = ("rtt_min", "rtt_p25", "rtt_median", "rtt_p75", "rtt_mean", "rtt_std", "rtt_max")


def _route_stats(group: np.ndarray, names: list[str], code: np.ndarray, rtt: np.ndarray,
                 g: int) -> list[tuple[RouteStats, ...]]:
    """Each window's traced probes by forward route: sent, lost, median RTT.
    A lost probe's route is its flow's, so losses land on the path they took."""
    out: list[tuple[RouteStats, ...]] = [()] * g
    if len(group) == 0:
        return out
    keys = np.stack([group, code], axis=1)
    uniq, sub = unique_rows_inverse(keys)
    m = len(uniq)
    sent, received, _, rt, starts = received_by_group(sub, rtt, m)
    med = np.full(m, np.nan)
    has = received > 0
    if has.any():
        med[has] = group_quantiles(rt, starts[has], received[has], 0.5)
    # uniq is sorted by window: each window's routes are one run.
    win = uniq[:, 0]
    bounds = np.flatnonzero(np.r_[True, win[1:] != win[:-1], True])
    items = [RouteStats(r, n, n - k, md) for r, n, k, md in zip(
        np.asarray(names, dtype=object)[uniq[:, 1]].tolist(), sent.tolist(), received.tolist(),
        med.tolist(), strict=True)]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        out[int(win[lo])] = tuple(items[lo:hi])
    return out
