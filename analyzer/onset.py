"""When did a fault begin, from window statistics alone?

An incident is detected in windows (30 s by default), and its first
anomalous window starts wherever the clock put it: up to a window before
the fault. Who reads an incident wants the fault's start, and the
agents report windows, not probes, so the start is read from the windows
themselves: a window the fault began in holds a mixture of healthy and
faulty probes, and both the probes lost and the RTTs' excess over the
healthy level add up linearly over time. The share of the first window the
fault filled is its excess RTT (or lost probes) over a whole faulty
window's, beyond the healthy level; when it filled all of it, the window
before may hold its first seconds. A loss is dated by the window and share
that make the lost counts likeliest (`_loss_onset`): one found only by
summing windows began windows before the first flagged one. Its end is
read the same way, backwards.
A latency that creeps up holds no such step: it is flagged once its rise
crosses what a window may call slow, minutes in, and begins where the
windows held show the rise beginning (`_ramp_onset`).

Lost probes are counted, not taken as a share of those sent: an agent that
dies stops sending its own probes while probes to it are lost, so the
share moves with the sending rate, and the count with the fault alone.

A long-term drift is found only at the end of its 30-min period; where in
the period it began is read off the period's window medians (`drift_onset`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from analyzer.detect import LOSS_SCALES

FILLED = 0.9  # a first window the fault filled this much: look at the one before
# A loss found by summing windows began at most this many before its first flagged one.
SCAN_WINDOWS = max(LOSS_SCALES)
CHANGE_CHI2 = 6.63  # chi-squared (1 degree of freedom) at 1 %: a change of loss rate that counts
RAMP_WINDOWS = 3  # a rise over fewer windows than this is a step (one partly filled window
#                  each side of it makes two)
SPIKE = 4.0  # a window this many noise deviations above its neighbours' median is a burst
RISE_BOUNDS = 65  # window boundaries a drift's rise may start or end at, evenly spread (short
#                   windows make thousands of places in a period, and the fit is over pairs)


def onset(starts: np.ndarray, lost: np.ndarray, received: np.ndarray, rtt_sum: np.ndarray,
          first: float, window_s: float, symptom: str,
          others: Sequence[tuple[float, float]] = ()) -> float | None:
    """The estimated start of a fault first flagged in the window starting at
    `first`, or None when the windows cannot tell (no healthy window before
    it, no whole faulty window after it, or no clear step between the two
    and, for a latency, no ramp before it either).
    Per window (`starts`, in any order) and incident pair (columns): probes
    lost, probes received and their RTTs' sum (us). A latency's healthy
    level is read from the two windows before the one before `first`, each
    pair's RTT against its own; the faulty one from up to three after it
    (their median: a fault may end, a congestion pass). A loss is dated by
    `_loss_onset`. `others`: (start, end) of other faults' incidents on
    these pairs, which a latency's ramp is read beside (`_ramp_onset`)."""
    starts = np.asarray(starts, dtype=np.float64)
    k = np.rint(starts / window_s).astype(np.int64)
    at = {int(x): i for i, x in enumerate(k.tolist())}
    k0 = round(first / window_s)
    healthy = [at[j] for j in (k0 - 3, k0 - 2) if j in at]
    faulty = [at[j] for j in (k0 + 1, k0 + 2, k0 + 3) if j in at]
    if k0 not in at or not healthy or not faulty:
        return None
    if symptom != "latency":
        return _loss_onset(starts, k, lost.sum(axis=1).astype(np.float64), k0, window_s)
    got = received[healthy].sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        level = np.where(got > 0, rtt_sum[healthy].sum(axis=0) / got, np.nan)
    # A pair with no healthy RTT of its own adds nothing either way.
    amount = np.nansum(rtt_sum - received * level, axis=1)
    step = float(np.median(amount[faulty]))
    start: float | None = None
    if step > 0:
        share = float(np.clip(amount[at[k0]] / step, 0.0, 1.0))
        start = first + window_s * (1.0 - share)
        if share >= FILLED and k0 - 1 in at:
            start -= window_s * float(np.clip(amount[at[k0 - 1]] / step, 0.0, 1.0))
    ramp = _ramp_onset(starts, k, received, rtt_sum, k0, window_s, others)
    if ramp is not None and (start is None or ramp < start - window_s):
        return ramp
    return start


