"""Per-flow route tracing: reading the routers' quotes (no network), then on
a namespace cluster whose switches hash ECMP on ports, each probe flow's
traced route against the kernel's own choice for its tunnel packets, and a
dead link seen on exactly the flows that cross it."""

from __future__ import annotations

import json
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from probe_agent import wire
from probe_agent.flowtrace import VXLAN_PORT, FlowTracer, parse_icmp
from probe_agent.udp import ProbeTarget, Reply, Sent
from probe_agent.window import WindowAccumulator
from testbed import faults
from testbed.cluster import Cluster, create_cluster
from testbed.layout import Layout
from testbed.sh import run
from tests.conftest import requires_testbed
from tests.helpers import TracedProber, wait_for

TOKEN = 0x1122334455667788


def _ip(src: str, dst: str, proto: int, payload: bytes, ttl: int = 64) -> bytes:
    """An IPv4 header (RFC 791, no options; the checksum is not read) and payload."""
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, 0, ttl, proto, 0,
                       socket.inet_aton(src), socket.inet_aton(dst)) + payload


def _udp(sport: int, dport: int, payload: bytes) -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def _probe(seq: int, token: int = TOKEN) -> bytes:
    buf = wire.probe_buffer(wire.MIN_SIZE)
    wire.fill_probe(buf, seq, token, 123)
    return bytes(buf)


def _inner(seq: int, token: int = TOKEN, vlan: bool = False) -> bytes:
    """A probe as it leaves the container, then wrapped by the host's VXLAN
    (RFC 7348: outer IP/UDP to 4789, 8-byte VXLAN header, the Ethernet frame)."""
    frame = _ip("192.168.10.1", "192.168.10.3", 17, _udp(40001, 7100, _probe(seq, token)), ttl=2)
    ether = bytes(6) + bytes(6) + (b"\x81\x00\x00\x07" if vlan else b"") + b"\x08\x00"
    vxlan = struct.pack("!II", 0x08000000, 7 << 8)
    return _ip("10.0.0.2", "10.0.1.3", 17, _udp(51690, VXLAN_PORT, vxlan + ether + frame), ttl=2)


def _icmp(router: str, icmp_type: int, quoted: bytes) -> bytes:
    return _ip(router, "10.0.0.2", 1, struct.pack("!BBHI", icmp_type, 0, 0, 0) + quoted)


def test_a_quote_of_a_tunnel_packet_names_the_probe_flow_inside_it():
    for vlan in (False, True):
        q = parse_icmp(_icmp("10.255.0.3", 11, _inner(41, vlan=vlan)))
        assert q is not None
        assert (q.icmp_type, q.router, q.src, q.sport, q.dst, q.dport) == (
            11, "10.255.0.3", "192.168.10.1", 40001, "192.168.10.3", 7100)
        assert (q.tunnel_sport, q.token, q.seq) == (51690, TOKEN, 41)


def test_a_quote_of_a_plain_probe_names_it():
    plain = _ip("10.0.0.2", "10.0.1.3", 17, _udp(40002, 7100, _probe(9)))
    q = parse_icmp(_icmp("10.0.0.1", 11, plain))
    assert q is not None and (q.src, q.sport, q.dport, q.tunnel_sport, q.seq) == (
        "10.0.0.2", 40002, 7100, 0, 9)
    # The same UDP port as the tunnel's, told apart only by its port: a
    # router quoting a tunnel packet under another tunnel port says nothing.
    assert parse_icmp(_icmp("10.0.0.1", 11, _inner(41)), tunnel_port=4790) is None


