"""Anomaly detection over probe windows: pure logic on arrays, one row per
(src, dst, size class), every row of a window in one pass.

- Latency (short-term): a window whose median rose by a real amount (a lone
  slow probe moves max and std, not the median) and whose p25 did not fall is anomalous when its
  LOF (RTT statistics, log scale) against the row's last windows is high and
  it lies outside their cluster. Only such windows need the LOF at all.
- Loss: one-sided binomial test against the row's own healthy loss rate (never
  below the configured baseline), per size class: a path that drops only
  large packets stands out in that class alone.
- Drift (long-term): the medians of each completed period against a
  log-normal fitted to the row's first complete period (analyzer/drift.py),
  Benjamini-Hochberg across all rows tested together.

Anomalous windows never enter a row's history: a fault must not become the
baseline it is judged against."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy import special

from analyzer.drift import benjamini_hochberg, fit_lognormal, ks_lognormal
from analyzer.lof import lof_novelty
from netskel.arrays import find_sorted, row_nanmedian
from netskel.config import AnalyzerConfig
from netskel.model import RTT_STATS

STATS = RTT_STATS
P25, MEDIAN = 0, 1

# A row is one directed pair at one probe size over one protocol: RDMA and
# UDP probes of a pair are two instruments, each with its own history.
RowKey = tuple[str, str, int, str]


@dataclass
class Groups:
    """CSR membership of window rows in loss-pooling groups: row i belongs to
    codes[indptr[i]:indptr[i + 1]]."""

    indptr: np.ndarray
    codes: np.ndarray
    count: int


PRIOR_PROBES = 10_000.0  # pseudo-probes at the floor rate a loss baseline starts from
TAIL_PRIOR = 30.0  # ... and a slow-tail baseline: about one window, so history rules
# Slow tails: a member of a significant pooled group shares its blame only
# when its own window is unlikely at its own healthy share: the group says
# where, each row's own probes say whose. A healthy path has a slow probe in
# most windows (spikes), so one beside a slow link's pairs is no evidence;
# a lost probe, at a healthy rate of 1e-4, is (loss keeps own_alpha 1).
OWN_ALPHA = 0.05


def healthy_rate(hist_sent: np.ndarray, hist_lost: np.ndarray, floor: float,
                 prior_probes: float = PRIOR_PROBES) -> np.ndarray:
    """A loss baseline learned from healthy history: `prior_probes`
    pseudo-probes at the floor, then what was seen; never below the floor."""
    return np.asarray(np.maximum(floor, (hist_lost + floor * prior_probes)
                                 / (hist_sent + prior_probes)))


def binom_sf(k: np.ndarray | int, n: np.ndarray | int, p: np.ndarray | float) -> np.ndarray:
    """P(X > k), X ~ Binomial(n, p): scipy.stats.binom.sf through
    scipy.special (scipy.stats costs 0.65 s to import; tests hold the two
    equal). Counts may arrive as floats (pooled weights): floored, as
    scipy.stats floors them."""
    kk, nn = _counts(k, n)
    return np.asarray(np.where(kk < 0, 1.0, special.bdtrc(np.maximum(kk, 0), nn, p)))


def binom_cdf(k: np.ndarray | int, n: np.ndarray | int, p: np.ndarray | float) -> np.ndarray:
    kk, nn = _counts(k, n)
    return np.asarray(np.where(kk < 0, 0.0, special.bdtr(np.maximum(kk, 0), nn, p)))


def _counts(k: np.ndarray | int, n: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    return (np.floor(np.asarray(k, dtype=np.float64)).astype(np.int64),
            np.floor(np.asarray(n, dtype=np.float64)).astype(np.int64))


def poisson_sf(k: np.ndarray | int, mu: np.ndarray | float) -> np.ndarray:
    """P(X > k), X ~ Poisson(mu); 1 for k < 0, as scipy.stats has it."""
    k = np.asarray(k)
    return np.asarray(np.where(k < 0, 1.0, special.pdtrc(np.maximum(k, 0), mu)))


def poisson_cdf(k: np.ndarray | int, mu: np.ndarray | float) -> np.ndarray:
    """P(X <= k), X ~ Poisson(mu); 0 for k < 0."""
    k = np.asarray(k)
    return np.asarray(np.where(k < 0, 0.0, special.pdtr(np.maximum(k, 0), mu)))


def loss_logp(lost: np.ndarray, expected: np.ndarray, min_lost: int) -> np.ndarray:
    """log P(at least `lost` | Poisson(`expected`)); 0 (no evidence) below
    `min_lost` losses."""
    with np.errstate(divide="ignore"):
        logsf = np.log(poisson_sf(lost - 1, np.maximum(expected, 1e-12)))
    return np.asarray(np.where(lost >= min_lost, logsf, 0.0))


LOSS_SCALES = (1, 2, 4, 8)  # windows a pooled loss test sums, newest back (see Carry)
# A span's loss has ended when its newest windows (this one, or this one and
# the next older ones) lost so much less than its older windows did that
# Poisson chance gives it less than ENDED_ALPHA, and no more than healthy
# windows might (at least QUIET_P likely at the healthy rate): a weaker loss
# going on after a strong one has not ended (see _ended).
ENDED_ALPHA = 1e-3
QUIET_P = 0.01
TAIL_SCALES = (1, 2)  # ... and a slow-tail test: congestion must not add up over minutes


@dataclass
class Carry:
    """Per group, the probes of its last windows (a ring). 1 % loss on a
    link few pairs cross is one lost probe a window or two, never
    significant in one; summed over the windows it has lasted (each scale
    in LOSS_SCALES tested, Bonferroni over the scales: a sequential test in
    the manner of a multi-window scan) it is found in a few, and keeps being
    found in the windows after (a streak of windows opens an incident; each
    window names only the rows that lost probes in it, so a healed path is
    not named again, and a span this window's loss says has ended is not
    summed: ENDED_ALPHA). `lost_sum` keeps each group's losses over the ring,
    so only groups that lost enough to matter have their scales summed."""

    sent: np.ndarray  # (windows, groups), float32; row `newest` is the last window's
    lost: np.ndarray
    lost_sum: np.ndarray  # (groups,) float64
    newest: int = 0

    @classmethod
    def empty(cls, n: int, depth: int = 1) -> Carry:
        return cls(np.zeros((depth, n), dtype=np.float32), np.zeros((depth, n), dtype=np.float32),
                   np.zeros(n))

    def fitted(self, n: int, depth: int) -> Carry:
        """This carry for n groups (groups only grow; new ones carry
        nothing) and `depth` windows: itself when it already is."""
        if self.sent.shape == (depth, n):
            return self
        out = Carry.empty(n, depth)
        m = min(n, self.sent.shape[1])
        for age in range(min(depth, len(self.sent))):
            src, dst = (self.newest - age) % len(self.sent), -age % depth
            out.sent[dst, :m], out.lost[dst, :m] = self.sent[src, :m], self.lost[src, :m]
        out.lost_sum = out.lost.sum(axis=0, dtype=np.float64)
        return out

    def spans(self, scales: Sequence[int], cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per scale (rows) and group in `cols`, the probes of the scale's
        windows before this one."""
        depth = len(self.sent)
        order = (self.newest - np.arange(depth)) % max(depth, 1)
        zero = np.zeros((1, len(cols)))
        s = np.vstack([zero, np.cumsum(self.sent[np.ix_(order, cols)], axis=0, dtype=np.float64)])
        lo = np.vstack([zero, np.cumsum(self.lost[np.ix_(order, cols)], axis=0, dtype=np.float64)])
        at = [k - 1 for k in scales]
        return s[at], lo[at]

    def push(self, sent: np.ndarray, lost: np.ndarray) -> Carry:
        """This window's probes in, the oldest window's out (in place)."""
        depth = len(self.sent)
        if depth:
            self.newest = (self.newest + 1) % depth
            lost32 = lost.astype(np.float32)
            self.lost_sum += lost32.astype(np.float64) - self.lost[self.newest]
            self.sent[self.newest], self.lost[self.newest] = sent, lost32
        return self


