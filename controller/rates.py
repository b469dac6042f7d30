"""NIC byte counters -> rates on one time grid, vectorized over all
endpoints: counters that reset, samples missing or out of order, any
interval. What inference reads (controller/skeleton.py), offline from a
Parquet file (controller/infer.py) and live from agents' samples
(controller/live.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from netskel.arrays import factorize
from netskel.errors import InputError, InsufficientData

ROW_BLOCK = 1 << 22  # rows per block of a pass that would need a rows-long temporary
GROUP_BLOCK = 1 << 19  # rows grouped by endpoint at a time: three columns' fit in cache


@dataclass
class Rates:
    endpoints: list[str]
    t0: float
    dt: float
    tx: np.ndarray  # (E, T) bytes/s
    rx: np.ndarray


def places(names: list[str], wanted: list[str]) -> np.ndarray:
    """Each name's place in `wanted`, or len(wanted) where it is not
    wanted: the `recode` of group_rows. Places up to 65,535 fit 16 bits,
    which numpy sorts by radix."""
    at = {e: i for i, e in enumerate(wanted)}
    code_type = np.uint16 if len(wanted) < 1 << 16 else np.int32
    return np.array([at.get(x, len(wanted)) for x in names], dtype=code_type)


def group_rows(code: np.ndarray, n: int, columns: list[np.ndarray], block: int | None = None,
               recode: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """(each column's rows grouped by their code 0..n-1, file order kept
    within a code; rows per code). `recode`: codes are first looked up in
    it, and rows whose new code is n or more are left out (other jobs'
    endpoints). Columns in memory: `group_spans` a block at a time
    (GROUP_BLOCK rows unless `block`)."""
    block = block or GROUP_BLOCK
    spans = [(lo, min(len(code), lo + block)) for lo in range(0, len(code), block)]
    return group_spans(code, n, spans, lambda i: [c[spans[i][0]:spans[i][1]] for c in columns],
                       [c.dtype for c in columns], block, recode)


def group_spans(code: np.ndarray, n: int, spans: list[tuple[int, int]],
                load: Callable[[int], list[np.ndarray]], dtypes: list[np.dtype[Any]],
                block: int | None = None, recode: np.ndarray | None = None
                ) -> tuple[list[np.ndarray], np.ndarray]:
    """group_rows for columns that arrive a span of rows at a time
    (`load(i)`: span i's columns; a Parquet row group as it is decoded), so
    no column is held in file order first. A stable counting sort done a
    block of rows at a time: each block is sorted where it sits in cache
    and its codes' runs written to their places, a run per code. Sorting
    all rows and then gathering each column in that order reads every row
    from a random place: a recording whose rows come in time order, every
    endpoint once per sampling (what collectors write), is a transposition
    (77 M rows: 13-15 s for the sort and three gathers, 4-5 s in blocks;
    decoding into file order first and grouping after wrote and read every
    column once more, 1.8 GB)."""
    step = block or GROUP_BLOCK
    blocks = [(i, b, min(hi, b + step)) for i, (lo, hi) in enumerate(spans)
              for b in range(lo, hi, step)]

    def codes(lo: int, hi: int) -> np.ndarray:
        c = code[lo:hi]
        return c if recode is None else recode[c]

    per = np.empty((len(blocks), n), dtype=np.int64)

    def count(b: int) -> None:
        per[b] = np.bincount(codes(*blocks[b][1:]), minlength=n + 1)[:n]

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(count, range(len(blocks))))
    counts = per.sum(axis=0)
    # Where each block's run of each code starts in the output.
    dest = np.cumsum(per, axis=0)
    dest -= per
    dest += (np.cumsum(counts) - counts)[None, :]
    out = [np.empty(int(counts.sum()), dtype=t) for t in dtypes]
    of_span: dict[int, list[int]] = defaultdict(list)
    for b, (i, _, _) in enumerate(blocks):
        of_span[i].append(b)

    def place(i: int) -> None:
        columns = load(i)
        for b in of_span[i]:
            _, lo, hi = blocks[b]
            c = codes(lo, hi)
            used = np.flatnonzero(per[b])
            runs = per[b, used]
            order = np.argsort(c, kind="stable")[:runs.sum()]  # left-out rows sort last
            at = np.repeat(dest[b, used] - (np.cumsum(runs) - runs), runs)
            at += np.arange(len(at))
            part = slice(lo - spans[i][0], hi - spans[i][0])
            if len(at) == hi - lo:
                # Every row kept: each row's place, and the columns written
                # there straight from the block (no gathered copy of each).
                where = np.empty(hi - lo, dtype=np.int64)
                where[order] = at
                for col, o in zip(columns, out, strict=True):
                    o[where] = col[part]
            else:
                for col, o in zip(columns, out, strict=True):
                    o[at] = col[part][order]

    with ThreadPoolExecutor(2) as pool:  # spans write disjoint rows
        list(pool.map(place, range(len(spans))))
    return out, counts


def time_order_within(ts: np.ndarray, counts: np.ndarray) -> np.ndarray | None:
    """For rows grouped by endpoint (`counts` rows each): the order that
    puts each endpoint's rows in time order (ties keep their order, as
    np.lexsort), or None when they are in order already (recordings are
    usually appended as samples arrive)."""
    back = ts[1:] < ts[:-1]  # time steps back: a new endpoint, or rows out of order
    if np.count_nonzero(back) < len(counts):
        ends = np.cumsum(counts)[:-1] - 1
        back[ends[ends >= 0]] = False
        if not back.any():
            return None
    del back
    # Only each endpoint's run needs ordering. A stable sort (timsort) of
    # (endpoint, time) keys laid out endpoint by endpoint merges within runs
    # instead of sorting all rows from scratch (77 M rows: 8-14 s against
    # 22-26 s for the full sort).
    span = float(ts.max() - ts.min()) + 1.0
    key = np.repeat(np.arange(len(counts), dtype=np.float64) * span, counts)
    key += ts - ts.min()
    return np.argsort(key, kind="stable")


def to_rates(ts: np.ndarray, endpoint: np.ndarray, tx: np.ndarray, rx: np.ndarray,
             wanted: list[str], names: list[str] | None = None, chunk: int = 128) -> Rates:
    """Every wanted endpoint's tx/rx rate on one shared grid, vectorized over
    all endpoints. `endpoint` holds ids, or integer codes into `names` (a
    dictionary-encoded column)."""
    if names is None:
        names, code = factorize(np.asarray(endpoint, dtype=object))
    else:
        code = np.asarray(endpoint)
    # Renumbered 0..E-1 as the rows are grouped, everything else left out,
    # a block at a time: every (rows,) array here is large (77 M rows: 0.6
    # GB a column), and memory a process touches first is slow. A wanted
    # endpoint with no rows is grouped_rates' error.
    grouped, counts = group_rows(code, len(wanted), [ts, tx, rx], recode=places(names, wanted))
    del code, ts, tx, rx  # each endpoint's rows are one run now
    # Popped into the call: no name here keeps them alive while
    # grouped_rates replaces them.
    return grouped_rates(grouped.pop(0), grouped.pop(0), grouped.pop(0), counts, wanted, chunk)


def grouped_rates(ts: np.ndarray, tx: np.ndarray, rx: np.ndarray, counts: np.ndarray,
                  wanted: list[str], chunk: int = 128) -> Rates:
    """to_rates of rows already grouped by endpoint (`counts` rows each, in
    `wanted` order; file order within an endpoint). tx and rx become the
    running byte counts in place: they must be the caller's to give."""
    if not np.all(counts > 0):
        none = [e for e, c in zip(wanted, counts.tolist(), strict=True) if not c]
        raise InsufficientData(f"no throughput samples for endpoint '{none[0]}'"
                               + (f" and {len(none) - 1} more" if len(none) > 1 else ""))
    within = time_order_within(ts, counts)
    if within is not None:
        ts, tx, rx = ts[within], tx[within], rx[within]
    del within
    bounds = np.r_[0, np.cumsum(counts)]
    # Duplicate timestamps of one endpoint carry nothing new.
    dup = np.zeros(len(ts), dtype=bool)
    np.less_equal(ts[1:], ts[:-1], out=dup[1:])
    dup[bounds[1:-1]] = False  # an endpoint's first row follows another's last
    if dup.any():
        keep = ~dup
        bounds = np.r_[0, np.cumsum(keep)][bounds]
        ts, tx, rx = ts[keep], tx[keep], rx[keep]
    del dup
    few = np.flatnonzero(np.diff(bounds) < 2)
    if len(few):
        raise InsufficientData(f"endpoint '{wanted[int(few[0])]}' has fewer than two throughput "
                               "samples" + (f" and {len(few) - 1} more" if len(few) > 1 else ""))
    first = np.zeros(len(ts), dtype=bool)
    first[bounds[:-1]] = True
    # The sampling interval: the median step within endpoints, from about a
    # million of them (steps from one endpoint's last row to the next's
    # first are skipped).
    at = np.arange(0, len(ts) - 1, max(1, (len(ts) - 1) // 1_000_000))
    at = at[~first[at + 1]]
    dt = float(np.median(ts[at + 1] - ts[at])) if len(at) else 0.0
    if not dt > 0:
        raise InputError("throughput samples have no usable interval")
    start = float(ts[bounds[:-1]].max())
    end = float(ts[bounds[1:] - 1].min())
    if end - start < 4 * dt:
        raise InsufficientData("endpoints' recordings do not overlap in time")
    most = int(np.diff(bounds).max())
    if (end - start) / dt > 4 * most + 64:
        # A grid far finer than the rows can fill: timestamps that are not a
        # sampling (and an (endpoints x grid) array that would not fit).
        raise InputError(f"throughput timestamps span {end - start:.6g} s at a {dt:.6g} s "
                         f"interval, more than 4x the {most} samples of any endpoint")

    def cumulative(v: np.ndarray) -> np.ndarray:
        """Bytes counted so far, through counter resets (a drop means the
        counter restarted from zero). One running sum over all endpoints:
        rates are differences within an endpoint, so its offset cancels.
        Integer counters stay exact through the running sum. `v` (grouped
        rows, ours) becomes the sum."""
        # Increments in place, blocks from the end backwards (each block's
        # previous row is still a counter reading): no second rows-long
        # array (77 M rows: 0.6 GB each for tx and rx).
        for hi in range(len(v), 1, -ROW_BLOCK):
            lo = max(hi - ROW_BLOCK, 1)
            inc = v[lo:hi] - v[lo - 1:hi - 1]
            np.copyto(inc, v[lo:hi], where=inc < 0)
            v[lo:hi] = inc
        v[first] = 0
        return np.cumsum(v, out=v)

    # tx and rx are independent passes of memory-bound numpy work, which
    # releases the GIL: two threads use both cores.
    with ThreadPoolExecutor(2) as pool:
        ctx, crx = pool.map(cumulative, (tx, rx))
    del tx, rx
    grid = np.arange(start, end, dt)
    g = len(grid)
    out_tx = np.empty((len(wanted), g - 1), dtype=np.float32)
    out_rx = np.empty_like(out_tx)

    # `chunk` endpoints at a time: their (endpoints x grid) temporaries stay
    # in cache (32,768 endpoints: 128 a chunk 0.88x the time of 1,024).
    def fill(lo: int) -> None:
        hi = min(len(wanted), lo + chunk)
        rows = slice(bounds[lo], bounds[hi])
        # Grid point j of an endpoint interpolates between its last sample at
        # or before grid[j] and the next one. A sample lands in cell
        # ceil((t-start)/dt): counting samples per cell (no search) gives each
        # grid point's index.
        cell = np.clip(np.ceil((ts[rows] - start) / dt), 0, g).astype(np.int64)
        local = np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(bounds[lo:hi + 1]))
        counts = np.bincount(local * (g + 1) + cell, minlength=(hi - lo) * (g + 1))
        seen = np.cumsum(counts.reshape(hi - lo, g + 1), axis=1)[:, :g]
        i = bounds[lo:hi, None] + seen - 1
        i = np.clip(i, bounds[lo:hi, None], bounds[lo + 1:hi + 1, None] - 2)
        t_lo, t_hi = ts[i], ts[i + 1]
        frac = np.clip((grid[None, :] - t_lo) / (t_hi - t_lo), 0.0, 1.0)
        for c, out in ((ctx, out_tx), (crx, out_rx)):
            v = c[i] + frac * (c[i + 1] - c[i])
            out[lo:hi] = np.diff(v, axis=1) / dt

    with ThreadPoolExecutor(2) as pool:  # chunks write disjoint rows
        list(pool.map(fill, range(0, len(wanted), chunk)))
    return Rates(endpoints=list(wanted), t0=start, dt=dt, tx=out_tx, rx=out_rx)