def test_short_quotes_other_icmp_and_garbage_are_none_never_an_error():
    full = _icmp("10.255.0.3", 11, _inner(41))
    # RFC 792 routers quote 8 bytes past the IP header: the tunnel's UDP
    # header only, no probe inside: the hop cannot be matched.
    assert parse_icmp(full[:20 + 8 + 20 + 8]) is None
    header_end = len(full) - (wire.MIN_SIZE - wire.HEADER_SIZE)
    for cut in range(len(full)):  # a quote cut inside the probe's header says nothing
        assert (parse_icmp(full[:cut]) is None) is (cut < header_end), cut
    echo = _ip("10.0.0.1", "10.0.0.2", 1, struct.pack("!BBHI", 0, 0, 0, 0) + _inner(1))
    assert parse_icmp(echo) is None
    rng = random.Random(7)
    for _ in range(2000):
        junk = bytearray(full)
        for _ in range(rng.randint(1, 4)):
            junk[rng.randrange(len(junk))] = rng.randrange(256)
        got = parse_icmp(bytes(junk))
        assert got is None or got.seq >= 0
        assert parse_icmp(bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))) is None


def test_an_echo_after_the_tracer_closed_is_ignored():
    """The prober reads the reply hook, then the tracer closes, then the
    echo comes: the hook must not raise (it killed the check's prober
    thread, and the check judged pairs on the few probes it had sent)."""
    tracer = FlowTracer(None, TOKEN)
    tracer.replied(1)
    tracer.close()
    tracer.replied(2)
    assert tracer._replied == [1], "the late echo is dropped, not queued"


def test_a_failing_trace_hook_does_not_stop_the_prober():
    """Whatever the hook does, the prober goes on reading and probing."""
    from probe_agent.udp import Prober

    got: list[Reply] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.bind(("127.0.0.1", 0))
        p = Prober({"a": "127.0.0.1"}, {"a": (64,)}, 10.0, 1.0, lambda *a: None,
                   lambda *a: None, on_trace_reply=lambda seq: 1 / 0)
        try:
            for token in (p.trace_token, p.token):
                buf = wire.probe_buffer(wire.MIN_SIZE)
                wire.fill_probe(buf, 7, token, 1)
                p._inflight[7] = [("a", "b"), 64, 1, 0, 0, p.flows["a"][0]]
                peer.sendto(wire.reply_to(bytes(buf), 0), p.flow_sockets["a"][0].getsockname())
                wait_for(lambda: select.select([p.flow_sockets["a"][0]], [], [], 0)[0], 5,
                         "the reply to arrive")
                p._receive(p.flow_sockets["a"][0], "a")
                got += p._settle(time.time_ns(), final=True)
        finally:
            p.close()
    assert len(got) == 1, "the probe's reply after the failed hook was read"


# -- on a cluster -------------------------------------------------------------

FLOWS = 16  # all on one spine by chance: 2 * 2**-16


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = create_cluster(Layout(hosts=4, rails=1, hosts_per_tor=2, spines=2, ecmp_ports=True))
    yield c
    assert c.destroy() == []


class _Probing(TracedProber):
    """Our prober in container 0 probing container 2 over FLOWS flows at
    200/s, its tracer in host 0, its probes counted by flow in one window."""

    def __init__(self, c: Cluster) -> None:
        lay = c.layout
        self.acc = WindowAccumulator(window_s=1000, timeout_s=1)
        self.lock = threading.Lock()
        self.sent, self.want, self.enough = 0, 0, threading.Event()
        super().__init__(f"/run/netns/{c.container_ns(0)}", lay.overlay_ip(0, 0),
                         f"/run/netns/{c.container_ns(2)}", lay.overlay_ip(2, 0),
                         f"/run/netns/{c.host_ns(0)}", FLOWS, 200.0, self._sent, self._replied)

    def _sent(self, events: list[Sent]) -> None:
        with self.lock:
            self.acc.sent_many(events)
            self.sent += len(events)
            if self.sent >= self.want:
                self.enough.set()

    def _replied(self, replies: list[Reply]) -> None:
        with self.lock:
            self.acc.replied_many(replies)


@pytest.fixture
def probing(cluster: Cluster) -> Iterator[_Probing]:
    p = _Probing(cluster)
    yield p
    p.close()


def _from_tor0(c: Cluster) -> dict[str, int]:
    """Packets each spine has received from ToR 0 (its port r0t0)."""
    out = {}
    for s in range(c.layout.spines):
        got = json.loads(run("ip", "-n", c.spine_ns(s), "-s", "-j", "link", "show", "dev", "r0t0"))
        out[c.layout.spine(s)] = int(got[0]["stats64"]["rx"]["packets"])
    return out


