"""Each probe flow's underlay route, traced Paris style on the flow itself.

A pair's probes leave from several UDP source ports (probe_agent/udp.py),
and the ECMP hash sends each 5-tuple its own way. A trace of the NIC pair
with any other 5-tuple would name some path, not the one a flow's probes
took: so the trace packets are sent on the flow's own socket, only their IP
TTL set low (per packet, ancillary data), as Paris traceroute keeps the
header fields the hash reads fixed (Augustin et al., IMC 2006; 007, Arzani
et al., NSDI 2018, traces the flows that lost packets the same way).

In an overlay the probes ride in the host's tunnel (VXLAN): the underlay
sees the tunnel's 5-tuple, whose source port the host's kernel derives from
the flow inside, so the trace packet takes the probes' path too, and the
tunnel copies the inner TTL outward where it is configured to (`ip link add
... type vxlan ... ttl inherit`). The routers' time-exceeded answers go to
the host NIC, not the container: they are read from a raw ICMP socket in
the host's namespace and matched to the trace by the probe header inside
the packet they quote (RFC 1812 routers quote up to 576 bytes; one that
quotes only 8 bytes past the outer IP header leaves the hop unknown). The
responder's echo of a trace packet says the trace reached the target.

Failures are results: a hop that does not answer is None; without the
tunnel's TTL copied outward no router answers and the route stays unknown."""

from __future__ import annotations

import errno
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from probe_agent import wire
from probe_agent.trace import Trace, in_netns

log = logging.getLogger(__name__)
VXLAN_PORT = 4789
ICMP_TIME_EXCEEDED = 11
ICMP_DEST_UNREACH = 3
_VXLAN_HEADER = 8
_ETHERNET = struct.Struct("!6s6sH")
_VLAN_TPID = (0x8100, 0x88A8)
_ETH_IPV4 = 0x0800
_UDP = 17
_ICMP = 1


@dataclass(frozen=True)
class Quote:
    """What one ICMP error says about the probe packet it quotes."""

    icmp_type: int
    router: str          # the ICMP's source: the router that answered
    src: str             # the probe's own addresses and ports (inside the tunnel if any)
    sport: int
    dst: str
    dport: int
    tunnel_sport: int    # the tunnel packet's source port: the one the ECMP hash read; 0 if none
    token: int           # from the probe header: whose trace and which packet
    seq: int


def _ipv4(data: bytes, at: int) -> tuple[int, int, str, str] | None:
    """(protocol, header length, src, dst) of an IPv4 header at `at`."""
    if len(data) < at + 20 or data[at] >> 4 != 4:
        return None
    ihl = (data[at] & 0x0F) * 4
    if ihl < 20 or len(data) < at + ihl:
        return None
    return (data[at + 9], ihl, socket.inet_ntoa(data[at + 12:at + 16]),
            socket.inet_ntoa(data[at + 16:at + 20]))


def parse_icmp(packet: bytes, tunnel_port: int = VXLAN_PORT) -> Quote | None:
    """The quoted probe of an ICMP error as a raw IPv4 socket reads it (IP
    header first); None for anything else or a quote too short to say."""
    outer = _ipv4(packet, 0)
    if outer is None or outer[0] != _ICMP or len(packet) < outer[1] + 8:
        return None
    at = outer[1]
    icmp_type = packet[at]
    if icmp_type not in (ICMP_TIME_EXCEEDED, ICMP_DEST_UNREACH):
        return None
    at += 8
    quoted = _ipv4(packet, at)
    if quoted is None or quoted[0] != _UDP or len(packet) < at + quoted[1] + 8:
        return None
    at += quoted[1]
    sport, dport = struct.unpack_from("!HH", packet, at)
    src, dst, tunnel_sport = quoted[2], quoted[3], 0
    at += 8
    if dport == tunnel_port:  # a tunnel packet: the probe is the frame inside
        at += _VXLAN_HEADER
        if len(packet) < at + _ETHERNET.size:
            return None
        _, _, ethertype = _ETHERNET.unpack_from(packet, at)
        at += _ETHERNET.size
        while ethertype in _VLAN_TPID and len(packet) >= at + 4:
            ethertype, = struct.unpack_from("!H", packet, at + 2)
            at += 4
        inner = _ipv4(packet, at) if ethertype == _ETH_IPV4 else None
        if inner is None or inner[0] != _UDP or len(packet) < at + inner[1] + 8:
            return None
        at += inner[1]
        tunnel_sport = sport
        src, dst = inner[2], inner[3]
        sport, dport = struct.unpack_from("!HH", packet, at)
        at += 8
    head = wire.header(packet[at:])  # the probe's header right behind its UDP header
    if head is None or head.kind != wire.KIND_PROBE:
        return None
    return Quote(icmp_type, socket.inet_ntoa(packet[12:16]), src, sport, dst, dport,
                 tunnel_sport, head.token, head.seq)


