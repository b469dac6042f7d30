"""A training job's NIC traffic, as contract files, for any dp/tp/pp/ep and
rank placement — so inference is tested without a live cluster.

Ranks follow Megatron's order (tp fastest, then dp, then pp): rank =
t + TP*(d + DP*s). GPU i of a host uses NIC i (rail i). A container holds one
TP group when TP is smaller than the NICs per host, else one host.

The physics of real training (the independent dev set's README; our own
gloo job in tests/test_testbed_torch.py shows the same shape):
- each data-parallel replica runs its own 1F1B pipeline at its own pace:
  a per-iteration speed factor (stragglers, a few %) and, now and then, a
  stall of 50-500 ms; activations (tens of MB per microbatch, at line rate)
  go stage s -> s+1 forward and gradients back;
- a stage's data-parallel all-reduce starts when the slowest replica's last
  backward of that stage ends, so the last stage reduces first and stage 0
  last, one microbatch's backward apart; it is ~90 % of each NIC's bytes, a
  line-rate burst of tens to hundreds of ms, sent and received at once;
- the iteration ends with stage 0's reduction (the optimizer step), so
  iteration lengths jitter and the error accumulates (no fixed period);
- MoE adds all-to-all inside each expert group around every microbatch;
  an all-to-all waits for every member, so an expert group's replicas move
  in lockstep, at its slowest member's pace (`a2a_share`: each all-to-all's
  bytes per microbatch and direction, as a share of one activation);
- noise: background bytes, random one-way bursts of 20-600 MB, checkpoint
  writes of GBs by every endpoint at once, missing samples, counter resets,
  host clock offsets, shuffled rows."""

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
    period_s: float = 6.0
    microbatches: int = 8
    a2a_share: float = 0.5  # MoE all-to-all bytes per microbatch and direction / activation
    periodic: bool = True   # False: bring-up/debug traffic with no iteration

    def __post_init__(self) -> None:
        for n in ("dp", "tp", "pp", "ep", "nics_per_host", "microbatches"):
            if getattr(self, n) < 1:
                raise ValueError(f"{n} must be at least 1, got {getattr(self, n)}")
        if self.dp % self.ep:
            raise ValueError(f"ep {self.ep} must divide dp {self.dp} (expert groups of replicas)")
        if not self.period_s > 0 or not self.a2a_share >= 0:
            raise ValueError("period_s must be positive and a2a_share not negative")


@dataclass(frozen=True)
class Noise:
    interval_s: float = 0.05
    duration_s: float = 40.0
    clock_offset_s: float = 0.02   # per host, uniform +-
    missing: float = 0.02          # fraction of samples dropped
    resets: int = 2                # endpoints whose counter restarts mid-recording
    background_bps: float = 2e6    # bytes/s of unrelated traffic, per endpoint
    iteration_jitter: float = 0.03  # sd of the whole job's per-iteration speed
    straggle: float = 0.02         # sd of each replica's extra slowness per iteration
    stall_prob: float = 0.05       # chance a replica stalls 50-500 ms in an iteration
    oneway_per_s: float = 0.03     # random one-way bursts per endpoint per second
    checkpoint_every_s: float = 60.0  # every endpoint writes GBs one-way at once
    shuffle: bool = True           # False: rows in recording order (by time)


@dataclass
class Truth:
    """What the job really is, in the dev set's terms: dp_groups are network
    groups (one rail's share of a logical data-parallel group)."""
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
            # A network data-parallel group is the logical group's share of one rail.
            for gpu in sorted({r.gpu for r in group}):
                tr.dp_groups.append(sorted(r.endpoint for r in group if r.gpu == gpu))
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


LINE_RATE = 25e9  # bytes/s of one NIC (200 Gbit/s)


@dataclass(frozen=True)
class _Schedule:
    """One job's timeline: per iteration, the start of every replica's
    pipeline and its speed factor, and each stage's all-reduce start."""
    starts: np.ndarray  # (K,) iteration start
    pace: np.ndarray  # (dp, K) speed factor of each replica
    stall: np.ndarray  # (dp, K) seconds a replica lost before its pipeline
    reduce_at: np.ndarray  # (pp, K) all-reduce start of each stage
    unit: float  # seconds of one microbatch's forward + backward slot
    reduce_s: float  # all-reduce duration
    grad_bytes: float
    act_bytes: float


def _schedule(job: JobShape, nz: Noise, duration: float, rng: np.random.Generator) -> _Schedule:
    P, m = job.pp, job.microbatches
    # 1F1B: the pipeline is busy for (m + P - 1) slots forward and backward.
    unit = job.period_s * 0.8 / (2 * (m + P - 1))
    act = 30e6
    # The gradient all-reduce is ~9x the activation bytes a middle stage moves.
    grad = 9 * 4 * m * act if job.dp > 1 else 0.0
    reduce_s = grad / LINE_RATE
    starts, paces, stalls, reduces = [], [], [], []
    t = -rng.uniform(0, job.period_s)
    while t < duration + job.period_s:
        k_pace = 1.0 + rng.normal(0, nz.iteration_jitter)  # the whole job this iteration
        pace = k_pace * (1.0 + np.abs(rng.normal(0, nz.straggle, job.dp)))
        stall = np.where(rng.random(job.dp) < nz.stall_prob,
                         rng.uniform(0.05, 0.5, job.dp), 0.0)
        if job.ep > 1:  # an expert group's all-to-alls wait for its slowest member
            first, group = np.arange(0, job.dp, job.ep), np.arange(job.dp) // job.ep
            pace = np.maximum.reduceat(pace, first)[group]
            stall = np.maximum.reduceat(stall, first)[group]
        # Stage s's last backward ends after (m + P - 1 - s) ... slots; its
        # all-reduce waits for the slowest replica.
        ends = np.array([np.max(stall + pace * unit * (2 * (m + P - 1) - s)) for s in range(P)])
        starts.append(t)
        paces.append(pace)
        stalls.append(stall)
        reduces.append(t + ends)
        t = t + float(ends[0]) + reduce_s + 0.05 * job.period_s
    return _Schedule(np.array(starts), np.array(paces).T, np.array(stalls).T,
                     np.array(reduces).T, unit, reduce_s, grad, act)


