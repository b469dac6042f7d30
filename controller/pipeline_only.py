"""A job without data parallelism: its pipeline from the transfers alone.

Why a path of its own: a pure pipeline (dp = 1) has no gradient all-reduce,
the collective the rest of inference stands on (controller/timing.py): no
reduction levels to make stages, no data-parallel group to line clocks up.
Its reduction offsets are whatever its activations do, one endpoint per
"stage" apart from the rest (a real gloo pp4 x dp1 job in the testbed read
as dp4 x pp1, its one stage scattered). What it does have:
- point-to-point transfers: a stage's send is its neighbour's receive at
  the same instant, so each host's sent bytes track its neighbours' received
  bytes and nobody else's (in that job 0.39-0.46 against -0.03 to -0.08 for
  hosts two or more stages apart); the neighbours form a path;
- 1F1B's shape, which orients the path: stage 0 sends its warm-up forwards
  early in the iteration and receives the backwards late, the last stage
  receives each forward and sends its backward right after, so (centre of
  received bytes - centre of sent bytes) within an iteration falls along
  the pipeline (there: +0.54, +0.07, -0.17, -0.28 s).
Only where every host holds one endpoint on each of the same rails (one
stage per host, the rails carrying copies of one pattern), the iterations
repeat, every stretch of the recording finds the same path and its weakest
link beats every other host pair by SIGNIFICANCE standard errors over the
stretches; anything else keeps the caller's answer (recall first: a path
nearly as good as another would drop true pairs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controller.grouping import find_root
from controller.timing import Iterations, high_passed, one_way_outliers, window_centres

SIGNIFICANCE = 4.0  # standard errors by which the path must stand out
MAX_HOSTS = 64  # more stages than this is no pipeline anyone runs
BLOCK_ITERATIONS = 4  # iterations per stretch that must find the path alone...
MAX_BLOCKS = 8  # ...in at most this many stretches, at least three
UNEVEN_SHARE = 0.5  # a host pair exchanging under this share of another's is no collective's


@dataclass(frozen=True)
class Chain:
    stages: list[np.ndarray]  # endpoint indices per stage, in pipeline order when `oriented`
    oriented: bool
    separation: float  # 1 - (strongest pair off the path / weakest on it), in [0, 1]
    notes: list[str]


def host_grid(rail_of: np.ndarray, host_of: np.ndarray) -> np.ndarray | None:
    """(hosts, rails) endpoint indices, or None unless every host has exactly
    one endpoint on each of the same rails."""
    hosts, h = np.unique(host_of, return_inverse=True)
    rails, r = np.unique(rail_of, return_inverse=True)
    if len(rail_of) != len(hosts) * len(rails):
        return None
    grid = np.full((len(hosts), len(rails)), -1, dtype=np.int64)
    grid[h, r] = np.arange(len(rail_of))
    return grid if bool(np.all(grid >= 0)) else None


def _unit(x: np.ndarray) -> np.ndarray:
    y = x - x.mean(axis=1, keepdims=True)
    return np.asarray(y / (np.linalg.norm(y, axis=1, keepdims=True) + 1e-12))


def transfer_matrix(tx: np.ndarray, rx: np.ndarray, grid: np.ndarray, max_lag: int = 1
                    ) -> np.ndarray:
    """(hosts, hosts): how well one host's sends show as the other's receives
    and back, averaged over the rails; per rail at the lag (up to max_lag
    samples) where they show best: two hosts' clocks tens of ms apart put a
    transfer in neighbouring samples of the two recordings."""
    ntx, nrx = _unit(tx), _unit(rx)
    hosts, rails = grid.shape
    k = tx.shape[1]
    out = np.zeros((hosts, hosts))
    for r in range(rails):
        e = grid[:, r]
        # c[lag][a, b]: a's sends against b's receives `lag` samples later.
        c = {lag: ntx[e, max(0, -lag):k - max(0, lag)] @ nrx[e, max(0, lag):k - max(0, -lag)].T
             for lag in range(-max_lag, max_lag + 1)}
        out += np.max([(c[lag] + c[-lag].T) / 2 for lag in c], axis=0)
    out /= rails
    np.fill_diagonal(out, -np.inf)
    return out


def greedy_path(w: np.ndarray) -> list[int] | None:
    """The hosts as one path through heavy edges: edges taken heaviest first
    unless a host would get a third neighbour or a cycle would close (the
    greedy heuristic for a maximum-weight Hamiltonian path; exact when the
    path's edges outweigh every other, which is all this module accepts)."""
    n = len(w)
    if n < 2:
        return None
    parent = list(range(n))
    degree = np.zeros(n, dtype=np.int64)
    nbrs: list[list[int]] = [[] for _ in range(n)]
    iu, ju = np.triu_indices(n, k=1)
    taken = 0
    for k in np.argsort(-w[iu, ju], kind="stable"):
        a, b = int(iu[k]), int(ju[k])
        if degree[a] >= 2 or degree[b] >= 2 or find_root(parent, a) == find_root(parent, b):
            continue
        parent[find_root(parent, a)] = find_root(parent, b)
        degree[a] += 1
        degree[b] += 1
        nbrs[a].append(b)
        nbrs[b].append(a)
        taken += 1
        if taken == n - 1:
            break
    if taken != n - 1:
        return None
    path = [int(np.flatnonzero(degree == 1)[0])]
    while len(path) < n:
        path.append(next(x for x in nbrs[path[-1]] if len(path) < 2 or x != path[-2]))
    return path


def uneven_exchange(tx: np.ndarray, rx: np.ndarray, rail_of: np.ndarray, host_of: np.ndarray,
                    it: Iterations, dt: float, clock_s: float) -> float | None:
    """How clearly some host pair exchanges less than another (a t value),
    or None where it cannot be asked (fewer than three hosts, hosts not one
    endpoint per rail, too few iterations) or the weaker pair exchanges
    more than UNEVEN_SHARE of the stronger one's. In one collective every member
    bursts with every other at once, so all host pairs look alike (a real
    gloo dp4 at 0.25 s: 0.57-0.73); in a pipeline far stages exchange
    nothing (the real pp4 x dp1 at 0.25 s: 0.02 against 0.57), even where
    coarse samples hide which neighbours are which. The pairs are chosen on
    the recording's first half and tested on the second half's stretches
    (a pair chosen for being extreme would pass any test on the data that
    chose it)."""
    grid = host_grid(rail_of, host_of)
    blocks = int(np.clip(it.count // BLOCK_ITERATIONS, 3, MAX_BLOCKS // 2))
    if grid is None or not 3 <= len(grid) <= MAX_HOSTS or it.count < 2 * blocks:
        return None  # (more hosts than any pipeline has stages: not a pipeline's question)
    _, _, _, htx, hrx, _, _ = _prepared(tx, rx, it, dt, clock_s)
    half = htx.shape[1] // 2
    w = transfer_matrix(htx[:, :half], hrx[:, :half], grid)
    iu, ju = np.triu_indices(len(w), k=1)
    hi, lo = int(np.argmax(w[iu, ju])), int(np.argmin(w[iu, ju]))
    strong, weak = [], []
    for part in np.array_split(np.arange(half, htx.shape[1]), blocks):
        wb = transfer_matrix(htx[:, part[0]:part[-1] + 1], hrx[:, part[0]:part[-1] + 1], grid)
        strong.append(float(wb[iu[hi], ju[hi]]))
        weak.append(float(wb[iu[lo], ju[lo]]))
    a, b = np.asarray(strong), np.asarray(weak)
    if not b.mean() < UNEVEN_SHARE * a.mean():
        return None
    d = a - b
    spread = float(d.std(ddof=1))
    return float(d.mean() / (spread / np.sqrt(len(d)))) if spread > 0 else float("inf")


def _edges(path: list[int]) -> set[tuple[int, int]]:
    return {(min(a, b), max(a, b)) for a, b in zip(path, path[1:], strict=False)}


def _host_mean(x: np.ndarray) -> np.ndarray:
    """Column means over the finite values (NaN where none, without a warning)."""
    ok = np.isfinite(x)
    n = ok.sum(axis=0)
    return np.where(n > 0, np.where(ok, x, 0.0).sum(axis=0) / np.maximum(n, 1), np.nan)


def receive_lead(tx: np.ndarray, rx: np.ndarray, it: Iterations, dt: float) -> np.ndarray:
    """(E, K) per iteration, the centre of each endpoint's received bytes
    minus that of its sent bytes (seconds; NaN where it moved nothing)."""
    return np.asarray(window_centres(rx, it.bounds, dt) - window_centres(tx, it.bounds, dt))


def coarsened(tx: np.ndarray, rx: np.ndarray, it: Iterations, dt: float, clock_s: float
              ) -> tuple[np.ndarray, np.ndarray, Iterations, float]:
    """(tx, rx, iterations, dt) in bins about as long as two hosts' clocks
    may be apart (`clock_s`): no collective here to align the clocks on, so
    a send and its receive are only sure to meet in bins that long, up to
    one bin apart. Not in more lags of finer samples: the real job's
    transfers come every 100 ms, and at 50 ms a lag of two lined every
    stage up with the next one's (non-neighbours 0.3, as high as
    neighbours). At 10 ms, too, every transfer is a one-way sample of its
    own, and the largest of those are left out as random bursts."""
    f = max(1, int(round(clock_s / dt)))
    if f == 1:
        return tx, rx, it, dt
    n = tx.shape[1] // f * f

    def binned(x: np.ndarray) -> np.ndarray:
        return np.asarray(x[:, :n].reshape(len(x), -1, f).sum(axis=2) / f)
    return (binned(tx), binned(rx),
            Iterations(sync=it.sync // f, bounds=it.bounds // f, period=it.period,
                       regularity=it.regularity), dt * f)


def _prepared(tx: np.ndarray, rx: np.ndarray, it: Iterations, dt: float, clock_s: float
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Iterations,
                         float]:
    """(tx, rx, lone, high-passed tx, high-passed rx, iterations, dt), all at
    the clocks' spread (`coarsened`). `lone`: samples of random one-way
    bursts and checkpoint writes (partner of nobody), zero in the
    high-passed series."""
    ctx, crx, cit, cdt = coarsened(tx, rx, it, dt, clock_s)
    keep = np.zeros(ctx.shape, dtype=bool)
    lone = one_way_outliers(ctx, crx, keep)
    htx, hrx = high_passed(ctx, keep, cdt), high_passed(crx, keep, cdt)
    htx[lone] = 0.0
    hrx[lone] = 0.0
    return ctx, crx, lone, htx, hrx, cit, cdt


def pipeline_chain(tx: np.ndarray, rx: np.ndarray, rail_of: np.ndarray, host_of: np.ndarray,
                   it: Iterations, dt: float, clock_s: float) -> Chain | None:
    """The stages of a pure pipeline, one host each, or None where the
    transfers do not make one clear path. Read at the clocks' spread
    (`clock_s`, `coarsened`)."""
    grid = host_grid(rail_of, host_of)
    if grid is None or not 2 <= len(grid) <= MAX_HOSTS:
        return None
    tx, rx, lone, htx, hrx, it, dt = _prepared(tx, rx, it, dt, clock_s)
    w = transfer_matrix(htx, hrx, grid)
    path = greedy_path(w)
    if path is None:
        return None
    on = np.zeros(w.shape, dtype=bool)
    for a, b in zip(path, path[1:], strict=False):
        on[a, b] = on[b, a] = True
    noise = 1.0 / np.sqrt(htx.shape[1])  # how unrelated series of this length correlate
    weakest = float(w[on].min())
    if weakest < SIGNIFICANCE * noise:
        return None  # some neighbours exchange nothing visible: no pipeline shown
    # Every other host pair must exchange clearly less than the weakest
    # neighbours: hosts whose traffic spreads over many peers (or a
    # collective: everyone bursts at once) make no path. Periodic traffic
    # has far fewer independent samples than samples, so 1/sqrt(samples)
    # flatters a margin: it is judged by its spread over stretches of the
    # recording instead, each of which must find the same path on its own.
    # Recall first: a doubtful path is no path, the caller's list stands.
    off = ~on & np.isfinite(w)
    strongest_off = float(w[off].max()) if off.any() else 0.0
    if off.any():
        margins = []
        blocks = int(np.clip(it.count // BLOCK_ITERATIONS, 3, MAX_BLOCKS))
        for part in np.array_split(np.arange(htx.shape[1]), blocks):
            sl = slice(int(part[0]), int(part[-1]) + 1)
            wb = transfer_matrix(htx[:, sl], hrx[:, sl], grid)
            again = greedy_path(wb)
            if again is None or _edges(again) != _edges(path):
                return None
            margins.append(float(wb[on].min() - wb[off].max()))
        m = np.asarray(margins)
        if not m.mean() > SIGNIFICANCE * m.std(ddof=1) / np.sqrt(len(m)):
            return None
    del htx, hrx
    separation = float(np.clip(1.0 - max(strongest_off, 0.0) / weakest, 0.0, 1.0))
    stages = [grid[h] for h in path]
    # Orientation: stage 0 receives latest relative to what it sends.
    lead = receive_lead(np.where(lone, 0.0, tx), np.where(lone, 0.0, rx), it, dt)
    d = _host_mean(lead[stages[0]]) - _host_mean(lead[stages[-1]])
    d = d[np.isfinite(d)]
    notes = [f"no data-parallel collective: a pure pipeline of {len(path)} stages from the "
             f"transfers (weakest neighbours {weakest:.2f}, strongest others "
             f"{strongest_off:.2f}, noise {noise:.3f})"]
    t = float(np.mean(d) / (np.std(d, ddof=1) / np.sqrt(len(d)))) if len(d) > 2 else 0.0
    oriented = bool(np.isfinite(t) and abs(t) >= SIGNIFICANCE)
    if not oriented:
        notes.append(f"pipeline direction not told apart (t = {t:.1f}): stage order in doubt")
    elif t < 0:
        stages = stages[::-1]
    return Chain(stages=stages, oriented=oriented, separation=separation, notes=notes)
