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
- link / switch faults: any of the above on the probes whose flow's path
  crosses `link` or `switch`. Each pair spreads its probes over `flows`
  flows (round robin, each flow through every size), each hashed onto its
  own ECMP path, as real probes with several UDP source ports do; a flow's
  path is written to the `route` column only when that flow was traced
  (`traced_share` of them), and its index to `flow` (contract section 3)
- blackhole / loop / nic_offload: overlay faults (see `break_overlay`); the
  pairs whose round trip uses the broken rule lose every probe
- agent_crash: `endpoint`'s agent neither probes nor answers

Benign noise besides: rare single-probe spikes and, `benign_per_hour`
times an hour, congestion of one random switch for 3-19 s (+20-60 us to the
probes crossing it), which is never a fault (listed in `ProbeTruth.benign`).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

FAULT_KINDS = ("spike", "congestion", "step", "loss", "large_drop", "drift", "blackhole", "loop",
               "nic_offload", "agent_crash")
OVERLAY_KINDS = ("blackhole", "loop", "nic_offload")


@dataclass(frozen=True)
class ProbeFault:
    kind: str
    start: float               # seconds from the recording's start
    duration: float = float("inf")
    magnitude: float = 0.0
    hosts: tuple[str, ...] = ()  # pairs touching these hosts' NICs are affected
    link: str = ""               # ... or pairs whose route crosses this link
    switch: str = ""             # ... or this switch
    rule_host: str = ""          # overlay faults: the host whose rule breaks
    rule_dst: str = ""           # ... for this overlay destination ip
    loop_host: str = ""          # loop: the host the broken rule tunnels back to
    nic: str = ""                # nic_offload: the NIC whose offloaded rule is wrong
    endpoint: str = ""           # agent_crash


@dataclass(frozen=True)
class ProbeNoise:
    rate_hz: float = 10.0
    sizes: tuple[int, ...] = (64, 1024, 4096)
    rtt_sigma: float = 0.05
    tail: float = 0.002          # fraction of probes with an extra exponential delay
    healthy_loss: float = 0.00005   # RDMA fabrics are all but lossless
    spikes_per_pair_hour: float = 60.0
    flows: int = 4                  # flows per pair, each on its own ECMP path
    traced_share: float = 0.6       # share of flows whose route is known
    benign_per_hour: float = 6.0    # short congestion episodes on a random switch


@dataclass
class ProbeTruth:
    pairs: list[tuple[str, str]] = field(default_factory=list)
    affected: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # fault index -> pairs
    benign: list[dict[str, Any]] = field(default_factory=list)  # congestion episodes, not faults


def with_overlay(doc: dict[str, Any], hosts: set[str] | None = None) -> dict[str, Any]:
    """The topology with a healthy overlay: on every host (or those given),
    per endpoint of the cluster, deliver if local else tunnel to its NIC;
    every NIC offloads all of its host's rules."""
    out = copy.deepcopy(doc)
    nic_host = {n["id"]: h["id"] for h in out["hosts"] for n in h["nics"]}
    eps = [e for c in out["containers"] for e in c["endpoints"]]
    vs = {}
    for h in out["hosts"]:
        if hosts is not None and h["id"] not in hosts:
            continue
        rules = [{"vni": e["vni"], "dst": e["ip"], "action": "deliver", "to": e["id"]}
                 if nic_host[e["nic"]] == h["id"] else
                 {"vni": e["vni"], "dst": e["ip"], "action": "tunnel", "to": e["nic"]} for e in eps]
        vs[h["id"]] = {"rules": rules,
                       "offloaded": {n["id"]: copy.deepcopy(rules) for n in h["nics"]}}
    out["vswitch"] = vs
    return out


def break_overlay(doc: dict[str, Any], faults: list[ProbeFault]) -> dict[str, Any]:
    """The snapshot as it reads during the faults: a blackhole deletes
    rule_host's rule for rule_dst (from the switch and its NICs); a loop points
    it at loop_host, whose rule points back; nic_offload corrupts one NIC's
    offloaded copy (tunnels to the wrong NIC)."""
    out = copy.deepcopy(doc)
    nic_host = {n["id"]: h["id"] for h in out["hosts"] for n in h["nics"]}
    first_nic = {h["id"]: h["nics"][0]["id"] for h in out["hosts"]}
    for f in faults:
        if f.kind not in OVERLAY_KINDS:
            continue
        vs = out["vswitch"]
        if f.kind == "blackhole":
            host = vs[f.rule_host]
            host["rules"] = [r for r in host["rules"] if r["dst"] != f.rule_dst]
            for nic in host["offloaded"]:
                host["offloaded"][nic] = [r for r in host["offloaded"][nic] if r["dst"] != f.rule_dst]
        elif f.kind == "loop":
            for a, b in ((f.rule_host, f.loop_host), (f.loop_host, f.rule_host)):
                for table in (vs[a]["rules"], *vs[a]["offloaded"].values()):
                    for r in table:
                        if r["dst"] == f.rule_dst:
                            r.update(action="tunnel", to=first_nic[b])
        else:
            host = vs[nic_host[f.nic]]
            wrong = next(n for n in first_nic.values() if nic_host[n] != nic_host[f.nic])
            for r in host["offloaded"][f.nic]:
                if r["dst"] == f.rule_dst:
                    r.update(action="tunnel", to=wrong if r["to"] != wrong else f.nic)
    return out


