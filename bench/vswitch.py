"""What reading a host's virtual switch costs the agent: a testbed-style
multi-table pipeline (testbed/cluster.py: overlay_pipeline) for a host
of a cluster with HOSTS hosts x 8 rails, i.e. one L3 flow per overlay
destination, as `ovs-ofctl dump-flows` prints it.

Figures: reading the dump (our reader) against the ovs library's parser
alone on the same lines (the baseline, same run); running the pipeline to
the contract's rules (what the agent does when the table changed; an
unchanged table is not run again); the median of --repeat runs. Then the
datapath cache of such a host (what `--vswitch-datapath` reads: four
cached flows per destination, as OVS cached them on the testbed) read to
rules (netskel/dpflows.py) against the ovs library's datapath-flow parser
alone on the same lines; and the same host with routing before conntrack
(OVN's order): one flow per destination ending in a recirculation, read
through the shared flows after it (`route_first_*`).

    python bench/vswitch.py [--hosts 64 250] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def dump_text(hosts: int) -> tuple[str, str]:
    from testbed.cluster import overlay_pipeline
    from testbed.layout import Layout

    lay = Layout(hosts=hosts, rails=8, hosts_per_tor=16, spines=8)
    lines = ["NXST_FLOW reply (xid=0x4):"]
    for f in overlay_pipeline(lay, 0, {r: r + 1 for r in range(8)}):
        head, actions = f.split(",actions=")
        table, match = head.split(",", 1)
        lines.append(f" cookie=0x0, duration=12.5s, {table}, n_packets=0, n_bytes=0, idle_age=3, "
                     f"{match} actions={actions}")
    show = "".join(f" {r + 1}(c0e{r}): addr:02:00:00:00:00:0{r}\n" for r in range(8))
    return "\n".join(lines) + "\n", show + " 100(vx7): addr:02:00:00:00:00:ff\n"


def datapath_text(hosts: int) -> str:
    """The datapath cache of a host talking to every destination: the four
    flows Open vSwitch cached per destination on the testbed (recorded in
    tests/data/dpctl), addresses renumbered."""
    sample = (ROOT / "tests" / "data" / "dpctl" / "netdev-ovs3.1.txt").read_text().splitlines()
    flows = [ln for ln in sample if "actions:" in ln and "eth_type(0x0800)" in ln]
    lines = ["flow-dump from the main thread:"]
    for i in range(hosts * 8):
        dst = f"192.168.{10 + i // 250}.{2 + i % 250}"
        lines += [ln.replace("192.168.10.2", dst) for ln in flows]
    return "\n".join(lines) + "\n"


def route_first_text(hosts: int) -> str:
    """The route-first pipeline's cache (recorded in tests/data/dpctl): per
    destination the flow before the recirculation; the flows after it
    match no destination, so one of each serves all (OVS shares the
    recirculation id where the frozen state, here the output port, is
    the same)."""
    sample = (ROOT / "tests" / "data" / "dpctl" / "netdev-ovs3.1-route-first.txt").read_text()
    flows = [ln for ln in sample.splitlines() if "actions:" in ln]
    before = [ln for ln in flows if "recirc(" in ln and "in_port(c0e0)" in ln]
    lines = ["flow-dump from the main thread:", *(ln for ln in flows if ln not in before)]
    for i in range(hosts * 8):
        dst = f"192.168.{10 + i // 250}.{2 + i % 250}"
        lines += [ln.replace("dst=192.168.10.2,", f"dst={dst},") for ln in before]
    return "\n".join(lines) + "\n"


def parse_each(parser: Callable[[str], object], lines: list[str]) -> None:
    """The ovs library's parser on every line, nothing kept (the baseline)."""
    for ln in lines:
        parser(ln)


def medians(repeat: int, *steps: Callable[[], object]) -> tuple[list[float], list[object]]:
    """Each step run `repeat` times, interleaved (step 1, 2, ..., 1, 2, ...):
    the median seconds of each, and what each returned last."""
    times: list[list[float]] = [[] for _ in steps]
    last: list[object] = [None] * len(steps)
    for _ in range(repeat):
        for i, step in enumerate(steps):
            t0 = time.perf_counter()
            last[i] = step()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times], last


def measure_datapath(hosts: int, repeat: int) -> dict[str, float | int]:
    from ovs.flow.odp import ODPFlow

    from netskel.dpflows import DatapathRead, read_datapath

    text = datapath_text(hosts)
    flow_lines = [ln for ln in text.splitlines() if "actions:" in ln]
    (b, r), (_, got) = medians(repeat, lambda: parse_each(ODPFlow, flow_lines),
                               lambda: read_datapath(text, frozenset({"vx7"}), 7))
    assert isinstance(got, DatapathRead)
    rf_text = route_first_text(hosts)
    rf_lines = [ln for ln in rf_text.splitlines() if "actions:" in ln]
    (rb, rr), (_, rf) = medians(repeat, lambda: parse_each(ODPFlow, rf_lines),
                                lambda: read_datapath(rf_text, frozenset({"vx7"}), 7))
    assert isinstance(rf, DatapathRead)
    return {"hosts": hosts, "datapath_flows": len(flow_lines), "datapath_rules": len(got.rules),
            "ovs_odp_parse_s": round(b, 3), "datapath_read_s": round(r, 3),
            "datapath_read_vs_ovs_parse": round(r / b, 3),
            "route_first_flows": len(rf_lines), "route_first_rules": len(rf.rules),
            "route_first_read_s": round(rr, 3), "route_first_read_vs_ovs_parse": round(rr / rb, 3)}


def measure(hosts: int, repeat: int) -> dict[str, float | int]:
    from ovs.flow.ofp import OFPFlow

    from netskel.ofdump import read_dump
    from probe_agent.vswitch import parse_dump_flows

    text, show = dump_text(hosts)
    flow_lines = [ln.strip() for ln in text.splitlines() if "actions=" in ln]
    (b, r, f), (_, _, got) = medians(repeat, lambda: parse_each(OFPFlow, flow_lines),
                                     lambda: read_dump(text),
                                     lambda: parse_dump_flows(text, (100,), 7, show))
    rules = len(got.rules)  # type: ignore[attr-defined]
    return {"hosts": hosts, "flows": len(flow_lines), "rules": rules,
            "ovs_parse_s": round(b, 3), "read_s": round(r, 3),
            "read_vs_ovs_parse": round(r / b, 2), "read_and_run_s": round(f, 3),
            "run_ms_per_destination": round(1000 * (f - r) / max(1, rules), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hosts", type=int, nargs="+", default=[64, 250])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    out = [{**measure(h, a.repeat), **measure_datapath(h, a.repeat)} for h in a.hosts]
    for row in out:
        print(json.dumps(row), file=sys.stderr)
    print(json.dumps({"bench": "vswitch", "sizes": out}))


if __name__ == "__main__":
    main()
