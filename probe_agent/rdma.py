"""RDMA probing through pyverbs, used where an RDMA device exists.

Why UD queue pairs: one unconnected queue pair per endpoint reaches every
target (an address handle per target and flow), as R-Pingmesh probes, so a
thousand targets cost no thousand connections. The flow label of each
address handle sets the RoCEv2 UDP source port, so a pair's flows take the
ECMP paths its training traffic takes. Times come from the completion
queue: the NIC's wall-clock completion stamps where the device offers them
(`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`), else the host's
monotonic clock at post and at poll; both ends of an RTT always use one
clock. The responder's dwell (its receive completion to its reply's post)
travels in the reply, as the UDP responder's does.

Where there is no device (or no pyverbs) `rdma_availability` says why and
the agent probes over UDP: nothing here ever invents a result.

The probe is the UDP probe's packet (probe_agent/wire.py) followed by the
sender's GID and QPN, so the responder can address its reply."""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.registration import gid_bytes
from probe_agent import wire

log = logging.getLogger(__name__)

QKEY = 0x4E534B31  # "NSK1": only our probes are accepted by our queue pairs
GRH_SIZE = 40  # a UD receive buffer starts with the packet's global route header
_RETURN = struct.Struct("!16sI")  # the sender's GID (raw) and QPN, after the wire header
MIN_SIZE = wire.HEADER_SIZE + _RETURN.size
SYS_INFINIBAND = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class RdmaAvailability:
    available: bool
    reason: str
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class RdmaAddress:
    """Where an endpoint's queue pair answers: registered with the controller
    and handed to the endpoint's probers in their ping lists."""

    gid: str  # 8 groups of 4 hex digits, as pyverbs prints a GID
    qpn: int


def rdma_availability() -> RdmaAvailability:
    try:
        from pyverbs import device as d
    except ImportError as e:
        return RdmaAvailability(False, f"pyverbs is not installed ({e}); install rdma-core's "
                                       "python3-pyverbs")
    try:
        devices = d.get_device_list()
    except Exception as e:  # pyverbs raises its own PyverbsRDMAError without a device
        return RdmaAvailability(False, f"no RDMA device: {e}")
    if not devices:
        return RdmaAvailability(False, "no RDMA device found")
    names = tuple(dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                  for dev in devices)
    return RdmaAvailability(True, "ok", names)


def device_of_interface(ifname: str, sys_net: Path = Path("/sys/class/net")) -> str | None:
    """The RDMA device behind a network interface (a VF's or a Soft-RoCE
    link's), from sysfs; None when the interface has none."""
    dev = sys_net / ifname / "device" / "infiniband"
    try:
        names = sorted(os.listdir(dev))
    except OSError:
        names = []
    if names:
        return names[0]
    # Soft-RoCE devices have no PCI parent: match their netdev by name.
    try:
        for name in sorted(os.listdir(SYS_INFINIBAND)):
            parent = SYS_INFINIBAND / name / "parent"
            if parent.exists() and parent.read_text().strip() == ifname:
                return name
    except OSError:
        pass
    return None


def gid_str(raw: bytes) -> str:
    h = raw.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def flow_label(seq: int, flows: int) -> int:
    """A non-zero 20-bit flow label per flow: RoCEv2 NICs derive the UDP
    source port from it, which is what ECMP hashes."""
    return 0x1000 + (seq % max(1, flows)) * 0x101


@dataclass
class _Pending:
    dst: str
    size: int
    t_post: int  # monotonic ns at post
    flow: int = 0  # its flow label: the flow it took
    t_tx: int | None = None  # completion stamp of the send, when polled


