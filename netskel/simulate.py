"""A training job's NIC traffic, as contract files, for any dp/tp/pp/ep and
rank placement — so inference is tested without a live cluster.

Ranks follow Megatron's order (tp fastest, then dp, then pp): rank =
t + TP*(d + DP*s). GPU i of a host uses NIC i (rail i). A container holds one
TP group when TP is smaller than the NICs per host, else one host.

Per iteration: forward activations stage s -> s+1 per microbatch, backward
gradients s+1 -> s, then each stage's data-parallel all-reduce once its
backward is done; MoE adds all-to-all bursts inside each expert group.
Each data-parallel replica runs with its own small timing jitter (what
pairs the corresponding endpoints of adjacent stages); all-reduces start
together; an expert group's all-to-all is a collective, so its members move
it together (the group's mean jitter). Noise: background bytes, missing samples, counter resets, host
clock offsets, shuffled rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from netskel.model import pair_key


@dataclass(frozen=True)
class JobShape:
    name: str
    dp: int
    tp: int
    pp: int
    ep: int = 1
    nics_per_host: int = 8
    period_s: float = 2.0
    microbatches: int = 4
    periodic: bool = True   # False: bring-up/debug traffic with no iteration


@dataclass(frozen=True)
class Noise:
    interval_s: float = 0.05
    duration_s: float = 40.0
    clock_offset_s: float = 0.03   # per host, uniform +-
    missing: float = 0.02          # fraction of samples dropped
    resets: int = 2                # endpoints whose counter restarts mid-recording
    background_bps: float = 2e6    # bytes/s of unrelated traffic, per endpoint
    replica_jitter_s: float = 0.01  # per replica per iteration
    shuffle: bool = True           # False: rows in recording order (by time)


@dataclass
class Truth:
    dp_groups: list[list[str]] = field(default_factory=list)
    pp_stages: list[list[str]] = field(default_factory=list)
    ep_groups: list[list[str]] = field(default_factory=list)
    pairs: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class _Rank:
    endpoint: str
    host: int
    gpu: int
    t: int
    d: int
    s: int


def _place(job: JobShape, host0: int) -> tuple[list[_Rank], list[dict[str, Any]], int]:
    n = job.dp * job.tp * job.pp
    per_container = job.tp if job.tp < job.nics_per_host else job.nics_per_host
    ranks, containers = [], []
    for c in range(n // per_container):
        eps = []
        for i in range(per_container):
            rank = c * per_container + i
            t, rest = rank % job.tp, rank // job.tp
            d, s = rest % job.dp, rest // job.dp
            host = host0 + rank // job.nics_per_host
            gpu = rank % job.nics_per_host
            eid = f"{job.name}-w{c:04d}/rnic{i}"
            ranks.append(_Rank(eid, host, gpu, t, d, s))
            eps.append({"id": eid, "nic": f"h{host:05d}/rnic{gpu}", "vni": 7})
        containers.append({"id": f"{job.name}-w{c:04d}", "job": job.name,
                           "host": f"h{host0 + (c * per_container) // job.nics_per_host:05d}",
                           "endpoints": eps})
    return ranks, containers, -(-n // job.nics_per_host)


def _truth(job: JobShape, ranks: list[_Rank]) -> Truth:
    by = {(r.t, r.d, r.s): r for r in ranks}
    tr = Truth()

    def add_pairs(members: list[_Rank]) -> None:
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                if a.gpu == b.gpu and a.host != b.host:
                    tr.pairs.add(pair_key(a.endpoint, b.endpoint))

    for s in range(job.pp):
        tr.pp_stages.append(sorted(r.endpoint for r in ranks if r.s == s))
        for t in range(job.tp):
            group = [by[(t, d, s)] for d in range(job.dp)]
            tr.dp_groups.append(sorted(r.endpoint for r in group))
            add_pairs(group)
            if job.ep > 1:
                for e0 in range(0, job.dp, job.ep):
                    eg = group[e0:e0 + job.ep]
                    tr.ep_groups.append(sorted(r.endpoint for r in eg))
                    add_pairs(eg)
            if s + 1 < job.pp:
                for d in range(job.dp):
                    add_pairs([by[(t, d, s)], by[(t, d, s + 1)]])
    return tr


NO_JITTER, REPLICA, EXPERTS = 0, 1, 2
Burst = tuple[float, float, float, int]


def _bursts(job: JobShape, r: _Rank) -> tuple[list[Burst], list[Burst]]:
    """(offset, duration, bytes, whose jitter moves it) per burst, tx and rx."""
    P, m = job.pp, job.microbatches
    delta = job.period_s * 0.6 / (2 * (P + m))
    act, dur = 8e6, delta * 0.5
    tx: list[Burst] = []
    rx: list[Burst] = []
    fwd_end = (P + m) * delta
    for j in range(m):
        if r.s + 1 < P:
            tx.append(((r.s + j) * delta, dur, act, REPLICA))
            rx.append((fwd_end + (P - 2 - r.s + j) * delta, dur, act, REPLICA))
        if r.s > 0:
            rx.append(((r.s - 1 + j) * delta, dur, act, REPLICA))
            tx.append((fwd_end + (P - 1 - r.s + j) * delta, dur, act, REPLICA))
        if job.ep > 1:  # all-to-all around the expert layers, forward and backward
            for off in ((r.s + j) * delta + dur, fwd_end + (P - 1 - r.s + j) * delta + dur):
                tx.append((off, dur * 0.5, act / 2, EXPERTS))
                rx.append((off, dur * 0.5, act / 2, EXPERTS))
    if job.dp > 1:
        start = fwd_end + (P - r.s + m) * delta
        grad = 40e6 * 2 * (job.dp - 1) / job.dp
        tx.append((start, delta * 1.5, grad, NO_JITTER))
        rx.append((start, delta * 1.5, grad, NO_JITTER))
    return tx, rx


def _cumulative(bursts: list[Burst], starts: np.ndarray, jitter: np.ndarray,
                expert_jitter: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Bytes sent by each sample time: piecewise-linear through all bursts."""
    if not bursts:
        return np.zeros_like(times)
    off = np.array([b[0] for b in bursts])
    dur = np.array([b[1] for b in bursts])
    size = np.array([b[2] for b in bursts])
    kind = np.array([b[3] for b in bursts])[None, :]
    shift = np.where(kind == REPLICA, jitter[:, None],
                     np.where(kind == EXPERTS, expert_jitter[:, None], 0.0))
    begin = starts[:, None] + off[None, :] + shift
    begin = begin.ravel()
    end = begin + np.tile(dur, len(starts))
    sizes = np.tile(size, len(starts))
    order = np.argsort(begin)
    begin, end, sizes = begin[order], end[order], sizes[order]
    xs = np.concatenate([begin, end])
    ys_delta = np.concatenate([np.zeros_like(begin), sizes])
    o = np.argsort(xs, kind="stable")
    xs = xs[o]
    # Cumulative bytes at each breakpoint: linear ramps between begin and end.
    cum_at_end = np.cumsum(ys_delta[o])
    ramp = np.interp(times, xs, cum_at_end)
    return np.asarray(ramp)


