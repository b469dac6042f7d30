"""UDP responder and prober on real sockets, with kernel receive timestamps.

One thread each serves every endpoint of the container through a selector.
Probers stagger their first probe over one interval and jitter every
interval by ±10 %, so a thousand agents started together do not probe in
lock-step. A failed send is recorded as a lost probe, never raised.

The prober wakes once per batch of sends, not once per reply: a reply's RTT
comes from the kernel's stamps, so when user space reads it changes
nothing, and replies wait in the socket until the next batch. A wake-up is
what a sidecar pays for most (on this machine's VM 70-110 µs of CPU for a
bare timed sleep, 60 µs more for the first system call after it, against
2-5 µs per call once awake; bench/agent_overhead.py)."""

from __future__ import annotations

import errno
import heapq
import logging
import os
import random
import selectors
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from netskel.errors import InputError
from probe_agent import metrics, wire

log = logging.getLogger(__name__)
_TIMESPEC = struct.Struct("@qq")
_SCM_TIMESTAMPING = struct.Struct("@qqqqqq")  # ts[0] software, ts[1] unused, ts[2] raw hardware
_EXTENDED_ERR = struct.Struct("@IBBBBII")  # struct sock_extended_err
_TX_FLAGS = struct.Struct("@I")  # one send's stamping flags, as ancillary data
# Linux asm-generic values; Python's socket module exports none of them.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
_IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
SO_BUSY_POLL = getattr(socket, "SO_BUSY_POLL", 46)
_EE_ORIGIN_TIMESTAMPING = 4
_EE_ORIGIN_AT = 4  # ee_origin's byte in struct sock_extended_err (after u32 ee_errno)
_TX_HARDWARE, _TX_SOFTWARE, _RX_HARDWARE, _RX_SOFTWARE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_SOFTWARE, _RAW_HARDWARE = 1 << 4, 1 << 6
# What a responder asks of the kernel for each reply alone (ancillary data:
# Linux 4.13 and later; an older kernel refuses, and replies go unstamped).
REPLY_STAMP = _TX_SOFTWARE | _TX_HARDWARE
# Kernel stamps at both ends of the socket layer: TX when the driver takes the
# packet (read back from the error queue, with the packet, so it is matched
# by its own header), RX when the stack receives it. Hardware stamps are
# asked for too; a NIC that offers them (`ethtool -T`) fills ts[2].
TIMESTAMPING_FLAGS = (_TX_SOFTWARE | _RX_SOFTWARE | _SOFTWARE
                      | _TX_HARDWARE | _RX_HARDWARE | _RAW_HARDWARE)
_ANCILLARY = socket.CMSG_SPACE(_SCM_TIMESTAMPING.size) + socket.CMSG_SPACE(_TIMESPEC.size)
_ERR_ANCILLARY = (socket.CMSG_SPACE(_SCM_TIMESTAMPING.size)
                  + socket.CMSG_SPACE(_EXTENDED_ERR.size + 16))
_MAX_DATAGRAM = 65535
# Of a stamped packet back from the error queue, the bytes read: its lower
# headers (link, IP, UDP; outer ones too behind a tunnel device) and ours.
_TX_PEEK = 512
JITTER = 0.1
# Probes due within this share of their interval go out with the ones due
# now, at most MAX_BATCH_S early. The prober then wakes at most ~20 times a
# second whatever the per-pair rate: a wake-up costs more CPU than the
# probes it sends (bench/agent_overhead.py: 64 targets at 10/s, 46 wake-ups
# a second with 20 ms batches, 0.066 CPU-s per 1,000 probes; 20 with 50 ms,
# 0.046). The RTT comes from kernel stamps, so when a probe leaves changes
# nothing it measures; a pair keeps its mean rate and its jitter (the next
# probe is scheduled from the last one's due time, not its send time). At
# the production rate of 1/s the cap decides, as it did before.
BATCH_SHARE = 0.5
MAX_BATCH_S = 0.050
IDLE_WAIT_S = 0.2  # longest sleep: how soon a stop or new targets are seen
UDP_IP_OVERHEAD = 28  # UDP 8 + IPv4 20: what a datagram's payload leaves of the MTU
# A UDP datagram's bytes on the interface beyond its payload: those and
# Ethernet's 14 (what the netdev byte counters count); for the agent's own
# traffic, taken out of the counters skeleton inference reads.
WIRE_OVERHEAD = UDP_IP_OVERHEAD + 14
USER, KERNEL, HARDWARE = "user", "kernel", "hardware"
# Replies a responder socket may hold waiting for their send stamps; past
# it they are given up (their replies' own dwell stands).
MAX_UNSTAMPED = 4096
# How long a prober holds a reply read without its follow-up. A busy
# interpreter at the responder holds the follow-up for one of CPython's
# switch intervals (5 ms) at each of its socket calls between probe and
# follow-up: with a pure-Python thread spinning beside the responder, 8-13 %
# of follow-ups came more than 20 ms after their reply (bench/fidelity.py
# --gil-load). Records of an old responder's replies come this much later;
# their RTTs do not change.
FOLLOW_UP_WAIT_S = 0.100


