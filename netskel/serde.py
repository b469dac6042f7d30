"""The one place that converts protobuf messages to domain objects and back."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from google.protobuf import json_format, struct_pb2

from analyzer.batch import STAT_FIELDS, WindowBatch
from controller.pinglist import Target
from controller.registration import RegEndpoint, Registration
from controller.state import CheckOrder, ListUpdate
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.errors import InputError
from netskel.model import (
    CLOCKS,
    AgentState,
    Component,
    CounterSample,
    DatapathRule,
    FlowRule,
    Incident,
    RouteStats,
    VSwitchDump,
    WindowStats,
    pair_key,
)

_SYMPTOM = {"loss": cpb.SYMPTOM_LOSS, "latency": cpb.SYMPTOM_LATENCY,
            "degradation": cpb.SYMPTOM_DEGRADATION, "unreachable": cpb.SYMPTOM_UNREACHABLE}
_LAYER = {"underlay": cpb.LAYER_UNDERLAY, "overlay": cpb.LAYER_OVERLAY, "nic": cpb.LAYER_NIC,
          "host": cpb.LAYER_HOST, "agent": cpb.LAYER_AGENT, "unknown": cpb.LAYER_UNKNOWN}
_CTYPE = {"link": cpb.COMPONENT_TYPE_LINK, "switch": cpb.COMPONENT_TYPE_SWITCH,
          "nic": cpb.COMPONENT_TYPE_NIC, "vswitch_rule": cpb.COMPONENT_TYPE_VSWITCH_RULE,
          "host": cpb.COMPONENT_TYPE_HOST, "endpoint": cpb.COMPONENT_TYPE_ENDPOINT,
          "agent": cpb.COMPONENT_TYPE_AGENT}
_SYMPTOM_R = {v: k for k, v in _SYMPTOM.items()}
_LAYER_R = {v: k for k, v in _LAYER.items()}
_CTYPE_R = {v: k for k, v in _CTYPE.items()}
VERDICTS = {"NETWORK_OK": dpb.NETWORK_OK, "NETWORK_FAULT": dpb.NETWORK_FAULT,
            "INCONCLUSIVE": dpb.INCONCLUSIVE}
VERDICT_NAMES = {v: k for k, v in VERDICTS.items()}

_STATS = ("rtt_min", "rtt_p25", "rtt_median", "rtt_p75", "rtt_mean", "rtt_std", "rtt_max")


# -- registration -------------------------------------------------------------
def registration_to_pb(reg: Registration) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        container=reg.container, job=reg.job or "", host=reg.host, probe_port=reg.probe_port,
        agent_version=reg.agent_version,
        endpoints=[pb.EndpointInfo(id=e.id, nic=e.nic, ip=e.ip, vni=e.vni or 0, ifname=e.ifname,
                                   rdma_gid=e.rdma_gid, rdma_qpn=e.rdma_qpn)
                   for e in reg.endpoints])


def registration_from_pb(m: pb.RegisterRequest) -> Registration:
    return Registration(
        container=m.container, job=m.job or None, host=m.host, probe_port=m.probe_port,
        agent_version=m.agent_version,
        endpoints=tuple(RegEndpoint(id=e.id, nic=e.nic, ip=e.ip, vni=e.vni or None,
                                    ifname=e.ifname, rdma_gid=e.rdma_gid, rdma_qpn=e.rdma_qpn)
                        for e in m.endpoints))


# -- ping lists ---------------------------------------------------------------
def target_to_pb(t: Target) -> pb.PingTarget:
    return pb.PingTarget(src=t.src, dst=t.dst, dst_ip=t.dst_ip, dst_port=t.dst_port,
                         active=t.active, src_nic_ip=t.src_nic_ip, dst_nic_ip=t.dst_nic_ip,
                         dst_rdma_gid=t.dst_rdma_gid, dst_rdma_qpn=t.dst_rdma_qpn)


def target_from_pb(m: pb.PingTarget) -> Target:
    return Target(src=m.src, dst=m.dst, dst_ip=m.dst_ip, dst_port=m.dst_port, active=m.active,
                  src_nic_ip=m.src_nic_ip, dst_nic_ip=m.dst_nic_ip, dst_rdma_gid=m.dst_rdma_gid,
                  dst_rdma_qpn=m.dst_rdma_qpn)


def list_update_to_pb(u: ListUpdate) -> pb.PingListUpdate:
    m = pb.PingListUpdate(
        version=u.version, full=u.full,
        upsert=[target_to_pb(t) for t in u.diff.upsert],
        remove=[pb.PingTarget(src=s, dst=d) for s, d in u.diff.remove])
    if u.check is not None:
        m.check.CopyFrom(check_order_to_pb(u.check))
    return m


def check_order_to_pb(c: CheckOrder) -> pb.CheckOrder:
    return pb.CheckOrder(id=c.id, targets=[target_to_pb(t) for t in c.targets],
                         duration_s=c.duration_s, rate_hz=c.rate_hz)


def check_order_from_pb(m: pb.CheckOrder) -> CheckOrder:
    return CheckOrder(id=m.id, targets=tuple(target_from_pb(t) for t in m.targets),
                      duration_s=m.duration_s, rate_hz=m.rate_hz)


# -- reports ------------------------------------------------------------------
def window_to_pb(w: WindowStats) -> cpb.WindowStats:
    m = cpb.WindowStats(src=w.src, dst=w.dst, window_start=w.window_start,
                        window_end=w.window_end, size=w.size, sent=w.sent, lost=w.lost,
                        proto=w.proto, route=w.route, slow=w.slow, clock=w.clock,
                        routes=[cpb.RouteStats(route=r.route, sent=r.sent, lost=r.lost,
                                               rtt_median=r.rtt_median) for r in w.routes])
    for k in _STATS:
        setattr(m, k, getattr(w, k))
    return m


def window_from_pb(m: cpb.WindowStats) -> WindowStats:
    stats = {k: getattr(m, k) for k in _STATS}
    if m.lost >= m.sent:
        stats = {k: math.nan for k in _STATS}
    return WindowStats(src=m.src, dst=m.dst, window_start=m.window_start,
                       window_end=m.window_end, size=m.size, sent=m.sent, lost=m.lost,
                       proto=m.proto or "udp", route=m.route,
                       slow=min(m.slow, max(0, m.sent - m.lost)),
                       clock=m.clock if m.clock in CLOCKS else "",
                       routes=tuple(RouteStats(route=r.route, sent=r.sent, lost=min(r.lost, r.sent),
                                               rtt_median=r.rtt_median if r.lost < r.sent
                                               else math.nan)
                                    for r in m.routes if r.route), **stats)


# WindowColumns' numeric columns: field -> the little-endian type of its
# packed form (PackedColumns).
_PACKED = {"src": "<u4", "dst": "<u4", "window_start": "<f8", "window_end": "<f8",
           "size": "<u4", "sent": "<u4", "lost": "<u4", "rtt": "<f8", "slow": "<u4",
           "proto": "<u4", "route": "<i4", "route_count": "<u4", "route_code": "<u4",
           "route_sent": "<u4", "route_lost": "<u4", "route_median": "<f8", "clock": "<u4"}


def window_batch_to_pb(b: WindowBatch, packed: bool = True) -> pb.WindowBatch:
    """Windows as the columns the analyzer reads (`window_batch_from_pb`):
    numbers packed as bytes, or (packed=False) as repeated fields, the form
    older agents send."""
    cols = {"src": b.src, "dst": b.dst, "window_start": b.start, "window_end": b.end,
            "size": b.size, "sent": b.sent, "lost": b.lost, "rtt": b.stats.ravel(),
            "slow": b.slow, "proto": b.proto, "clock": b.clock, "route": b.route,
            "route_count": np.diff(b.r_ptr), "route_code": b.r_route, "route_sent": b.r_sent,
            "route_lost": b.r_lost, "route_median": b.r_median}
    c = cpb.WindowColumns(names=b.names, protos=b.protos, clocks=b.clocks,
                          route_names=b.route_names)
    for k, v in cols.items():
        if packed:
            setattr(c.packed, k, np.asarray(v, dtype=_PACKED[k]).tobytes())
        else:
            getattr(c, k).extend(v.tolist())
    return pb.WindowBatch(columns=c)


def window_batch_from_pb(m: pb.WindowBatch) -> WindowBatch:
    """A report's windows as one batch: its columns, and any windows sent
    one message each (older agents), by `window_from_pb`'s rules. Columns
    that do not fit together (lengths, indexes out of their table) are an
    InputError naming the column."""
    parts = []
    if m.windows:
        parts.append(WindowBatch.from_windows([window_from_pb(w) for w in m.windows]))
    if m.HasField("columns"):
        parts.append(_columns_from_pb(m.columns))
    return WindowBatch.concat(parts)


def _table(names: Sequence[str], codes: np.ndarray, what: str,
           rename: Callable[[str], str] = str) -> tuple[list[str], np.ndarray]:
    """(the distinct names, codes into them): a table may repeat a name,
    which must still be one name downstream. -1 stays -1."""
    if len(codes) and (codes.max() >= len(names) or codes.min() < -1):
        raise InputError(f"window columns: {what} index out of its table of {len(names)}")
    table = list(names) if rename is str else [rename(x) for x in names]
    if len(set(table)) == len(table):
        return table, codes
    seen: dict[str, int] = {}
    remap = np.array([seen.setdefault(x, len(seen)) for x in table] + [-1], dtype=np.int64)
    return list(seen), np.asarray(remap[codes])


def _numbers(c: cpb.WindowColumns) -> Callable[[str, type], np.ndarray]:
    """Reads one numeric column, packed or repeated, as a fresh array."""
    if not c.HasField("packed"):
        # np.array is 4x np.fromiter's speed on a repeated field
        return lambda field, dtype: np.array(getattr(c, field), dtype=dtype)
    if any(len(getattr(c, f)) for f in _PACKED):
        raise InputError("window columns: both packed and repeated numbers in one message")
    p = c.packed

    def packed(field: str, dtype: type) -> np.ndarray:
        raw, kind = getattr(p, field), np.dtype(_PACKED[field])
        if len(raw) % kind.itemsize:
            raise InputError(f"window columns: {field} is {len(raw)} bytes, not whole "
                             f"{kind.itemsize}-byte values")
        return np.frombuffer(raw, dtype=kind).astype(dtype)
    return packed


def _columns_from_pb(c: cpb.WindowColumns) -> WindowBatch:
    read = _numbers(c)
    src = read("src", np.int64)
    n = len(src)

    def col(field: str, dtype: type, length: int) -> np.ndarray:
        values = read(field, dtype)
        if len(values) != length:
            raise InputError(f"window columns: {field} has {len(values)} entries, "
                             f"expected {length}")
        return values

    sent = col("sent", np.int64, n)
    lost = col("lost", np.int64, n)
    stats = col("rtt", np.float64, n * len(STAT_FIELDS)).reshape(n, len(STAT_FIELDS))
    stats[lost >= sent] = math.nan
    names, ends = _table(c.names, np.concatenate([src, col("dst", np.int64, n)]), "endpoint")
    protos, proto = _table(c.protos, col("proto", np.int64, n), "proto",
                           lambda x: x or "udp")
    # No clock column (an older agent): every clock unknown. A name outside
    # CLOCKS is unknown too: it describes, it decides nothing.
    clock = read("clock", np.int64)
    if len(clock) not in (0, n):
        raise InputError(f"window columns: clock has {len(clock)} entries, expected {n}")
    clocks, clock = _table(c.clocks, clock, "clock", lambda x: x if x in CLOCKS else "") \
        if len(clock) else ([""], np.zeros(n, dtype=np.int64))
    counts = col("route_count", np.int64, n)
    m = int(counts.sum())
    code = col("route_code", np.int64, m)
    if m and code.min() < 0:
        raise InputError("window columns: route_code index out of its table")
    routes, both = _table(c.route_names, np.concatenate([col("route", np.int64, n), code]),
                          "route")
    if "" in routes:  # an untraced route is no route
        empty = routes.index("")
        both[both == empty] = -1
    route, r_route = both[:n], both[n:]
    r_sent = col("route_sent", np.int64, m)
    r_lost = np.minimum(col("route_lost", np.int64, m), r_sent)
    r_median = col("route_median", np.float64, m)
    r_median[r_lost >= r_sent] = math.nan
    keep = r_route >= 0
    owner = np.repeat(np.arange(n), counts)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=n), out=ptr[1:])
    return WindowBatch(
        names=names, src=ends[:n], dst=ends[n:], start=col("window_start", np.float64, n),
        end=col("window_end", np.float64, n), size=col("size", np.int64, n),
        sent=sent, lost=lost, stats=stats,
        slow=np.minimum(col("slow", np.int64, n), np.maximum(sent - lost, 0)),
        protos=protos, proto=proto, clocks=clocks, clock=clock, route_names=routes,
        route=route, r_ptr=ptr,
        r_route=r_route[keep], r_sent=r_sent[keep], r_lost=r_lost[keep],
        r_median=r_median[keep])


def counter_to_pb(s: CounterSample) -> pb.CounterSample:
    return pb.CounterSample(endpoint=s.endpoint, ts=s.ts, tx_bytes=s.tx_bytes,
                            rx_bytes=s.rx_bytes)


def counter_from_pb(m: pb.CounterSample) -> CounterSample:
    return CounterSample(endpoint=m.endpoint, ts=m.ts, tx_bytes=m.tx_bytes, rx_bytes=m.rx_bytes)


def agent_state_to_pb(s: AgentState) -> pb.AgentState:
    return pb.AgentState(container=s.container, endpoints=list(s.endpoints),
                         registered=s.registered, ready=s.ready, last_heartbeat=s.last_heartbeat)


def agent_state_from_pb(m: pb.AgentState) -> AgentState:
    return AgentState(container=m.container, endpoints=tuple(m.endpoints),
                      registered=m.registered, ready=m.ready, last_heartbeat=m.last_heartbeat)


def _rule_to_pb(r: FlowRule) -> pb.VSwitchRule:
    return pb.VSwitchRule(vni=r.vni, dst=r.dst, action=r.action, to=r.to, priority=r.priority)


def _rule_from_pb(r: pb.VSwitchRule) -> FlowRule:
    return FlowRule(vni=r.vni, dst=r.dst, action=r.action, to=r.to, priority=r.priority)


def vswitch_to_pb(d: VSwitchDump) -> pb.VSwitchDump:
    m = pb.VSwitchDump(host=d.host, ts=d.ts, rules=[_rule_to_pb(r) for r in d.rules])
    if d.datapath is not None:
        m.datapath_read = True
        m.datapath.extend(pb.DatapathRule(port=f.port, from_tunnel=f.from_tunnel,
                                          rule=_rule_to_pb(f.rule)) for f in d.datapath)
    return m


def vswitch_from_pb(m: pb.VSwitchDump) -> VSwitchDump:
    datapath = tuple(DatapathRule(port=f.port, from_tunnel=f.from_tunnel,
                                  rule=_rule_from_pb(f.rule)) for f in m.datapath)
    return VSwitchDump(host=m.host, ts=m.ts, rules=tuple(_rule_from_pb(r) for r in m.rules),
                       datapath=datapath if m.datapath_read or datapath else None)


# -- incidents ----------------------------------------------------------------
def incident_to_pb(i: Incident) -> cpb.Incident:
    evidence = struct_pb2.Struct()
    json_format.ParseDict(i.evidence, evidence)
    m = cpb.Incident(id=i.id, start=i.start, symptom=_SYMPTOM[i.symptom], layer=_LAYER[i.layer],
                     component=cpb.Component(type=_CTYPE[i.component.type], id=i.component.id),
                     pairs=[cpb.EndpointPair(a=a, b=b) for a, b in i.pairs],
                     confidence=i.confidence, evidence=evidence)
    if i.end is not None:
        m.end = i.end
    return m


def incident_from_pb(m: cpb.Incident) -> Incident:
    return Incident(id=m.id, start=m.start, end=m.end if m.HasField("end") else None,
                    symptom=_SYMPTOM_R[m.symptom], layer=_LAYER_R[m.layer],
                    component=Component(type=_CTYPE_R[m.component.type], id=m.component.id),
                    pairs=[(p.a, p.b) for p in m.pairs], confidence=m.confidence,
                    evidence=json_format.MessageToDict(m.evidence))


def pairs_from_pb(pairs: Iterable[cpb.EndpointPair]) -> list[tuple[str, str]]:
    return [pair_key(p.a, p.b) for p in pairs]