@dataclass
class RdmaPinger:
    """One UD queue pair on one device port: sends probes and answers
    others' probes. Single-threaded: `poll` drives both directions."""

    device: str
    on_sent: Callable[[str, str, int, float, int], None]
    on_reply: Callable[[str, str, int, float, float, int], None]
    src: str = ""
    port: int = 1
    gid_index: int = 0
    depth: int = 256
    max_size: int = 4096
    flows: int = 4
    _v: dict[str, Any] = field(default_factory=dict, repr=False)
    _pending: dict[int, _Pending] = field(default_factory=dict, repr=False)
    _ahs: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False)
    _seq: int = 0
    _slot: int = 0
    _token: int = 0
    hw_clock: bool = False

    def open(self) -> RdmaAddress:
        """Open the device, queue pair and buffers; the address to register."""
        import pyverbs.enums as e
        from pyverbs.cq import CQEX, CqInitAttrEx
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        ctx = Context(name=self.device)
        pd = PD(ctx)
        stamped = e.IBV_WC_STANDARD_FLAGS | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
        try:
            cq = CQEX(ctx, CqInitAttrEx(cqe=2 * self.depth, wc_flags=stamped))
            self.hw_clock = True
        except Exception as exc:  # the device has no wall-clock completion stamps
            log.info("%s: no completion wall clock (%s); host clock at post and poll",
                     self.device, exc)
            cq = CQEX(ctx, CqInitAttrEx(cqe=2 * self.depth, wc_flags=e.IBV_WC_STANDARD_FLAGS))
        cap = QPCap(max_send_wr=self.depth, max_recv_wr=self.depth, max_send_sge=1,
                    max_recv_sge=1)
        attr = QPAttr(port_num=self.port)
        attr.qkey = QKEY
        attr.pkey_index = 0
        # pyverbs moves a UD queue pair to ready-to-send when given attributes.
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap), attr)
        slot = GRH_SIZE + self.max_size
        recv_mr = MR(pd, slot * self.depth, e.IBV_ACCESS_LOCAL_WRITE)
        send_mr = MR(pd, self.max_size * self.depth, e.IBV_ACCESS_LOCAL_WRITE)
        gid = str(ctx.query_gid(self.port, self.gid_index))
        self._v = {"e": e, "ctx": ctx, "pd": pd, "cq": cq, "qp": qp, "recv_mr": recv_mr,
                   "send_mr": send_mr, "slot": slot, "gid": gid}
        for i in range(self.depth):
            self._post_recv(i)
        self._token = int.from_bytes(os.urandom(8), "big")
        return RdmaAddress(gid=gid, qpn=int(qp.qp_num))

    def close(self) -> None:
        for key in ("qp", "cq", "recv_mr", "send_mr"):
            obj = self._v.get(key)
            if obj is not None:
                obj.close()
        self._ahs.clear()
        pd, ctx = self._v.get("pd"), self._v.get("ctx")
        if pd is not None:
            pd.close()
        if ctx is not None:
            ctx.close()
        self._v = {}

    # -- sending ------------------------------------------------------------
    def _post_recv(self, i: int) -> None:
        from pyverbs.wr import SGE, RecvWR

        v = self._v
        sge = SGE(v["recv_mr"].buf + i * v["slot"], v["slot"], v["recv_mr"].lkey)
        v["qp"].post_recv(RecvWR(wr_id=i, num_sge=1, sg=[sge]))

    def _ah(self, gid: str, label: int) -> Any:
        ah = self._ahs.get((gid, label))
        if ah is None:
            from pyverbs.addr import AH, GID, AHAttr, GlobalRoute

            gr = GlobalRoute(dgid=GID(gid), sgid_index=self.gid_index, flow_label=label,
                             hop_limit=64)
            ah = AH(self._v["pd"], attr=AHAttr(port_num=self.port, is_global=1, gr=gr))
            self._ahs[(gid, label)] = ah
        return ah

    def _post_send(self, data: bytes, to: RdmaAddress, label: int, wr_id: int) -> None:
        from pyverbs.wr import SGE, SendWR

        v = self._v
        # Send buffers in turn: one is reused only after depth - 1 later sends
        # (the prober polls completions every few dozen posts).
        self._slot = slot = (self._slot + 1) % self.depth
        v["send_mr"].write(data, len(data), slot * self.max_size)
        wr = SendWR(wr_id=wr_id, num_sge=1,
                    sg=[SGE(v["send_mr"].buf + slot * self.max_size, len(data),
                            v["send_mr"].lkey)])
        wr.set_wr_ud(self._ah(to.gid, label), to.qpn, QKEY)
        v["qp"].post_send(wr)

    def probe(self, dst: str, to: RdmaAddress, size: int) -> None:
        """Send one probe; a failed post is a lost probe, never raised."""
        size = max(MIN_SIZE, min(size, self.max_size))
        self._seq += 1
        seq = self._seq
        now = time.monotonic_ns()
        p = wire.Probe(kind=wire.KIND_PROBE, size=size, seq=seq, token=self._token, t_send_ns=now)
        me = RdmaAddress(self._v["gid"], int(self._v["qp"].qp_num))
        data = bytearray(wire.encode(p))
        _RETURN.pack_into(data, wire.HEADER_SIZE, gid_bytes(me.gid), me.qpn)
        label = flow_label(seq, self.flows)
        self._pending[seq] = _Pending(dst=dst, size=size, t_post=now, flow=label)
        self.on_sent(self.src, dst, size, time.time(), label)
        try:
            self._post_send(bytes(data), to, label, seq << 1)
        except Exception as exc:
            log.debug("rdma probe to %s not posted: %s", dst, exc)
            self._pending.pop(seq, None)

    # -- completions --------------------------------------------------------
    def _stamp(self, cq: Any) -> int:
        return int(cq.read_completion_wallclock_ns()) if self.hw_clock else time.monotonic_ns()

    def poll(self, timeout_s: float) -> None:
        """Handle completions for up to timeout_s: answer probes, match
        replies, forget probes older than their timeout (the window
        accumulator counts them lost)."""
        from pyverbs.cq import PollCqAttr

        v = self._v
        cq, e = v["cq"], v["e"]
        end = time.monotonic() + timeout_s
        while True:
            ret = cq.start_poll(PollCqAttr())
            if ret == errno.ENOENT:
                if time.monotonic() >= end:
                    return
                time.sleep(0.0002)
                continue
            try:
                while ret == 0:
                    self._completion(cq, e)
                    ret = cq.poll_next()
            finally:
                cq.end_poll()

    def _completion(self, cq: Any, e: Any) -> None:
        wr_id, ok = int(cq.wr_id), cq.status == e.IBV_WC_SUCCESS
        stamp = self._stamp(cq)
        if cq.read_opcode() != e.IBV_WC_RECV:  # our send finished
            pending = self._pending.get(wr_id >> 1) if not wr_id & 1 else None
            if pending is not None:
                if ok:
                    pending.t_tx = stamp
                else:
                    self._pending.pop(wr_id >> 1, None)
            return
        slot, polled = wr_id, time.monotonic_ns()
        data = self._v["recv_mr"].read(GRH_SIZE + self.max_size,
                                       slot * self._v["slot"])[GRH_SIZE:]
        self._post_recv(slot)
        if not ok:
            return
        head = wire.header(data)
        if head is None:
            return
        if head.kind == wire.KIND_PROBE and len(data) >= MIN_SIZE:
            raw_gid, qpn = _RETURN.unpack_from(data, wire.HEADER_SIZE)
            reply = bytearray(data[:head.size])
            to = RdmaAddress(gid_str(raw_gid), qpn)
            dwell = time.monotonic_ns() - polled
            reply[:wire.HEADER_SIZE] = wire.reply_to(bytes(reply[:wire.HEADER_SIZE]),
                                                     dwell)[:wire.HEADER_SIZE]
            try:
                self._post_send(bytes(reply), to, flow_label(head.seq, self.flows),
                                (head.seq << 1) | 1)
            except Exception as exc:
                log.debug("rdma reply not posted: %s", exc)
        elif head.kind == wire.KIND_REPLY and head.token == self._token:
            pending = self._pending.pop(head.seq, None)
            if pending is None:
                return
            t_tx = pending.t_tx if pending.t_tx is not None and self.hw_clock else pending.t_post
            t_rx = stamp if self.hw_clock else polled
            rtt_us = max(0.0, (t_rx - t_tx - head.dwell_ns) / 1000.0)
            self.on_reply(self.src, pending.dst, pending.size, time.time(), rtt_us, pending.flow)

    def expire(self, timeout_s: float) -> int:
        """Drop probes unanswered for timeout_s (they stay lost)."""
        cutoff = time.monotonic_ns() - int(timeout_s * 1e9)
        old = [s for s, p in self._pending.items() if p.t_post < cutoff]
        for s in old:
            del self._pending[s]
        return len(old)