def _ended(now_sent: np.ndarray, now_lost: np.ndarray, rate: np.ndarray, cum_sent: np.ndarray,
           cum_lost: np.ndarray, scales: Sequence[int]) -> np.ndarray:
    """Per scale (rows) and group: its span is a fault that ended, not one
    going on. Summed with the windows after it, a spine that was down would
    keep every link it served "lossy" for minutes, and the odd healthy loss
    on them would be named. Ended: some tail (this window and the newest
    windows before it, shorter than the span) lost no more than a healthy
    tail might (QUIET_P at the healthy rate) and so much less than the older
    windows of the span did that Poisson chance gives it less than
    ENDED_ALPHA. A tail of this window alone is not enough where one lost
    probe is already unlikely at the healthy rate (a pair's 60 probes):
    five quiet windows after a loop, then one loss, was summed with the
    loop. `cum_sent`, `cum_lost`: row j, the probes of the j windows before
    this one (Carry.spans at every depth up to the deepest scale)."""
    deepest = max(scales)
    ended = np.zeros((len(scales), len(now_sent)), dtype=bool)
    for j in range(deepest - 1):
        tail_sent, tail_lost = now_sent + cum_sent[j], now_lost + cum_lost[j]
        quiet = poisson_sf(tail_lost - 1, np.maximum(tail_sent * rate, 1e-12)) >= QUIET_P
        if not quiet.any():
            continue
        for i, k in enumerate(scales):
            if k - 1 <= j:
                continue
            old_sent, old_lost = cum_sent[k - 1] - cum_sent[j], cum_lost[k - 1] - cum_lost[j]
            with np.errstate(divide="ignore", invalid="ignore"):
                before = np.where(old_sent > 0, old_lost / old_sent, 0.0)
            ended[i] |= quiet & (poisson_cdf(tail_lost, tail_sent * before) < ENDED_ALPHA)
    return ended


