"""Localization time: 10,000 anomalous pairs on a 4,096-host topology.

    python bench/localize.py [--hosts 4096] [--anomalous 10000] [--healthy 100000]

Leaf-spine, one rail: 4,096 hosts, 32 per ToR (128 ToRs), 8 spines, overlay
snapshots of 65 hosts. Faults: 7 ToR-spine links, one failed spine,
one overlay blackhole; anomalous pairs are drawn among the pairs those
faults really touch (routes by ECMP hash), healthy pairs among the rest.
Times `localize` (the pure function the analyzer calls per window) cold
(paths computed) and warm (paths cached, as in a running analyzer), and
checks the components it names. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analyzer.localize import Pair, localize  # noqa: E402
from analyzer.overlay import OverlayTables  # noqa: E402
from analyzer.paths import UnderlayPaths  # noqa: E402
from netskel.probesim import ProbeFault, break_overlay, with_overlay  # noqa: E402
from netskel.topology import link_id, parse_topology  # noqa: E402
from testbed.layout import Layout, layout_doc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4096)
    ap.add_argument("--anomalous", type=int, default=10_000)
    ap.add_argument("--healthy", type=int, default=100_000)
    a = ap.parse_args()
    lay = Layout(hosts=a.hosts, rails=1, hosts_per_tor=32, spines=8)
    blackhole = ProbeFault("blackhole", 0, rule_host=lay.host(0), rule_dst=lay.overlay_ip(100, 0))
    t = time.perf_counter()
    # Overlay tables of the hosts that matter (all 4,096 would be 33 M rules to parse).
    overlay_hosts = {lay.host(h) for h in range(0, a.hosts, 64)} | {lay.host(100)}
    topo = parse_topology(break_overlay(with_overlay(layout_doc(lay), overlay_hosts), [blackhole]))
    t_topo = time.perf_counter() - t
    paths = UnderlayPaths(topo)
    tables = OverlayTables(topo)
    rng = np.random.default_rng(0)
    eps = [lay.endpoint(h, 0) for h in range(a.hosts)]
    nic = [lay.nic(h, 0) for h in range(a.hosts)]

    def spine_of(i: int, j: int) -> int:  # the ECMP choice a traced route would report
        return (i * 7919 + j * 104729) % lay.spines
    bad_spine = lay.spine(3)
    bad_links = {link_id(lay.tor(0, 8 * k + 1), lay.spine(k)) for k in range(lay.spines) if k != 3}
    routes: dict[Pair, dict[str, float]] = {}
    anomalous: dict[Pair, str] = {}
    healthy: set[Pair] = set()
    while len(anomalous) < a.anomalous or len(healthy) < a.healthy:
        i, j = sorted(int(x) for x in rng.choice(a.hosts, 2, replace=False))
        ti, tj = lay.tor_index(i), lay.tor_index(j)
        s = spine_of(i, j)
        hops = [lay.tor(0, ti)] if ti == tj else [lay.tor(0, ti), lay.spine(s), lay.tor(0, tj)]
        links = paths.route_links(nic[i], nic[j], hops)
        pair = (eps[i], eps[j])
        hit = bool(bad_links & set(links)) or (ti != tj and lay.spine(s) == bad_spine)
        if hit and len(anomalous) < a.anomalous:
            anomalous[pair] = "loss"
            routes[pair] = links
        elif not hit and len(healthy) < a.healthy:
            healthy.add(pair)
            routes[pair] = links
    overlay_pair = (eps[0], eps[100])
    anomalous[overlay_pair] = "unreachable"
    routes[overlay_pair] = paths.weighted_links(nic[0], nic[100])

    def candidates(p: Pair) -> dict[str, float]:
        return routes[p]
    runs = []
    for _ in range(3):
        tables._cache.clear()
        t = time.perf_counter()
        found = localize(anomalous, healthy, set(), candidates, lambda p: tables.round_trip(*p),
                         lambda link: tuple(x for x in topo.links[link] if x in topo.switches))
        runs.append(time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(2000):  # cold shortest-path candidates, as an analyzer's first window pays
        paths.weighted_links(nic[i], nic[(i * 37 + 11) % a.hosts])
    per_pair_paths = (time.perf_counter() - t) / 2000
    named = sorted((f.component.type, f.component.id) for f in found)
    want = sorted([("link", x) for x in bad_links] + [("switch", bad_spine)]
                  + [("vswitch_rule", f"{lay.host(0)}:{lay.vni}:{lay.overlay_ip(100, 0)}")])
    print(json.dumps({"bench": "localize", "hosts": a.hosts, "anomalous_pairs": len(anomalous),
                      "healthy_pairs": len(healthy), "localize_s": round(min(runs), 3),
                      "localize_runs_s": [round(x, 3) for x in runs],
                      "topology_load_s": round(t_topo, 2),
                      "cold_path_per_pair_ms": round(per_pair_paths * 1e3, 3),
                      "components_named": len(found), "all_faults_named_exactly": named == want,
                      "extra": [n for n in named if n not in want][:5]}))


if __name__ == "__main__":
    main()