def _routes(doc: dict[str, Any], pairs: list[tuple[str, str, str, str]],
            nic_of: dict[str, str], flow: int = 0) -> list[list[str]]:
    """One shortest switch path per pair for one flow index, ECMP choices by
    a stable hash of the pair and the flow."""
    nb: dict[str, set[str]] = {}
    for link in doc["links"]:
        nb.setdefault(link["a"], set()).add(link["b"])
        nb.setdefault(link["b"], set()).add(link["a"])
    switches = {sw["id"] for sw in doc["switches"]}
    dist_cache: dict[str, dict[str, int]] = {}

    def dist(target: str) -> dict[str, int]:
        if target not in dist_cache:
            d, todo = {target: 0}, [target]
            while todo:
                nxt = []
                for u in todo:
                    if u != target and u not in switches:
                        continue
                    for v in nb.get(u, ()):
                        if v not in d:
                            d[v] = d[u] + 1
                            nxt.append(v)
                todo = nxt
            dist_cache[target] = d
        return dist_cache[target]
    out = []
    for a, b, _ha, _hb in pairs:
        na, nb_ = nic_of[a], nic_of[b]
        d = dist(nb_)
        path, u = [], na
        while True:
            steps = sorted(v for v in nb.get(u, ()) if d.get(v, -9) == d[u] - 1
                           and (v in switches or v == nb_))
            if not steps or steps[0] == nb_ or nb_ in steps:
                break
            key = f"{a}|{b}|{u}" if flow == 0 else f"{a}|{b}|{flow}|{u}"
            pick = int(hashlib.blake2b(key.encode(), digest_size=4).hexdigest(), 16)
            u = steps[pick % len(steps)]
            path.append(u)
        out.append(path)
    return out


def _hits(f: ProbeFault, a: str, b: str, ha: str, hb: str, route: list[str],
          links: set[str], ep: dict[str, dict[str, Any]], nic_host: dict[str, str]) -> bool:
    """Does fault f touch the probe round trip between endpoints a and b?"""
    if f.kind == "agent_crash":
        return f.endpoint in (a, b)
    if f.kind == "blackhole":
        return bool((ha == f.rule_host and ep[b]["ip"] == f.rule_dst)
                    or (hb == f.rule_host and ep[a]["ip"] == f.rule_dst))
    if f.kind == "loop":
        return bool((ep[b]["ip"] == f.rule_dst and ha in (f.rule_host, f.loop_host))
                    or (ep[a]["ip"] == f.rule_dst and hb in (f.rule_host, f.loop_host)))
    if f.kind == "nic_offload":
        return bool((ep[a]["nic"] == f.nic and ep[b]["ip"] == f.rule_dst)
                    or (ep[b]["nic"] == f.nic and ep[a]["ip"] == f.rule_dst))
    if f.link:
        return f.link in links
    if f.switch:
        return f.switch in route
    return (ha in f.hosts or hb in f.hosts) if f.hosts else True


