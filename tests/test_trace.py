"""Per-flow tracing without a tunnel, on real namespaces: a host, two
routers with two equal-cost paths between them, a far host. The probes are
the host's own packets, so the routers quote them directly; the tracer
listens in the host's namespace from this (root) one, as the sidecar does."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from probe_agent.flowtrace import FlowTracer
from tests.conftest import requires_testbed
from tests.helpers import TracedProber

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
               "net.ipv4.icmp_ratelimit=0", "net.ipv4.fib_multipath_hash_policy=1",
               # Answer from the link the packet came in on: the hop says which.
               "net.ipv4.icmp_errors_use_inbound_ifaddr=1")
        sh("ip", "-n", ns["a"], "route", "add", "default", "via", "10.91.1.254")
        sh("ip", "-n", ns["b"], "route", "add", "default", "via", "10.91.3.254")
        sh("ip", "-n", ns["r1"], "route", "add", "10.91.3.0/24", "nexthop", "via", "10.91.2.2",
           "nexthop", "via", "10.91.2.6")
        sh("ip", "-n", ns["r2"], "route", "add", "10.91.1.0/24", "via", "10.91.2.1")
        yield ns
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n], check=False)


NAMES = {"10.91.1.254": "r1", "10.91.2.2": "r2", "10.91.2.6": "r2"}
FLOWS = 16


@pytest.fixture
def flows(chain) -> Iterator[TracedProber]:
    """A prober in A over FLOWS flows, a responder in B, the tracer in A."""
    f = TracedProber(f"/var/run/netns/{chain['a']}", "10.91.1.1", f"/var/run/netns/{chain['b']}",
                     "10.91.3.2", f"/var/run/netns/{chain['a']}", FLOWS)
    yield f
    f.close()


def test_each_flow_names_every_router_and_stops_at_the_destination(flows):
    traces = flows.trace_all()
    assert sorted(traces) == sorted(flows.prober.flows["a"])
    for t in traces.values():
        assert t.error == "" and t.reached and t.tunnel_sport == 0, t
        assert len(t.hops) == 2 and t.hops[0] == "10.91.1.254"
        assert t.hops[1] in ("10.91.2.2", "10.91.2.6")  # the ECMP member this flow hashed onto
        assert t.route(NAMES) == "r1>r2"
        assert t.route({"10.91.1.254": "r1"}) == "", "an unknown router makes the route unknown"
    # r1 hashes ports: 16 flows take both of its links (all on one: 2 ** -15).
    assert {t.hops[1] for t in traces.values()} == {"10.91.2.2", "10.91.2.6"}


def test_one_flow_keeps_one_path(flows):
    """Paris tracing: every TTL of a flow's trace took the flow's 5-tuple,
    so the same flows traced again answer the same."""
    first, again = flows.trace_all(), flows.trace_all()
    assert {f: t.hops for f, t in first.items()} == {f: t.hops for f, t in again.items()}


def test_silent_router_and_bad_namespace_are_results_not_errors(chain, flows):
    sh("ip", "netns", "exec", chain["r2"], "nft", "add table ip t ; "
       "add chain ip t out { type filter hook output priority 0 ; } ; "
       "add rule ip t out icmp type time-exceeded drop")
    for t in flows.trace_all(timeout_s=0.3).values():
        assert t.reached and t.hops[0] == "10.91.1.254" and t.hops[1] is None
        assert t.route(NAMES) == ""
    with pytest.raises(OSError, match="no-such-namespace"):
        FlowTracer("/var/run/netns/nt-no-such-namespace", 1)
