"""Fault kinds the development set does not hold, injected into its clean
recording: exploration, not evidence (our injection over their background;
the held-out set has its own). Each kind edits `rtt_us` of the clean
recording's probes in one window and writes the dev-set layout with a
`truth.json` naming the injected component, so `bench/accuracy.py` scores
it and `bench/variants.py` makes its harder copies.

    python bench/inject.py OUT [--kinds bigdrop,flap,...] [--clean DIR] [--place N]
    python bench/accuracy.py OUT --only faults

`--place N` draws the placement below at random (seed N): many seeds test
the fabric's other spots, which one fixed placement does not.

Kinds (endpoint jobA-w003/rnic5, its NIC-ToR link, ToR tor-r5-1, spine-3 unless
--endpoint/--tor/--spine say otherwise;
400 s from 400 s into the recording unless --start/--length say otherwise):
  bigdrop    probes of 1 KB and more to and from the endpoint lost
  nicslow    +80 us on the endpoint's probes
  flap       the endpoint's link: 5 s of total loss every minute
  drift      the endpoint's link: latency creeping from +0 to +30 us over the window
  smallstep  the endpoint's link: +8 us (under what a 30 s window may call slow: only
             the 30-min test can see it, so it needs recordings over an hour long)
  tordown    every probe through the ToR lost
  torloss    3 % of probes through the ToR lost
  spinedown  every probe through the spine lost
  spinelat   +60 us on probes through the spine
  linkloss   the endpoint's link: 1 % of its probes lost
  uplinkloss the link between the ToR and the spine: 2 % of probes through it lost
  uplinklat  the same link: +60 us on probes through it (with two ToRs on the
             rail, the other ToR's link to the spine is accepted too: every
             path through one crosses the other)
  hostslow   the endpoint's host: +80 us on probes to and from all its endpoints
  hostloss   the same host: 2 % of those probes lost
  agentdown  the endpoint's container: its agents stop (its endpoints send no
             probes, probes to them are lost), for good
  busy       no fault: benign congestion every minute on average (a random ToR
             or spine, 3-19 s, +20-60 us on probes through it; the dev set's
             clean recording has one every ~3 minutes), so every incident is
             false (--busy-per-hour; --start/--length do not apply)
  overlayloop the endpoint's host's virtual-switch rule for its first partner
             tunnels to a third host, whose rule tunnels back (the topology's
             snapshot shows both, offloaded copies included): the round
             trips through either rule are lost
  blackhole  the endpoint's host's rule for its first partner drops (offloaded
             copies too): the round trips through it are lost
  nicoffload the endpoint's NIC's hardware holds a third of its host's rules,
             two of them wrong (the topology's snapshot shows it), and the
             probes its host sends by a rule the NIC lacks or holds wrong take
             the slow path: +95-110 us, 0.05 % lost (as the dev set's NIC fault)
Faults already in --clean's truth stay: inject into an injected recording
to overlap two faults (the dev set overlaps a blackhole and a link's loss).
A probe without a traced route crosses the spine one time in as many
spines (ECMP), drawn at random: which flows really did is not in the data.
Prints one JSON line naming what it made.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from netskel.topology import link_id  # noqa: E402

CLEAN = ROOT.parent / "shared/data/dev/faults/dev-fa1_clean_busy"
KINDS = ("bigdrop", "nicslow", "flap", "drift", "smallstep", "tordown", "torloss", "spinedown", "spinelat",
         "linkloss", "uplinkloss", "uplinklat", "hostslow", "hostloss",
         "agentdown", "overlayloop", "blackhole", "nicoffload")
ENDPOINT, TOR, SPINE = "jobA-w003/rnic5", "tor-r5-1", "spine-3"
START_S, LENGTH_S = 400.0, 400.0
BUSY_PER_HOUR = 60.0


def _neighbours(topo: dict[str, Any], node: str) -> set[str]:
    return ({ln["a"] for ln in topo["links"] if ln["b"] == node}
            | {ln["b"] for ln in topo["links"] if ln["a"] == node})


def _first_partner(topo: dict[str, Any], endpoint: str, src: np.ndarray, dst: np.ndarray
                   ) -> tuple[dict[str, tuple[str, dict[str, Any]]], str, str]:
    """(endpoint -> its host and entry, the endpoint's host, the first
    partner it probes on another host)."""
    where = {e["id"]: (c["host"], e) for c in topo["containers"] for e in c["endpoints"]}
    host_a = where[endpoint][0]
    partner = next(d for a, d in zip(src, dst, strict=True)
                   if a == endpoint and where[d][0] != host_a)
    return where, host_a, partner


def _set_rule(topo: dict[str, Any], host: str, rule: dict[str, Any]) -> None:
    """The host's rule for (vni, dst) replaced by `rule`, in its switch and
    in every offloaded copy (the hardware agrees: no NIC is to blame)."""
    vs = topo.setdefault("vswitch", {}).setdefault(host, {"rules": []})

    def same(r: dict[str, Any]) -> bool:
        return bool(r["vni"] == rule["vni"] and r["dst"] == rule["dst"])

    vs["rules"] = [r for r in vs["rules"] if not same(r)] + [rule]
    for nic, rules in vs.get("offloaded", {}).items():
        vs["offloaded"][nic] = [r for r in rules if not same(r)] + [dict(rule)]


def _through(where: dict[str, tuple[str, dict[str, Any]]], hosts: tuple[str, ...], vni: Any,
             partner: str, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Probes whose round trip takes those hosts' rule for the partner: their
    endpoints of that network to the partner, and the partner's to them
    (the reply)."""
    on = [e for e, (h, doc) in where.items() if h in hosts and doc.get("vni") == vni]
    return np.asarray((np.isin(src, on) & (dst == partner)) | ((src == partner) & np.isin(dst, on)))


