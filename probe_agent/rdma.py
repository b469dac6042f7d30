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
sender's GID and QPN, so the responder can address its reply.

Every pyverbs object the prober builds is made by one function here
(`cq_attr`, `qp_attrs`, `address_attr`, `recv_wr`, `send_wr`) from the
namespace `load_verbs` returns, so `tests/test_rdma.py` builds the very same
objects on whatever pyverbs is installed (Debian 12's rdma-core 44 in CI),
device or not: a renamed module or argument fails there, not on the first
machine with a NIC. The enum module has two names (`pyverbs.enums` in Debian
12's rdma-core 44, `pyverbs.libibverbs_enums` in PyPI's 59); both load."""

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
from types import SimpleNamespace
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


# The constants the prober uses, looked up by name in either enum module.
ENUMS = ("IBV_QPT_UD", "IBV_ACCESS_LOCAL_WRITE", "IBV_WC_STANDARD_FLAGS",
         "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK", "IBV_WC_RECV", "IBV_WC_SUCCESS",
         "IBV_WR_SEND", "IBV_SEND_SIGNALED")


def _enum(module: Any, name: str) -> int:
    """A constant by name: a module attribute, or a member of one of the
    module's enum classes (Cython may expose only the class)."""
    if hasattr(module, name):
        return int(getattr(module, name))
    for attr in vars(module).values():
        if isinstance(attr, type) and hasattr(attr, name):
            return int(getattr(attr, name))
    raise ImportError(f"{module.__name__} has no {name}")


def load_verbs() -> SimpleNamespace:
    """The pyverbs classes and constants the prober uses, in one namespace;
    ImportError when pyverbs (or a name it should have) is missing."""
    try:
        import pyverbs.libibverbs_enums as enums
    except ImportError:
        import pyverbs.enums as enums
    from pyverbs.addr import AH, GID, AHAttr, GlobalRoute
    from pyverbs.cq import CQEX, CqInitAttrEx, PollCqAttr
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, RecvWR, SendWR

    e = SimpleNamespace(**{name: _enum(enums, name) for name in ENUMS})
    return SimpleNamespace(
        e=e, AH=AH, GID=GID, AHAttr=AHAttr, GlobalRoute=GlobalRoute, CQEX=CQEX,
        CqInitAttrEx=CqInitAttrEx, PollCqAttr=PollCqAttr, Context=Context, MR=MR, PD=PD,
        QP=QP, QPAttr=QPAttr, QPCap=QPCap, QPInitAttr=QPInitAttr, SGE=SGE, RecvWR=RecvWR,
        SendWR=SendWR)


def cq_attr(vb: SimpleNamespace, depth: int, stamped: bool) -> Any:
    """One completion queue for sends and receives of `depth` each; with
    NIC wall-clock stamps when asked (a device without them refuses it)."""
    flags = vb.e.IBV_WC_STANDARD_FLAGS
    if stamped:
        flags |= vb.e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
    return vb.CqInitAttrEx(cqe=2 * depth, wc_flags=flags)


def qp_attrs(vb: SimpleNamespace, cq: Any, depth: int, port: int) -> tuple[Any, Any]:
    """A UD queue pair's creation attributes and the attributes pyverbs
    takes it to ready-to-send with (port, our Q_Key, the default P_Key)."""
    cap = vb.QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
    init = vb.QPInitAttr(qp_type=vb.e.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap)
    attr = vb.QPAttr(port_num=port)
    attr.qkey = QKEY
    attr.pkey_index = 0
    return init, attr


def address_attr(vb: SimpleNamespace, gid: str, label: int, sgid_index: int, port: int,
                 dscp: int = 0) -> Any:
    """Where a probe goes: the target's GID over our GID index, with the
    flow label that picks its RoCEv2 source port (its ECMP path) and the
    traffic class (DSCP << 2) of the job's RDMA traffic."""
    gr = vb.GlobalRoute(dgid=vb.GID(gid), sgid_index=sgid_index, flow_label=label, hop_limit=64,
                        traffic_class=dscp << 2)
    return vb.AHAttr(port_num=port, is_global=1, gr=gr)


def recv_wr(vb: SimpleNamespace, wr_id: int, addr: int, length: int, lkey: int) -> Any:
    return vb.RecvWR(wr_id=wr_id, num_sge=1, sg=[vb.SGE(addr, length, lkey)])


def send_wr(vb: SimpleNamespace, wr_id: int, addr: int, length: int, lkey: int) -> Any:
    """A signalled send: its completion is the probe's send stamp."""
    return vb.SendWR(wr_id=wr_id, opcode=vb.e.IBV_WR_SEND, num_sge=1,
                     sg=[vb.SGE(addr, length, lkey)], send_flags=vb.e.IBV_SEND_SIGNALED)


def rdma_availability() -> RdmaAvailability:
    try:
        from pyverbs import device as d
        load_verbs()
    except ImportError as e:
        return RdmaAvailability(False, f"pyverbs is not installed or lacks what the prober uses "
                                       f"({e}); install rdma-core's python3-pyverbs")
    try:
        devices = d.get_device_list()
    except Exception as e:  # pyverbs raises its own PyverbsRDMAError without a device
        return RdmaAvailability(False, f"no RDMA device: {e}")
    if not devices:
        return RdmaAvailability(False, "no RDMA device found")
    names = tuple(dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
                  for dev in devices)
    return RdmaAvailability(True, "ok", names)


def device_of_interface(ifname: str, sys_net: Path = Path("/sys/class/net"),
                        sys_ib: Path = SYS_INFINIBAND) -> str | None:
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
        for name in sorted(os.listdir(sys_ib)):
            parent = sys_ib / name / "parent"
            if parent.exists() and parent.read_text().strip() == ifname:
                return name
    except OSError:
        pass
    return None


def _index(name: str) -> int:
    return int(name) if name.isdigit() else 1 << 30


def roce_gid_index(device: str, port: int = 1, sys_ib: Path = SYS_INFINIBAND) -> int:
    """The GID index to probe from: a RoCE v2 one, since only v2 packets are
    UDP (the flow label picks the source port ECMP hashes on; v1 frames are
    not even routed), IPv4-mapped first (what NCCL picks on routed fabrics).
    0 where the port lists no GID types (InfiniBand) or no v2 GID."""
    base = sys_ib / device / "ports" / str(port)
    try:
        names = sorted(os.listdir(base / "gid_attrs" / "types"), key=_index)
    except OSError:
        return 0
    best: tuple[int, int] | None = None
    for name in names:
        try:
            kind = (base / "gid_attrs" / "types" / name).read_text().strip()
            gid = (base / "gids" / name).read_text().strip()
        except OSError:  # an unused table entry reads as EINVAL
            continue
        if kind.lower() != "roce v2" or not name.isdigit() or not gid.strip("0:"):
            continue
        rank = 0 if gid.startswith("0000:0000:0000:0000:0000:ffff:") else 1
        if best is None or rank < best[0]:
            best = (rank, int(name))
    return best[1] if best else 0


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
    dscp: int = 0
    _v: dict[str, Any] = field(default_factory=dict, repr=False)
    _pending: dict[int, _Pending] = field(default_factory=dict, repr=False)
    _ahs: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False)
    _seq: int = 0
    _slot: int = 0
    _token: int = 0
    hw_clock: bool = False

    def open(self) -> RdmaAddress:
        """Open the device, queue pair and buffers; the address to register."""
        vb = load_verbs()
        e = vb.e
        ctx = vb.Context(name=self.device)
        pd = vb.PD(ctx)
        try:
            cq = vb.CQEX(ctx, cq_attr(vb, self.depth, stamped=True))
            self.hw_clock = True
        except Exception as exc:  # the device has no wall-clock completion stamps
            log.info("%s: no completion wall clock (%s); host clock at post and poll",
                     self.device, exc)
            cq = vb.CQEX(ctx, cq_attr(vb, self.depth, stamped=False))
        # pyverbs moves a UD queue pair to ready-to-send when given attributes.
        qp = vb.QP(pd, *qp_attrs(vb, cq, self.depth, self.port))
        slot = GRH_SIZE + self.max_size
        recv_mr = vb.MR(pd, slot * self.depth, e.IBV_ACCESS_LOCAL_WRITE)
        send_mr = vb.MR(pd, self.max_size * self.depth, e.IBV_ACCESS_LOCAL_WRITE)
        gid = str(ctx.query_gid(self.port, self.gid_index))
        self._v = {"vb": vb, "e": e, "ctx": ctx, "pd": pd, "cq": cq, "qp": qp,
                   "recv_mr": recv_mr, "send_mr": send_mr, "slot": slot, "gid": gid}
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
        v = self._v
        mr = v["recv_mr"]
        v["qp"].post_recv(recv_wr(v["vb"], i, mr.buf + i * v["slot"], v["slot"], mr.lkey))

    def _ah(self, gid: str, label: int) -> Any:
        ah = self._ahs.get((gid, label))
        if ah is None:
            vb = self._v["vb"]
            ah = vb.AH(self._v["pd"], attr=address_attr(vb, gid, label, self.gid_index,
                                                        self.port, self.dscp))
            self._ahs[(gid, label)] = ah
        return ah

    def _post_send(self, data: bytes, to: RdmaAddress, label: int, wr_id: int) -> None:
        v = self._v
        # Send buffers in turn: one is reused only after depth - 1 later sends
        # (the prober polls completions every few dozen posts).
        self._slot = slot = (self._slot + 1) % self.depth
        mr = v["send_mr"]
        mr.write(data, len(data), slot * self.max_size)
        wr = send_wr(v["vb"], wr_id, mr.buf + slot * self.max_size, len(data), mr.lkey)
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
        v = self._v
        cq, e = v["cq"], v["e"]
        end = time.monotonic() + timeout_s
        while True:
            ret = cq.start_poll(v["vb"].PollCqAttr())
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
        nxt = time.monotonic() + random.random() / self.rate_hz
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
            # The rate read every turn: a reloaded one applies from the next.
            nxt += (1.0 + random.uniform(-0.1, 0.1)) / self.rate_hz


def open_pingers(endpoints: dict[str, str], on_sent: Callable[[str, str, int, float, int], None],
                 on_reply: Callable[[str, str, int, float, float, int], None], max_size: int,
                 dscp: int = 0) -> tuple[dict[str, RdmaPinger], dict[str, RdmaAddress], str]:
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
        p = RdmaPinger(device, on_sent, on_reply, src=ep, max_size=max(max_size, MIN_SIZE),
                       gid_index=roce_gid_index(device), dscp=dscp)
        try:
            addresses[ep] = p.open()
        except Exception as exc:  # a device that fails to open: that endpoint probes over UDP
            why.append(f"{ep}: {device} did not open ({exc})")
            p.close()
            continue
        pingers[ep] = p
    return pingers, addresses, "; ".join(why) or "ok"