def _rank_bursts(job: JobShape, r: _Rank, sch: _Schedule, ep_shift: np.ndarray
                 ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """(begin, duration, bytes) arrays of this rank's tx and rx bursts."""
    P, m = job.pp, job.microbatches
    u = sch.unit
    base = sch.starts + sch.stall[r.d]
    pace = sch.pace[r.d]
    act_s = sch.act_bytes / LINE_RATE
    tx: list[tuple[np.ndarray, float, float]] = []
    rx: list[tuple[np.ndarray, float, float]] = []

    def at(slot: np.ndarray) -> np.ndarray:
        return np.asarray(base[:, None] + pace[:, None] * u * slot[None, :])
    j = np.arange(m, dtype=np.float64)
    fwd_send = at(r.s + j + 1)  # forward of microbatch j leaves stage s
    bwd_send = at(2 * (m + P - 1) - (r.s + m - j) + 1 - 1e-3)
    if r.s + 1 < P:
        tx.append((fwd_send, act_s, sch.act_bytes))
        rx.append((at(2 * (m + P - 1) - (r.s + 1 + m - j) + 1 - 1e-3), act_s, sch.act_bytes))
    if r.s > 0:
        rx.append((at(r.s + j), act_s, sch.act_bytes))
        tx.append((bwd_send, act_s, sch.act_bytes))
    if job.ep > 1:  # all-to-all around the expert layers, a collective of the group
        for when in (fwd_send, bwd_send):
            a2a_s = 2 * job.a2a_share * act_s
            w = when + ep_shift[:, None] - a2a_s
            tx.append((w, a2a_s, sch.act_bytes * job.a2a_share))
            rx.append((w, a2a_s, sch.act_bytes * job.a2a_share))
    if job.dp > 1:
        tx.append((sch.reduce_at[r.s][:, None], sch.reduce_s, sch.grad_bytes))
        rx.append((sch.reduce_at[r.s][:, None], sch.reduce_s, sch.grad_bytes))

    def flat(parts: list[tuple[np.ndarray, float, float]]) -> tuple[np.ndarray, ...]:
        if not parts:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        b = np.concatenate([p[0].ravel() for p in parts])
        d = np.concatenate([np.full(p[0].size, p[1]) for p in parts])
        z = np.concatenate([np.full(p[0].size, p[2]) for p in parts])
        return b, d, z
    return flat(tx), flat(rx)


def _cumulative(begin: np.ndarray, dur: np.ndarray, size: np.ndarray,
                times: np.ndarray) -> np.ndarray:
    """Bytes moved by each sample time: linear ramps through every burst."""
    if len(begin) == 0:
        return np.zeros_like(times)
    xs = np.concatenate([begin, begin + dur])
    inc = np.concatenate([np.zeros_like(size), size])
    o = np.argsort(xs, kind="stable")
    # Between a burst's begin and end the bytes ramp up; np.interp over the
    # sorted breakpoints, with begins counted at the level before them.
    level = np.cumsum(inc[o])
    lo = np.concatenate([[0.0], level[:-1]])
    # Begin points sit at the previous level, end points at the new one.
    y = np.where(np.concatenate([np.ones(len(begin), bool), np.zeros(len(begin), bool)])[o],
                 lo, level)
    return np.asarray(np.interp(times, xs[o], y, left=0.0))


def _noise_bursts(nz: Noise, duration: float, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random one-way bursts (20-600 MB) of one endpoint, one direction."""
    k = rng.poisson(duration * nz.oneway_per_s)
    size = rng.uniform(20e6, 600e6, k)
    return rng.uniform(0, duration, k), size / (LINE_RATE * 0.2), size


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
    schedules = {job.name: _schedule(job, nz, nz.duration_s, rng) for job in jobs}
    ep_shift = {job.name: rng.normal(0, 0.003, (max(1, job.dp // max(job.ep, 1)),
                                                 len(schedules[job.name].starts)))
                for job in jobs}
    ckpt = np.arange(rng.uniform(5, nz.checkpoint_every_s), nz.duration_s, nz.checkpoint_every_s)
    for i, (job, r) in enumerate(all_ranks):
        if job.periodic:
            (tb, td, tz), (rb, rd, rz) = _rank_bursts(
                job, r, schedules[job.name], ep_shift[job.name][r.d // max(job.ep, 1)])
        else:  # bring-up: irregular symmetric bursts of random size
            k = rng.poisson(nz.duration_s / 3)
            tb = rb = rng.uniform(0, nz.duration_s, k)
            tz = rz = rng.uniform(1e6, 3e8, k)
            td = rd = tz / LINE_RATE
        ob, od, oz = _noise_bursts(nz, nz.duration_s, rng)
        way = rng.random(len(ob)) < 0.5
        cb = ckpt + rng.uniform(0, 0.2, len(ckpt))
        tx = _cumulative(np.r_[tb, ob[way], cb], np.r_[td, od[way], np.full(len(cb), 1.0)],
                         np.r_[tz, oz[way], np.full(len(cb), 2e9)], times)
        rx = _cumulative(np.r_[rb, ob[~way]], np.r_[rd, od[~way]], np.r_[rz, oz[~way]], times)
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