def _ramp_onset(starts: np.ndarray, k: np.ndarray, received: np.ndarray, rtt_sum: np.ndarray,
                k0: int, window_s: float, others: Sequence[tuple[float, float]] = ()
                ) -> float | None:
    """A latency that creeps up is flagged only once its rise crosses what
    a window may call slow, many windows after it began, and the windows
    just before the first flagged one are no healthy level. Where the
    incident pairs' RTT (each pair against its own mean) began to rise, if
    the rise that fits the windows held, up to three after the first
    flagged, best is a ramp that began two windows or more before the
    first flagged one and rose over `RAMP_WINDOWS` or more (a step, whose
    partly filled windows on either side make a short ramp, is read finer
    by its share) and beats one level by more than chance would
    (`_best_rise`). A ramp already rising in the first window held began
    there or before: the first window held is the earliest the windows
    can say. Another fault on these pairs while the windows were held
    (`others`: its incident's start and end) moved their level by its own
    step: the rise is fitted beside one level more for each, over the share
    of each window it covered; otherwise a creep that began minutes after
    a slow spine's step, on pairs the spine slowed too, was read from a
    rise through both, 381 s before it began (bench/inject.py drift with
    spinelat, draw 4066 of session 62)."""
    use = k <= k0 + 3
    if use.sum() < 4:
        return None
    rec, rs, kk = received[use], rtt_sum[use], k[use]
    with np.errstate(invalid="ignore", divide="ignore"):
        rtt = np.where(rec > 0, rs / rec, np.nan)
        seen = np.isfinite(rtt)
        centred = rtt - np.nansum(rtt, axis=0) / seen.sum(axis=0)
        weight = np.where(seen, rec, 0.0)
        mean = np.nansum(centred * weight, axis=1) / weight.sum(axis=1)
    series = np.full(int(kk.max() - kk.min()) + 1, np.nan)
    series[kk - kk.min()] = mean
    begin = float(starts[use].min())
    at = begin + window_s * np.arange(len(series))
    levels = np.array([np.clip((np.minimum(at + window_s, b) - np.maximum(at, a)) / window_s,
                               0.0, 1.0) for a, b in others]).reshape(len(others), len(series))
    rise = _best_rise(series, levels[levels.any(axis=1)])
    if rise is None or rise[1] - rise[0] < RAMP_WINDOWS or kk.min() + rise[0] > k0 - 2:
        return None
    return begin + rise[0] * window_s


def _poisson_loglik(x: np.ndarray, mu: np.ndarray) -> float:
    """Log-likelihood of counts x under Poisson means mu (without the terms
    that do not depend on mu); a mean of 0 against a count is as unlikely
    as one probe in a thousand windows."""
    mu = np.maximum(mu, 1e-3)
    return float((x * np.log(mu) - mu).sum())


def _one_rate(x: np.ndarray) -> float:
    """Log-likelihood of counts under one Poisson rate, their mean."""
    return _poisson_loglik(x, np.full(len(x), x.mean()))


def _loss_onset(starts: np.ndarray, k: np.ndarray, lost: np.ndarray, k0: int,
                window_s: float) -> float | None:
    """Where a loss began: the lost counts of the windows held are a
    healthy rate, then one window the fault filled a share of, then the
    faulty rate (read where the fault certainly was, below). The window
    and share that make the counts likeliest (Poisson), among the windows
    at most SCAN_WINDOWS before the first flagged one `k0` and with two
    before them, if a change of rate there beats one rate for all by more
    than chance would (likelihood ratio, chi-squared at 1 %). A loss found
    by summing windows began windows before its first flagged one, and a
    strong one may have filled the one before it: one model reads both,
    where the share of the flagged window alone dated a 1 % loss 48 s late
    (bench/inject.py --place 204, linkloss). The caller holds windows after
    `k0`."""
    order = np.argsort(k, kind="stable")
    k, x, starts = k[order], lost[order], starts[order]
    use = k >= k0 - 2 * SCAN_WINDOWS  # older windows may hold some other fault
    k, x, starts = k[use], x[use], starts[use]
    # The faulty rate, the same for every place tried (or the likelihoods
    # would compare levels, not places), from up to three windows after the
    # first flagged one (the fault's): their mean, the rate's likeliest,
    # to find the place (their median, 1, made one probe lost in a healthy
    # window five before a weak loss of 7, 5, 1, 1 its start); their
    # median for the share of a whole faulty window the place held (a
    # fault may end, a congestion pass).
    faulty = x[(k > k0) & (k <= k0 + 3)]
    high = float(faulty.mean())
    best, pick, held = -np.inf, -1, 0.0
    for j in range(2, len(x) - 1):
        if k[j] > k0:
            break
        if k[j] < k0 - SCAN_WINDOWS:
            continue
        low = float(x[:j].mean())
        if high <= low:
            continue
        share = float(np.clip((x[j] - low) / (high - low), 0.0, 1.0))
        mu = np.concatenate([np.full(j, low), [low + share * (high - low)],
                             np.full(len(x) - j - 1, high)])
        fit = _poisson_loglik(x, mu)
        if fit >= best:  # a tie: this window filled whole, or the one before not at all
            best, pick, held = fit, j, share
    if pick < 0:
        return None
    j = pick
    # Two rates, split where the fault began (a window it held none of is
    # healthy), against one: each its maximum-likelihood mean.
    cut = j if held > 0 else j + 1
    before, after = x[:cut], x[cut:]
    gain = _one_rate(before) + _one_rate(after) - _one_rate(x)
    if 2 * gain < CHANGE_CHI2:
        return None
    if held == 0:
        return float(starts[j] + window_s)
    low, high = float(x[:j].mean()), float(np.median(faulty))
    share = float(np.clip((x[j] - low) / (high - low), 0.0, 1.0)) if high > low else 1.0
    return float(starts[j] + window_s * (1.0 - share))


