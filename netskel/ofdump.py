"""Real `ovs-ofctl dump-flows` text, read into a model of the OpenFlow
pipeline that the interpreter (`netskel.ofpipeline`) can follow.

Open vSwitch's own flow library (`ovs.flow.ofp.OFPFlow`, PyPI `ovs[flow]`)
parses each line; around it we cover what real dumps contain and it does
not read: named tables (`--names`: `table=L3Forwarding`,
`goto_table:Output`), flows with no match before `actions`
(`n_bytes=0, actions=drop`), flag words (`send_flow_rem reset_counts`),
`packet_type=(1,0x800)` and quoted port names.

A line the library cannot read, or whose action we cannot interpret,
becomes an explicit unknown (its table and priority are still read when
they can be, so the interpreter knows where the uncertainty lies), listed
in `not_understood`, never a guess and never an exception: the rest of the
dump is used. Only text that is not a flow dump at all raises `DumpError`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PRIORITY = 32768  # what ovs-ofctl gives a flow added without one
NAMED_TABLE_BASE = 1000   # named tables get ids past OpenFlow's 0-254


class DumpError(ValueError):
    """The text is not `ovs-ofctl dump-flows` output."""


@dataclass(frozen=True)
class Match:
    """One match condition. `value` is an int (masked by `mask`, None =
    exact), a port name, or the flag string of `ct_state`."""

    field: str
    value: int | str
    mask: int | None = None


@dataclass(frozen=True)
class Action:
    kind: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OfFlow:
    line: int                # 1-based line of the dump
    text: str
    table: int
    priority: int
    match: tuple[Match, ...] | None   # None: the line could not be read
    actions: tuple[Action, ...] | None

    @property
    def understood(self) -> bool:
        return self.match is not None and self.actions is not None


@dataclass(frozen=True)
class NotUnderstood:
    line: int
    text: str
    why: str


@dataclass(frozen=True)
class FlowDump:
    flows: tuple[OfFlow, ...]
    not_understood: tuple[NotUnderstood, ...]
    table_names: Mapping[str, int]   # --names style table name -> the id used here

    def table_label(self, table: int) -> str:
        for name, t in self.table_names.items():
            if t == table:
                return name
        return str(table)


# -- field names ----------------------------------------------------------------
# Every spelling of the fields the interpreter models, to one name.
_ALIASES = {
    "ip_dst": "nw_dst", "ipv4_dst": "nw_dst", "nxm_of_ip_dst": "nw_dst", "oxm_of_ipv4_dst": "nw_dst",
    "ip_src": "nw_src", "ipv4_src": "nw_src", "nxm_of_ip_src": "nw_src", "oxm_of_ipv4_src": "nw_src",
    "tunnel_id": "tun_id", "nxm_nx_tun_id": "tun_id", "oxm_of_tunnel_id": "tun_id",
    "nxm_nx_tun_ipv4_dst": "tun_dst", "tun_ipv4_dst": "tun_dst",
    "nxm_nx_tun_ipv4_src": "tun_src", "tun_ipv4_src": "tun_src",
    "nxm_of_in_port": "in_port", "oxm_of_in_port": "in_port",
    "oxm_of_metadata": "metadata", "nxm_nx_pkt_mark": "pkt_mark",
    "nxm_nx_ct_mark": "ct_mark", "nxm_nx_ct_label": "ct_label", "nxm_nx_ct_zone": "ct_zone",
    "nxm_nx_ct_state": "ct_state", "eth_type": "dl_type", "nxm_of_eth_type": "dl_type",
    "eth_dst": "dl_dst", "eth_src": "dl_src", "nxm_of_eth_dst": "dl_dst", "nxm_of_eth_src": "dl_src",
    "ip_proto": "nw_proto", "nxm_of_ip_proto": "nw_proto", "nxm_of_vlan_tci": "vlan_tci",
}
_REG = re.compile(r"^(?:nxm_nx_|oxm_of_pkt_)?(x{0,2}reg)(\d+)$")
# Match words naming a protocol; the probes are IPv4 UDP.
PROTO_WORDS = frozenset({"ip", "ipv4", "udp", "tcp", "icmp", "sctp", "arp", "rarp", "ipv6", "tcp6",
                         "udp6", "icmp6", "sctp6", "mpls", "mplsm", "igmp", "dl_type_any"})


def canonical_field(name: str) -> str:
    n = name.strip().lower()
    m = _REG.match(n)
    if m:
        return f"{m.group(1)}{m.group(2)}"
    return _ALIASES.get(n, n)


def ip_and_mask(text: str) -> tuple[int, int] | None:
    """IPv4 `a.b.c.d`, `a.b.c.d/len` or `a.b.c.d/m.a.s.k` as (value, mask);
    None for IPv6 or anything else."""
    addr, _, m = str(text).partition("/")
    try:
        value = int(ipaddress.IPv4Address(addr))
        if not m:
            return value, 0xFFFFFFFF
        if m.isdigit():
            n = int(m)
            if n > 32:
                return None
            mask = (0xFFFFFFFF << (32 - n)) & 0xFFFFFFFF
        else:
            mask = int(ipaddress.IPv4Address(m))
    except ValueError:
        return None
    return value & mask, mask


def mac_int(text: str) -> int | None:
    parts = text.split(":")
    try:
        if len(parts) != 6 or any(not 1 <= len(p) <= 2 for p in parts):
            return None
        return int("".join(p.zfill(2) for p in parts), 16)
    except ValueError:
        return None


def _mask_value(v: Any) -> tuple[int, int | None] | None:
    """The ovs library's Mask* objects, ints, and hex strings as (value, mask)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v, None
    text = str(v).strip().strip('"')
    value, _, mask = text.partition("/")
    if ":" in value:  # a MAC address
        mac = mac_int(value)
        mm = mac_int(mask) if mask else None
        return None if mac is None or (mask and mm is None) else (mac, mm)
    try:
        return int(value, 0), (int(mask, 0) if mask else None)
    except ValueError:
        return None


