"""Paris-style underlay tracing on real namespaces: a host, two routers with
two equal-cost paths between them, a far host. The trace runs from this
(root) namespace into the host's, as the sidecar agent does."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator

import pytest

from probe_agent.trace import Trace, trace, trace_all
from tests.conftest import requires_testbed

pytestmark = requires_testbed


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def chain() -> Iterator[dict[str, str]]:
    """A -- R1 ==(two links)== R2 -- B, ECMP at R1 towards B."""
    tag = f"nt{os.getpid() % 100000}"
    ns = {k: f"{tag}{k}" for k in ("a", "r1", "r2", "b")}
    made: list[str] = []
    try:
        for n in ns.values():
            sh("ip", "netns", "add", n)
            made.append(n)

        def link(x: str, xi: str, y: str, yi: str, i: int) -> None:
            sh("ip", "link", "add", f"{tag}{i}x", "netns", ns[x], "type", "veth", "peer",
               "name", f"{tag}{i}y", "netns", ns[y])
            for n, dev, ip in ((x, f"{tag}{i}x", xi), (y, f"{tag}{i}y", yi)):
                sh("ip", "-n", ns[n], "addr", "add", ip, "dev", dev)
                sh("ip", "-n", ns[n], "link", "set", dev, "up")
        link("a", "10.91.1.1/24", "r1", "10.91.1.254/24", 1)
        link("r1", "10.91.2.1/30", "r2", "10.91.2.2/30", 2)
        link("r1", "10.91.2.5/30", "r2", "10.91.2.6/30", 3)
        link("r2", "10.91.3.254/24", "b", "10.91.3.2/24", 4)
        for r in ("r1", "r2"):
            sh("ip", "netns", "exec", ns[r], "sysctl", "-qw", "net.ipv4.ip_forward=1",
               "net.ipv4.icmp_ratelimit=0")
        sh("ip", "-n", ns["a"], "route", "add", "default", "via", "10.91.1.254")
        sh("ip", "-n", ns["b"], "route", "add", "default", "via", "10.91.3.254")
        sh("ip", "-n", ns["r1"], "route", "add", "10.91.3.0/24", "nexthop", "via", "10.91.2.2",
           "nexthop", "via", "10.91.2.6")
        sh("ip", "-n", ns["r2"], "route", "add", "10.91.1.0/24", "via", "10.91.2.1")
        yield ns
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n], check=False)


def test_trace_names_every_router_and_stops_at_the_destination(chain):
    t = trace("10.91.1.1", "10.91.3.2", netns=f"/var/run/netns/{chain['a']}")
    assert t.error == "" and t.reached
    assert len(t.hops) == 2
    assert t.hops[0] == "10.91.1.254"
    assert t.hops[1] in ("10.91.2.2", "10.91.2.6")  # the ECMP member this flow hashed onto
    names = {"10.91.1.254": "r1", "10.91.2.2": "r2", "10.91.2.6": "r2"}
    assert t.route(names) == "r1>r2"
    assert t.route({"10.91.1.254": "r1"}) == "", "an unknown router makes the route unknown"


def test_one_flow_keeps_one_path(chain):
    """Paris tracing: every TTL of one trace used the same 5-tuple, and the
    same flow traced twice answers the same."""
    netns = f"/var/run/netns/{chain['a']}"
    first = trace("10.91.1.1", "10.91.3.2", sport=40001, netns=netns)
    again = trace("10.91.1.1", "10.91.3.2", sport=40001, netns=netns)
    assert first.reached and first.hops == again.hops


def test_silent_router_and_bad_namespace_are_results_not_errors(chain):
    sh("ip", "netns", "exec", chain["r2"], "nft", "add table ip t ; "
       "add chain ip t out { type filter hook output priority 0 ; } ; "
       "add rule ip t out icmp type time-exceeded drop")
    t = trace("10.91.1.1", "10.91.3.2", timeout_s=0.3, netns=f"/var/run/netns/{chain['a']}")
    assert t.reached and t.hops[0] == "10.91.1.254" and t.hops[1] is None
    assert t.route({"10.91.1.254": "r1", "10.91.2.2": "r2", "10.91.2.6": "r2"}) == ""
    bad = trace("10.91.1.1", "10.91.3.2", netns="/var/run/netns/nt-no-such-namespace")
    assert isinstance(bad, Trace) and not bad.reached and "no-such-namespace" in bad.error


def test_trace_all_traces_each_nic_pair_once(chain):
    netns = f"/var/run/netns/{chain['a']}"
    pairs = [("10.91.1.1", "10.91.3.2")] * 3 + [("10.91.1.1", "10.91.1.254")]
    got = trace_all(pairs, netns, threading.Event(), gap_s=0.0)
    assert set(got) == {("10.91.1.1", "10.91.3.2"), ("10.91.1.1", "10.91.1.254")}
    assert got[("10.91.1.1", "10.91.1.254")].reached
    assert got[("10.91.1.1", "10.91.1.254")].hops == ()
