"""Per-flow routes on real traffic: does the live system name a dead link
exactly when the fabric spreads each pair's flows over its spines?

    python bench/flows.py [--loss 100] [--timeout 120] [--runs 1]

A namespace cluster whose switches hash ECMP on ports (Layout.ecmp_ports):
one rail, three ToRs of two hosts, two spines; controller, analyzer and one
agent per container, as `netskel demo` runs them. Then `--loss` % of the
packets on ToR 0's link to spine 0 are dropped, both ways, and we wait for
the first incident. Twice per run, alternately: agents tracing each probe
flow's route (the default), and the same agents with no route traces (no
--underlay-netns: the analyzer can only spread a pair's blame over its
paths). Three ToRs, so the link is knowable: pairs between ToRs 1 and 2
cross spine 0's other links and clear them.

Prints one JSON line: per variant, the component named, whether it is the
link and named alone (not one of links it could not tell apart), its
confidence and the seconds from fault to incident. Needs root
and the testbed tools (scripts/setup.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netskel.api.v1 import netdiag_pb2 as dpb  # noqa: E402
from testbed import faults  # noqa: E402
from testbed.deploy import Deployment  # noqa: E402
from testbed.layout import Layout  # noqa: E402

WINDOW_S = 10
LINK = "spine-0~tor-r0-0"


def one(traced: bool, loss: int, timeout: float) -> dict[str, Any]:
    lay = Layout(hosts=6, rails=1, hosts_per_tor=2, spines=2, ecmp_ports=True)
    args: tuple[str, ...] = () if traced else ("--underlay-netns", "")
    with Deployment(lay, window_s=WINDOW_S, agent_args=args) as d:
        d.start_agents()
        d.wait_all_ok(timeout=120)
        # A few healthy windows with every flow's route in them.
        time.sleep(3 * WINDOW_S)
        d.wait_all_ok(timeout=60)
        t_fault = time.time()
        undo = faults.random_loss(d.cluster, LINK, loss)
        try:
            deadline = time.monotonic() + timeout
            incidents: list[Any] = []
            while time.monotonic() < deadline and not incidents:
                time.sleep(1)
                incidents = [i for i in d.netdiag.ListIncidents(
                    dpb.ListIncidentsRequest()).incidents if i.start >= t_fault - WINDOW_S]
            t_found = time.time()
        finally:
            undo()
        if not incidents:
            return {"named": None, "exact": False, "delay_s": None}
        first = min(incidents, key=lambda i: i.start)
        ev = dict(first.evidence)
        twins = list(ev.get("indistinguishable_from", []))
        # Exact: the link, alone. A tie named by its first member is a coin
        # the bench's choice of link could have won or lost.
        return {"named": first.component.id, "exact": first.component.id == LINK and not twins,
                "confidence": round(first.confidence, 3), "indistinguishable_from": twins,
                "incidents": len(incidents), "delay_s": round(t_found - t_fault, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loss", type=int, default=100, help="percent dropped on the link")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    out: dict[str, list[dict[str, Any]]] = {"traced": [], "untraced": []}
    for _ in range(a.runs):
        for traced in (True, False):
            got = one(traced, a.loss, a.timeout)
            out["traced" if traced else "untraced"].append(got)
            print(("traced  " if traced else "untraced"), got, file=sys.stderr, flush=True)
    print(json.dumps({"link": LINK, "loss_percent": a.loss, **{
        k: {"exact": sum(r["exact"] for r in v), "runs": len(v), "results": v}
        for k, v in out.items()}}))


if __name__ == "__main__":
    main()