def ending(starts: np.ndarray, lost: np.ndarray, received: np.ndarray, rtt_sum: np.ndarray,
           last: float, window_s: float, symptom: str) -> float | None:
    """The estimated end of a fault last seen in the window starting at
    `last`: the onset of its end, read the same way with time running
    backwards (the windows after it are the healthy ones)."""
    began = onset(-(np.asarray(starts, dtype=np.float64) + window_s), lost, received, rtt_sum,
                  -(last + window_s), window_s, symptom)
    return None if began is None else -began


def _best_rise(excess: np.ndarray, levels: np.ndarray | None = None
               ) -> tuple[float, float] | None:
    """(a, b): the rise from one level to a higher one that fits `excess`
    (one value per window place, NaN where none) best by least squares,
    from window boundary a to b >= a (a step when b == a, a slow
    degradation when it ramps, held or not), if it beats one level by more
    than chance would (BIC: three more parameters); None when it does not
    or with fewer than four values. Each row of `levels` (one value per
    place) is a level of its own fitted beside the rise (another fault's
    step). A burst (`_despiked`) is read as its neighbours: a congestion on
    the pairs' switch lifts a window tens of us, least squares follows it,
    and two bursts beside a slow spine's step moved a creep's start 190 s;
    a step or a rise keeps its shape."""
    y = _despiked(np.asarray(excess, dtype=np.float64))
    use = np.isfinite(y)
    t = np.flatnonzero(use).astype(np.float64) + 0.5  # window centres
    y = y[use]
    n = len(y)
    if n < 4:
        return None
    places = int(t[-1]) + 1
    bounds = np.unique(np.round(np.linspace(0, places, min(places + 1, RISE_BOUNDS))))
    i, j = np.triu_indices(len(bounds))
    a, b = bounds[i], bounds[j]  # a rise from boundary a to boundary b >= a
    with np.errstate(invalid="ignore", divide="ignore"):
        h = np.where(b[:, None] > a[:, None],
                     np.clip((t[None, :] - a[:, None]) / (b - a)[:, None], 0.0, 1.0),
                     (t[None, :] >= a[:, None]).astype(np.float64))
    # The levels (one, and one more for each other fault) taken out of
    # both sides first (Frisch-Waugh-Lovell): the rise's fit beside them is
    # then one slope per candidate.
    x = np.vstack([np.ones(len(use)), *([] if levels is None else levels)])[:, use].T
    proj = x @ np.linalg.pinv(x)
    hc = h - h @ proj
    yc = y - proj @ y
    shh = (hc * hc).sum(axis=1)
    total = float((yc * yc).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(shh > 1e-12, (hc * yc).sum(axis=1) / shh, 0.0)
    gain = np.where(slope > 0, slope * slope * shh, -np.inf)
    k = int(np.argmax(gain))
    if not np.isfinite(gain[k]) or \
            n * np.log(max(total, 1e-300) / max(total - gain[k], 1e-300)) <= 3 * np.log(n):
        return None
    return float(a[k]), float(b[k])


def _despiked(y: np.ndarray) -> np.ndarray:
    """A place with values on both sides that stands above their median of
    three by more than SPIKE times the noise (read robustly from the
    differences of neighbours) takes that median. Only bursts up (a
    congestion adds delay, nothing takes it away): smoothing every place
    would make its noise look like a trend to the test, and a window
    between two bursts is no dip."""
    out = y.copy()
    if len(y) >= 3:
        three = np.vstack([y[:-2], y[1:-1], y[2:]])
        inner = np.isfinite(three).all(axis=0)
        med = np.median(three[:, inner], axis=0)
        steps = np.abs(np.diff(y))
        noise = 1.4826 * float(np.median(steps[np.isfinite(steps)])) / np.sqrt(2) \
            if np.isfinite(steps).any() else 0.0
        mid = out[1:-1]
        spike = mid[inner] - med > SPIKE * noise
        mid[np.flatnonzero(inner)[spike]] = med[spike]
    return out


def drift_onset(excess: np.ndarray) -> float | None:
    """Where a long-term drift began within its period, in windows from the
    period's start: `excess` holds one value per window place (the pairs'
    log-median over their reference's, NaN where none). The start of the
    rise that fits best (`_best_rise`), if one stands out; otherwise the
    drift held the whole period (0). None with fewer than four values."""
    if np.isfinite(np.asarray(excess, dtype=np.float64)).sum() < 4:
        return None
    rise = _best_rise(excess)
    return 0.0 if rise is None else rise[0]