def _loop(topo: dict[str, Any], endpoint: str, src: np.ndarray, dst: np.ndarray
          ) -> tuple[dict[str, str], list[dict[str, str]], str, np.ndarray]:
    """Rewrite the snapshot's rules into a two-host loop for one destination;
    which probes' round trips cross either rule."""
    where, host_a, partner = _first_partner(topo, endpoint, src, dst)
    mine = where[endpoint][1]
    x, vni = where[partner][1]["ip"], where[partner][1]["vni"]
    rail = next(n["rail"] for h in topo["hosts"] for n in h["nics"] if n["id"] == mine["nic"])
    host_c, nic_c = next((h["id"], n["id"]) for h in topo["hosts"] for n in h["nics"]
                         if h["id"] not in (host_a, where[partner][0]) and n["rail"] == rail)
    _set_rule(topo, host_a, {"vni": vni, "dst": x, "action": "tunnel", "to": nic_c})
    _set_rule(topo, host_c, {"vni": vni, "dst": x, "action": "tunnel", "to": mine["nic"]})
    hit = _through(where, (host_a, host_c), vni, partner, src, dst)
    return ({"type": "vswitch_rule", "id": f"{host_a}:{vni}:{x}"},
            [{"type": "vswitch_rule", "id": f"{host_c}:{vni}:{x}"}], "overlay", hit)


def _blackhole(topo: dict[str, Any], endpoint: str, src: np.ndarray, dst: np.ndarray
               ) -> tuple[dict[str, str], np.ndarray]:
    """Set the endpoint's host's rule for its first cross-host partner to
    drop; which probes' round trips take that rule."""
    where, host_a, partner = _first_partner(topo, endpoint, src, dst)
    x, vni = where[partner][1]["ip"], where[partner][1]["vni"]
    _set_rule(topo, host_a, {"vni": vni, "dst": x, "action": "drop"})
    hit = _through(where, (host_a,), vni, partner, src, dst)
    return {"type": "vswitch_rule", "id": f"{host_a}:{vni}:{x}"}, hit


