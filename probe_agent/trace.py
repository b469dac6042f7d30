"""Underlay route tracing, Paris style: one fixed UDP 5-tuple, TTL raised hop
by hop, so every probe hashes onto the same ECMP path the flow takes.

Routers' ICMP time-exceeded replies come back on the sending socket's error
queue (IP_RECVERR, as tracepath does), so no raw socket and no NET_RAW is
needed. The agent lives in the container's namespace, but the underlay is
the host's: the socket is opened inside the host namespace (setns on one
thread, then back) and keeps working there after the thread returns.

Failures are results: a hop that does not answer is None, a trace that
cannot start returns an empty route and says why."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

IP_RECVERR = 11
SO_EE_ORIGIN_ICMP = 2
ICMP_TIME_EXCEEDED = 11
ICMP_DEST_UNREACH = 3
CLONE_NEWNET = 0x40000000
TRACE_DPORT = 33434  # classic traceroute port: nothing listens, the target answers unreachable
_EE = struct.Struct("=IBBBBII")  # struct sock_extended_err


@dataclass(frozen=True)
class Trace:
    src_ip: str
    dst_ip: str
    hops: tuple[str | None, ...]  # router addresses in order; None: no answer
    reached: bool                  # the destination itself answered
    error: str = ""
    tunnel_sport: int = 0          # flow traces through a tunnel: its source port (flowtrace)

    def route(self, names: dict[str, str]) -> str:
        """Switch ids joined by '>' (contract section 3), or '' unless every
        router on the way answered and is known: a partial route would
        accuse the wrong links."""
        if not self.reached or self.error:
            return ""
        ids = [names.get(h or "") for h in self.hops]
        if not ids or any(i is None for i in ids):
            return ""
        return ">".join(i for i in ids if i is not None)


@contextlib.contextmanager
def in_netns(path: str | None) -> Iterator[None]:
    """This thread in the network namespace at `path`, for the block only.
    setns moves the calling thread alone, so threads need no lock between
    them; threads started inside the block start in `path` too."""
    if not path:
        yield
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {path}: {os.strerror(e)}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:  # pragma: no cover - cannot fail back
                e = ctypes.get_errno()
                raise OSError(e, f"setns back: {os.strerror(e)}")
    finally:
        os.close(target)
        os.close(home)


def open_socket(src_ip: str, sport: int, netns: str | None) -> socket.socket:
    """A UDP socket bound to the NIC's address in the namespace that owns it."""
    with in_netns(netns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_IP, IP_RECVERR, 1)
        s.bind((src_ip, sport))
    except OSError:
        s.close()
        raise
    return s


def _read_error(s: socket.socket) -> tuple[int, int, str] | None:
    """(icmp type, code, offender address) of one queued ICMP error."""
    try:
        _, anc, _, _ = s.recvmsg(512, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None
    for level, kind, data in anc:
        if level != socket.SOL_IP or kind != IP_RECVERR or len(data) < _EE.size + 8:
            continue
        _errno, origin, icmp_type, icmp_code, _pad, _info, _data = _EE.unpack_from(data)
        if origin != SO_EE_ORIGIN_ICMP:
            continue
        family, = struct.unpack_from("=H", data, _EE.size)
        if family != socket.AF_INET:
            continue
        addr = socket.inet_ntoa(data[_EE.size + 4:_EE.size + 8])
        return icmp_type, icmp_code, addr
    return None


def trace(src_ip: str, dst_ip: str, sport: int = 0, dport: int = TRACE_DPORT,
          max_hops: int = 8, timeout_s: float = 0.5, netns: str | None = None) -> Trace:
    """Hop addresses from src_ip's namespace to dst_ip over one 5-tuple."""
    try:
        s = open_socket(src_ip, sport, netns)
    except OSError as e:
        return Trace(src_ip, dst_ip, (), False, error=str(e))
    hops: list[str | None] = []
    try:
        s.connect((dst_ip, dport))
        for ttl in range(1, max_hops + 1):
            s.setsockopt(socket.SOL_IP, socket.IP_TTL, ttl)
            try:
                s.send(b"netskel-trace")
            except OSError as e:
                if e.errno not in (errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.ENETUNREACH):
                    raise
                # An earlier probe's error surfaced on send: the queue below has it.
            answer = _await_error(s, timeout_s)
            if answer is None:
                hops.append(None)
                continue
            icmp_type, _code, addr = answer
            if icmp_type == ICMP_DEST_UNREACH and addr == dst_ip:
                return Trace(src_ip, dst_ip, tuple(hops), True)
            hops.append(addr)
            if icmp_type != ICMP_TIME_EXCEEDED:  # a router refused: the trace ends there
                return Trace(src_ip, dst_ip, tuple(hops), False,
                             error=f"ICMP type {icmp_type} from {addr}")
        return Trace(src_ip, dst_ip, tuple(hops), False, error=f"not reached in {max_hops} hops")
    except OSError as e:
        return Trace(src_ip, dst_ip, tuple(hops), False, error=str(e))
    finally:
        s.close()


def _await_error(s: socket.socket, timeout_s: float) -> tuple[int, int, str] | None:
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    poller.register(s.fileno(), select.POLLERR)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if poller.poll(left * 1000):
            got = _read_error(s)
            if got is not None:
                return got


def trace_all(pairs: Sequence[tuple[str, str]], netns: str | None, stop: threading.Event,
              gap_s: float = 0.05, max_hops: int = 8, timeout_s: float = 0.5
              ) -> dict[tuple[str, str], Trace]:
    """Each distinct (src NIC, dst NIC) once, spaced out so the routers'
    ICMP rate limits and the probed links see a trickle."""
    out: dict[tuple[str, str], Trace] = {}
    for src, dst in dict.fromkeys(pairs):
        if stop.is_set():
            break
        out[(src, dst)] = trace(src, dst, max_hops=max_hops, timeout_s=timeout_s, netns=netns)
        stop.wait(gap_s)
    return out
