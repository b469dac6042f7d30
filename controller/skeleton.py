"""Traffic-skeleton inference from NIC byte counters: pure functions of data.

1. Counters -> rates on one time grid (resets, gaps, unsorted rows, any
   interval, host clock offsets of tens of ms).
2. Is the job periodic? Autocorrelation of its aggregate rate finds the
   iteration period; no clear period -> the rail-aligned list, flagged.
3. Features per endpoint: the burst profile folded over the period plus the
   STFT magnitude at the period's harmonics (scipy.signal.stft).
4. Per rail, hierarchical clustering into equal groups (the count chosen
   from the largest gap in merge heights, among divisors of the count);
   clusters on different rails with the same hosts and the same position in
   their containers are one data-parallel group (a host may carry several
   data-parallel ranks when TP is smaller than its NIC count).
5. Pipeline: groups on a rail are stages; adjacent stages exchange
   activations (one's tx overlaps the other's rx); the forward direction is
   the one whose overlap comes first. Corresponding endpoints of adjacent
   stages are matched by fine-timing correlation (each replica keeps its own
   jitter); where that is ambiguous all cross pairs are kept (recall first).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from scipy import signal
from scipy.cluster import hierarchy
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import squareform

from controller.pinglist import id_hash, owner_bits
from netskel.arrays import factorize, pair_order
from netskel.errors import InputError
from netskel.model import pair_key
from netskel.topology import Topology

MIN_PERIODICITY = 0.3
PROFILE_BINS = 48
HARMONICS = 8
MIN_MATCH_MARGIN = 0.05  # below: timing says nothing, keep every cross pair
AMBIGUITY = 0.15  # a runner-up this close to the best is kept too
SIGNIFICANCE = 4.0  # partners must agree this many noise levels above chance
MIN_CHAIN_CLARITY = 1.5  # adjacent stages must exchange this much more than others


@dataclass
class Rates:
    endpoints: list[str]
    t0: float
    dt: float
    tx: np.ndarray  # (E, T) bytes/s
    rx: np.ndarray


@dataclass
class Skeleton:
    job: str
    confidence: float
    dp: int
    tp: int
    pp: int
    ep: int | None
    dp_groups: list[list[str]]
    pp_stages: list[list[str]]
    endpoints: list[str]
    pair_index: np.ndarray  # (P, 2) indices into endpoints, each pair once
    notes: list[str] = field(default_factory=list)
    ep_groups: list[list[str]] = field(default_factory=list)

    @property
    def pairs(self) -> set[tuple[str, str]]:
        """The pairs as sorted id tuples (convenient, not for millions)."""
        e = self.endpoints
        return {pair_key(e[int(a)], e[int(b)]) for a, b in self.pair_index}


def _endpoint_time_order(code: np.ndarray, ts: np.ndarray, counts: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(row order by endpoint, then time; the timestamps in that order).
    Recordings are usually appended as samples arrive, so each endpoint's rows
    are already in time order: a stable radix sort by endpoint alone keeps
    them so (O(n)). Only when some endpoint's rows are out of order does a
    full sort run."""
    small = code.astype(np.uint16) if len(counts) <= 1 << 16 else code
    order = np.argsort(small, kind="stable")
    del small
    t = ts[order]
    back = t[1:] < t[:-1]  # time steps back: a new endpoint, or rows out of order
    if np.count_nonzero(back) < len(counts):
        ends = np.cumsum(counts)[:-1] - 1
        back[ends[ends >= 0]] = False
        if not back.any():
            return order, t
    span = float(ts.max() - ts.min()) + 1.0
    order = np.argsort(code * span + (ts - ts.min()))
    return order, ts[order]


