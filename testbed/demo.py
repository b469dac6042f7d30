"""`netskel demo`: the whole system on this machine, then a fault, then
what NetDiag says about it."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from netskel import serde
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.errors import NetskelError
from testbed import faults
from testbed.deploy import Deployment
from testbed.layout import Layout
from testbed.prometheus import Prometheus, prometheus_available

LINK_FAULTS = ("link-down", "loss", "mtu", "queue")


def preflight() -> None:
    if os.geteuid() != 0:
        raise NetskelError("demo: needs root (network namespaces)")
    missing = [b for b in ("ip", "ovs-vswitchd", "ovsdb-server", "nft", "ethtool", "tc")
               if shutil.which(b) is None]
    if missing:
        raise NetskelError(f"demo: missing {', '.join(missing)} (run scripts/setup.sh)")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def show_alerts(prom: Prometheus, t_fault: float, wait_s: float = 15.0) -> None:
    """What the network team's Prometheus says: netskel's alerts firing
    once the analyzer's gauges carry the incident (scraped every second)."""
    deadline = time.monotonic() + wait_s
    while not (alerts := [x for x in prom.alerts() if x["state"] == "firing"]) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    say(f"Prometheus after {time.time() - t_fault:.0f}s: "
        + ("; ".join(f"{x['labels']['alertname']} firing ({x['labels'].get('severity')}): "
                     f"{x['annotations'].get('summary', '')}" for x in alerts)
           or f"no alert firing within {wait_s:.0f} s"))


def run_demo(a: argparse.Namespace) -> int:
    preflight()
    lay = Layout(hosts=a.hosts, rails=a.rails, hosts_per_tor=max(1, a.hosts // 2))
    with Deployment(lay, window_s=a.window, with_prometheus=prometheus_available()) as d:
        say(f"cluster {d.cluster.prefix}: {lay.hosts} hosts x {lay.rails} rails, "
            f"{lay.tors_per_rail * lay.rails} ToRs, {lay.spines} spines; run dir {d.cluster.run_dir}")
        say(f"Prometheus with netskel's alerts at {d.prometheus.url}" if d.prometheus else
            "no prometheus here (scripts/setup.sh installs it): alerts not shown")
        d.start_agents()
        say(f"{lay.hosts} agents started; waiting for a healthy {a.window}s window on every pair")
        t_ok = d.wait_all_ok(timeout=6 * a.window + 30)
        say(f"all {len(d.all_pairs())} rail-aligned pairs healthy")
        link = "spine-0~tor-r0-0"
        if a.fault == "link-down":
            affected = d.crossing("tor-r0-0", "spine-0")
            undo = faults.link_down(d.cluster, link)
            what = f"link {link} down"
        elif a.fault == "loss":
            affected = d.crossing("tor-r0-0", "spine-0")
            undo = faults.random_loss(d.cluster, link, 10)
            what = f"10% loss on {link}"
        elif a.fault == "mtu":
            affected = d.crossing("tor-r0-0", "spine-0")
            undo = faults.drop_above(d.cluster, link, 1000)
            what = f"packets > 1000 B dropped on {link}"
        elif a.fault == "queue":
            affected = d.crossing("tor-r0-0", "spine-0")
            undo = faults.rate_limit(d.cluster, link, load_from=(0, 2, 0))
            what = f"20 Mbit/s bottleneck and load on {link}"
        elif a.fault == "stale-flow":
            affected = [(lay.endpoint(0, 0), lay.endpoint(1, 0))]
            undo = faults.stale_datapath_flow(d.cluster, 0, 0, lay.overlay_ip(1, 0))
            what = (f"{lay.host(0)}'s cached flow to {lay.overlay_ip(1, 0)} drops "
                    f"(a stale offloaded flow on {lay.nic(0, 0)}; tables right)")
        else:
            affected = [(lay.endpoint(0, 0), lay.endpoint(1, 0))]
            undo = faults.delete_overlay_rule(d.cluster, 0, lay.overlay_ip(1, 0))
            what = f"overlay rule for {lay.overlay_ip(1, 0)} deleted on {lay.host(0)}"
        t_fault = time.time()
        say(f"FAULT: {what}; pairs crossing it: {len(affected)}")
        try:
            deadline = time.monotonic() + 3 * a.window + 30
            resp = None
            while time.monotonic() < deadline:
                resp = d.diagnose(d.all_pairs(), since=t_ok)
                if resp.verdict == dpb.NETWORK_FAULT:
                    break
                time.sleep(1)
            assert resp is not None
            say(f"NetDiag after {time.time() - t_fault:.0f}s: "
                f"{serde.VERDICT_NAMES[resp.verdict]}")
            for v in resp.pairs:
                mark = "*" if (v.pair.a, v.pair.b) in affected else " "
                print(f"  {mark} {v.pair.a:<18} {v.pair.b:<18} "
                      f"{serde.VERDICT_NAMES[v.verdict]:<14} {v.reason}")
            print("  (* = crosses the fault per the kernel's ECMP choice)" if a.fault in LINK_FAULTS
                  else "  (* = the pair whose flow the fault breaks)")
            for inc in resp.incidents:
                print(json.dumps(serde.incident_from_pb(inc).to_doc(), indent=1)[:1500])
            if d.prometheus is not None:
                show_alerts(d.prometheus, t_fault)
            if a.keep:
                port = d.analyzer.ports[0] if d.analyzer else 0
                say(f"cluster kept; NetDiag at 127.0.0.1:{port} (Ctrl-C to remove; "
                    "NETSKEL_KEEP_RUN=1 keeps its logs too)")
                from netskel.stopping import wait_for_signal
                wait_for_signal()
        finally:
            undo()
    say("cluster removed")
    return 0