def scaled_loss_logp(now_sent: np.ndarray, now_lost: np.ndarray, rate: np.ndarray, carry: Carry,
                     scales: Sequence[int], min_lost: int, cols: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group (`cols`: their columns in the carry, all by default): log p
    of its loss at the scale where it is least likely (Bonferroni over the
    scales; 0 below `min_lost` losses at every scale), the likelihood ratio
    there (to rank groups: strong groups' p-values underflow and would tie),
    and the probes sent and lost over that scale's windows (the evidence)."""
    n = len(now_lost)
    cols = np.arange(n) if cols is None else cols
    logp, llr = np.zeros(n), np.zeros(n)
    sent_at, lost_at = now_sent.astype(np.float64), now_lost.astype(np.float64)
    cand = np.flatnonzero(now_lost + carry.lost_sum[cols] >= min_lost)
    if not len(cand):
        return logp, llr, sent_at, lost_at
    # Every depth once: the scales' spans, and the tails _ended weighs them by.
    cum_sent, cum_lost = carry.spans(range(1, max(scales) + 1), cols[cand])
    at = [k - 1 for k in scales]
    span_sent, span_lost = cum_sent[at], cum_lost[at]
    tot = now_lost[cand][None, :] + span_lost
    mu = np.maximum((now_sent[cand][None, :] + span_sent) * rate[cand][None, :], 1e-12)
    lp = loss_logp(tot, mu, min_lost)
    lp = np.where(_ended(now_sent[cand], now_lost[cand], rate[cand], cum_sent, cum_lost, scales),
                  0.0, lp)
    best = np.argmin(lp, axis=0)
    c = np.arange(len(cand))
    t, m = tot[best, c], mu[best, c]
    with np.errstate(divide="ignore", invalid="ignore"):
        llr[cand] = np.where(t > 0, t * np.log(t / m) - (t - m), 0.0)
    logp[cand] = lp[best, c] + np.log(len(scales))
    sent_at[cand] += span_sent[best, c]
    lost_at[cand] = t
    return logp, llr, sent_at, lost_at


class Pooled(NamedTuple):
    hit: np.ndarray    # bool per row: its losses are a significant group's
    near: np.ndarray   # bool per row: in a suspicious group, not hit
    carry: Carry
    by: np.ndarray     # the group that explained each hit row, -1 elsewhere


def pooled_loss(g: Groups, sent: np.ndarray, lost: np.ndarray, hist_sent: np.ndarray,
                hist_lost: np.ndarray, floor: float, alpha: float, min_lost: int = 1,
                max_groups: int = 64,
                prior_probes: float = PRIOR_PROBES) -> np.ndarray:
    """Rows hit by a significant pooled loss (see pooled_loss_carried), in
    this window alone."""
    return pooled_loss_carried(g, sent, lost, hist_sent, hist_lost, floor, alpha, min_lost,
                               max_groups, prior_probes, scales=(1,)).hit


def pooled_loss_carried(g: Groups, sent: np.ndarray, lost: np.ndarray, hist_sent: np.ndarray,
                        hist_lost: np.ndarray, floor: float, alpha: float, min_lost: int = 1,
                        max_groups: int = 64, prior_probes: float = PRIOR_PROBES,
                        carry: Carry | None = None, near_alpha: float = 0.0,
                        margin: float = 0.0, own_alpha: float = 1.0,
                        scales: Sequence[int] = LOSS_SCALES
                        ) -> Pooled:
    """Rows hit, which group explained each, rows in suspicious groups, and
    the carry for the next window.

    Rows with losses in a group whose pooled loss is significant. 1 % loss
    is a few probes per pair-window, lost in the noise; over the tens of pairs
    crossing one link it is hundreds (Poisson test of the summed losses
    against the group's own healthy loss rate, which starts at the floor as
    `prior_probes` pseudo-probes and learns from history), and over the
    windows it has lasted (`scales`, see Carry) it adds up even where few
    pairs cross. Groups are taken most significant first and their rows
    explained away, so a lossy link does not also make every other link its
    pairs cross look lossy.

    A group is suspicious when its unexplained loss has p < near_alpha at
    some scale without being significant: its rows stay out of the healthy
    history (a slow loss must not teach the baseline the fault)."""
    member = np.repeat(np.arange(len(sent)), np.diff(g.indptr))
    h_sent = np.bincount(g.codes, weights=hist_sent[member], minlength=g.count)
    h_lost = np.bincount(g.codes, weights=hist_lost[member], minlength=g.count)
    # margin: the rate must rise this much above the healthy one to count
    # (events that come in runs, like a slow flow's probes, are overdispersed).
    rate = np.minimum(1.0, healthy_rate(h_sent, h_lost, floor, prior_probes) + margin)
    sent_w = sent.astype(np.float64)
    lost_w = lost.astype(np.float64).copy()
    hit = np.zeros(len(sent), dtype=bool)
    by = np.full(len(sent), -1, dtype=np.int64)
    done = np.zeros(g.count, dtype=bool)
    ring = (carry if carry is not None else Carry.empty(g.count)).fitted(g.count, max(scales) - 1)
    # Per group, this window's probes nothing has explained yet.
    now_sent = all_sent = np.bincount(g.codes, weights=sent_w[member], minlength=g.count)
    now_lost = all_lost = np.bincount(g.codes, weights=lost_w[member], minlength=g.count)
    for _ in range(max_groups):
        logp, llr, _, _ = scaled_loss_logp(now_sent, now_lost, rate, ring, scales, min_lost)
        significant = logp < np.log(alpha)
        # Most significant first (a superset must not win a tie).
        best = int(np.argmax(np.where(significant & ~done, llr, -np.inf)))
        if not significant[best] or done[best]:
            break
        done[best] = True
        rows = member[g.codes == best]
        rows = rows[lost_w[rows] > 0]
        # Only members whose own losses fit the group's loss rate share its
        # blame: one lost probe beside a pair that lost everything is not.
        g_rate = min(1.0, float(lost_w[rows].sum()) / max(float(sent_w[rows].sum()), 1.0))
        fits = binom_cdf(lost_w[rows], sent_w[rows], g_rate) >= 0.01
        own_rate = np.minimum(1.0, healthy_rate(hist_sent[rows], hist_lost[rows], floor,
                                                prior_probes) + margin)
        own = poisson_sf(lost_w[rows] - 1, np.maximum(sent_w[rows] * own_rate, 1e-12)) < own_alpha
        rows = rows[fits & own]
        hit[rows] = True
        by[rows] = best
        lost_w[rows] = 0.0  # explained: no longer evidence against other groups
        sent_w[rows] = 0.0
        now_sent = np.bincount(g.codes, weights=sent_w[member], minlength=g.count)
        now_lost = np.bincount(g.codes, weights=lost_w[member], minlength=g.count)
    else:  # the last test came before the last rows were explained
        logp, _, _, _ = scaled_loss_logp(now_sent, now_lost, rate, ring, scales, min_lost)
    hit &= lost > 0
    by[~hit] = -1
    # What is left unexplained (`logp` is its test): suspicious groups, and
    # the next window's carry.
    near_rows = np.zeros(len(sent), dtype=bool)
    if near_alpha > 0:
        near_group = (logp < np.log(near_alpha)) & ~done & (now_lost > 0)
        near_rows[member[near_group[g.codes]]] = True
    # A group carries what it explained (its fault's evidence goes on
    # adding up) and what nothing did; not what another group explained.
    return Pooled(hit, near_rows & ~hit, ring.push(np.where(done, all_sent, now_sent),
                                                   np.where(done, all_lost, now_lost)), by)


@dataclass
class Observation:
    """Per input window (same order as given)."""

    latency: np.ndarray      # bool
    sustained: np.ndarray    # bool: latency with p25 up as well, slow for >= 3/4 of the window
    loss: np.ndarray         # bool
    unreachable: np.ndarray  # bool
    lof: np.ndarray          # computed where the median rose enough to matter, else NaN
    loss_p: np.ndarray
    loss_baseline: np.ndarray
    ref_median: np.ndarray   # the row's typical median RTT, NaN without history
    tail: np.ndarray | None = None  # bool: latency from the slow tail alone (part of `latency`)
    crept: np.ndarray | None = None  # bool: slow against the slow reference (part of `latency`)
    slow_ref: np.ndarray | None = None  # the slow reference median, NaN before its first block
    # The pooled group whose significant loss explained the row (-1: none):
    # a group of a link all the pair's paths cross names where it was lost.
    loss_group: np.ndarray | None = None


@dataclass
class DriftReport:
    rows: np.ndarray      # rows tested (their period completed)
    flagged: np.ndarray   # bool per tested row
    pvalue: np.ndarray
    shift: np.ndarray
    period_start: float
    # Each flagged row's window medians over the period (in the order of the
    # flagged rows among `rows`), by the windows' places in it (NaN where a
    # window was missing or not healthy), and its reference's log-median:
    # when a drift began (analyzer/onset.py). Flagged rows only: every
    # tested row's would be a second copy of the whole period at its end.
    values: np.ndarray
    ref_mu: np.ndarray
    window_s: float


class Detector:
    def __init__(self, cfg: AnalyzerConfig) -> None:
        self.cfg = cfg
        self.keys: list[RowKey] = []
        self.index: dict[RowKey, int] = {}
        self._number: dict[str, int] = {}  # endpoint -> number, for packed row keys
        self._class: dict[tuple[int, str], int] = {}  # (size, protocol) -> number, likewise
        self._packed = True  # False once a key did not fit: the dict alone from then on
        self._packed_keys = np.zeros(0, dtype=np.int64)  # sorted
        self._packed_rows = np.zeros(0, dtype=np.int64)
        h = cfg.lof_history_windows
        self._cap = 0
        self.hist = np.zeros((0, h, len(STATS)), dtype=np.float32)
        self.hvalid = np.zeros((0, h), dtype=bool)
        self.hsent = np.zeros((0, h), dtype=np.int64)
        self.hlost = np.zeros((0, h), dtype=np.int64)
        self.hpos = np.zeros(0, dtype=np.int64)
        self.hrecv = np.zeros((0, h), dtype=np.int64)  # received and slow-tail probes
        self.hslow = np.zeros((0, h), dtype=np.int64)
        # Drift: medians of the current period, and the reference fit.
        self.slots = 0
        self.period = np.zeros(0, dtype=np.int64)
        self.pvals = np.zeros((0, 0), dtype=np.float32)  # by the window's place in the period
        self.window_s = 0.0
        self.ref_mu = np.zeros(0)
        self.ref_sigma = np.zeros(0)
        # Creep: per row, the median and p25 of each of its last blocks of
        # `lof_history_windows` healthy windows (a ring), and their medians.
        b = max(cfg.slow_reference_blocks, 1)
        self.sref = np.zeros((0, b, 2), dtype=np.float32)
        self.spos = np.zeros(0, dtype=np.int64)
        self.sref_med = np.zeros(0, dtype=np.float32)
        self.sref_p25 = np.zeros(0, dtype=np.float32)
        self.carry: Carry | None = None  # suspicious loss groups' last window
        self.tail_carry: Carry | None = None  # ... and slow-tail groups'

    # -- rows -----------------------------------------------------------------
    def rows_for(self, keys: Sequence[RowKey]) -> np.ndarray:
        names: dict[str, int] = {}
        protos: dict[str, int] = {}
        src = [names.setdefault(k[0], len(names)) for k in keys]
        dst = [names.setdefault(k[1], len(names)) for k in keys]
        proto = [protos.setdefault(k[3], len(protos)) for k in keys]
        return self.rows_for_columns(list(names), np.array(src, dtype=np.int64),
                                     np.array(dst, dtype=np.int64),
                                     np.array([k[2] for k in keys], dtype=np.int64),
                                     list(protos), np.array(proto, dtype=np.int64))

    def rows_for_columns(self, names: Sequence[str], src: np.ndarray, dst: np.ndarray,
                         size: np.ndarray, protos: Sequence[str], proto: np.ndarray
                         ) -> np.ndarray:
        """Each window's row (src, dst: indexes into names; proto into
        protos), new keys given new rows in order of first appearance. Keys
        are packed into one int64 (endpoint numbers, and a number per size
        and protocol) and found by one sorted search: a dictionary lookup
        per window cost a quarter of a second in a window of half a million
        pairs. Beyond the packing's room (2**23 endpoints, 2**16 (size,
        protocol) pairs) every key goes through the dict."""
        num = self._number
        numbers = np.array([num.setdefault(x, len(num)) for x in names], dtype=np.int64)
        n = len(src)
        out = np.empty(n, dtype=np.int64)
        if not n:
            return out
        if self._packed:
            # One number per (size, protocol) met: a handful, however many windows.
            width = max(len(protos), 1)
            both, inverse = np.unique(size * width + proto, return_inverse=True)
            classes = np.array([self._class.setdefault((int(x) // width, protos[int(x) % width]),
                                                       len(self._class)) for x in both.tolist()],
                               dtype=np.int64)[inverse.reshape(-1)]
            if len(num) >= 1 << 23 or len(self._class) >= 1 << 16:
                self._packed = False
        if not self._packed:
            index = self.index
            for i, k in enumerate(zip([names[j] for j in src.tolist()],
                                      [names[j] for j in dst.tolist()], size.tolist(),
                                      [protos[j] for j in proto.tolist()], strict=True)):
                r = index.get(k)
                if r is None:
                    r = index[k] = len(self.keys)
                    self.keys.append(k)
                out[i] = r
            self._grow(len(self.keys))
            return out
        key = (numbers[src] << 40) | (numbers[dst] << 16) | classes
        found, at = find_sorted(self._packed_keys, key)
        out[found] = self._packed_rows[at[found]]
        miss = np.flatnonzero(~found)
        if len(miss):
            new, first, inverse = np.unique(key[miss], return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")  # rows numbered in order of arrival
            rank = np.empty(len(new), dtype=np.int64)
            rank[order] = np.arange(len(new))
            rows = len(self.keys) + rank
            for j in order.tolist():
                i = int(miss[first[j]])
                k = (names[int(src[i])], names[int(dst[i])], int(size[i]), protos[int(proto[i])])
                self.index[k] = len(self.keys)
                self.keys.append(k)
            out[miss] = rows[inverse]
            keys = np.concatenate([self._packed_keys, new])
            sort = np.argsort(keys, kind="stable")
            self._packed_keys = keys[sort]
            self._packed_rows = np.concatenate([self._packed_rows, rows])[sort]
        self._grow(len(self.keys))
        return out

    def _grow(self, n: int) -> None:
        if n <= self._cap:
            return
        cap = max(n, 2 * self._cap, 1024)
        extra = cap - self._cap

        def pad(a: np.ndarray, fill: float | int | bool) -> np.ndarray:
            return np.concatenate([a, np.full((extra, *a.shape[1:]), fill, dtype=a.dtype)])
        self.hist, self.hvalid = pad(self.hist, np.nan), pad(self.hvalid, False)
        self.hsent, self.hlost, self.hpos = pad(self.hsent, 0), pad(self.hlost, 0), pad(self.hpos, 0)
        self.hrecv, self.hslow = pad(self.hrecv, 0), pad(self.hslow, 0)
        self.period, self.pvals = pad(self.period, -1), pad(self.pvals, np.nan)
        self.ref_mu, self.ref_sigma = pad(self.ref_mu, np.nan), pad(self.ref_sigma, np.nan)
        self.sref, self.spos = pad(self.sref, np.nan), pad(self.spos, 0)
        self.sref_med, self.sref_p25 = pad(self.sref_med, np.nan), pad(self.sref_p25, np.nan)
        self._cap = cap

    # -- one window of rows ---------------------------------------------------
    def judge_check(self, keys: Sequence[RowKey], stats: np.ndarray, sent: np.ndarray,
                    lost: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(loss, slow, unreachable, reference median) of an active check's
        windows, judged against the rows' histories without joining them: a
        check is a second opinion, not part of the pair's record. A row
        without history is judged on loss alone."""
        cfg = self.cfg
        sent = np.asarray(sent, dtype=np.int64)
        lost = np.asarray(lost, dtype=np.int64)
        n, h = len(keys), self.hist.shape[1]
        hist = np.full((n, h, len(STATS)), np.nan, dtype=np.float32)
        valid = np.zeros((n, h), dtype=bool)
        hs, hl = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        at = np.array([i for i, k in enumerate(keys) if k in self.index], dtype=np.int64)
        if len(at):
            rows = np.array([self.index[keys[i]] for i in at], dtype=np.int64)
            hist[at], valid[at] = self.hist[rows], self.hvalid[rows]
            hs[at], hl[at] = self.hsent[rows].sum(axis=1), self.hlost[rows].sum(axis=1)
        _, loss_p = self._loss_p(sent, lost, hs, hl)
        loss = (lost >= cfg.loss_min_lost) & (loss_p < cfg.loss_alpha / max(1, len(keys)))
        ref_med, ref_p25, need, enough = self._latency_reference(hist, valid)
        with np.errstate(invalid="ignore"):
            slow = (np.isfinite(stats).all(axis=1) & enough
                    & (stats[:, MEDIAN] - ref_med >= need) & (stats[:, P25] - ref_p25 >= need))
        return loss, slow, lost >= sent, ref_med

    def _loss_p(self, sent: np.ndarray, lost: np.ndarray, hs: np.ndarray, hl: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """(baseline loss rate, binomial p-value of this many lost) of each
        row against its own healthy history's loss."""
        base = np.minimum(np.maximum(self.cfg.loss_baseline, hl / np.maximum(hs, 1)), 0.5)
        loss_p = np.ones(len(sent))
        some = lost > 0  # P(X >= 0) = 1: only windows with a loss need the test
        loss_p[some] = binom_sf(lost[some] - 1, sent[some], base[some])
        return base, loss_p

    def _latency_reference(self, hist: np.ndarray, valid: np.ndarray
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(usual median, usual p25, the rise that counts, enough history)
        per row from its healthy windows."""
        cfg = self.cfg
        # Rows without history: NaN.
        ref_med = row_nanmedian(np.where(valid, hist[:, :, MEDIAN], np.nan))
        ref_p25 = row_nanmedian(np.where(valid, hist[:, :, P25], np.nan))
        need = np.maximum(cfg.latency_min_shift_us, cfg.latency_rel_shift * np.nan_to_num(ref_med))
        return ref_med, ref_p25, need, valid.sum(axis=1) >= cfg.lof_min_history

    def observe(self, rows: np.ndarray, stats: np.ndarray, sent: np.ndarray, lost: np.ndarray,
                window_start: float, window_end: float, groups: Groups | None = None,
                held: np.ndarray | None = None, slow: np.ndarray | None = None,
                explained: np.ndarray | None = None
                ) -> tuple[Observation, DriftReport | None]:
        """rows (N,) unique; stats (N, 7) in STATS order, NaN when all probes
        were lost; groups: which pooled loss groups each row belongs to;
        held: rows an open loss incident holds, whose windows must not teach
        the baseline the fault (once the row has a baseline of its own);
        explained: rows whose losses something else explains (a stopped
        agent, a failed host): tested on their own, left out of the pooled
        groups, where they would make their links' other pairs look lossy."""
        cfg = self.cfg
        sent = np.asarray(sent, dtype=np.int64)
        lost = np.asarray(lost, dtype=np.int64)
        unreachable = lost >= sent
        # Loss against the row's own healthy history.
        hs, hl = self.hsent[rows].sum(axis=1), self.hlost[rows].sum(axis=1)
        base, loss_p = self._loss_p(sent, lost, hs, hl)
        # loss_alpha is the window's false-alarm budget across every test
        # (Bonferroni): half a million pairs must not make noise significant.
        alpha = cfg.loss_alpha / max(1, len(rows) + (groups.count if groups is not None else 0))
        loss = (lost >= cfg.loss_min_lost) & (loss_p < alpha)
        suspect = np.zeros(len(rows), dtype=bool)
        loss_group = np.full(len(rows), -1, dtype=np.int64)
        if groups is not None:  # pooled: a pair's sizes, a link's pairs
            keep = np.ones(len(rows), dtype=bool) if explained is None else ~explained
            pooled, suspect, self.carry, loss_group = pooled_loss_carried(
                groups, np.where(keep, sent, 0), np.where(keep, lost, 0), hs, hl,
                cfg.loss_baseline, alpha, cfg.loss_min_lost, carry=self.carry,
                near_alpha=cfg.loss_near_alpha)
            loss |= pooled
        # Latency: only a window whose median and p25 rose by a real amount can
        # be anomalous; LOF (log space) then decides whether it is an outlier
        # against the pair's recent windows. Rows that cannot qualify skip LOF.
        hist = self.hist[rows]
        valid = self.hvalid[rows]
        has_rtt = np.isfinite(stats).all(axis=1)
        ref_med, ref_p25, need, enough = self._latency_reference(hist, valid)
        with np.errstate(invalid="ignore"):
            shifted = (has_rtt & enough & (stats[:, MEDIAN] - ref_med >= need)
                       & (stats[:, P25] >= ref_p25))
        lof = np.full(len(rows), np.nan)
        latency = np.zeros(len(rows), dtype=bool)
        cand = np.flatnonzero(shifted)
        if len(cand):
            feats = np.log1p(np.maximum(stats[cand], 0.0))
            hfeats = np.log1p(np.maximum(np.nan_to_num(hist[cand].astype(np.float64)), 0.0))
            res = lof_novelty(hfeats, valid[cand], feats, cfg.lof_neighbors)
            lof[cand] = res.score
            latency[cand] = (res.score > cfg.lof_threshold) & res.outside
        # Creep: the recent windows above creep along with a slow drift (each
        # is judged against the last few, which crept too), so a drift of a
        # few us a minute is never an outlier there. The same rise, judged
        # against the slow reference (the median of the row's last blocks of
        # healthy windows, ~30 min), is seen once it reaches the size that
        # counts. The size is what makes it safe: a benign level change
        # smaller than `need` never counts, whatever its significance.
        crept = np.zeros(len(rows), dtype=bool)
        slow_med = self.sref_med[rows]
        if cfg.slow_reference_blocks > 0:
            slow_p25 = self.sref_p25[rows]
            need_s = np.maximum(cfg.latency_min_shift_us,
                                cfg.latency_rel_shift * np.nan_to_num(slow_med))
            with np.errstate(invalid="ignore"):
                crept = (has_rtt & np.isfinite(slow_med)
                         & (stats[:, MEDIAN] - slow_med >= need_s)
                         & (stats[:, P25] - slow_p25 >= need_s))
            latency |= crept
        with np.errstate(invalid="ignore"):  # p25 up too: >= 3/4 of the window was slow
            sustained = latency & ((stats[:, P25] - ref_p25 >= need) | crept)
        # The slow tail: one slow path among a pair's flows leaves its median
        # and p25 where they were, while a quarter of its probes are late.
        # Tested like loss (the tail is the event, received probes the
        # trials), pooled per pair and per link every path of the pair
        # crosses, against the row's own healthy tail share.
        # Unlike loss, a healthy path's tail share is its own (jitter, spikes):
        # only rows with a history are tested, and their history, not a
        # prior at the floor, sets the rate.
        received = np.maximum(sent - lost, 0)
        tail = np.zeros(len(rows), dtype=bool)
        if slow is not None and groups is not None:
            slow = np.minimum(np.asarray(slow, dtype=np.int64), received)
            known = (self.hrecv[rows] > 0).sum(axis=1) >= cfg.lof_min_history
            tail, tail_suspect, self.tail_carry, _ = pooled_loss_carried(
                groups, np.where(known, received, 0), np.where(known, slow, 0),
                self.hrecv[rows].sum(axis=1), self.hslow[rows].sum(axis=1), cfg.tail_floor,
                alpha, cfg.loss_min_lost, prior_probes=TAIL_PRIOR, carry=self.tail_carry,
                near_alpha=cfg.loss_near_alpha, margin=cfg.tail_margin, own_alpha=OWN_ALPHA,
                scales=TAIL_SCALES)
            suspect |= tail_suspect
            tail &= ~latency  # rows only the tail flags
            latency |= tail
        # Healthy windows join the history (a ring of the last H).
        # Near-significant rows stay out too: a slow loss must not become the baseline.
        near = (lost >= cfg.loss_min_lost) & (loss_p < cfg.loss_near_alpha)
        healthy = ~(loss | latency | unreachable | suspect | near)
        if held is not None:
            known = (self.hsent[rows] > 0).sum(axis=1) >= cfg.lof_min_history
            healthy &= ~(held & known)
        hr = rows[healthy]
        pos = self.hpos[hr]
        self.hist[hr, pos] = np.where(has_rtt[healthy, None], stats[healthy], np.nan)
        self.hvalid[hr, pos] = has_rtt[healthy]
        self.hsent[hr, pos], self.hlost[hr, pos] = sent[healthy], lost[healthy]
        self.hrecv[hr, pos] = received[healthy]
        self.hslow[hr, pos] = 0 if slow is None else slow[healthy]
        self.hpos[hr] = (pos + 1) % self.hist.shape[1]
        if cfg.slow_reference_blocks > 0:
            self._close_blocks(hr[self.hpos[hr] == 0])
        drift = self._drift(rows, stats[:, MEDIAN], has_rtt & healthy, window_start, window_end)
        return Observation(latency=latency, sustained=sustained, loss=loss,
                           unreachable=unreachable, lof=lof,
                           loss_p=loss_p, loss_baseline=base, ref_median=ref_med,
                           tail=tail, crept=crept, slow_ref=slow_med,
                           loss_group=loss_group), drift

    def _close_blocks(self, rows: np.ndarray) -> None:
        """Rows whose history ring just filled with new healthy windows: the
        ring's median and p25 become a block of their slow reference."""
        if not len(rows):
            return
        # Rows whose ring holds no RTT: NaN.
        valid = self.hvalid[rows]
        med = row_nanmedian(np.where(valid, self.hist[rows, :, MEDIAN], np.nan))
        p25 = row_nanmedian(np.where(valid, self.hist[rows, :, P25], np.nan))
        pos = self.spos[rows]
        self.sref[rows, pos, 0], self.sref[rows, pos, 1] = med, p25
        self.spos[rows] = (pos + 1) % self.sref.shape[1]
        self.sref_med[rows] = row_nanmedian(self.sref[rows, :, 0])
        self.sref_p25[rows] = row_nanmedian(self.sref[rows, :, 1])

    def _drift(self, rows: np.ndarray, medians: np.ndarray, ok: np.ndarray, start: float,
               end: float) -> DriftReport | None:
        cfg = self.cfg
        if self.slots == 0:  # the window length is known now; _grow pads this width from here on
            self.window_s = max(end - start, 1e-3)
            self.slots = int(np.ceil(cfg.drift_period_s / self.window_s)) + 1
            self.pvals = np.full((self._cap, self.slots), np.nan, dtype=np.float32)
        period = int(np.floor(start / cfg.drift_period_s))
        done = rows[(self.period[rows] >= 0) & (self.period[rows] < period)]
        report = self._test_periods(done) if len(done) else None
        fresh = rows[self.period[rows] != period]
        self.period[fresh] = period
        self.pvals[fresh] = np.nan
        # Each window in its place in the period, so a drift's start can be
        # read off where its medians rose.
        place = int((start - period * cfg.drift_period_s) // self.window_s)
        if 0 <= place < self.slots:
            self.pvals[rows[ok], place] = medians[ok]
        return report

    def _test_periods(self, rows: np.ndarray) -> DriftReport:
        """Rows whose period just ended: the first becomes the reference; later
        ones are tested against it."""
        cfg = self.cfg
        vals = self.pvals[rows].astype(np.float64)
        valid = np.isfinite(vals) & (vals > 0)
        period_start = float(self.period[rows].max() * cfg.drift_period_s)
        have_ref = np.isfinite(self.ref_mu[rows])
        res = ks_lognormal(self.ref_mu[rows], self.ref_sigma[rows], vals, valid,
                           min_values=cfg.drift_min_windows)
        found = benjamini_hochberg(np.where(have_ref, res.pvalue, np.nan), cfg.drift_fdr)
        flagged = found & (res.shift >= cfg.drift_min_shift)
        new_ref = rows[~have_ref & (valid.sum(axis=1) >= cfg.drift_min_windows)]
        if len(new_ref):
            mu, sigma = fit_lognormal(self.pvals[new_ref].astype(np.float64),
                                      np.isfinite(self.pvals[new_ref]) & (self.pvals[new_ref] > 0))
            self.ref_mu[new_ref], self.ref_sigma[new_ref] = mu, sigma
        tested = have_ref & np.isfinite(res.pvalue)
        return DriftReport(rows=rows[tested], flagged=flagged[tested], pvalue=res.pvalue[tested],
                           shift=res.shift[tested], period_start=period_start,
                           values=self.pvals[rows[tested & flagged]],
                           ref_mu=self.ref_mu[rows[tested & flagged]], window_s=self.window_s)
