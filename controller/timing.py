"""Iteration timing of a training job from its NICs' rates: pure functions.

Why this shape: in real data-parallel training the gradient all-reduce is
most of the bytes (about 90 %), a line-rate burst that each endpoint sends
and receives at once (tx ~ rx), and it is a collective: every member of a
data-parallel group bursts at the same instant. A pipeline stage reduces
when its last backward ends, so the last stage reduces first and stage 0
last, one microbatch's backward apart, and the job's iteration ends when
stage 0's reduction does (the optimizer step): a job-wide sync point.
Iterations jitter (a few %), the error accumulates and replicas stall, so
the recording is cut at each sync point rather than folded at one period.

- `find_iterations`: the job's reductions (each endpoint's line-rate bursts
  of symmetric traffic, min(tx, rx): one-way bursts and checkpoint writes
  cancel; an MoE job's all-to-alls stay below), grouped into one cluster
  per iteration by the gaps between them (a grouping whose windows do not
  hold most endpoints' reductions is one stage's, not iterations); the sync
  points are the clusters' ends; the period is their median spacing.
- `collective_offsets`: each endpoint's reduction time within each
  iteration, relative to the job's mean: stages show as levels.
- `host_clocks` / `align_clocks`: each host's clock error, read from its
  endpoints' reductions against the rest of their data-parallel groups (a
  collective happens at one instant), and every endpoint's rates moved
  onto the common clock, so a send and its receive fall in one sample.
- `activity_wobble`: each endpoint's centre of non-collective traffic per
  iteration, relative to its stage: a replica's own pace, shared by all its
  stages and tensor-parallel ranks (how partners are told apart).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from netskel.arrays import row_nanmedian

BURST_LEVEL = 0.1  # a sample is part of a burst above this share of the job's top reduction rate
# An endpoint's reduction: its samples above this share of its own top rate
# (then widened a sample each side, so a burst's tail still counts). The
# reduction is one line-rate burst of GBs; an MoE stage's all-to-alls are
# many smaller ones, in lockstep across its expert group, and at 10 % of
# the top (BURST_LEVEL) they joined it and pulled every centre off.
REDUCTION_LEVEL = 0.3
COLLECTIVE_LEVEL = 0.05  # an endpoint's sample is collective above this share of its top
GAP_RATIO = 1.5  # gaps between iterations: their median at least this many times the cut
# Fewer repeats than this are no evidence of training. Iterations last up
# to 30 s: three minutes of counters hold six.
MIN_ITERATIONS = 5
# In an iteration every endpoint reduces; in one pipeline stage's cluster of
# reductions at most half do (pp >= 2). The median window must hold this share.
WHOLE_JOB = 0.75
REGULAR_TOLERANCE = 0.25  # an iteration is regular within this fraction of the period
OUTLIER_SAMPLES = 1.5  # an iteration's centre further than this many samples from the median...
ONE_WAY_SHARE = 0.03  # an endpoint's samples with the largest one-way bytes, left out of transfer scores
OUTLIER_MADS = 3.0  # ...plus this many robust deviations is a stall or straggler, left out


@dataclass(frozen=True)
class Iterations:
    sync: np.ndarray  # sample index where each iteration's reductions end (the next one's compute starts)
    bounds: np.ndarray  # mid-gap after each iteration: windows that hold its reductions whole
    period: float  # seconds, the median spacing of iterations
    regularity: float  # share of spacings within REGULAR_TOLERANCE of the period

    @property
    def count(self) -> int:
        return max(0, len(self.sync) - 1)


def symmetric(tx: np.ndarray, rx: np.ndarray) -> np.ndarray:
    """Traffic sent and received at once: collectives stay, one-way cancels."""
    return np.asarray(np.minimum(tx, rx))


def _clusters(hot: np.ndarray, gaps: np.ndarray, job: np.ndarray, cut: int, dt: float
              ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(cluster ends, mid-gap bounds, period, regularity) when burst samples
    closer than `cut` samples belong to one iteration (`gaps`: np.diff(hot))."""
    big = np.flatnonzero(gaps > cut)
    starts = np.r_[hot[0], hot[big + 1]]
    ends = np.r_[hot[big], hot[-1]]
    half = (starts[1:] - ends[:-1] + 1) // 2
    bounds = ends + 1 + np.r_[half, int(np.median(half)) if len(half) else 0]
    if len(ends) < MIN_ITERATIONS + 1:
        return ends, bounds, 0.0, 0.0
    w = job[hot] + 1e-30
    seg = np.repeat(np.arange(len(starts)), np.diff(np.r_[0, big + 1, len(hot)]))
    centre = np.bincount(seg, weights=hot * w) / np.bincount(seg, weights=w)
    spacing = np.diff(centre) * dt
    period = float(np.median(spacing))
    if dt > REGULAR_TOLERANCE * period:
        # Under four samples an iteration, spacings are grid values (a
        # burst inside one sample has its centre on the grid): a 2.5-sample
        # period reads 2 and 3, and their median is one of them, against
        # which the other looks irregular (merging pairs of iterations, 5
        # and 5, then looks more regular than the truth). Their mean is the
        # period; then regularity is judged as for any period, so random
        # samples (spacings 1, 2, 3, ...) stay irregular.
        period = float(np.mean(spacing[np.abs(spacing - period) <= dt * (1 + 1e-6)]))
    regular = float(np.mean(np.abs(spacing - period) <= REGULAR_TOLERANCE * period))
    # Iterations are apart: the gaps between them stand out from the gaps
    # inside them. Random bursts joined by a large cut until their count
    # looks regular are parted by gaps just over the cut.
    if float(np.median(gaps[big])) < GAP_RATIO * cut:
        regular = 0.0
    return ends, bounds, period, regular