def simulate_probes(topo_doc: dict[str, Any], duration_s: float, faults: list[ProbeFault],
                    noise: ProbeNoise | None = None, seed: int = 0,
                    t0: float = 1_733_988_600.0) -> tuple[pa.Table, ProbeTruth]:
    """Probe records for every same-rail cross-host endpoint pair of the topology."""
    nz = noise or ProbeNoise()
    rng = np.random.default_rng(seed)
    nic_host: dict[str, str] = {}
    nic_rail: dict[str, int] = {}
    for h in topo_doc["hosts"]:
        for n in h["nics"]:
            nic_host[n["id"]], nic_rail[n["id"]] = h["id"], n["rail"]
    ep = {e["id"]: e for c in topo_doc["containers"] for e in c["endpoints"]}
    eps = [(e["id"], nic_host[e["nic"]], nic_rail[e["nic"]]) for e in ep.values()]
    pairs = [(a[0], b[0], a[1], b[1]) for i, a in enumerate(eps) for b in eps[i + 1:]
             if a[2] == b[2] and a[1] != b[1]]
    nic_of = {e: ep[e]["nic"] for e in ep}
    nflows = max(1, nz.flows)
    # routes[flow][pair]: the switch path of that flow of that pair.
    routes = [_routes(topo_doc, pairs, nic_of, flow) for flow in range(nflows)]
    truth = ProbeTruth(pairs=[(p[0], p[1]) for p in pairs])
    route_links = []
    for flow_routes in routes:
        links_of = []
        for (a, b, _ha, _hb), r in zip(pairs, flow_routes, strict=True):
            hops = [nic_of[a], *r, nic_of[b]]
            links_of.append({"~".join(sorted((u, v))) for u, v in zip(hops, hops[1:], strict=False)})
        route_links.append(links_of)
    hits = []  # hits[k][flow][pair]
    for k, f in enumerate(faults):
        if f.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind '{f.kind}'")
        hit = [[_hits(f, a, b, ha, hb, r, lk, ep, nic_host)
                for (a, b, ha, hb), r, lk in zip(pairs, routes[fl], route_links[fl], strict=True)]
               for fl in range(nflows)]
        hits.append(hit)
        truth.affected[k] = [(p[0], p[1]) for i, p in enumerate(pairs)
                             if any(hit[fl][i] for fl in range(nflows))]
    switches = [sw["id"] for sw in topo_doc["switches"]]
    for _ in range(rng.poisson(nz.benign_per_hour * duration_s / 3600) if switches else 0):
        start = float(rng.uniform(0, duration_s))
        truth.benign.append({"kind": "congestion", "switch": switches[rng.integers(len(switches))],
                             "start": t0 + start, "end": t0 + start + float(rng.uniform(3, 19)),
                             "extra_us": float(rng.uniform(20, 60))})
    n_per = int(duration_s * nz.rate_hz)
    base_t = np.arange(n_per) / nz.rate_hz
    sizes = np.resize(np.asarray(nz.sizes, dtype=np.int64), n_per)
    # Each flow through every size, as the agent sends them (probe_agent/
    # udp.py) and as the development set's routes show (a route's probes in
    # 2-4 size rows a window): a flow tied to one size is the only flow of
    # its size row, and its route can never be slower than its row.
    flow_of = (np.arange(n_per) // max(1, len(nz.sizes))) % nflows
    traced = rng.random((len(pairs), nflows)) < nz.traced_share
    cols: dict[str, list[np.ndarray]] = {"ts": [], "rtt": [], "size": [], "pair": [], "keep": [],
                                         "flow": []}
    for pi in range(len(pairs)):
        t = base_t + rng.uniform(0, 1.0 / nz.rate_hz) + rng.normal(0, 0.01 / nz.rate_hz, n_per)
        rtt = rng.uniform(70, 130) * rng.lognormal(0, nz.rtt_sigma, n_per) + sizes * 0.004
        tail = rng.random(n_per) < nz.tail
        rtt[tail] += rng.exponential(200, int(tail.sum()))
        lost = rng.random(n_per) < nz.healthy_loss
        keep = np.ones(n_per, dtype=bool)
        for ep_ in truth.benign:
            crossed = np.array([ep_["switch"] in routes[fl][pi] for fl in range(nflows)])
            on = crossed[flow_of] & (t0 + t >= ep_["start"]) & (t0 + t < ep_["end"])
            rtt[on] += ep_["extra_us"]
        for f, hit in zip(faults, hits, strict=True):
            by_flow = np.array([hit[fl][pi] for fl in range(nflows)])
            if f.kind != "spike" and not by_flow.any():
                continue
            on = (t >= f.start) & (t < f.start + f.duration)
            if f.kind != "spike":
                on &= by_flow[flow_of]
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
            elif f.kind == "agent_crash":  # the crashed end neither probes nor answers
                if pairs[pi][0] == f.endpoint:
                    keep &= ~on
                lost |= on
            else:  # overlay faults: nothing gets through
                lost |= on
        rtt[lost] = np.nan
        cols["ts"].append(t0 + t)
        cols["rtt"].append(rtt)
        cols["size"].append(sizes)
        cols["pair"].append(np.full(n_per, pi, dtype=np.int64))
        cols["keep"].append(keep)
        cols["flow"].append(flow_of)
    keep_all = np.concatenate(cols["keep"])
    pair = np.concatenate(cols["pair"])[keep_all]
    ts = np.concatenate(cols["ts"])[keep_all]
    order = np.argsort(ts, kind="stable")
    names_a = np.array([p[0] for p in pairs], dtype=object)
    names_b = np.array([p[1] for p in pairs], dtype=object)
    # route_str[pair, flow]: the flow's path when it was traced, else null.
    route_str = np.array([[">".join(routes[fl][pi]) if traced[pi, fl] else None
                           for fl in range(nflows)] for pi in range(len(pairs))], dtype=object)
    flow_all = np.concatenate(cols["flow"])[keep_all][order]
    rtt_all = np.concatenate(cols["rtt"])[keep_all][order]
    table = pa.table({
        "ts": pa.array(ts[order], pa.float64()),
        "src": pa.array(names_a[pair[order]].tolist(), pa.string()),
        "dst": pa.array(names_b[pair[order]].tolist(), pa.string()),
        "size": pa.array(np.concatenate(cols["size"])[keep_all][order].astype(np.int32), pa.int32()),
        "rtt_us": pa.array(rtt_all, pa.float64(), mask=np.isnan(rtt_all)),
        "proto": pa.array(["udp"] * len(ts), pa.string()),
        "route": pa.array(route_str[pair[order], flow_all].tolist(), pa.string()),
        "flow": pa.array(flow_all.astype(np.int32), pa.int32()),
    })
    return table, truth