# Sends one trace packet of the flow: send(ttl, seq); raises OSError.
Send = Callable[[int, int], None]
K = TypeVar("K")


@dataclass
class _Flow:
    """What one flow's trace has heard so far."""

    hops: dict[int, str] = field(default_factory=dict)  # TTL -> router
    reached: int | None = None  # the least TTL whose packet the target echoed
    tunnel_sport: int = 0
    error: str = ""

    def done(self) -> bool:
        return bool(self.error.startswith("send")) or (
            self.reached is not None and all(t in self.hops for t in range(1, self.reached)))

    def result(self, src_ip: str, dst_ip: str, max_hops: int) -> Trace:
        last = self.reached - 1 if self.reached is not None else max(self.hops, default=0)
        path = tuple(self.hops.get(t) for t in range(1, last + 1))
        if self.reached is None:
            return Trace(src_ip, dst_ip, path, False, tunnel_sport=self.tunnel_sport,
                         error=self.error or f"not reached in {max_hops} hops")
        return Trace(src_ip, dst_ip, path, True, tunnel_sport=self.tunnel_sport)


class FlowTracer:
    """Traces from one thread, a pair's flows at a time; `replied` is called
    from the prober's thread when a trace packet's echo comes back."""

    def __init__(self, netns: str | None, token: int, tunnel_port: int = VXLAN_PORT) -> None:
        with in_netns(netns):
            self.raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        self.raw.setblocking(False)
        self.token = token
        self.tunnel_port = tunnel_port
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._lock = threading.Lock()
        self._replied: list[int] = []
        self._closed = False
        self._seq = 0

    def replied(self, seq: int) -> None:
        """Never raises: the prober calls it, and an echo may come back
        after the tracer closed (the prober read the hook just before)."""
        with self._lock:
            if self._closed:
                return
            self._replied.append(seq)
            try:
                self._wake_w.send(b"x")
            except OSError:  # BlockingIOError: the tracer has wake-ups pending already
                pass

    def _drain(self) -> list[Quote]:
        out: list[Quote] = []
        while True:
            try:
                packet = self.raw.recv(2048)
            except (BlockingIOError, InterruptedError):
                return out
            q = parse_icmp(packet, self.tunnel_port)
            if q is not None and q.token == self.token:
                out.append(q)

    def _take_replies(self) -> list[int]:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            got, self._replied = self._replied, []
        return got

    def trace(self, send: Send, src_ip: str, dst_ip: str, max_hops: int = 8,
              timeout_s: float = 0.5) -> Trace:
        """The hops of one flow (`trace_many` of one)."""
        return self.trace_many([(0, send)], src_ip, dst_ip, max_hops, timeout_s)[0]

    def trace_many(self, flows: Sequence[tuple[K, Send]], src_ip: str, dst_ip: str,
                   max_hops: int = 8, timeout_s: float = 0.5) -> dict[K, Trace]:
        """The hops of several flows of one pair at once: a packet at every
        TTL up to `max_hops` on every flow, then the answers until, on every
        flow, the first TTL that reached the target has every lower TTL
        answered, or the timeout. At once, because an answer waits for the
        prober's next wake-up (up to 0.2 s): one flow after another, a
        sidecar's thousand flows would take minutes."""
        self._drain()  # whatever ICMP the host heard since the last trace
        self._take_replies()
        states: dict[K, _Flow] = {}
        at: dict[int, tuple[_Flow, int]] = {}  # seq -> (its flow, its TTL)
        for key, send in flows:
            st = states[key] = _Flow()
            for ttl in range(1, max_hops + 1):
                self._seq += 1
                at[self._seq] = (st, ttl)
                try:
                    send(ttl, self._seq)
                except OSError as e:
                    if e.errno not in (errno.EHOSTUNREACH, errno.ENETUNREACH,
                                       errno.ECONNREFUSED):
                        st.error = st.error or f"send: {e}"
        poller = select.poll()
        poller.register(self.raw.fileno(), select.POLLIN)
        poller.register(self._wake_r.fileno(), select.POLLIN)
        deadline = time.monotonic() + timeout_s
        while True:
            for q in self._drain():
                got = at.get(q.seq)
                if got is None:
                    continue
                st, ttl = got
                st.tunnel_sport = q.tunnel_sport or st.tunnel_sport
                if q.icmp_type == ICMP_TIME_EXCEEDED:
                    st.hops[ttl] = q.router
                elif not st.error:
                    st.error = f"ICMP type {q.icmp_type} from {q.router}"
            for seq in self._take_replies():
                got = at.get(seq)
                if got is not None:
                    st, ttl = got
                    st.reached = ttl if st.reached is None else min(st.reached, ttl)
            if all(st.done() for st in states.values()):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            poller.poll(left * 1000)
        return {key: st.result(src_ip, dst_ip, max_hops) for key, st in states.items()}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.raw.close()
            self._wake_r.close()
            self._wake_w.close()