def to_rates(ts: np.ndarray, endpoint: np.ndarray, tx: np.ndarray, rx: np.ndarray,
             wanted: list[str], names: list[str] | None = None, chunk: int = 1024) -> Rates:
    """Every wanted endpoint's tx/rx rate on one shared grid, vectorized over
    all endpoints. `endpoint` holds ids, or integer codes into `names` (a
    dictionary-encoded column)."""
    if names is None:
        names, code = factorize(np.asarray(endpoint, dtype=object))
    else:
        code = np.asarray(endpoint)
    index = {n: i for i, n in enumerate(names)}
    missing = [e for e in wanted if e not in index]
    if missing:
        raise InputError(f"no throughput samples for endpoint '{missing[0]}'"
                         + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    want = np.array([index[e] for e in wanted], dtype=np.int64)
    # Renumber the wanted endpoints 0..E-1 and drop everything else.
    remap = np.full(len(names), -1, dtype=np.intp)
    remap[want] = np.arange(len(want))
    code = remap[code]
    sel = code >= 0
    if not sel.all():
        ts, code, tx, rx = ts[sel], code[sel], tx[sel], rx[sel]
    counts = np.bincount(code, minlength=len(want))
    order, ts = _endpoint_time_order(code, ts, counts)
    # Sorted by endpoint: the codes are runs, rebuilt from their counts.
    code = np.repeat(np.arange(len(want)), counts)
    tx, rx = tx[order].astype(np.float64), rx[order].astype(np.float64)
    del order
    # Duplicate timestamps of one endpoint carry nothing new.
    dup = np.zeros(len(ts), dtype=bool)
    dup[1:] = (code[1:] == code[:-1]) & (ts[1:] <= ts[:-1])
    if dup.any():
        ts, code, tx, rx = ts[~dup], code[~dup], tx[~dup], rx[~dup]
    bounds = np.searchsorted(code, np.arange(len(want) + 1))
    if np.any(np.diff(bounds) < 2):
        raise InputError("an endpoint has fewer than two throughput samples")
    first = np.zeros(len(ts), dtype=bool)
    first[bounds[:-1]] = True
    steps = np.diff(ts)
    steps[bounds[1:-1] - 1] = np.nan  # the step between two endpoints
    dt = float(np.nanmedian(steps[::max(1, len(steps) // 1_000_000)]))
    if not dt > 0:
        raise InputError("throughput samples have no usable interval")
    del steps
    start = float(ts[bounds[:-1]].max())
    end = float(ts[bounds[1:] - 1].min())
    if end - start < 4 * dt:
        raise InputError("endpoints' recordings do not overlap in time")

    def cumulative(v: np.ndarray) -> np.ndarray:
        """Bytes counted so far, through counter resets (a drop means the
        counter restarted from zero). One running sum over all endpoints:
        rates are differences within an endpoint, so its offset cancels."""
        inc = np.empty_like(v)
        np.subtract(v[1:], v[:-1], out=inc[1:])
        np.copyto(inc, v, where=inc < 0)
        inc[first] = 0.0
        return np.cumsum(inc, out=inc)

    ctx, crx = cumulative(tx), cumulative(rx)
    del tx, rx
    grid = np.arange(start, end, dt)
    g = len(grid)
    # Grid point j of an endpoint interpolates between its last sample at or
    # before grid[j] and the next one. A sample lands in cell ceil((t-start)/dt):
    # counting samples per cell (no search) gives each grid point's index.
    cell = np.clip(np.ceil((ts - start) / dt), 0, g).astype(np.int64)
    out_tx = np.empty((len(want), g - 1), dtype=np.float32)
    out_rx = np.empty_like(out_tx)
    for lo in range(0, len(want), chunk):
        hi = min(len(want), lo + chunk)
        rows = slice(bounds[lo], bounds[hi])
        counts = np.bincount((code[rows] - lo) * (g + 1) + cell[rows], minlength=(hi - lo) * (g + 1))
        seen = np.cumsum(counts.reshape(hi - lo, g + 1), axis=1)[:, :g]
        i = bounds[lo:hi, None] + seen - 1
        i = np.clip(i, bounds[lo:hi, None], bounds[lo + 1:hi + 1, None] - 2)
        t_lo, t_hi = ts[i], ts[i + 1]
        frac = np.clip((grid[None, :] - t_lo) / (t_hi - t_lo), 0.0, 1.0)
        for c, out in ((ctx, out_tx), (crx, out_rx)):
            v = c[i] + frac * (c[i + 1] - c[i])
            out[lo:hi] = np.diff(v, axis=1) / dt
    return Rates(endpoints=list(wanted), t0=start, dt=dt, tx=out_tx, rx=out_rx)


def find_period(total: np.ndarray, dt: float) -> tuple[float, float]:
    """(period in seconds, strength in [0, 1]) from the aggregate's
    autocorrelation; strength near 0 means no iteration structure."""
    x = total - total.mean()
    n = len(x)
    if n < 16 or not np.any(x):
        return 0.0, 0.0
    spec = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(spec * np.conj(spec))[:n]
    acf = acf / acf[0]
    acf = acf * n / (n - np.arange(n))  # unbiased: long lags have fewer terms
    lo, hi = 3, n // 3
    if hi <= lo + 2:
        return 0.0, 0.0
    # Peaks are picked on a lightly smoothed ACF: a period that is not a whole
    # number of samples splits its peak over two neighbouring lags.
    smooth = np.convolve(acf, np.ones(3) / 3, mode="same")
    seg = smooth[lo:hi]
    # The first lag where the ACF dips below zero, then its highest peak.
    neg = np.flatnonzero(seg < 0)
    if len(neg) == 0:
        return 0.0, 0.0
    tail = seg[neg[0]:]
    top = float(tail.max())
    # The first local maximum nearly as high as the best: multiples of the
    # period are as high as the period itself.
    local = np.flatnonzero((tail[1:-1] >= tail[:-2]) & (tail[1:-1] >= tail[2:])
                           & (tail[1:-1] >= 0.5 * top)) + 1
    peak = neg[0] + (int(local[0]) if len(local) else int(np.argmax(tail)))
    lag = lo + peak
    strength = float(acf[lag - 1:lag + 2].max())
    # Refine with the farthest multiple of the period still well inside the data.
    best = float(lag)
    for k in range(2, 10):
        c = int(round(k * best))
        if c < 3 or c + 2 >= hi:
            break
        w = slice(c - 2, c + 3)
        j = c - 2 + int(np.argmax(acf[w]))
        strength = max(strength, float(acf[j]))
        if 0 < j < n - 1:
            a, b, cc = acf[j - 1], acf[j], acf[j + 1]
            denom = a - 2 * b + cc
            frac = 0.5 * (a - cc) / denom if denom else 0.0
            refined = (j + frac) / k
            if abs(refined - lag) <= 1.0:  # a multiple of the period, not a stray peak
                best = refined
    return best * dt, max(0.0, min(1.0, strength))


def features(r: Rates, period: float) -> np.ndarray:
    """The burst pattern as Fourier coefficients at the period's harmonics,
    rotated so that the fundamental has phase 0: host clocks disagree by tens
    of milliseconds, but where a stage's bursts sit relative to each other
    does not. The STFT magnitude at the same harmonics (shift-invariant as
    well) is appended."""
    total = (r.tx + r.rx).astype(np.float64)
    e, n = total.shape
    t = np.arange(n) * r.dt
    k = np.arange(1, HARMONICS * 2 + 1)
    basis = np.exp(-2j * np.pi * np.outer(t, k) / period)
    x = (total - total.mean(axis=1, keepdims=True)) @ basis
    rot = np.conj(x[:, :1]) / (np.abs(x[:, :1]) + 1e-12)
    # Weight 1/sqrt(k): real bursts are jittery, high harmonics are noisier.
    y = x * rot ** k[None, :] / np.sqrt(k)[None, :]
    y /= np.linalg.norm(y, axis=1, keepdims=True) + 1e-12
    nper = int(min(n, max(16, round(4 * period / r.dt))))
    freqs, _, z = signal.stft(total, fs=1.0 / r.dt, nperseg=nper, axis=-1)
    mag = np.abs(z).mean(axis=-1)
    harm = np.array([np.argmin(np.abs(freqs - j / period)) for j in range(1, HARMONICS + 1)])
    spec = mag[:, harm]
    spec /= np.linalg.norm(spec, axis=1, keepdims=True) + 1e-9
    return np.hstack([y.real, y.imag, 0.5 * spec])


def distances(x: np.ndarray) -> np.ndarray:
    """Euclidean distance matrix in one BLAS pass."""
    sq = np.einsum("ij,ij->i", x, x)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    np.maximum(d2, 0.0, out=d2)
    np.fill_diagonal(d2, 0.0)
    return np.asarray(np.sqrt(d2, out=d2))


def silhouette(d: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette from a distance matrix: near 0 for a cut through
    structureless data, near 1 for real groups. Per-cluster distance sums in
    one pass per cut (scikit-learn's silhouette_score is the reference)."""
    n = len(labels)
    g = int(labels.max()) + 1
    if not 1 < g < n:
        return 0.0
    sizes = np.bincount(labels, minlength=g)
    onehot = np.zeros((n, g))
    onehot[np.arange(n), labels] = 1.0
    sums = d @ onehot  # (n, g): each point's distance sum to every cluster
    own = sizes[labels]
    a = sums[np.arange(n), labels] / np.maximum(own - 1, 1)
    mean_other = sums / np.maximum(sizes, 1)[None, :]
    mean_other[np.arange(n), labels] = np.inf
    b = mean_other.min(axis=1)
    s = (b - a) / np.maximum(np.maximum(a, b), 1e-300)
    s[own == 1] = 0.0
    return float(s.mean())


def equal_clusters(x: np.ndarray, hosts: list[str], min_separation: float = 0.5
                   ) -> tuple[np.ndarray, float]:
    """Labels of the best split into equal groups of two or more, none holding
    two NICs of one host, and its separation; one group when no split is
    clearly better than chance."""
    n = len(x)
    if n <= 3:
        return np.zeros(n, dtype=np.int64), 1.0
    d = distances(x)
    # The distances already at hand, condensed: linkage need not recompute them.
    z = hierarchy.linkage(squareform(d, checks=False), method="average")
    names, host_code = np.unique(np.asarray(hosts, dtype=object), return_inverse=True)
    n_hosts = len(names)
    best: tuple[float, np.ndarray | None] = (0.0, None)
    for g in range(2, n // 2 + 1):
        if n % g:
            continue
        labels = hierarchy.fcluster(z, g, criterion="maxclust") - 1
        sizes = np.bincount(labels, minlength=g)
        if len(sizes) != g or np.any(sizes != n // g):
            continue
        if len(np.unique(labels * n_hosts + host_code)) != n:  # two NICs of a host together
            continue
        sep = silhouette(d, labels)
        if sep > best[0]:
            best = (sep, labels)
    if best[1] is None or best[0] < min_separation:
        return np.zeros(n, dtype=np.int64), 1.0
    return best[1].astype(np.int64), best[0]


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9))


def _folded(x: np.ndarray, dt: float, period: float) -> np.ndarray:
    """Mean rate per phase bin; no finer than the sampling, so no bin is empty."""
    n = x.shape[-1]
    nb = int(min(PROFILE_BINS, max(4, period // dt)))
    bins = np.minimum((((np.arange(n) * dt) / period) % 1.0 * nb).astype(np.int64), nb - 1)
    counts = np.maximum(np.bincount(bins, minlength=nb), 1)
    return np.bincount(bins, weights=x, minlength=nb) / counts


def quiet_phase(profile: np.ndarray) -> tuple[int, int]:
    """(end bin, middle bin) of the longest circular run of quiet bins: where
    one iteration ends and the next begins."""
    quiet = profile < 0.05 * profile.max()
    nb = len(profile)
    best_len, best_end, run = 0, 0, 0
    for i in range(2 * nb):
        if quiet[i % nb]:
            run += 1
            if best_len < run <= nb:
                best_len, best_end = run, (i + 1) % nb
        else:
            run = 0
    return best_end, (best_end - best_len // 2) % nb


def order_stages(groups: list[np.ndarray], r: Rates, period: float) -> tuple[list[int], float]:
    """Chain the groups of one rail by activation exchange, oriented forward;
    and how clearly: the weakest chain link over the strongest non-link."""
    k = len(groups)
    if k == 1:
        return [0], float("inf")
    tx = [_folded(r.tx[g].mean(axis=0), r.dt, period) for g in groups]
    rx = [_folded(r.rx[g].mean(axis=0), r.dt, period) for g in groups]
    w = np.zeros((k, k))
    for i in range(k):
        for j in range(k):
            if i != j:
                w[i, j] = _overlap(tx[i], rx[j]) + _overlap(tx[j], rx[i])
    # Greedy path: strongest exchanges first, degree <= 2, no cycle.
    parent = list(range(k))

    def root(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a
    deg = [0] * k
    adj: dict[int, list[int]] = defaultdict(list)
    edges = sorted(((a, b) for a in range(k) for b in range(a + 1, k)), key=lambda p: -w[p])
    for i, j in edges:
        if deg[i] < 2 and deg[j] < 2 and root(i) != root(j):
            adj[i].append(j)
            adj[j].append(i)
            deg[i] += 1
            deg[j] += 1
            parent[root(i)] = root(j)
    ends = [i for i in range(k) if deg[i] <= 1]
    chain = [ends[0]]
    while len(chain) < k:
        nxt = [j for j in adj[chain[-1]] if j not in chain]
        if not nxt:
            break
        chain.append(nxt[0])
    if len(chain) < k:
        return list(range(k)), 0.0
    links = {frozenset(p) for p in zip(chain, chain[1:], strict=False)}
    on = min(w[a, b] for a, b in zip(chain, chain[1:], strict=False))
    off = max((w[a, b] for a in range(k) for b in range(a + 1, k)
               if frozenset((a, b)) not in links), default=0.0)
    clarity = on / off if off > 0 else float("inf")

    # Orientation: the first stage bursts first in forward. The iteration
    # starts where the job's longest quiet stretch ends.
    job = sum(t + x for t, x in zip(tx, rx, strict=True))
    best_end, _ = quiet_phase(job)
    quiet = job < 0.05 * job.max()
    background = float(np.median(job[quiet])) / k if quiet.any() else 0.0

    def onset(g: int) -> int:
        """When a group first transmits: the next stage receives at that very
        moment, so only transmissions tell who went first."""
        prof = np.roll(tx[g], -best_end)
        floor = max(5 * background, 0.02 * float(prof.max()))
        return int(np.argmax(prof > floor))
    if onset(chain[-1]) < onset(chain[0]):
        chain = chain[::-1]
    return chain, clarity


def iteration_boundary(r: Rates, members: np.ndarray, period: float) -> float:
    """Where, within the period, these endpoints' iterations end: the middle
    of their longest quiet stretch (seconds from the grid's start, mod period)."""
    prof = _folded((r.tx[members] + r.rx[members]).mean(axis=0), r.dt, period)
    _, mid = quiet_phase(prof)
    return float(mid / len(prof) * period)


def jitter_sequences(r: Rates, idx: np.ndarray, period: float, boundary: float,
                     weigh: str) -> np.ndarray:
    """Per endpoint, the byte-weighted centre of its traffic in each
    iteration, detrended: a replica's timing wobble from iteration to
    iteration, shared by all its stages; constant clock offsets cancel.

    weigh: "total" (tx + rx); "one_way" (|tx - rx|: the all-reduce sends and
    receives at once, cancels, and no longer dilutes the activations' wobble,
    but a middle stage sending and receiving activations at once cancels them
    too, so callers try both); "two_way" (min(tx, rx): collectives, among
    them the all-to-all that moves with its expert group). Apart from
    "total", only traffic above the background floor counts: quiet-time noise
    has a long lever arm on a centre of mass."""
    tx, rx = r.tx[idx].astype(np.float64), r.rx[idx]
    if weigh == "total":
        x = tx + rx
    else:
        x = np.abs(tx - rx) if weigh == "one_way" else np.minimum(tx, rx)
        x = np.maximum(x - 2.0 * np.median(x, axis=1, keepdims=True), 0.0)
    n = x.shape[1]
    t = np.arange(n) * r.dt
    it = np.floor((t - boundary) / period).astype(np.int64)
    first, last = it.min() + 1, it.max() - 1  # whole iterations only
    keep = (it >= first) & (it <= last)
    k = last - first + 1
    if k < 3:
        return np.zeros((len(idx), 0))
    onehot = np.zeros((n, k))
    onehot[np.flatnonzero(keep), it[keep] - first] = 1.0
    den = x @ onehot
    cen = ((x * t[None, :]) @ onehot) / np.maximum(den, 1e-9)
    # Iteration k sits near k periods: remove each endpoint's own line (which
    # also absorbs a slightly wrong period and its clock offset).
    ks = np.arange(k, dtype=np.float64)
    design = np.stack([np.ones(k), ks - ks.mean()], axis=1)
    coef, *_ = np.linalg.lstsq(design, cen.T, rcond=None)
    return np.asarray(cen - (design @ coef).T)


def match_partners(a_idx: np.ndarray, b_idx: np.ndarray, seq: dict[int, np.ndarray]
                   ) -> tuple[list[tuple[int, int]], float]:
    """Corresponding endpoints of two adjacent stages: the pairing whose
    timing wobbles agree best, plus, for recall, any pair nearly as good as
    an endpoint's assigned partner. Returns the pairs and how clearly the
    timing separates partners (median margin over the runner-up)."""
    sa = np.stack([seq[int(i)] for i in a_idx])
    sb = np.stack([seq[int(i)] for i in b_idx])
    if sa.shape[1] < 3:
        return [], 0.0
    sa = sa / (np.linalg.norm(sa, axis=1, keepdims=True) + 1e-12)
    sb = sb / (np.linalg.norm(sb, axis=1, keepdims=True) + 1e-12)
    c = sa @ sb.T
    # Correlations of K unrelated wobbles scatter by about 1/sqrt(K).
    noise = 1.0 / np.sqrt(sa.shape[1])
    rows, cols = linear_sum_assignment(-c)
    if float(np.median(c[rows, cols])) < SIGNIFICANCE * noise:
        return [], 0.0  # timing carries no partner information
    keep = np.zeros_like(c, dtype=bool)
    keep[rows, cols] = True
    if c.shape[1] > 1:  # a close runner-up may be the real partner: keep it too
        order = np.argsort(-c, axis=1)
        first = c[np.arange(len(c)), order[:, 0]]
        second = c[np.arange(len(c)), order[:, 1]]
        close = (first - second) < max(AMBIGUITY, 2.0 * noise)
        keep[np.flatnonzero(close), order[close, 0]] = True
        keep[np.flatnonzero(close), order[close, 1]] = True
    runner = np.sort(c, axis=1)[:, -2] if c.shape[1] > 1 else np.zeros(len(rows))
    margin = float(np.median(c[rows, cols] - runner[rows])) if len(rows) else 0.0
    pairs = [(int(a_idx[i]), int(b_idx[j])) for i, j in zip(*np.nonzero(keep), strict=True)]
    return pairs, margin


def infer(topo: Topology, job: str, r: Rates) -> Skeleton:
    eps = r.endpoints
    nic = [topo.nics[topo.endpoints[e].nic] for e in eps]
    total = (r.tx + r.rx).astype(np.float64)
    z = (total - total.mean(axis=1, keepdims=True)) / (total.std(axis=1, keepdims=True) + 1e-9)
    period, strength = find_period(z.mean(axis=0), r.dt)
    if strength < MIN_PERIODICITY or period <= 0:
        return rail_aligned(topo, job, eps, f"no periodic traffic (periodicity {strength:.2f})")
    feats = features(r, period)
    by_rail: dict[int, list[int]] = defaultdict(list)
    for i, nc in enumerate(nic):
        by_rail[nc.rail].append(i)
    rail_groups: list[tuple[int, np.ndarray]] = []
    seps = []
    for rail, idx in sorted(by_rail.items()):
        ia = np.array(idx)
        labels, sep = equal_clusters(feats[ia], [nic[i].host for i in idx])
        seps.append(sep)
        for c in range(labels.max() + 1):
            rail_groups.append((rail, ia[labels == c]))
    # One data-parallel group = same hosts, same slot in their containers.
    slot = {}
    for cont in topo.containers.values():
        for k, e in enumerate(cont.endpoints):
            slot[e.id] = k
    merged: dict[tuple[frozenset[str], int, int], list[int]] = defaultdict(list)
    stage_key: dict[int, tuple[frozenset[str], int, int]] = {}
    for gi, (_rail, members) in enumerate(rail_groups):
        hosts = frozenset(nic[i].host for i in members)
        slots = {slot[eps[i]] for i in members}
        key = (hosts, min(slots) if len(slots) == 1 else -1, gi if len(slots) != 1 else -1)
        merged[key].extend(members.tolist())
        stage_key[gi] = key
    dp_groups = [sorted(eps[i] for i in m) for m in merged.values()]
    sizes = {len(g) for g in dp_groups}
    dp = max(sizes) if sizes else 1
    n = len(eps)
    rail_of = np.array([x.rail for x in nic])
    host_codes = {h: k for k, h in enumerate(sorted({x.host for x in nic}))}
    host_of = np.array([host_codes[x.host] for x in nic])
    chunks: list[np.ndarray] = []
    for m in merged.values():
        arr = np.asarray(m)
        for rail in np.unique(rail_of[arr]):
            sub = arr[rail_of[arr] == rail]
            ia, ib = np.triu_indices(len(sub), k=1)
            chunks.append(np.stack([sub[ia], sub[ib]], axis=1))
    # Pipeline stages, per rail.
    notes = []
    stage_sets: dict[int, list[int]] = defaultdict(list)
    pp = 1
    for rail in sorted(by_rail):
        groups = [g for rr, g in rail_groups if rr == rail]
        pp = max(pp, len(groups))
        if len(groups) == 1:
            stage_sets[0].extend(groups[0].tolist())
            continue
        chain, clarity = order_stages(groups, r, period)
        if clarity < MIN_CHAIN_CLARITY:
            return rail_aligned(topo, job, eps, f"pipeline order unclear on rail {rail} "
                                f"(clarity {clarity:.2f}): sampling too coarse for the stages")
        for s, gi in enumerate(chain):
            stage_sets[s].extend(groups[gi].tolist())
        members = np.concatenate(groups)
        boundary = iteration_boundary(r, members, period)
        seqs = [{int(i): row for i, row in zip(members, jitter_sequences(r, members, period, boundary, w),
                                               strict=True)} for w in ("one_way", "total")]
        for a, b in zip(chain, chain[1:], strict=False):
            # The weighting that separates partners more clearly wins.
            matched, margin = max((match_partners(groups[a], groups[b], sq) for sq in seqs),
                                  key=lambda m: m[1])
            if margin < MIN_MATCH_MARGIN:  # timing cannot tell partners apart: keep them all
                ga, gb = np.meshgrid(groups[a], groups[b], indexing="ij")
                chunks.append(np.stack([ga.ravel(), gb.ravel()], axis=1))
                notes.append(f"rail {rail}: stage partners ambiguous, kept all cross pairs")
            elif matched:
                chunks.append(np.asarray(matched, dtype=np.int64))
    ep, ep_groups = expert_groups(r, [np.asarray(m) for m in merged.values()], period)
    if n % (dp * pp):
        notes.append(f"{n} endpoints do not divide into dp={dp} x pp={pp}")
    tp = max(1, n // (dp * pp))
    sep = float(np.median(seps)) if seps else 1.0
    # Geometric mean of periodicity and cluster separation (silhouette):
    # both must be good, neither alone sinks a clear answer.
    quality = sep if pp > 1 or len(dp_groups) > len(by_rail) else 1.0
    confidence = float(np.sqrt(strength * max(0.0, quality)))
    return Skeleton(job=job, confidence=round(float(min(1.0, max(0.0, confidence))), 3), dp=dp,
                    tp=tp, pp=pp, ep=ep, dp_groups=sorted(dp_groups),
                    ep_groups=sorted(sorted(eps[i] for i in g) for g in ep_groups),
                    pp_stages=[sorted(eps[i] for i in stage_sets[s]) for s in sorted(stage_sets)],
                    endpoints=list(eps), pair_index=_network_pairs(chunks, host_of), notes=notes)


def expert_split(seq: np.ndarray) -> np.ndarray | None:
    """Labels of the members of one data-parallel group by expert group, or
    None. Members of an expert group meet in every all-to-all, so their
    per-iteration timing wobbles together; the split must be equal and its
    within-group agreement well above chance (correlations of K unrelated
    wobbles scatter by 1/sqrt(K))."""
    m, k = seq.shape
    if m < 4 or k < 3:
        return None
    x = seq / (np.linalg.norm(seq, axis=1, keepdims=True) + 1e-12)
    labels, sep = equal_clusters(x, [str(i) for i in range(m)], min_separation=0.25)
    g = int(labels.max()) + 1
    if g == 1:
        return None
    c = x @ x.T
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(m, dtype=bool)
    within, between = c[same & off], c[~same]
    noise = 1.0 / np.sqrt(k)
    stderr = noise * np.sqrt(1.0 / len(within) + 1.0 / len(between))
    if float(within.mean() - between.mean()) < SIGNIFICANCE * max(stderr, noise / 2):
        return None
    return labels


def expert_groups(r: Rates, dp_groups: list[np.ndarray], period: float
                  ) -> tuple[int, list[np.ndarray]]:
    """(ep, expert groups as endpoint indices) from the all-to-all timing
    inside each data-parallel group; ep 1 and no groups when none shows."""
    found: list[np.ndarray] = []
    sizes: list[int] = []
    for members in dp_groups:
        if len(members) < 4:
            continue
        seq = jitter_sequences(r, members, period, iteration_boundary(r, members, period),
                               "two_way")
        labels = expert_split(seq)
        if labels is None:
            sizes.append(1)
            continue
        g = int(labels.max()) + 1
        sizes.append(len(members) // g)
        found += [members[labels == c] for c in range(g)]
    ep = max(set(sizes), key=sizes.count) if sizes else 1
    return ep, [f for f in found if len(f) == ep] if ep > 1 else []


def _network_pairs(chunks: list[np.ndarray], host_of: np.ndarray) -> np.ndarray:
    """Unique unordered pairs that cross hosts (same-host traffic stays on NVLink)."""
    if not chunks:
        return np.zeros((0, 2), dtype=np.int64)
    p = np.concatenate(chunks)
    lo, hi = np.minimum(p[:, 0], p[:, 1]), np.maximum(p[:, 0], p[:, 1])
    del p
    keep = host_of[lo] != host_of[hi]
    lo, hi = lo[keep], hi[keep]
    o = pair_order(lo, hi, int(host_of.shape[0]))
    lo, hi = lo[o], hi[o]
    new = np.ones(len(lo), dtype=bool)
    new[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    return np.stack([lo[new], hi[new]], axis=1).astype(np.int64, copy=False)


def rail_aligned(topo: Topology, job: str, eps: list[str], why: str) -> Skeleton:
    nic = [topo.nics[topo.endpoints[e].nic] for e in eps]
    rail_of = np.array([x.rail for x in nic])
    host_codes = {h: k for k, h in enumerate(sorted({x.host for x in nic}))}
    host_of = np.array([host_codes[x.host] for x in nic])
    chunks = []
    for rail in np.unique(rail_of):
        sub = np.flatnonzero(rail_of == rail)
        a, b = np.triu_indices(len(sub), k=1)
        chunks.append(np.stack([sub[a], sub[b]], axis=1))
    return Skeleton(job=job, confidence=0.1, dp=1, tp=1, pp=1, ep=None, dp_groups=[],
                    pp_stages=[], endpoints=list(eps),
                    pair_index=_network_pairs(chunks, host_of), notes=[why])


def ping_list(sk: Skeleton) -> dict[str, list[str]]:
    """Each pair probed from one end, by the controller's stable owner rule."""
    eps = sk.endpoints
    h = np.array([id_hash(e) for e in eps], dtype=np.uint64)
    rank = np.empty(len(eps), dtype=np.int64)
    rank[np.argsort(np.asarray(eps, dtype=object), kind="stable")] = np.arange(len(eps))
    a, b = sk.pair_index[:, 0], sk.pair_index[:, 1]
    lo = np.where(rank[a] < rank[b], a, b)
    hi = np.where(rank[a] < rank[b], b, a)
    bits = owner_bits(h[lo], h[hi])
    src = np.where(bits == 0, lo, hi)
    dst = np.where(bits == 0, hi, lo)
    order = pair_order(src, rank[dst], len(eps))
    src, dst = src[order], dst[order]
    names = np.asarray(eps, dtype=object)[dst]
    bounds = np.searchsorted(src, np.arange(len(eps) + 1))
    out: dict[str, list[str]] = {e: [] for e in sorted(eps)}
    for i, e in enumerate(eps):
        out[e] = names[bounds[i]:bounds[i + 1]].tolist()
    return out
