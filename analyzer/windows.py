"""Probe records to window statistics, in one vectorized pass.

Windows align to multiples of the window length since the epoch, as the
agents' windows do, so offline and live analysis see the same windows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from analyzer.batch import STAT_FIELDS, WindowBatch
from netskel.arrays import packed_rows, unique_rows_inverse
from netskel.model import TAIL_SHIFT_US, WindowStats

if TYPE_CHECKING:  # the agent computes its windows here too, without pyarrow
    from analyzer.records import ProbeRecords

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


def grouped(keys: np.ndarray, rtt: np.ndarray, rtt_sorted: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                       np.ndarray, np.ndarray | None]:
    """(distinct key rows sorted, each row's group, then received_by_group's
    five arrays, and the row order by group and RTT, None where the keys
    are too wide to pack) for non-negative int64 key rows. Two sorts
    instead of three: the RTTs once, then one stable sort by the packed key
    groups the rows and leaves each group's RTTs in order (lost probes,
    sorted as infinite, at each group's end). `rtt_sorted`: the rows are
    already in that RTT order within every group of these keys (a finer
    grouping of rows taken in an earlier call's order), so the stable sort
    alone does."""
    keys = np.asarray(keys, dtype=np.int64)
    flat = packed_rows(keys)
    if flat is None:  # too wide to pack
        uniq, group = unique_rows_inverse(keys)
        return (uniq, group, *received_by_group(group, rtt, len(uniq)), None)
    ok = np.isfinite(rtt)
    if rtt_sorted:
        order = np.argsort(flat, kind="stable")
    else:
        by_rtt = np.argsort(np.where(ok, rtt, np.inf))
        order = by_rtt[np.argsort(flat[by_rtt], kind="stable")]
    fs = flat[order]
    first = np.empty(len(fs), dtype=bool)
    first[:1] = True
    np.not_equal(fs[1:], fs[:-1], out=first[1:])
    gid = np.cumsum(first) - 1
    g = int(gid[-1]) + 1 if len(gid) else 0
    group = np.empty(len(keys), dtype=np.int64)
    group[order] = gid
    uniq = keys[order[first]]
    okk = ok[order]
    sent = np.bincount(gid, minlength=g)
    gr = gid[okk]
    received = np.bincount(gr, minlength=g)
    starts = np.zeros(g, dtype=np.int64)
    starts[1:] = np.cumsum(received)[:-1]
    return uniq, group, sent, received, gr, rtt[order][okk], starts, order


def rtt_stats(received: np.ndarray, gr: np.ndarray, rt: np.ndarray, starts: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """(the contract's RTT statistics of every group, (g, 7) in STAT_FIELDS
    order, NaN where nothing came back; each group's slow count) from
    received_by_group's arrays: one pass for all windows, the offline
    reader's and an agent's alike."""
    g = len(received)
    has = received > 0
    safe_counts = np.maximum(received, 1)
    safe_starts = np.where(has, starts, 0)
    stats = np.full((g, len(STAT_FIELDS)), np.nan)
    slow = np.zeros(g, dtype=np.int64)
    if not len(rt):
        return stats, slow
    col = {f: k for k, f in enumerate(STAT_FIELDS)}
    sums = np.bincount(gr, weights=rt, minlength=g)
    mean = sums / safe_counts
    dev = rt - mean[gr]
    stats[:, col["rtt_mean"]] = mean
    stats[:, col["rtt_std"]] = np.sqrt(np.bincount(gr, weights=dev * dev, minlength=g)
                                       / safe_counts)
    stats[:, col["rtt_min"]] = rt[safe_starts]
    stats[:, col["rtt_max"]] = rt[safe_starts + safe_counts - 1]
    for name, q in zip(("rtt_p25", "rtt_median", "rtt_p75"), QUANTILES, strict=True):
        stats[:, col[name]] = group_quantiles(rt, safe_starts, safe_counts, q)
    stats[~has] = np.nan
    # The slow tail: probes well above their window's own p25 (one slow
    # path among a pair's flows, while its median stays put).
    slow = np.bincount(gr, weights=rt >= stats[gr, col["rtt_p25"]] + TAIL_SHIFT_US,
                       minlength=g).astype(np.int64)
    return stats, slow


def compute_windows_parallel(rec: ProbeRecords, window_s: float = 30.0, parts: int = 2
                             ) -> list[WindowStats]:
    return window_batch_parallel(rec, window_s, parts).windows()


def window_batch_parallel(rec: ProbeRecords, window_s: float = 30.0, parts: int = 2
                          ) -> WindowBatch:
    """window_batch over time slices cut at window boundaries, one thread
    each: windows never span a cut, and the sorts (most of the time)
    release the GIL, so two cores take two slices at once."""
    if parts <= 1 or len(rec) < 200_000:
        return window_batch(rec, window_s)
    widx = np.floor(rec.ts / window_s).astype(np.int64)
    cuts = np.unique(np.quantile(widx, np.linspace(0, 1, parts + 1)[1:-1]).astype(np.int64))
    bounds = [int(widx.min())] + [int(c) for c in cuts] + [int(widx.max()) + 1]
    if bool(np.all(widx[1:] >= widx[:-1])):
        # Rows in time order (as recorders write them): each slice is a
        # view, not a copy of every column (an hour's copy: ~0.4 GB).
        at = np.searchsorted(widx, bounds)
        slices = [rec.subset(slice(int(a), int(b))) for a, b in zip(at, at[1:], strict=False)
                  if a < b]
    else:
        slices = [rec.subset((widx >= lo) & (widx < hi))
                  for lo, hi in zip(bounds, bounds[1:], strict=False) if lo < hi]
    del widx
    with ThreadPoolExecutor(len(slices)) as pool:
        done = list(pool.map(lambda r: window_batch(r, window_s), slices))
    return WindowBatch.concat(done)


def compute_windows(rec: ProbeRecords, window_s: float = 30.0) -> list[WindowStats]:
    """The windows as objects (tests, and callers that want a few)."""
    return window_batch(rec, window_s).windows()


def window_batch(rec: ProbeRecords, window_s: float = 30.0) -> WindowBatch:
    n = len(rec)
    if n == 0:
        return WindowBatch.empty()
    src_names, src_code = rec.factorized("src")
    dst_names, dst_code = rec.factorized("dst")
    proto_names, proto_code = rec.factorized("proto")
    widx = np.floor(rec.ts / window_s).astype(np.int64)
    keys = np.stack([widx, src_code, dst_code, rec.size, proto_code], axis=1)
    uniq, group, sent, received, gr, rt, starts, order = grouped(keys, rec.rtt_us)
    g = len(uniq)
    stats, slow = rtt_stats(received, gr, rt, starts)
    route_names: list[str] = []
    code = np.full(n, -1, dtype=np.int64)
    if rec.has_route:
        route_names, code = rec.factorized("route")
        named = np.asarray(route_names + [""], dtype=object)
        code = np.where(named[code] != "", code, -1)
    route, r_ptr, r_route, r_sent, r_lost, r_median = route_columns(
        group, code, rec.rtt_us, order, g)
    # One endpoint dictionary for both ends.
    names = sorted(set(src_names) | set(dst_names))
    at = {x: i for i, x in enumerate(names)}
    src_map = np.array([at[x] for x in src_names], dtype=np.int64)
    dst_map = np.array([at[x] for x in dst_names], dtype=np.int64)
    return WindowBatch(names=names, src=src_map[uniq[:, 1]], dst=dst_map[uniq[:, 2]],
                       start=uniq[:, 0] * window_s, end=(uniq[:, 0] + 1) * window_s,
                       size=uniq[:, 3].copy(), sent=sent.astype(np.int64),
                       lost=(sent - received).astype(np.int64), stats=stats, slow=slow,
                       protos=list(proto_names), proto=uniq[:, 4].copy(),
                       # Probe records (contract section 3) name no clock.
                       clocks=[""], clock=np.zeros(len(uniq), dtype=np.int64),
                       route_names=list(route_names), route=route, r_ptr=r_ptr,
                       r_route=r_route, r_sent=r_sent, r_lost=r_lost, r_median=r_median)


def route_columns(group: np.ndarray, code: np.ndarray, rtt: np.ndarray,
                  order: np.ndarray | None, g: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                             np.ndarray]:
    """(each window's main route, then its probes by traced route as CSR
    arrays: row pointer, route code, sent, lost, median RTT) from every
    probe's window `group` and route `code` (codes numbered by route name;
    -1: not traced) and `order`, `grouped`'s (group, RTT) row order or None."""
    traced = code >= 0
    # In the windows' (group, RTT) order, each route's probes are in RTT
    # order already: no second RTT sort.
    rows = np.flatnonzero(traced) if order is None else order[traced[order]]
    r_ptr, r_route, r_sent, r_lost, r_median = _route_stats(
        group[rows], code[rows], rtt[rows], g, rtt_sorted=order is not None)
    return _main_route(r_ptr, r_route, r_sent, g), r_ptr, r_route, r_sent, r_lost, r_median


def _main_route(ptr: np.ndarray, code: np.ndarray, sent: np.ndarray, g: int) -> np.ndarray:
    """The route a window names (-1: none traced): the one most of its
    probes took, the first by name on a tie. A function of the probes, not
    of the file's row order (the last traced row seen was: a shuffled file
    moved votes between links)."""
    route = np.full(g, -1, dtype=np.int64)
    has = np.flatnonzero(np.diff(ptr) > 0)
    if not len(has):
        return route
    # Codes number the routes by name, so "more probes, then the smaller
    # code" is one integer per entry; each window's entries are one run.
    score = sent.astype(np.int64) * (int(code.max()) + 1) + (int(code.max()) - code)
    best = np.maximum.reduceat(score, ptr[has])
    entry = np.flatnonzero(score == np.repeat(best, np.diff(ptr)[has]))
    route[has] = code[entry]
    return route


def _route_stats(group: np.ndarray, code: np.ndarray, rtt: np.ndarray, g: int,
                 rtt_sorted: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each window's traced probes by forward route, as CSR arrays (row
    pointer per window; route code, sent, lost, median RTT per entry). A lost
    probe's route is its flow's, so losses land on the path they took."""
    ptr = np.zeros(g + 1, dtype=np.int64)
    if len(group) == 0:
        return ptr, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), \
            np.zeros(0, dtype=np.int64), np.zeros(0)
    uniq, _, sent, received, _, rt, starts, _ = grouped(np.stack([group, code], axis=1), rtt,
                                                        rtt_sorted)
    m = len(uniq)
    med = np.full(m, np.nan)
    has = received > 0
    if has.any():
        med[has] = group_quantiles(rt, starts[has], received[has], 0.5)
    # uniq is sorted by window: each window's routes are one run.
    np.cumsum(np.bincount(uniq[:, 0], minlength=g), out=ptr[1:])
    return ptr, uniq[:, 1].copy(), sent.astype(np.int64), (sent - received).astype(np.int64), med