def find_iterations(burst: np.ndarray, dt: float) -> Iterations | None:
    """Sync points of the job's iterations from its endpoints' reductions
    (`reduction_bursts`), or None when they have no repeating structure (a
    debug or idle job)."""
    share = burst / (burst.sum(axis=1, keepdims=True) + 1e-9)  # every endpoint counts alike
    job = share.mean(axis=0)
    top = float(np.quantile(job, 0.999))
    if not top > 0:
        return None
    hot = np.flatnonzero(job > BURST_LEVEL * top)
    if len(hot) < MIN_ITERATIONS + 1:
        return None
    # Gaps inside an iteration's burst cluster (stages one backward apart)
    # are shorter than gaps between iterations. Which gaps join bursts into
    # iterations is what makes iterations most regular (a cut too small
    # splits iterations, one too large merges them: both give irregular
    # spacing); among equals the smallest cut wins.
    gaps = np.diff(hot)
    cuts = np.unique(np.r_[1, gaps])  # 1: only adjacent samples join
    tried = [(c, *_clusters(hot, gaps, job, int(c), dt)) for c in cuts]
    # Every endpoint reduces once an iteration. With few long iterations,
    # each pipeline stage's reduction (one backward apart, far closer than
    # the iterations) is a regular cluster of its own, holding 1/pp of the
    # endpoints: such clusters are not iterations.
    on = burst[:: max(1, len(burst) // 1024)] > 0  # up to 1,024 endpoints, evenly spread
    whole = [t for t in tried if t[3] > 0 and _coverage(on, t[2]) >= WHOLE_JOB]
    if not whole:
        return None
    best = max(t[4] for t in whole)
    cut, ends, bounds, period, regular = next(t for t in whole if t[4] >= best)
    n = burst.shape[1]
    return Iterations(sync=np.minimum(ends + 1, n), bounds=np.minimum(bounds, n),
                      period=period, regularity=regular)


def _coverage(on: np.ndarray, bounds: np.ndarray) -> float:
    """Median over iteration windows (between consecutive mid-gap bounds)
    of the share of endpoints (rows of `on`: where each reduces) that
    reduce in the window."""
    if len(bounds) < 2:
        return 0.0
    edges = np.minimum(np.asarray(bounds, dtype=np.int64), on.shape[1] - 1)
    inside = np.logical_or.reduceat(on, edges[:-1], axis=1)
    inside[:, np.diff(edges) <= 0] = False  # reduceat gives an empty window its first sample
    return float(np.median(inside.mean(axis=0)))


def window_centres(x: np.ndarray, sync: np.ndarray, dt: float, rows: int = 256) -> np.ndarray:
    """(E, K) byte-weighted centre time of x in each iteration window
    [sync[k], sync[k+1]); NaN where an endpoint moved nothing. Windows are
    contiguous, so one running reduction per block of rows does it: memory
    stays (rows x samples) whatever the number of iterations (a one-hot
    (samples x iterations) matrix was 2.6 GB for an hour at 10 ms with 2 s
    iterations)."""
    e, n = x.shape
    k = len(sync) - 1
    out = np.full((e, max(k, 0)), np.nan)
    lo, hi = (int(sync[0]), int(sync[-1])) if k > 0 else (0, 0)
    if hi <= lo:
        return out
    edges = np.asarray(sync, dtype=np.int64) - lo
    empty = np.diff(edges) <= 0
    # reduceat needs every index inside the span (an empty last window is
    # clamped; it is set to nothing below anyway).
    starts = np.minimum(edges[:-1], hi - lo - 1)
    t = np.arange(lo, hi, dtype=np.float64) * dt
    for r0 in range(0, e, rows):
        block = np.asarray(x[r0:r0 + rows, lo:hi], dtype=np.float64)
        den = np.add.reduceat(block, starts, axis=1)
        num = np.add.reduceat(block * t, starts, axis=1)
        den[:, empty] = 0.0  # reduceat gives an empty window its first sample
        with np.errstate(invalid="ignore", divide="ignore"):
            c = num / den
        c[den <= 0] = np.nan
        out[r0:r0 + rows] = c
    return out


def _robust_mean(x: np.ndarray, dt: float) -> np.ndarray:
    """Row-wise mean of the values near the row's median, NaNs ignored.
    Centres are quantized to the sampling interval: at coarse sampling an
    endpoint's centre takes two or three values, and a trimmed mean or a
    median snaps to the commonest one (offsets one quarter of a sample apart
    come out equal). A plain mean of the values within a sample and a half
    (plus the row's own spread) keeps the sub-sample information and still
    drops the stalls and stragglers that land far off."""
    # Row medians by one sort (`row_nanmedian`): numpy's nanmedian of short
    # rows goes through masked arrays (32,768 x 40: 0.115 s against 0.018).
    m = row_nanmedian(x)[:, None]
    dev = np.abs(x - m)
    mad = row_nanmedian(dev)[:, None]
    with np.errstate(invalid="ignore"):
        inside = dev <= OUTLIER_SAMPLES * dt + OUTLIER_MADS * 1.4826 * mad
        return np.asarray(np.where(inside, x, 0.0).sum(axis=1) / inside.sum(axis=1))


def rowwise(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, rows: int = 2048
            ) -> np.ndarray:
    """fn (a per-row reduction keeping dims, e.g. np.quantile along axis 1)
    of x, `rows` rows at a time on both cores: numpy's partition releases
    the GIL, and each row's answer is its own (32,768 x 2,393: 1.0-1.7 s for
    one np.quantile, 0.5 s in blocks; the same values)."""
    if len(x) <= rows:
        return fn(x)
    with ThreadPoolExecutor(2) as pool:
        return np.concatenate(list(pool.map(lambda lo: fn(x[lo:lo + rows]),
                                            range(0, len(x), rows))))


def reduction_bursts(sym: np.ndarray) -> np.ndarray:
    """Each endpoint's symmetric traffic in its reductions only: samples
    above REDUCTION_LEVEL of its own top, widened a sample each side (a
    burst straddles samples), zero elsewhere."""
    top = rowwise(lambda b: np.quantile(b, 0.999, axis=1, keepdims=True), sym)
    hot = sym > REDUCTION_LEVEL * top
    hot[:, 1:] |= hot[:, :-1].copy()
    hot[:, :-1] |= hot[:, 1:].copy()
    return np.asarray(np.where(hot, sym, 0.0))


def collective_offsets(burst: np.ndarray, it: Iterations, dt: float) -> np.ndarray:
    """Per endpoint, seconds between its reduction and the job's mean
    reduction in the same iteration, averaged over iterations. Only burst
    samples and their neighbours count, so background bytes do not pull the
    centre while the tail of a burst that straddles a sample boundary does
    (dropping it would snap the centre to the sample grid): `burst` is
    `reduction_bursts` of the job's symmetric traffic."""
    # Windows cut mid-gap: a reduction whose endpoint's clock or burst runs
    # a little past the job's sync point stays in its own iteration.
    c = window_centres(burst, it.bounds, dt)
    # The job's reference is a mean, not a median: a median of quantized
    # centres jumps by a whole sample from one iteration to the next.
    seen = np.isfinite(c)
    mean = np.where(seen, c, 0.0).sum(axis=0) / np.maximum(seen.sum(axis=0), 1)
    rel = c - mean[None, :]
    return _robust_mean(rel, dt)


def host_clocks(offset: np.ndarray, groups: list[np.ndarray], host_of: np.ndarray,
                limit: float) -> np.ndarray:
    """Per endpoint, seconds its host's clock runs ahead of its peers'. The
    members of a data-parallel group reduce at one instant (the all-reduce
    waits for the last), so where each one's reduction sits against its
    group's median is its clock, plus noise the iterations average out;
    one host's endpoints share one clock (their median). Hosts' clocks
    lie tens of ms apart: at 50 ms sampling or finer, a send and its
    receive land samples apart, and the transfers that tell pipeline
    partners apart vanish or point at a lockstepped neighbour. No clock is
    further off than `limit` (NTP's bound): a host reducing further from its
    group than that is no clock error but a structure in doubt, and moving
    its rates by hundreds of ms would only scramble them."""
    res = np.zeros_like(offset)
    kept = [np.asarray(g) for g in groups if len(g) > 1]
    if kept:
        member = np.concatenate(kept)
        label = np.repeat(np.arange(len(kept)), [len(g) for g in kept])
        res[member] = offset[member] - grouped_median(offset[member], label)[label]
    _, host = np.unique(host_of, return_inverse=True)
    out = grouped_median(res, host)[host] if len(host) else np.zeros_like(offset)
    return np.asarray(np.clip(out, -limit, limit))


def on_one_clock(tx: np.ndarray, rx: np.ndarray, offset: np.ndarray, groups: list[np.ndarray],
                 host_of: np.ndarray, dt: float, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """Both rate arrays moved onto the common clock (`host_clocks` read from
    the reduction offsets, then `align_clocks`): what every sample-by-sample
    comparison of endpoints needs first."""
    ahead = host_clocks(offset, groups, host_of, limit)
    return align_clocks(tx, ahead, dt), align_clocks(rx, ahead, dt)


def grouped_median(values: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Median of `values` per label 0..label.max() (NaN where a label has
    none), by one sort instead of a boolean pass per label."""
    count = np.bincount(label)
    order = np.lexsort((values, label))
    v = values[order]
    start = np.r_[0, np.cumsum(count)[:-1]]
    out = np.full(len(count), np.nan)
    has = count > 0
    lo, hi = (start + (count - 1) // 2)[has], (start + count // 2)[has]
    out[has] = (v[lo] + v[hi]) / 2.0
    return out


def align_clocks(x: np.ndarray, ahead: np.ndarray, dt: float, rows: int = 256) -> np.ndarray:
    """Rates on the common clock: out[e, k] = x[e, k + ahead[e] / dt],
    linear between samples (what a sampler at the true instants would have
    read off the cumulative counter), the first and last sample held at
    the edges. Blocks of `rows` rows, slices per whole-sample shift within
    each: at 32,768 endpoints x is gigabytes, and gathering the rows of
    each shift from all of it took 2.4 s per array against 0.4 s."""
    s = ahead / dt
    whole = np.floor(s).astype(np.int64)
    frac = (s - whole).astype(x.dtype)
    out = np.empty_like(x)
    for a in range(0, x.shape[0], rows):
        b = min(a + rows, x.shape[0])
        block, w, f = x[a:b], whole[a:b], frac[a:b, None]
        for v in np.unique(w).tolist():
            r = np.flatnonzero(w == v)
            src = block[r]
            res = _shifted(src, v)
            res *= 1 - f[r]
            res += f[r] * _shifted(src, v + 1)
            out[a + r] = res
    return out


def _shifted(x: np.ndarray, v: int) -> np.ndarray:
    """y[:, k] = x[:, k + v], the first and last column held beyond the ends."""
    t = x.shape[1]
    y = np.empty_like(x)
    lo, hi = min(t, max(0, -v)), max(0, min(t, t - v))
    if lo < hi:
        y[:, lo:hi] = x[:, lo + v:hi + v]
    y[:, :lo] = x[:, :1]
    y[:, max(hi, lo):] = x[:, -1:]
    return y


def collective_mask(sym: np.ndarray, groups: list[np.ndarray] | None = None) -> np.ndarray:
    """Samples where an endpoint takes part in a collective burst, widened by
    one sample each side (a burst straddles samples). With `groups` (the
    data-parallel groups, on one clock), only where the endpoint's group
    bursts too (its median member, within a sample): a collective is
    group-wide. At 10 ms sampling activations are themselves line-rate
    bursts, and where a stage's forward sends overlap its backward receives
    they look as symmetric as a reduction: the endpoint's own level masked
    them, and with them the transfers that tell partners (median partner
    correlation ~0 at 10 ms; 0.25 with the group's say)."""
    rel = sym / np.maximum(np.max(sym, axis=1, keepdims=True), 1e-30)
    m = rel > COLLECTIVE_LEVEL
    for g in groups or []:
        if len(g) > 1:
            hot = median_above(rel[g], COLLECTIVE_LEVEL)
            hot[1:] |= hot[:-1].copy()
            hot[:-1] |= hot[1:].copy()
            m[g] &= hot
    m[:, 1:] |= m[:, :-1].copy()
    m[:, :-1] |= m[:, 1:].copy()
    return np.asarray(m)


def median_above(x: np.ndarray, level: float) -> np.ndarray:
    """np.median(x, axis=0) > level per column, by counting the values
    above: with more than half of them above, the median is; with fewer
    than half, it is not. Only a column with exactly half above (an even
    count) needs its median (a group's 512 x 2,400 samples: 1 ms against
    23 ms)."""
    n = x.shape[0]
    above = np.count_nonzero(x > level, axis=0)
    out = np.asarray(2 * above > n + (1 if n % 2 == 0 else 0))
    if n % 2 == 0:
        tie = np.flatnonzero(2 * above == n)
        if len(tie):
            out[tie] = np.median(x[:, tie], axis=0) > level
    return out


def activity_wobble(x: np.ndarray, mask: np.ndarray, it: Iterations, dt: float,
                    groups: list[np.ndarray]) -> np.ndarray:
    """(E, K) per iteration, the centre of each endpoint's traffic outside
    collectives, minus the mean of its group (its stage) in that iteration:
    what is left is its replica's own pace. Background is floored away:
    quiet-time noise has a long lever arm on a centre."""
    y = np.array(x, copy=True)  # one working copy, edited in place
    y[mask] = 0.0
    # The background level from every fourth sample: a median needs no more.
    y -= 2.0 * rowwise(lambda b: np.median(b, axis=1, keepdims=True), y[:, ::4])
    np.maximum(y, 0.0, out=y)
    c = window_centres(y, it.sync, dt)
    out = np.zeros_like(c)
    for g in groups:
        sub = c[g]
        seen = np.isfinite(sub)
        # The group's mean per iteration; an iteration none of them moved
        # bytes in has no centre (and no pace to tell).
        col = np.where(seen, sub, 0.0).sum(axis=0) / np.maximum(seen.sum(axis=0), 1)
        out[g] = np.where(seen, sub - col[None, :], 0.0)
    return out


def high_passed(x: np.ndarray, mask: np.ndarray, dt: float, window_s: float = 1.0) -> np.ndarray:
    """Traffic outside collectives minus its running mean over about a second:
    the instants of individual transfers, without the iteration's envelope
    that every endpoint shares."""
    y = np.where(mask, 0.0, x)
    y -= running_mean(y, max(3, int(round(window_s / dt)))).astype(y.dtype, copy=False)
    y[mask] = 0.0
    return y


def running_mean(y: np.ndarray, w: int, rows: int = 256) -> np.ndarray:
    """Row-wise mean over a window of w samples centred as np.convolve's
    "same" mode centres it (zeros beyond the ends), in the rows' own dtype.
    One float64 running sum per block of rows: exact enough, and no
    (E, T) float64 temporary (nor scipy.ndimage, whose import alone cost a
    fifth of a second of `netskel infer`)."""
    e, n = y.shape
    out = np.empty_like(y)
    lead = (w - 1) // 2  # samples after the centre (np.convolve "same")
    for lo in range(0, e, rows):
        block = y[lo:lo + rows]
        c = np.zeros((len(block), n + w + 1))
        np.cumsum(block, axis=1, dtype=np.float64, out=c[:, w - lead:w - lead + n])
        c[:, w - lead + n:] = c[:, w - lead + n - 1:w - lead + n]
        # c[:, m] is the sum of the row up to sample m - (w - lead), zero
        # before it and the row's total past its end; sample i's window is
        # (i + lead - w, i + lead].
        hi = c[:, w:w + n]
        low = c[:, 0:n]
        out[lo:lo + rows] = (hi - low) / w
    return out


def one_way_outliers(tx: np.ndarray, rx: np.ndarray, mask: np.ndarray,
                     share: float = ONE_WAY_SHARE) -> np.ndarray:
    """Each endpoint's samples outside collectives whose |tx - rx| is in the
    top `share` of its samples (collective ones counted as zero; the
    threshold from every other sample: a quantile needs no more)."""
    net = np.abs(tx - rx)
    net[mask] = 0.0
    top = rowwise(lambda b: np.quantile(b, 1.0 - share, axis=1, keepdims=True), net[:, ::2])
    return np.asarray((net > top) & (net > 0))