@requires_testbed
@pytest.mark.testbed
def test_each_flow_is_traced_on_the_path_its_packets_take(cluster, probing):
    """The traced spine of each flow is the spine that counts the flow's
    packets (the switches' own counters, not our tracer, say where they went)."""
    names = cluster.switch_addresses
    routes = {}
    seq = 1 << 40
    traces = probing.trace_all()
    assert sorted(traces) == sorted(probing.prober.flows["a"])
    for flow, tr in traces.items():
        assert tr.reached and not tr.error and tr.tunnel_sport, tr
        route = routes[flow] = tr.route(names)
        hops = route.split(">")
        assert len(hops) == 3 and hops[0] == "tor-r0-0" and hops[2] == "tor-r0-1", route
        before = _from_tor0(cluster)
        for _ in range(20):  # TTL 64: these reach the responder like probes of the flow
            seq += 1
            probing.prober.send_trace("a", flow, probing.dst_ip, probing.responder.port, 64, seq)
        want = sum(before.values()) + 20
        wait_for(lambda want=want: sum(_from_tor0(cluster).values()) >= want, 10,
                 "the spines to count the flow's packets")
        after = _from_tor0(cluster)
        gained = {s: after[s] - before[s] for s in after}
        assert gained[hops[1]] >= 20 and sum(gained.values()) - gained[hops[1]] < 20, \
            (flow, route, gained)
    assert len(set(routes.values())) == 2, "16 flows spread over both spines"


@requires_testbed
@pytest.mark.testbed
def test_a_dead_link_loses_the_probes_of_exactly_the_flows_routed_over_it(cluster, probing):
    names = cluster.switch_addresses
    routes = {flow: probing.trace(flow).route(names) for flow in probing.prober.flows["a"]}
    dead = next(r for r in routes.values() if r)
    tor, spine = dead.split(">")[:2]
    undo = faults.random_loss(cluster, "~".join(sorted((tor, spine))), 100)
    try:
        # Every flow probed 5 times (a target's probes cycle through the flows).
        probing.want = FLOWS * 5
        probing.prober.set_targets([ProbeTarget("a", "b", probing.dst_ip, probing.responder.port)])
        assert probing.enough.wait(30), "the prober stopped sending"
        probing.prober.set_targets([])
        with probing.lock:
            (w,) = probing.acc.close(now=float("inf"),
                                     route_of=lambda src, dst, flow: routes.get(flow, ""))
    finally:
        undo()
    by = {r.route: r for r in w.routes}
    assert set(by) == set(routes.values())
    assert by[dead].sent >= 5 and by[dead].lost == by[dead].sent, \
        "every probe whose flow crosses the dead link is lost"
    (alive,) = set(by) - {dead}
    # The other spine's flows come back unless their reply (hashed on its own
    # 5-tuple) crossed the dead link: some of them at least.
    assert by[alive].lost < by[alive].sent


@requires_testbed
@pytest.mark.testbed
def test_an_active_check_carries_its_probes_by_traced_route(cluster, probing):
    """A diagnosis engine's active check probes over flows too, traces them,
    and its windows say how many probes went each way."""
    from controller.pinglist import Target
    from probe_agent.check import run_check
    from probe_agent.trace import in_netns

    lay = cluster.layout
    target = Target("a", "b", probing.dst_ip, probing.responder.port, True)
    with in_netns(f"/run/netns/{cluster.container_ns(0)}"):
        windows = run_check((target,), 1.0, 200.0, {"a": lay.overlay_ip(0, 0)}, {"a": (64, 1024)},
                            1.0, f"/run/netns/{cluster.host_ns(0)}", cluster.switch_addresses,
                            threading.Event(), flows=FLOWS)
    assert sorted(w.size for w in windows) == [64, 1024]
    for w in windows:
        assert {r.route.split(">")[1] for r in w.routes} == {"spine-0", "spine-1"}, w.routes
        assert sum(r.sent for r in w.routes) == w.sent and w.lost == 0
        assert w.route in {r.route for r in w.routes}