def simulate(jobs: list[JobShape], noise: Noise | None = None, seed: int = 0,
             t0: float = 1_733_989_000.0) -> tuple[dict[str, Any], pa.Table, dict[str, Truth]]:
    """Topology document, throughput table (contract section 2), and truth."""
    nz = noise or Noise()
    rng = np.random.default_rng(seed)
    containers: list[dict[str, Any]] = []
    truths: dict[str, Truth] = {}
    all_ranks: list[tuple[JobShape, _Rank]] = []
    host0 = 0
    for job in jobs:
        ranks, conts, hosts = _place(job, host0)
        host0 += hosts
        containers += conts
        truths[job.name] = _truth(job, ranks)
        all_ranks += [(job, r) for r in ranks]
    n_hosts = host0
    npr = max(j.nics_per_host for j in jobs)
    topo = {"version": 1,
            "switches": [{"id": f"tor-r{r}", "tier": "tor", "rail": r} for r in range(npr)]
            + [{"id": "spine-0", "tier": "spine"}],
            "hosts": [{"id": f"h{h:05d}", "nics": [{"id": f"h{h:05d}/rnic{r}", "rail": r}
                                                  for r in range(npr)]} for h in range(n_hosts)],
            "links": [{"a": f"h{h:05d}/rnic{r}", "b": f"tor-r{r}"}
                      for h in range(n_hosts) for r in range(npr)]
            + [{"a": f"tor-r{r}", "b": "spine-0"} for r in range(npr)],
            "containers": containers}

    times = np.arange(0.0, nz.duration_s, nz.interval_s)
    clock = rng.uniform(-nz.clock_offset_s, nz.clock_offset_s, n_hosts)
    cols: dict[str, list[Any]] = {"ts": [], "endpoint": [], "tx_bytes": [], "rx_bytes": []}
    reset_idx = set(rng.choice(len(all_ranks), size=min(nz.resets, len(all_ranks)),
                               replace=False).tolist())
    iter_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i, (job, r) in enumerate(all_ranks):
        if job.name not in iter_cache:
            n_iter = int(nz.duration_s / job.period_s) + 2
            starts = np.arange(-1, n_iter - 1) * job.period_s + rng.uniform(0, job.period_s)
            jit = rng.normal(0, nz.replica_jitter_s, (job.dp, len(starts)))
            iter_cache[job.name] = (starts, jit)
        starts, jit = iter_cache[job.name]
        if job.periodic:
            tx_b, rx_b = _bursts(job, r)
            e0 = r.d // job.ep * job.ep
            ej = jit[e0:e0 + job.ep].mean(axis=0)
            tx = _cumulative(tx_b, starts, jit[r.d], ej, times)
            rx = _cumulative(rx_b, starts, jit[r.d], ej, times)
        else:  # bring-up: irregular bursts of random size
            k = rng.poisson(nz.duration_s / 3)
            b = [(float(x), 0.05, float(rng.uniform(1e6, 3e7)), NO_JITTER)
                 for x in rng.uniform(0, nz.duration_s, k)]
            tx = _cumulative(b, np.zeros(1), np.zeros(1), np.zeros(1), times)
            rx = _cumulative(b, np.zeros(1), np.zeros(1), np.zeros(1), times)
        bg = np.cumsum(rng.exponential(nz.background_bps * nz.interval_s, (2, len(times))), axis=1)
        tx, rx = tx + bg[0], rx + bg[1]
        if i in reset_idx:  # agent or VF restart: the counter starts again from zero
            cut = int(rng.integers(len(times) // 4, 3 * len(times) // 4))
            tx[cut:] -= tx[cut - 1]
            rx[cut:] -= rx[cut - 1]
        keep = rng.random(len(times)) >= nz.missing
        cols["ts"].append(t0 + times[keep] + clock[r.host])
        cols["endpoint"] += [r.endpoint] * int(keep.sum())
        cols["tx_bytes"].append(tx[keep].astype(np.int64))
        cols["rx_bytes"].append(rx[keep].astype(np.int64))
    ts = np.concatenate(cols["ts"])
    ep = np.asarray(cols["endpoint"], dtype=object)
    tx_all = np.concatenate(cols["tx_bytes"])
    rx_all = np.concatenate(cols["rx_bytes"])
    o = rng.permutation(len(ts)) if nz.shuffle else np.argsort(ts, kind="stable")
    ts, ep, tx_all, rx_all = ts[o], ep[o], tx_all[o], rx_all[o]
    table = pa.table({"ts": pa.array(ts, pa.float64()), "endpoint": pa.array(ep.tolist(), pa.string()),
                      "tx_bytes": pa.array(tx_all, pa.int64()),
                      "rx_bytes": pa.array(rx_all, pa.int64())})
    return topo, table, truths