def _open(ip: str, port: int, tx: bool = True, busy_poll_us: int = 0, dscp: int = 0
          ) -> tuple[socket.socket, bool]:
    """A bound UDP socket, and whether the kernel stamps it (SO_TIMESTAMPING;
    otherwise receive stamps only, SO_TIMESTAMPNS). `tx`: stamp sends too
    (the prober; a responder would only fill its error queue).
    `busy_poll_us`: SO_BUSY_POLL, the device queue polled this long on a read
    that finds nothing (0: off; raising it needs CAP_NET_ADMIN, and a
    refusal is logged, not raised: probing goes on without it).
    `dscp`: the class every packet from it carries (IP TOS, ECN bits 0)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if dscp:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    if busy_poll_us > 0:
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_BUSY_POLL, busy_poll_us)
        except OSError as e:
            log.warning("busy polling on %s refused: %s", ip, e)
    flags = TIMESTAMPING_FLAGS if tx else TIMESTAMPING_FLAGS & ~(_TX_SOFTWARE | _TX_HARDWARE)
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
        stamped = True
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        stamped = False
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.bind((ip, port))
    s.setblocking(False)
    return s, stamped


def _stamps(anc: list[tuple[int, int, bytes]]) -> tuple[int, int]:
    """The kernel's times (ns) in ancillary data: its software stamp and a
    NIC's raw hardware stamp, 0 where absent. The two clocks differ: only
    stamps of one clock are ever subtracted."""
    software = hardware = 0
    for level, kind, payload in anc:
        if level != socket.SOL_SOCKET:
            continue
        if kind == SO_TIMESTAMPING and len(payload) >= _SCM_TIMESTAMPING.size:
            s0, n0, _, _, s2, n2 = _SCM_TIMESTAMPING.unpack_from(payload)
            hardware = s2 * 1_000_000_000 + n2
            software = s0 * 1_000_000_000 + n0
        elif kind == SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(payload)
            software = sec * 1_000_000_000 + nsec
    return software, hardware


# A received datagram: (data, source address, kernel stamp, hardware stamp,
# user time when read; ns, 0 where absent).
Received = tuple[bytes, tuple[str, int], int, int, int]


def _recv(s: socket.socket) -> Received | None:
    """One datagram with its receive times; None when drained."""
    try:
        data, anc, _flags, addr = s.recvmsg(_MAX_DATAGRAM, _ANCILLARY)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as e:  # ICMP errors surface here (ECONNREFUSED): not ours to raise
        log.debug("recv error: %s", e)
        return b"", ("", 0), 0, 0, time.time_ns()
    return (data, addr, *_stamps(anc), time.time_ns())


def _tx_stamps(s: socket.socket, most: int = -1) -> list[tuple[bytes, int, int]]:
    """Drain the error queue (at most `most` entries, if not negative): each
    sent packet the kernel stamped, with its kernel and hardware stamps.
    The packet comes back (its first _TX_PEEK bytes: lower headers and
    ours), so it is matched by its own header, not by a send counter that a
    failed send would put out of step (read once per probe sent)."""
    out: list[tuple[bytes, int, int]] = []
    ip, recverr = socket.IPPROTO_IP, _IP_RECVERR
    while most < 0 or len(out) < most:
        try:
            data, anc, _flags, _addr = s.recvmsg(_TX_PEEK, _ERR_ANCILLARY, socket.MSG_ERRQUEUE)
        except (BlockingIOError, InterruptedError):
            return out
        except OSError as e:
            log.debug("error queue: %s", e)
            return out
        origin = 0
        for level, kind, payload in anc:
            if level == ip and kind == recverr and len(payload) >= _EXTENDED_ERR.size:
                origin = payload[_EE_ORIGIN_AT]
        software, hardware = _stamps(anc)
        if origin == _EE_ORIGIN_TIMESTAMPING and (software or hardware):
            out.append((data, software, hardware))
    return out


def follow_up_dwell(rx_kernel: int, rx_hardware: int, tx_kernel: int, tx_hardware: int
                    ) -> int | None:
    """A responder's dwell (ns) from its stamps of a probe's receipt and of
    its reply's send: both on the NIC's clock where it took both, else both
    on the kernel's; None where no clock has both (a NIC that stamps sends
    in hardware but missed this receipt leaves no software send stamp
    either), or where they run backwards: the reply's own dwell stands."""
    if tx_hardware and rx_hardware:
        dwell = tx_hardware - rx_hardware
    elif tx_kernel and rx_kernel:
        dwell = tx_kernel - rx_kernel
    else:
        return None
    return dwell if dwell >= 0 else None