# -- match -------------------------------------------------------------------------
def _match(raw: Mapping[str, Any], packet_type: str | None) -> tuple[Match, ...]:
    out: list[Match] = []
    if packet_type is not None:
        out.append(Match("packet_type", packet_type))
    for key, v in raw.items():
        if key == "priority":
            continue
        name = canonical_field(key)
        if name in PROTO_WORDS and v is True:
            out.append(Match("proto", name))
        elif name == "in_port":
            out.append(Match("in_port", v if isinstance(v, int) else str(v).strip('"')))
        elif name in ("nw_dst", "nw_src", "tun_dst", "tun_src"):
            im = ip_and_mask(str(v))
            # An IPv6 address in an IPv4 field cannot match an IPv4 probe.
            out.append(Match(name, im[0], im[1]) if im else Match("never", str(v)))
        elif name == "ct_state":
            out.append(Match("ct_state", str(v)))
        else:
            mv = _mask_value(v)
            out.append(Match(name, mv[0], mv[1]) if mv else Match(name, str(v)))
    return tuple(out)


# -- actions -----------------------------------------------------------------------
# Actions that change nothing the forwarding decision depends on here.
_HARMLESS = frozenset({
    "mod_dl_src", "mod_dl_dst", "mod_vlan_pcp", "mod_nw_tos", "mod_nw_ecn", "mod_nw_ttl",
    "mod_tp_src", "mod_tp_dst", "dec_ttl", "meter", "note", "set_queue", "pop_queue", "fin_timeout",
    "sample", "debug_recirc", "debug_slow", "set_mpls_ttl", "dec_mpls_ttl", "clear_actions",
})
_VLAN = frozenset({"strip_vlan", "pop_vlan", "push_vlan", "mod_vlan_vid"})