class RdmaProber:
    """Probes each RDMA target of each endpoint at the configured rate,
    sizes in turn, from one thread per endpoint's queue pair; starts are
    staggered over one interval and every interval jitters by 10 %."""

    def __init__(self, pingers: dict[str, RdmaPinger], rate_hz: float, sizes: dict[str, tuple[int, ...]],
                 timeout_s: float) -> None:
        self.pingers = pingers
        self.rate_hz = rate_hz
        self.sizes = sizes
        self.timeout_s = timeout_s
        self._targets: dict[tuple[str, str], RdmaAddress] = {}
        self._lock = threading.Lock()

    def set_targets(self, targets: dict[tuple[str, str], RdmaAddress]) -> None:
        with self._lock:
            self._targets = {k: a for k, a in targets.items() if k[0] in self.pingers}

    def run(self, src: str, stop: threading.Event) -> None:
        import random

        pinger = self.pingers[src]
        interval = 1.0 / self.rate_hz
        nxt = time.monotonic() + random.random() * interval
        turn = 0
        while not stop.is_set():
            pinger.poll(max(0.0, min(nxt - time.monotonic(), 0.05)))
            if time.monotonic() < nxt:
                continue
            with self._lock:
                mine = [(d, a) for (s, d), a in self._targets.items() if s == src]
            sizes = self.sizes.get(src, (64,))
            for k, (dst, addr) in enumerate(mine):
                pinger.probe(dst, addr, sizes[turn % len(sizes)])
                if k % 32 == 31:  # completions out before the send queue fills
                    pinger.poll(0.0)
            turn += 1
            pinger.expire(self.timeout_s)
            nxt += interval * (1.0 + random.uniform(-0.1, 0.1))


def open_pingers(endpoints: dict[str, str], on_sent: Callable[[str, str, int, float, int], None],
                 on_reply: Callable[[str, str, int, float, float, int], None], max_size: int
                 ) -> tuple[dict[str, RdmaPinger], dict[str, RdmaAddress], str]:
    """A queue pair for every endpoint (id -> interface) whose interface has
    an RDMA device: (pingers, their addresses, why the others have none)."""
    avail = rdma_availability()
    if not avail.available:
        return {}, {}, avail.reason
    pingers: dict[str, RdmaPinger] = {}
    addresses: dict[str, RdmaAddress] = {}
    why: list[str] = []
    for ep, ifname in endpoints.items():
        device = device_of_interface(ifname) if ifname else None
        if device is None:
            why.append(f"{ep}: no RDMA device behind interface '{ifname}'")
            continue
        p = RdmaPinger(device, on_sent, on_reply, src=ep, max_size=max(max_size, MIN_SIZE))
        try:
            addresses[ep] = p.open()
        except Exception as exc:  # a device that fails to open: that endpoint probes over UDP
            why.append(f"{ep}: {device} did not open ({exc})")
            p.close()
            continue
        pingers[ep] = p
    return pingers, addresses, "; ".join(why) or "ok"