class SourceLimit:
    """Per-source token buckets (a source: a prober's address and the local
    endpoint it probes): a source may burst `burst` probes, then
    `rate` a second. The responder is a UDP echo anyone can reach, so a
    forged source must not turn it into a flood (the reply is never larger
    than the probe, and never more frequent than this). Sources are kept
    LRU-bounded: spoofing many addresses costs memory that does not grow."""

    def __init__(self, rate: float = 500.0, burst: float = 1000.0, sources: int = 65536) -> None:
        self.rate, self.burst, self.sources = rate, burst, sources
        self._buckets: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()

    def allow(self, source: Hashable, now: float) -> bool:
        tokens, last = self._buckets.pop(source, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        ok = tokens >= 1.0
        self._buckets[source] = (tokens - 1.0 if ok else tokens, now)
        if len(self._buckets) > self.sources:
            self._buckets.popitem(last=False)
        return ok


# A responder socket's replies sent whose send stamp is not read yet: probe
# key -> (kernel receive stamp, hardware receive stamp, prober's address).
_Unstamped = dict[wire.Key, tuple[int, int, tuple[str, int]]]


class Responder:
    """Echoes well-formed probes on every endpoint address, each source
    within its rate; then sends each reply's follow-up with its dwell from
    kernel stamps (probe_agent/wire.py). A follow-up is header-sized, so a
    forged source gets at most one probe's bytes plus 36 back per probe, at
    its rate."""

    def __init__(self, addresses: Iterable[str], port: int,
                 limit: SourceLimit | None = None, busy_poll_us: int = 0,
                 dscp: int = 0) -> None:
        self.limit = limit or SourceLimit()
        # Receive stamps on the socket; a send stamp is asked for per reply
        # (not for the follow-ups: their stamps would only fill the queue).
        opened: list[tuple[socket.socket, bool]] = []
        for ip in addresses:
            try:
                opened.append(_open(ip, port, tx=False, busy_poll_us=busy_poll_us, dscp=dscp))
            except OSError as e:  # the port taken, or an endpoint address not on this host
                for sock, _ in opened:
                    sock.close()
                raise InputError(f"probe port {ip}:{port}: {e.strerror or e}") from None
        self.sockets = [sock for sock, _ in opened]
        # Kernel stamps on every socket: else replies only, no follow-ups.
        self.stamped = all(stamped for _, stamped in opened)
        # Bytes of probing traffic per local address, [sent, received]:
        # replies and follow-ups out, probes in (every datagram to the port).
        self.own_bytes = {ip: [0, 0] for ip in addresses}
        self.port = self.sockets[0].getsockname()[1] if self.sockets else port
        self._sel = selectors.DefaultSelector()
        for s in self.sockets:
            self._sel.register(s, selectors.EVENT_READ)
        self.garbage = 0
        # Replies whose send stamp is not read yet, per socket. A software
        # stamp is queued before the send returns; a hardware
        # one may come later, and its arrival wakes the selector.
        self._unstamped: dict[socket.socket, _Unstamped] = {s: {} for s in self.sockets}

    def serve(self, stop: threading.Event) -> None:
        local = {s: s.getsockname()[0] for s in self.sockets}
        stamp_it = [(socket.SOL_SOCKET, SO_TIMESTAMPING, _TX_FLAGS.pack(REPLY_STAMP))]
        while not stop.is_set():
            for key, _ in self._sel.select(timeout=IDLE_WAIT_S):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                answered = 0
                own = self.own_bytes[local[sock]]
                unstamped = self._unstamped[sock]
                while (got := _recv(sock)) is not None:
                    data, addr, t_kernel, t_hardware, t_user = got
                    own[1] += len(data) + WIRE_OVERHEAD
                    t_rx = t_kernel or t_user
                    if not data:
                        continue
                    if not wire.is_probe(data):
                        self.garbage += 1
                        metrics.PROBES_REFUSED.labels(reason="malformed").inc()
                        continue
                    # Per source and local endpoint: one prober's probes to
                    # this endpoint are one pair's, at the pair's rate.
                    if not self.limit.allow((addr[0], local[sock]), t_rx / 1e9):
                        metrics.PROBES_REFUSED.labels(reason="rate").inc()
                        continue
                    reply = wire.reply_to(data, time.time_ns() - t_rx)
                    stamped = self.stamped and t_kernel > 0
                    if not self._reply(sock, reply, addr, stamp_it if stamped else None):
                        continue
                    own[0] += len(reply) + WIRE_OVERHEAD
                    answered += 1
                    if stamped and self.stamped:
                        unstamped[wire.probe_key(data)] = (t_kernel, t_hardware, addr)
                if answered:
                    metrics.PROBES_ANSWERED.inc(answered)
                if self.stamped:
                    self._follow_up(sock, unstamped, own)

    def _reply(self, sock: socket.socket, reply: bytes | bytearray, addr: tuple[str, int],
               stamp_it: list[tuple[int, int, bytes]] | None) -> bool:
        """Send one reply, its send stamp asked for if `stamp_it`; whether it
        left. A kernel that refuses the per-send stamp gets the reply
        without it, and no follow-ups from then on."""
        try:
            if stamp_it is None:
                sock.sendto(reply, addr)
            else:
                sock.sendmsg([reply], stamp_it, 0, addr)
            return True
        except OSError as e:
            if stamp_it is not None and e.errno == errno.EINVAL:
                log.warning("the kernel stamps no single send (%s): replies carry their own "
                            "dwell, without follow-ups", e)
                self.stamped = False
                return self._reply(sock, reply, addr, None)
            log.debug("reply to %s failed: %s", addr, e)
            return False

    def _follow_up(self, sock: socket.socket, unstamped: _Unstamped, own: list[int]) -> None:
        """Send the follow-up of every reply whose send stamp came back. As
        many stamps are read as replies wait for one (no read that finds
        the queue empty); at least one, so a stray stamp is read too."""
        for data, software, hardware in _tx_stamps(sock, most=max(1, len(unstamped))):
            key = wire.sent_fields(data, wire.KIND_REPLY)
            entry = unstamped.pop(key, None) if key is not None else None
            if key is None or entry is None:
                continue
            rx_kernel, rx_hardware, addr = entry
            dwell = follow_up_dwell(rx_kernel, rx_hardware, software, hardware)
            if dwell is None:
                continue
            packet = wire.follow_up(key, dwell)
            try:
                sock.sendto(packet, addr)
                own[0] += len(packet) + WIRE_OVERHEAD
            except OSError as e:
                log.debug("follow-up to %s failed: %s", addr, e)
        if len(unstamped) > MAX_UNSTAMPED:  # stamps that never came: their replies stand
            unstamped.clear()

    def close(self) -> None:
        self._sel.close()
        for s in self.sockets:
            s.close()


@dataclass(frozen=True)
class ProbeTarget:
    src: str
    dst: str
    dst_ip: str
    dst_port: int


# A probe sent: (src, dst, size, t_send_s, flow); a reply: (src, dst, size,
# t_send_s, rtt_us, flow, clock); `flow`: the probe's flow within its pair
# (the UDP source port it left from), `clock`: of this RTT (USER, KERNEL or
# HARDWARE). The prober hands them over once per wake-up, a list at a time:
# one call and one lock per batch, not per probe (bench/agent_overhead.py).
Sent = tuple[str, str, int, float, int]
Reply = tuple[str, str, int, float, float, int, str]
SentHook = Callable[[list[Sent]], None]
ReplyHook = Callable[[list[Reply]], None]


class Prober:
    """Sends probes to the active targets of every local endpoint.

    Each endpoint probes from `flows` sockets, one UDP source port each, so
    a pair's probes take as many 5-tuples and spread over the ECMP paths the
    job's own flows take; a target's probes cycle through the flows, each
    flow through every size. The flow travels with each probe's record and
    is what the route tracer follows (probe_agent/flowtrace.py)."""

    def __init__(self, sources: dict[str, str], sizes: dict[str, tuple[int, ...]],
                 rate_hz: float, timeout_s: float, on_sent: SentHook, on_reply: ReplyHook,
                 rng: random.Random | None = None, kernel_tx: bool = True,
                 busy_poll_us: int = 0, flows: int = 1,
                 on_trace_reply: Callable[[int], None] | None = None, dscp: int = 0) -> None:
        if flows < 1:
            raise ValueError("flows must be at least 1")
        # kernel_tx False: the send stamp is user time before sendto, as
        # ping's is (bench/fidelity.py compares the two definitions).
        self.kernel_tx = kernel_tx
        opened = {ep: [_open(ip, 0, tx=kernel_tx, busy_poll_us=busy_poll_us, dscp=dscp)
                       for _ in range(flows)] for ep, ip in sources.items()}
        self.flow_sockets = {ep: [sock for sock, _ in socks] for ep, socks in opened.items()}
        self.flows = {ep: tuple(sock.getsockname()[1] for sock in socks)
                      for ep, socks in self.flow_sockets.items()}
        self.kernel_stamps = all(stamped for socks in opened.values() for _, stamped in socks)
        # Trace packets are probes under their own token: their replies say
        # the trace reached the target and are handed to `on_trace_reply`.
        self.trace_token = int.from_bytes(os.urandom(8), "big")
        self.on_trace_reply = on_trace_reply
        self.sizes = sizes
        self._lock = threading.Lock()
        self.set_rate(rate_hz)
        self.timeout_s = timeout_s
        self.on_sent = on_sent
        self.on_reply = on_reply
        self.rng = rng or random.Random()
        self.token = int.from_bytes(os.urandom(8), "big")
        self._sel = selectors.DefaultSelector()
        for ep, socks in self.flow_sockets.items():
            for sock in socks:
                self._sel.register(sock, selectors.EVENT_READ, ep)
        # Bytes of this prober's own traffic per endpoint, [sent, received]
        # (probes out, replies in; traces apart: another thread sends them).
        self.own_bytes = {ep: [0, 0] for ep in sources}
        self.own_trace_bytes = dict.fromkeys(sources, 0)
        self._targets: dict[tuple[str, str], ProbeTarget] = {}
        self._heap: list[tuple[float, int, tuple[str, str]]] = []
        self._count: dict[tuple[str, str], int] = {}
        self._seq = 0
        # seq -> [target key, size, t_send_ns (user, as in the packet),
        #         kernel send stamp, hardware send stamp (0 until read back), flow]
        self._inflight: dict[int, list[Any]] = {}
        # Replies read and not yet settled: seq -> (in-flight entry, the
        # reply's dwell, kernel, hardware and user receive times); follow-ups
        # read: seq -> (t_send_ns, dwell, user time read).
        self._unsettled: dict[int, tuple[list[Any], int, int, int, int]] = {}
        self._follow_ups: dict[int, tuple[int, int, int]] = {}
        self.timestamping = USER  # the clock of the last RTT: hardware, kernel or user
        # The hot path builds no per-probe objects: one packet buffer per
        # size rewritten in place, metric children looked up once.
        self._buffers = {s: wire.probe_buffer(s) for ss in sizes.values() for s in ss}
        self._m_sent = {s: metrics.PROBES_SENT.labels(proto="udp", size=str(s))
                        for s in self._buffers}
        self._m_rtt = {ep: metrics.PROBE_RTT.child(ep) for ep in sources}  # retired by close
        self._closed = False
        self._m_clock = {c: metrics.PROBE_STAMPS.labels(clock=c) for c in (USER, KERNEL, HARDWARE)}
        self._m_followed = metrics.PROBE_DWELLS.labels(source="follow_up")
        self._m_unfollowed = metrics.PROBE_DWELLS.labels(source="reply")

    def set_rate(self, rate_hz: float) -> None:
        """Probes per second per target from now on (a reloaded setting):
        each target's next probe keeps its time, the ones after follow the
        new interval."""
        if not rate_hz > 0:
            raise ValueError("probe rate must be positive")
        with self._lock:
            self.interval = 1.0 / rate_hz
            self.batch_s = min(BATCH_SHARE * self.interval, MAX_BATCH_S)

    def set_targets(self, targets: Iterable[ProbeTarget]) -> None:
        """Replace the probed set; new targets start at a random phase."""
        now = time.monotonic()
        with self._lock:
            new = {(t.src, t.dst): t for t in targets if t.src in self.flow_sockets}
            for k in new:
                if k not in self._targets:
                    heapq.heappush(self._heap, (now + self.rng.uniform(0, self.interval),
                                                self.rng.getrandbits(32), k))
            self._targets = new

    def targets(self) -> list[ProbeTarget]:
        with self._lock:
            return list(self._targets.values())

    def _send_due(self, now: float) -> float:
        """Send what is due within one batch (one wake-up serves several
        probes, inside their jitter); return when the next probe is due."""
        horizon = now + self.batch_s
        due: list[ProbeTarget] = []
        with self._lock:
            heap, targets, rng = self._heap, self._targets, self.rng
            while heap and heap[0][0] <= horizon:
                at, _, key = heapq.heappop(heap)
                target = targets.get(key)
                if target is None:
                    continue  # removed since it was scheduled
                step = self.interval * (1 + rng.uniform(-JITTER, JITTER))
                heapq.heappush(heap, (max(at + step, now), rng.getrandbits(32), key))
                due.append(target)
            next_due = heap[0][0] if heap else now + IDLE_WAIT_S
        if not due:
            return next_due
        sent: list[Sent] = []
        for target in due:
            self._probe(target, sent)
        self.on_sent(sent)
        per_size = dict.fromkeys(self._buffers, 0)
        for event in sent:
            per_size[event[2]] += 1
        for size, n in per_size.items():
            if n:
                self._m_sent[size].inc(n)
        return next_due

    def _probe(self, t: ProbeTarget, sent: list[Sent]) -> None:
        """Send one probe and note it in `sent`."""
        key = (t.src, t.dst)
        n = self._count.get(key, 0)
        self._count[key] = n + 1
        sizes = self.sizes[t.src]
        size = sizes[n % len(sizes)]
        socks = self.flow_sockets[t.src]
        f = (n // len(sizes)) % len(socks)
        flow = self.flows[t.src][f]
        self._seq += 1
        packet = self._buffers[size]
        t_ns = time.time_ns()
        wire.fill_probe(packet, self._seq, self.token, t_ns)
        try:
            socks[f].sendto(packet, (t.dst_ip, t.dst_port))
            self.own_bytes[t.src][0] += size + WIRE_OVERHEAD
        except OSError as e:  # unreachable, no route, buffer full: a lost probe
            log.debug("probe %s -> %s failed: %s", t.src, t.dst, e)
        # Bookkeeping after the send: nothing between the user stamp and it
        # (a reply cannot be read before this thread reads it).
        self._inflight[self._seq] = [key, size, t_ns, 0, 0, flow]
        sent.append((t.src, t.dst, size, t_ns / 1e9, flow))

    def send_trace(self, src: str, flow: int, dst_ip: str, dst_port: int, ttl: int,
                   seq: int) -> None:
        """One trace packet on a flow's own 5-tuple with its IP TTL set for
        this packet alone (ancillary IP_TTL: the probes sent meanwhile on the
        socket keep theirs). Called from the tracer's thread; a failed send
        raises OSError for the tracer to record."""
        sock = self.flow_sockets[src][self.flows[src].index(flow)]
        packet = wire.probe_buffer(wire.MIN_SIZE)
        wire.fill_probe(packet, seq, self.trace_token, time.time_ns())
        sock.sendmsg([packet], [(socket.IPPROTO_IP, socket.IP_TTL, struct.pack("@i", ttl))], 0,
                     (dst_ip, dst_port))
        self.own_trace_bytes[src] += len(packet) + WIRE_OVERHEAD

    def flow_senders(self, src: str, dst_ip: str, dst_port: int
                     ) -> list[tuple[int, Callable[[int, int], None]]]:
        """(flow, send(ttl, seq)) for each of `src`'s flows towards a target:
        what a FlowTracer traces a target's flows with."""
        def sender(flow: int) -> Callable[[int, int], None]:
            return lambda ttl, seq: self.send_trace(src, flow, dst_ip, dst_port, ttl, seq)
        return [(flow, sender(flow)) for flow in self.flows[src]]

    def _sent_stamps(self, sock: socket.socket) -> None:
        """Attach the kernel's send stamps to their probes in flight."""
        for data, software, hardware in _tx_stamps(sock):
            head = wire.sent_fields(data)
            if head is None or head[1] != self.token:
                continue
            entry = self._inflight.get(head[0])
            if entry is not None and entry[2] == head[2]:
                entry[3], entry[4] = software, hardware

    def _receive(self, sock: socket.socket, src: str) -> None:
        """Read the answers waiting on one of `src`'s flow sockets: replies
        (their probes leave the in-flight set) and follow-ups, to be
        settled by `_settle`."""
        replies = []
        token, trace_token = self.token, self.trace_token
        traced = self.on_trace_reply  # once: the tracer may unset it meanwhile
        got_bytes = 0
        while (got := _recv(sock)) is not None:
            got_bytes += len(got[0]) + WIRE_OVERHEAD
            f = wire.answer_fields(got[0])
            if f is None:
                continue
            kind, seq, answer_token, t_send_ns, dwell_ns = f
            if answer_token == token:
                if kind == wire.KIND_REPLY:
                    replies.append((seq, t_send_ns, dwell_ns, got[2], got[3], got[4]))
                else:
                    self._follow_ups[seq] = (t_send_ns, dwell_ns, got[4])
            elif answer_token == trace_token and kind == wire.KIND_REPLY and traced is not None:
                try:
                    traced(seq)
                except Exception as e:  # a trace's bookkeeping must never stop the probing
                    log.warning("trace reply hook failed: %s: %s", type(e).__name__, e)
        self.own_bytes[src][1] += got_bytes
        if self.kernel_stamps and self.kernel_tx:
            self._sent_stamps(sock)  # a send's stamp is queued before its reply can come
        for seq, t_send_ns, dwell_ns, rx_kernel, rx_hardware, rx_user in replies:
            entry = self._inflight.pop(seq, None)
            if entry is not None and entry[2] == t_send_ns:
                self._unsettled[seq] = (entry, dwell_ns, rx_kernel, rx_hardware, rx_user)

    def _settle(self, now_ns: int, final: bool = False) -> list[Reply]:
        """The RTTs of the replies read: with their follow-up's dwell where it
        came; a reply without one waits FOLLOW_UP_WAIT_S after it was read
        (the responder sends it right after the reply, but a busy
        interpreter there can hold it for its switch interval, 5 ms), then
        keeps its own dwell. `final`: nothing waits (the prober stops)."""
        out: list[Reply] = []
        clocks = dict.fromkeys((USER, KERNEL, HARDWARE), 0)
        followed = 0
        follow_ups = self._follow_ups
        waited = now_ns - int(FOLLOW_UP_WAIT_S * 1e9)  # read before this: waited enough
        for seq, (entry, dwell_ns, rx_kernel, rx_hardware, rx_user) in list(
                self._unsettled.items()):
            better = follow_ups.pop(seq, None)
            if better is not None and better[0] == entry[2]:
                dwell_ns = better[1]
                followed += 1
            elif rx_user > waited and not final:
                continue
            del self._unsettled[seq]
            (src, dst), size, tx_user, tx_kernel, tx_hardware, flow = entry
            # One clock at both ends, the most exact both have. Ping's
            # definition (kernel_tx False): user send, kernel receive.
            if not self.kernel_tx:
                clock, t_sent, t_got = USER, tx_user, rx_kernel or rx_user
            elif tx_hardware and rx_hardware:
                clock, t_sent, t_got = HARDWARE, tx_hardware, rx_hardware
            elif tx_kernel and rx_kernel:
                clock, t_sent, t_got = KERNEL, tx_kernel, rx_kernel
            else:  # read late (replies wait for the next batch): an upper bound
                clock, t_sent, t_got = USER, tx_user, rx_user
            rtt_us = (t_got - t_sent - dwell_ns) / 1e3
            self.timestamping = clock
            clocks[clock] += 1
            out.append((src, dst, size, tx_user / 1e9, rtt_us, flow, clock))
            self._m_rtt[src].observe(rtt_us)
        # A follow-up whose reply was lost, or came after it was settled.
        for seq in [q for q, f in follow_ups.items() if f[2] <= waited or final]:
            del follow_ups[seq]
        for clock, n in clocks.items():
            if n:
                self._m_clock[clock].inc(n)
        if followed:
            self._m_followed.inc(followed)
        if len(out) > followed:
            self._m_unfollowed.inc(len(out) - followed)
        return out

    def _expire(self, now_ns: int) -> None:
        limit = now_ns - int(self.timeout_s * 1e9)
        stale = [s for s, entry in self._inflight.items() if entry[2] < limit]
        for s in stale:
            size = self._inflight.pop(s)[1]
            metrics.PROBES_LOST.labels(proto="udp", size=str(size)).inc()

    def run(self, stop: threading.Event) -> None:
        """Each wake-up: read the replies waiting (before expiring, so a
        reply that came in time counts), send the batch due, sleep until the
        next one. Sleeping is a plain timed sleep, not a wait on the
        sockets: a reply must not wake the prober."""
        last_expire = 0.0
        while not stop.is_set():
            now = time.monotonic()
            for key, _ in self._sel.select(timeout=0):
                self._receive(key.fileobj, key.data)  # type: ignore[arg-type]
            replies = self._settle(time.time_ns())
            if replies:
                self.on_reply(replies)
            next_due = self._send_due(now)
            if now - last_expire > 0.5:
                self._expire(time.time_ns())
                last_expire = now
            time.sleep(max(0.0, min(next_due - time.monotonic(), IDLE_WAIT_S)))
        replies = self._settle(time.time_ns(), final=True)
        if replies:
            self.on_reply(replies)

    def close(self) -> None:
        self._sel.close()
        if not self._closed:  # a reply read after this is not counted: the prober is done
            for src, counts in self._m_rtt.items():
                metrics.PROBE_RTT.retire(src, counts)
        self._closed = True
        for socks in self.flow_sockets.values():
            for s in socks:
                s.close()
