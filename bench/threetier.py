"""Localization on a three-tier fabric (ToRs -> pod spines -> cores), which
the contract allows (`tier: core`) and the dev set does not hold: our
simulator's probes (netskel/probesim.py, four flows a pair, routes on a
share of them), so exploration, not evidence. Each case is one fault
10 minutes into 30 minutes of probes at 1/s over 2 pods x 2 rails x 2 ToRs
x 3 hosts; prints what `netskel analyze`'s logic named, then one JSON line.

    python bench/threetier.py [--seconds 1800] [--seed 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402

from analyzer.offline import analyze_files  # noqa: E402
from netskel.probesim import ProbeFault, ProbeNoise, simulate_probes, with_overlay  # noqa: E402

PODS, RAILS, TORS, HOSTS_PER_TOR, SPINES, CORES = 2, 2, 2, 3, 2, 2


def fabric() -> dict[str, Any]:
    """Every ToR of a pod to each of its pod's spines, every spine to each core."""
    sw: list[dict[str, Any]] = [{"id": f"core-{c}", "tier": "core"} for c in range(CORES)]
    links: list[dict[str, str]] = []
    hosts: list[dict[str, Any]] = []
    conts: list[dict[str, Any]] = []
    for p in range(PODS):
        for s in range(SPINES):
            sw.append({"id": f"spine-p{p}-{s}", "tier": "spine"})
            links += [{"a": f"spine-p{p}-{s}", "b": f"core-{c}"} for c in range(CORES)]
        for r in range(RAILS):
            for t in range(TORS):
                sw.append({"id": f"tor-p{p}-r{r}-{t}", "tier": "tor", "rail": r})
                links += [{"a": f"tor-p{p}-r{r}-{t}", "b": f"spine-p{p}-{s}"} for s in range(SPINES)]
    h = 0
    for p in range(PODS):
        for t in range(TORS):
            for _ in range(HOSTS_PER_TOR):
                hid = f"h{h:03d}"
                hosts.append({"id": hid, "nics": [{"id": f"{hid}/rnic{r}", "rail": r}
                                                  for r in range(RAILS)]})
                links += [{"a": f"{hid}/rnic{r}", "b": f"tor-p{p}-r{r}-{t}"} for r in range(RAILS)]
                conts.append({"id": f"j-w{h:03d}", "job": "j", "host": hid, "endpoints": [
                    {"id": f"j-w{h:03d}/rnic{r}", "nic": f"{hid}/rnic{r}",
                     "ip": f"192.168.{10 + r}.{h + 1}", "vni": 7} for r in range(RAILS)]})
                h += 1
    return with_overlay({"version": 1, "switches": sw, "hosts": hosts, "links": links,
                         "containers": conts})


CASES = {
    "core_link_loss": ProbeFault("loss", 600, 600, magnitude=0.05, link="core-1~spine-p0-0"),
    "tor_uplink_latency": ProbeFault("step", 600, 600, magnitude=100.0,
                                     link="spine-p1-1~tor-p1-r0-1"),
    "core_switch_loss": ProbeFault("loss", 600, 600, magnitude=0.05, switch="core-0"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1800.0)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    doc = fabric()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "t.json"
        topo.write_text(json.dumps(doc))
        for name, fault in CASES.items():
            table, _ = simulate_probes(doc, a.seconds, [fault],
                                       ProbeNoise(rate_hz=1.0, sizes=(64, 256, 1024, 4096)),
                                       seed=a.seed)
            probes = Path(tmp) / f"{name}.parquet"
            pq.write_table(table, probes)
            incidents = analyze_files(topo, probes)["incidents"]
            truth = fault.link or fault.switch
            named = [(i["component"]["id"], i["confidence"]) for i in incidents]
            print(f"{name}: truth {truth}; named {named}", file=sys.stderr)
            out[name] = {"truth": truth, "incidents": len(incidents),
                         "named": [n for n, _ in named],
                         "right_first": bool(named) and named[0][0] == truth}
    print(json.dumps({"bench": "threetier", "cases": out}))


if __name__ == "__main__":
    main()