def _offload_partly(topo: dict[str, Any], nic: str, src: np.ndarray, dst: np.ndarray,
                    rng: np.random.Generator) -> np.ndarray:
    """The NIC's hardware keeps a third of its host's rules, two of them
    pointing at the wrong NIC (the dev set's NIC fault: 48 of 128, 2
    differing); which probes' round trips leave through it by a rule it
    lacks or holds wrong (those take the slow path; the dev set's NIC fault
    spares a pair whose rule is offloaded)."""
    host = nic.split("/")[0]
    vs = topo.get("vswitch", {}).get(host)
    if not vs or not vs.get("rules"):
        raise SystemExit(f"nicoffload: the topology has no virtual-switch rules for {host}")
    rules = vs["rules"]
    keep = sorted(rng.choice(len(rules), size=max(3, len(rules) // 3), replace=False))
    held = [dict(rules[i]) for i in keep]
    for r in held[:2]:
        r["action"], r["to"] = "tunnel", nic
    key = {e["id"]: (e.get("vni"), e.get("ip")) for c in topo["containers"]
           for e in c["endpoints"]}
    mine = [e for c in topo["containers"] for e in c["endpoints"] if e["nic"] == nic]
    mine_ids = np.array([e["id"] for e in mine])
    partners = sorted(set(dst[np.isin(src, mine_ids)]) | set(src[np.isin(dst, mine_ids)]))
    right = {(r["vni"], r["dst"]): r for r in rules}
    if partners and all(_held_as(held, key[p]) == right.get(key[p]) for p in partners):
        gone = key[partners[0]]  # at least one of its pairs is hit
        held = [r for r in held if (r["vni"], r["dst"]) != gone]
    vs.setdefault("offloaded", {})[nic] = held
    bad = np.array([p for p in partners if _held_as(held, key[p]) != right.get(key[p])])
    return (np.isin(src, mine_ids) & np.isin(dst, bad)) | (np.isin(dst, mine_ids) & np.isin(src, bad))


def _held_as(held: list[dict[str, Any]], k: tuple[Any, Any]) -> dict[str, Any] | None:
    """The offloaded rule for (vni, dst), if the NIC holds one."""
    return next((r for r in held if (r["vni"], r["dst"]) == k), None)


def _endpoint_tor(topo: dict[str, Any]) -> dict[str, str]:
    """Each endpoint's ToR: the tor-tier neighbour of its NIC ("" if none)."""
    nic_of = {e["id"]: e["nic"] for c in topo["containers"] for e in c["endpoints"]}
    tor_of = {n: next((x for x in _neighbours(topo, n) if x.startswith("tor")), "")
              for n in set(nic_of.values())}
    return {e: tor_of[n] for e, n in nic_of.items()}


def _busy(topo: dict[str, Any], ts: np.ndarray, src: np.ndarray, dst: np.ndarray,
          hops: list[set[str]], rtt: np.ndarray, per_hour: float,
          rng: np.random.Generator) -> list[dict[str, Any]]:
    """Benign congestion episodes added to `rtt` in place, in the dev set's
    terms (truth `benign`): Poisson starts, each on one switch."""
    switches = [s["id"] for s in topo["switches"] if s.get("tier") in ("tor", "spine")]
    n_spines = sum(1 for s in topo["switches"] if s.get("tier") == "spine")
    ep_tor = _endpoint_tor(topo)
    t0, t1 = float(ts.min()), float(ts.max())
    episodes = []
    at = t0 + rng.exponential(3600.0 / per_hour)
    while at < t1 - 20.0:
        sw = str(rng.choice(switches))
        length, extra = float(rng.uniform(3, 19)), float(rng.uniform(20, 60))
        rows = np.flatnonzero((ts >= at) & (ts < at + length))
        on = []
        for i in rows:
            if hops[i]:
                on.append(sw in hops[i])
                continue
            a, b = ep_tor.get(src[i], ""), ep_tor.get(dst[i], "")
            if sw.startswith("tor"):
                on.append(sw in (a, b))
            else:  # a spine: only paths between two ToRs, one in as many spines
                on.append(a != b and rng.random() < 1 / n_spines)
        rtt[rows[np.array(on, dtype=bool)]] += extra
        episodes.append({"kind": "congestion", "switch": sw, "start": at, "end": at + length,
                         "extra_us": round(extra, 1), "injected": True})
        at += length + rng.exponential(3600.0 / per_hour)
    return episodes


def inject(kind: str, clean: Path, out: Path, seed: int = 0, start_s: float = START_S,
           length_s: float = LENGTH_S, endpoint: str = ENDPOINT, tor_id: str = TOR,
           spine_id: str = SPINE, busy_per_hour: float = BUSY_PER_HOUR) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(clean / "topology.json", out / "topology.json")
    topo = json.loads((clean / "topology.json").read_text())
    t = pq.read_table(clean / "probes.parquet")
    ts = t.column("ts").to_numpy()
    src = t.column("src").to_numpy(zero_copy_only=False)
    dst = t.column("dst").to_numpy(zero_copy_only=False)
    size = t.column("size").to_numpy()
    rtt = t.column("rtt_us").to_numpy(zero_copy_only=False).astype(np.float64)
    route = t.column("route").to_numpy(zero_copy_only=False)
    rng = np.random.default_rng(seed)
    start = float(ts.min()) + start_s
    window = (ts >= start) & (ts < start + length_s)
    nic_of = {e["id"]: e["nic"] for c in topo["containers"] for e in c["endpoints"]}
    hops = [set(r.split(">")) if r else set() for r in route]

    def through(node: str) -> np.ndarray:
        return np.array([node in h for h in hops])

    def touching(nics: set[str]) -> np.ndarray:
        return np.array([nic_of.get(a) in nics or nic_of.get(b) in nics
                         for a, b in zip(src, dst, strict=True)])

    lose = np.zeros(len(ts), dtype=bool)
    slow = 0.0
    layer = "underlay"
    accept: list[dict[str, str]] = []
    silent = np.zeros(len(ts), dtype=bool)  # rows a dead agent never sent
    end: float | None = start + length_s
    benign: list[dict[str, Any]] = []
    if kind == "busy":
        benign = _busy(topo, ts, src, dst, hops, rtt, busy_per_hour, rng)
        component, hit = {}, np.zeros(len(ts), dtype=bool)
    elif kind in ("bigdrop", "nicslow", "flap", "drift", "smallstep", "linkloss"):
        nic = nic_of[endpoint]
        tor = next(iter(_neighbours(topo, nic)))
        component = {"type": "link", "id": link_id(nic, tor)}
        hit = window & ((src == endpoint) | (dst == endpoint))
        if kind == "bigdrop":
            lose = hit & (size >= 1024)
        elif kind == "flap":
            lose = hit & (((ts - start) % 60.0) < 5.0)
        elif kind == "linkloss":
            lose = hit & (rng.random(len(ts)) < 0.01)
        elif kind == "drift":
            slow = 30.0
            rtt[hit] += slow * (ts[hit] - start) / length_s
        elif kind == "smallstep":
            rtt[hit] += 8.0
        else:
            slow = 80.0
            rtt[hit] += slow
    elif kind in ("tordown", "torloss"):
        component = {"type": "switch", "id": tor_id}
        hit = window & (touching(_neighbours(topo, tor_id)) | through(tor_id))
        lose = hit & (rng.random(len(ts)) < (1.0 if kind == "tordown" else 0.03))
    elif kind in ("spinedown", "spinelat", "uplinkloss", "uplinklat"):
        spines = [s["id"] for s in topo["switches"] if s.get("tier") == "spine"]
        ep_tor = _endpoint_tor(topo)
        tors = np.array([(ep_tor.get(a, ""), ep_tor.get(b, ""))
                         for a, b in zip(src, dst, strict=True)]).reshape(-1, 2)
        cross = tors[:, 0] != tors[:, 1]
        unrouted = np.array([not h for h in hops])
        by_chance = unrouted & cross & (rng.random(len(ts)) < 1 / len(spines))
        if kind.startswith("spine"):
            component = {"type": "switch", "id": spine_id}
            hit = window & (through(spine_id) | by_chance)
        else:  # the ToR's link to the spine: routes naming both, in either order
            component = {"type": "link", "id": link_id(tor_id, spine_id)}
            rail = next(s["rail"] for s in topo["switches"] if s["id"] == tor_id)
            others = [s["id"] for s in topo["switches"]
                      if s.get("tier") == "tor" and s.get("rail") == rail and s["id"] != tor_id]
            if len(others) == 1:
                accept = [{"type": "link", "id": link_id(others[0], spine_id)}]
            pat = (f"{tor_id}>{spine_id}", f"{spine_id}>{tor_id}")
            on = np.array([any(x in r for x in pat) if r else False for r in route])
            ends = (tors[:, 0] == tor_id) | (tors[:, 1] == tor_id)
            hit = window & (on | (by_chance & ends))
        if kind == "spinedown":
            lose = hit
        elif kind == "uplinkloss":
            lose = hit & (rng.random(len(ts)) < 0.02)
        else:
            slow = 60.0
            rtt[hit] += slow
    elif kind in ("hostslow", "hostloss"):
        host = next(c["host"] for c in topo["containers"]
                    for e in c["endpoints"] if e["id"] == endpoint)
        component, layer = {"type": "host", "id": host}, "host"
        on_host = {e["id"] for c in topo["containers"] if c["host"] == host for e in c["endpoints"]}
        hit = window & (np.isin(src, list(on_host)) | np.isin(dst, list(on_host)))
        if kind == "hostloss":
            lose = hit & (rng.random(len(ts)) < 0.02)
        else:
            slow = 80.0
            rtt[hit] += slow
    elif kind == "agentdown":
        cont = next(c for c in topo["containers"] for e in c["endpoints"] if e["id"] == endpoint)
        component, layer, end = {"type": "agent", "id": cont["id"]}, "agent", None
        mine = [e["id"] for e in cont["endpoints"]]
        accept = [{"type": "agent", "id": e} for e in mine]
        gone = ts >= start
        silent = gone & np.isin(src, mine)
        hit = gone & (np.isin(src, mine) | np.isin(dst, mine))
        lose = gone & np.isin(dst, mine) & ~silent
    elif kind == "blackhole":
        component, hit = _blackhole(topo, endpoint, src, dst)
        layer = "overlay"
        hit &= window
        lose = hit
        (out / "topology.json").write_text(json.dumps(topo))
    elif kind == "nicoffload":
        nic = nic_of[endpoint]
        component, layer = {"type": "nic", "id": nic}, "nic"
        hit = window & _offload_partly(topo, nic, src, dst, rng)
        slow = 95.0
        rtt[hit] += rng.uniform(95.0, 110.0, int(hit.sum()))
        lose = hit & (rng.random(len(ts)) < 0.0005)
        (out / "topology.json").write_text(json.dumps(topo))
    elif kind == "overlayloop":
        component, accept, layer, hit = _loop(topo, endpoint, src, dst)
        hit &= window
        lose = hit
        (out / "topology.json").write_text(json.dumps(topo))
    else:
        raise SystemExit(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    affected = hit if slow else lose
    rtt[lose] = np.nan
    col = pa.array(np.where(np.isnan(rtt), None, rtt), type=pa.float64())
    t = t.set_column(t.schema.get_field_index("rtt_us"), "rtt_us", col)
    pq.write_table(t.filter(pa.array(~silent)), out / "probes.parquet")
    pairs = sorted({tuple(sorted(p)) for p in zip(src[affected], dst[affected], strict=True)})
    truth = json.loads((clean / "truth.json").read_text())
    if kind == "busy":
        truth["benign"] = truth.get("benign", []) + benign
        (out / "truth.json").write_text(json.dumps(truth))
        return {"kind": kind, "episodes": len(benign)}
    truth["clean"] = False
    earlier = truth.get("faults") or []  # an injected --clean: the faults overlap
    symptom = ("latency" if slow else "unreachable"
               if kind in ("agentdown", "overlayloop", "blackhole") else "loss")
    truth["faults"] = earlier + [{"id": f"X{len(earlier) + 1}", "kind": kind, "start": start,
                                  "end": end, "layer": layer, "symptom": symptom,
                                  "component": component, "accept": accept, "params": {},
                                  "pairs": [list(p) for p in pairs]}]
    (out / "truth.json").write_text(json.dumps(truth))
    return {"kind": kind, "probes": int(affected.sum()), "pairs": len(pairs),
            "component": component}


# A drawn placement: faults of 5-25 min (the dev set's), 200 s from either
# end of the recording (a baseline before, an end seen after).
MIN_FAULT_S, MAX_FAULT_S, MARGIN_S = 300.0, 1500.0, 200.0


def placement(clean: Path, seed: int) -> tuple[str, str, str, float, float]:
    """Where the faults go, drawn from the clean recording's topology and
    length: the dev set's faults last 5-25 min and a fixed placement tests
    one spot of the fabric (spinedown on spine-3 passed while spine-5 made
    seven incidents)."""
    rng = np.random.default_rng(seed)
    topo = json.loads((clean / "topology.json").read_text())
    ts = pq.read_table(clean / "probes.parquet", columns=["ts"]).column("ts").to_numpy()
    span = float(ts.max() - ts.min()) if len(ts) else 0.0
    if span < MIN_FAULT_S + 2 * MARGIN_S:
        raise ValueError(f"{clean}: {span:.0f} s of probes; a placement needs at least "
                         f"{MIN_FAULT_S + 2 * MARGIN_S:.0f} s (a {MIN_FAULT_S:.0f} s fault, "
                         f"{MARGIN_S:.0f} s from either end)")
    endpoints = sorted(e["id"] for c in topo["containers"] for e in c["endpoints"])
    tors = sorted(x["id"] for x in topo["switches"] if x.get("tier") == "tor")
    spines = sorted(x["id"] for x in topo["switches"] if x.get("tier") == "spine")
    length = float(rng.uniform(MIN_FAULT_S, min(MAX_FAULT_S, span - 2 * MARGIN_S)))
    start = float(rng.uniform(MARGIN_S, span - length - MARGIN_S))
    return (str(rng.choice(endpoints)), str(rng.choice(tors)), str(rng.choice(spines)),
            round(start, 1), round(length, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--clean", type=Path, default=CLEAN)
    ap.add_argument("--start", type=float, default=START_S, help="seconds into the recording")
    ap.add_argument("--length", type=float, default=LENGTH_S, help="seconds the fault lasts")
    ap.add_argument("--seed", type=int, default=0, help="draws of random losses and ECMP hashing")
    ap.add_argument("--endpoint", default=ENDPOINT, help="of the endpoint and link kinds")
    ap.add_argument("--tor", default=TOR, help="of the ToR kinds")
    ap.add_argument("--spine", default=SPINE, help="of the spine kinds")
    ap.add_argument("--busy-per-hour", type=float, default=BUSY_PER_HOUR,
                    help="congestion episodes of the busy kind")
    ap.add_argument("--place", type=int, default=None, metavar="N",
                    help="draw the endpoint, ToR, spine, start and length (5-25 min, 200 s\n"
                         "from either end) at random, seeded by N; overrides those flags")
    a = ap.parse_args()
    missing = [f for f in ("topology.json", "probes.parquet") if not (a.clean / f).is_file()]
    if missing:
        ap.error(f"--clean {a.clean}: not a recording (no {' or '.join(missing)})")
    if a.place is not None:
        try:
            a.endpoint, a.tor, a.spine, a.start, a.length = placement(a.clean, a.place)
        except ValueError as e:
            ap.error(str(e))
        print(json.dumps({"placement": {"endpoint": a.endpoint, "tor": a.tor, "spine": a.spine,
                                        "start": a.start, "length": a.length}}))
    made = [inject(k, a.clean, a.out / k, seed=a.seed, start_s=a.start, length_s=a.length,
                   endpoint=a.endpoint, tor_id=a.tor, spine_id=a.spine,
                   busy_per_hour=a.busy_per_hour)
            for k in a.kinds.split(",") if k]
    print(json.dumps({"made": made}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
