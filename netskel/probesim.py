"""Probe recordings (contract section 3) of a healthy cluster with chosen
faults, so detection is tested and benchmarked without a live cluster.

Every pair is probed from one side at `rate_hz`, cycling through the size
classes. A healthy RTT is the pair's own base (70-130 us) times log-normal
noise, plus serialisation per byte, plus a rare heavy tail. Faults act on the
pairs whose endpoints sit on the given hosts, from `start` for `duration`:

- spike: single probes 5 ms slow, anywhere (not a fault)
- congestion: +300 us queueing for `duration` (< 20 s: not a fault)
- step: +`magnitude` us for good
- loss: each probe lost with probability `magnitude`
- large_drop: probes above 1 KB lost
- drift: RTT grows linearly to (1 + `magnitude`) over `duration`, then stays
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

FAULT_KINDS = ("spike", "congestion", "step", "loss", "large_drop", "drift")


@dataclass(frozen=True)
class ProbeFault:
    kind: str
    start: float               # seconds from the recording's start
    duration: float = float("inf")
    magnitude: float = 0.0
    hosts: tuple[str, ...] = ()  # pairs touching these hosts' NICs are affected


@dataclass(frozen=True)
class ProbeNoise:
    rate_hz: float = 10.0
    sizes: tuple[int, ...] = (64, 1024, 4096)
    rtt_sigma: float = 0.05
    tail: float = 0.002          # fraction of probes with an extra exponential delay
    healthy_loss: float = 0.00005   # RDMA fabrics are all but lossless
    spikes_per_pair_hour: float = 60.0


@dataclass
class ProbeTruth:
    pairs: list[tuple[str, str]] = field(default_factory=list)
    affected: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # fault index -> pairs


def simulate_probes(topo_doc: dict[str, object], duration_s: float, faults: list[ProbeFault],
                    noise: ProbeNoise | None = None, seed: int = 0,
                    t0: float = 1_733_988_600.0) -> tuple[pa.Table, ProbeTruth]:
    """Probe records for every same-rail cross-host endpoint pair of the topology."""
    nz = noise or ProbeNoise()
    rng = np.random.default_rng(seed)
    nic_host: dict[str, tuple[str, int]] = {}
    for h in topo_doc["hosts"]:  # type: ignore[attr-defined]
        for n in h["nics"]:
            nic_host[n["id"]] = (h["id"], n["rail"])
    eps = [(e["id"], *nic_host[e["nic"]]) for c in topo_doc["containers"]  # type: ignore[attr-defined]
           for e in c["endpoints"]]
    pairs = [(a[0], b[0], a[1], b[1]) for i, a in enumerate(eps) for b in eps[i + 1:]
             if a[2] == b[2] and a[1] != b[1]]
    truth = ProbeTruth(pairs=[(p[0], p[1]) for p in pairs])
    for k, f in enumerate(faults):
        if f.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind '{f.kind}'")
        truth.affected[k] = [(p[0], p[1]) for p in pairs if p[2] in f.hosts or p[3] in f.hosts]
    n_per = int(duration_s * nz.rate_hz)
    base_t = np.arange(n_per) / nz.rate_hz
    sizes = np.resize(np.asarray(nz.sizes, dtype=np.int64), n_per)
    cols: dict[str, list[np.ndarray]] = {"ts": [], "rtt": [], "size": [], "pair": []}
    for pi, (_a, _b, ha, hb) in enumerate(pairs):
        t = base_t + rng.uniform(0, 1.0 / nz.rate_hz) + rng.normal(0, 0.01 / nz.rate_hz, n_per)
        rtt = rng.uniform(70, 130) * rng.lognormal(0, nz.rtt_sigma, n_per) + sizes * 0.004
        tail = rng.random(n_per) < nz.tail
        rtt[tail] += rng.exponential(200, int(tail.sum()))
        lost = rng.random(n_per) < nz.healthy_loss
        for f in faults:
            hit = (ha in f.hosts or hb in f.hosts) if f.hosts else True
            if not hit:
                continue
            on = (t >= f.start) & (t < f.start + f.duration)
            if f.kind == "spike":
                k = rng.poisson(nz.spikes_per_pair_hour * duration_s / 3600)
                rtt[rng.integers(0, n_per, k)] += 5000.0
            elif f.kind == "congestion":
                rtt[on] += 300.0 * rng.uniform(0.5, 1.5, int(on.sum()))
            elif f.kind == "step":
                rtt[on] += f.magnitude
            elif f.kind == "loss":
                lost |= on & (rng.random(n_per) < f.magnitude)
            elif f.kind == "large_drop":
                lost |= on & (sizes > 1024)
            elif f.kind == "drift":
                frac = np.clip((t - f.start) / f.duration, 0.0, 1.0)
                rtt *= 1.0 + f.magnitude * np.where(t >= f.start, frac, 0.0)
        rtt[lost] = np.nan
        cols["ts"].append(t0 + t)
        cols["rtt"].append(rtt)
        cols["size"].append(sizes)
        cols["pair"].append(np.full(n_per, pi, dtype=np.int64))
    pair = np.concatenate(cols["pair"])
    ts = np.concatenate(cols["ts"])
    order = np.argsort(ts, kind="stable")
    names_a = np.array([p[0] for p in pairs], dtype=object)
    names_b = np.array([p[1] for p in pairs], dtype=object)
    rtt_all = np.concatenate(cols["rtt"])[order]
    table = pa.table({
        "ts": pa.array(ts[order], pa.float64()),
        "src": pa.array(names_a[pair[order]].tolist(), pa.string()),
        "dst": pa.array(names_b[pair[order]].tolist(), pa.string()),
        "size": pa.array(np.concatenate(cols["size"])[order].astype(np.int32), pa.int32()),
        "rtt_us": pa.array(rtt_all, pa.float64(), mask=np.isnan(rtt_all)),
        "proto": pa.array(["udp"] * len(ts), pa.string()),
    })
    return table, truth