def _subfield(d: Mapping[str, Any]) -> dict[str, Any]:
    return {"field": canonical_field(str(d.get("field", ""))), "start": d.get("start"),
            "end": d.get("end")}


def _port(v: Any) -> int | str:
    if isinstance(v, int):
        return v
    text = str(v).strip().strip('"')
    return int(text) if text.isdigit() else text


def _action(a: Mapping[str, Any]) -> Action:
    (kind, v), = a.items()
    if kind == "output":
        return Action("output", {"port": _port(v.get("port") if isinstance(v, Mapping) else v)})
    if kind == "enqueue":
        return Action("output", {"port": _port(v.get("port"))})
    if kind == "drop":
        return Action("drop")
    if kind == "resubmit":
        port, table = v.get("port"), v.get("table")
        return Action("resubmit", {"port": None if port in ("", None) else _port(port),
                                   "table": None if table in ("", None) else int(table)})
    if kind == "goto_table":
        return Action("goto_table", {"table": int(v)})
    if kind == "ct":
        args = dict(v) if isinstance(v, Mapping) else {}
        execs = [_action(x) for x in args.get("exec") or []]
        return Action("ct", {"table": args.get("table"), "commit": bool(args.get("commit")),
                             "zone": str(args.get("zone", 0)), "exec": tuple(execs)})
    if kind == "group":
        return Action("group", {"id": v})
    if kind in ("controller", "CONTROLLER"):
        return Action("output", {"port": "CONTROLLER"})
    if kind == "set_field":
        (fname, value), = v["value"].items()
        return Action("set", {"field": canonical_field(fname), "value": str(value)})
    if kind == "load":
        return Action("load", {"dst": _subfield(v["dst"]), "value": v["value"]})
    if kind == "move":
        return Action("move", {"src": _subfield(v["src"]), "dst": _subfield(v["dst"])})
    if kind in ("set_tunnel", "set_tunnel64"):
        return Action("set", {"field": "tun_id", "value": str(v)})
    if kind in ("mod_nw_dst", "mod_nw_src"):
        return Action("set", {"field": kind[4:], "value": str(v)})
    if kind == "write_metadata":
        return Action("set", {"field": "metadata", "value": str(v)})
    if kind == "learn":
        return Action("learn")  # installs flows for later packets; this one is not forwarded
    if kind == "conjunction":
        return Action("conjunction", dict(v))
    if kind in ("clone", "write_actions"):
        return Action(kind, {"actions": tuple(_action(x) for x in v)})
    if kind == "exit":
        return Action("exit")
    if kind == "ct_clear":
        return Action("ct_clear")
    if kind in _VLAN:
        return Action("set", {"field": "vlan_tci", "value": None})
    if kind in _HARMLESS:
        return Action("harmless", {"name": kind})
    return Action("unknown", {"name": kind})


def _unknown_actions(actions: tuple[Action, ...]) -> list[str]:
    out = []
    for a in actions:
        if a.kind == "unknown":
            out.append(str(a.args["name"]))
        elif a.kind in ("clone", "write_actions"):
            out += _unknown_actions(a.args["actions"])
        elif a.kind == "ct":
            out += _unknown_actions(a.args["exec"])
    return out


# -- lines ---------------------------------------------------------------------------
_HEADER = re.compile(r"^(NXST_FLOW|OFPST_FLOW|OFPST_AGGREGATE|NXST_AGGREGATE)\b.*\breply\b")
_FLAGS = re.compile(r"\b(send_flow_rem|check_overlap|reset_counts|no_packet_counts|no_byte_counts|"
                    r"no_readonly_table)\b\s*,?\s*")
_PACKET_TYPE = re.compile(r"packet_type=\(\s*([^)]*)\)\s*,?")
_TABLE = re.compile(r"(?<![\w_])table=([A-Za-z_][\w-]*|\d+)")
_PRIORITY = re.compile(r"(?<![\w_])priority=(\d+)")
_NAMED = [re.compile(r"(?<![\w_])(table=)([A-Za-z_][\w-]*)"),
          re.compile(r"(goto_table:)([A-Za-z_][\w-]*)"),
          re.compile(r"(resubmit\([^,()]*,)([A-Za-z_][\w-]*)")]


def _table_id(token: str, names: dict[str, int]) -> int:
    if token.isdigit():
        return int(token)
    return names.setdefault(token, NAMED_TABLE_BASE + len(names))


_INFO_KEYS = frozenset({"cookie", "duration", "table", "n_packets", "n_bytes", "idle_age", "hard_age",
                        "idle_timeout", "hard_timeout", "importance", "out_port", "out_group"})


def _prepare(text: str, names: dict[str, int], priority: int) -> tuple[str, str | None]:
    """The line as the ovs library reads it, and its packet_type if any.
    The library takes the last word before `actions=` as the match, so a
    flow that matches everything gets its priority written there."""
    head, sep, actions = text.partition("actions=")
    pt = None
    m = _PACKET_TYPE.search(head)
    if m:
        pt = ",".join(p.strip() for p in m.group(1).split(","))
        head = head[:m.start()] + head[m.end():]
    head = _FLAGS.sub("", head)
    head = head.strip().rstrip(",").strip()
    last = head.rsplit(None, 1)[-1] if head else ""
    if not head or last.split("=", 1)[0] in _INFO_KEYS:
        head = f"{head}, priority={priority}" if head else f"priority={priority}"
    line = head + " " + sep + actions
    for rx in _NAMED:
        line = rx.sub(lambda mm: mm.group(1) + str(_table_id(mm.group(2), names)), line)
    return line.strip(), pt


def read_dump(text: str) -> FlowDump:
    """Every flow line of a dump, in order. Raises DumpError only when the
    text holds neither a dump-flows header nor a flow line."""
    from ovs.flow.ofp import OFPFlow  # imported here: the analyzer needs none of it

    names: dict[str, int] = {}
    flows: list[OfFlow] = []
    bad: list[NotUnderstood] = []
    header = False
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if _HEADER.match(line):
            header = True
            continue
        if "actions=" not in line:
            bad.append(NotUnderstood(n, line, "not a flow line (no actions=)"))
            continue
        head = line.split("actions=", 1)[0]
        tm, pm = _TABLE.search(head), _PRIORITY.search(head)
        table = _table_id(tm.group(1), names) if tm else 0
        priority = int(pm.group(1)) if pm else DEFAULT_PRIORITY
        # A tab is whitespace, but the ovs library's key-value parser (ovs
        # 4.0.0, ovs/flow/kv.py) never moves past one that follows a value:
        # "table=1\t, priority=1" grew to 19 GB, without end, in
        # tests/test_fuzz.py. The flow keeps its text as written.
        prepared, packet_type = _prepare(line.replace("\t", " "), names, priority)
        try:
            parsed = OFPFlow(prepared)
            match = _match(parsed.match or {}, packet_type)
            actions = tuple(_action(a) for a in parsed.actions or [])
        except Exception as e:  # the library raises many kinds; a line is never fatal
            why = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            flows.append(OfFlow(n, line, table, priority, None, None))
            bad.append(NotUnderstood(n, line, why))
            continue
        unknown = _unknown_actions(actions)
        if unknown:
            bad.append(NotUnderstood(n, line, "action not interpreted: " + ", ".join(unknown)))
        flows.append(OfFlow(n, line, table, priority, match, actions))
    if not flows and not header:
        raise DumpError("no dump-flows header and no flow line"
                        + (f" (line {bad[0].line}: {bad[0].text[:60]!r})" if bad else " (empty)"))
    return FlowDump(tuple(flows), tuple(bad), dict(names))
