"""Follow one packet through an OpenFlow pipeline read from a real dump
(`netskel.ofdump`): tables by priority, matches with masks and prefixes,
through `resubmit`, `goto_table` and `ct(table=..)`, registers, metadata
and tunnel fields as the actions set them, to one end:

- `tunnel`: encapsulated toward a remote NIC (`remote_ip` from the flow's
  `tun_dst` or the tunnel port's `remote_ip`; None when the tunnel device
  chooses, as a kernel VXLAN device with its own forwarding table does);
- `deliver`: out of a port that is a local endpoint's;
- `drop`: no flow matched (a table miss) or no action sent it anywhere;
- `loop`: resubmits nested deeper than Open vSwitch allows (64);
- `leaves`: the packet leaves what a dump can describe — `NORMAL`,
  `LOCAL`, `IN_PORT`, `FLOOD`, the controller, an uplink or patch port;
- `unknown`: the answer depends on something the dump does not say (a
  line that could not be read outranks the match, a field the packet's
  description leaves open such as its MAC or L4 port, a group's buckets,
  a register output whose register is unknown, several copies out).

Matching is three-valued: a flow whose match depends on a field we do not
know for this packet "may match"; if it outranks every flow that surely
matches, the answer is `unknown`, never a guess.

Conntrack is modelled in the steady state of a probe flow: the pipeline
runs once as the flow's first packet (ct_state +new, marks 0) to learn
what it commits, then again as a later packet (+est with the committed
marks, or +new again when nothing committed) — the second run is the
answer, as `ovs-appctl ofproto/trace` shows for a packet of a running flow.
"""

from __future__ import annotations

import heapq
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from netskel.ofdump import Action, FlowDump, Match, OfFlow, canonical_field, ip_and_mask, mac_int

_NW_PROTO = {"udp": 17, "tcp": 6, "icmp": 1}
MAX_DEPTH = 64  # Open vSwitch's resubmit depth limit
_LEAVE = {"NORMAL": "NORMAL", "LOCAL": "LOCAL", "IN_PORT": "IN_PORT", "FLOOD": "FLOOD", "ALL": "ALL",
          "CONTROLLER": "CONTROLLER", "NONE": "NONE"}
_CT_BITS = {"new": 0x01, "est": 0x02, "rel": 0x04, "rpl": 0x08, "inv": 0x10, "trk": 0x20,
            "snat": 0x40, "dnat": 0x80}
_SUBFIELD = re.compile(r"^([A-Za-z_][\w]*)\[(?:(\d+)(?:\.\.(\d+))?)?\]$")
_WIDTH = {"tun_id": 64, "metadata": 64, "ct_label": 128, "nw_dst": 32, "nw_src": 32, "tun_dst": 32,
          "tun_src": 32, "in_port": 32, "vlan_tci": 16, "ct_zone": 16}


@dataclass(frozen=True)
class Port:
    number: int
    name: str
    kind: str = "local"            # local | tunnel | uplink | patch | internal
    remote_ip: str | None = None   # tunnels: the fixed far end; None = per flow / the device's
    key: int | None = None         # tunnels: the fixed VNI; None = per flow


@dataclass(frozen=True)
class Ports:
    """What the switch says about its ports (`ovs-ofctl show`, `ovs-vsctl`).
    `complete` when the list is the switch's whole set: an output to a port
    it does not name is then dropped, as Open vSwitch does."""

    ports: tuple[Port, ...] = ()
    complete: bool = False

    def by_number(self, n: int) -> Port | None:
        return next((p for p in self.ports if p.number == n), None)

    def by_name(self, name: str) -> Port | None:
        return next((p for p in self.ports if p.name == name), None)


@dataclass(frozen=True)
class Packet:
    """An IPv4 UDP probe entering the switch. `in_port` None: from some
    local port we do not name; `vni` is its tunnel id when it arrives from
    a tunnel; `reply`: the answer direction of the probe's flow."""

    dst: str
    in_port: int | str | None = None
    vni: int | None = None
    src: str | None = None
    reply: bool = False
    proto: str = "udp"  # udp | tcp | icmp
    fields: Mapping[str, int] = field(default_factory=dict)  # any other known field, e.g. dl_src


@dataclass(frozen=True)
class Step:
    table: int
    line: int | None   # None: a table miss
    text: str
    name: str = ""     # the table's name in a --names dump


@dataclass(frozen=True)
class Outcome:
    end: str
    port: int | str | None = None
    remote_ip: str | None = None
    vni: int | None = None
    why: str = ""
    steps: tuple[Step, ...] = ()

    def summary(self) -> dict[str, Any]:
        return {"end": self.end, "port": self.port, "remote_ip": self.remote_ip, "vni": self.vni,
                "why": self.why,
                "path": [{"table": s.name or s.table, "line": s.line, "flow": s.text}
                         for s in self.steps]}


def _rank(f: OfFlow) -> tuple[int, bool, int]:
    """Highest priority first; among equals, flows we read before ones we could not."""
    return (-f.priority, not f.understood, f.line)


class _Unknown(Exception):
    pass


class _Loop(Exception):
    pass


class _Exit(Exception):
    pass


def _ct_match(text: str) -> tuple[int, int] | None:
    if text.startswith(("0x", "0X")) or text.isdigit():
        v, _, m = text.partition("/")
        return int(v, 0), int(m, 0) if m else 0xFF
    value = mask = 0
    for sign, flag in re.findall(r"([+-])(\w+)", text):
        bit = _CT_BITS.get(flag)
        if bit is None:
            return None
        mask |= bit
        if sign == "+":
            value |= bit
    return value, mask


@dataclass
class _State:
    fields: dict[str, Any]
    ends: list[tuple[str, int | str | None, str | None, int | None]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    action_set: list[Action] = field(default_factory=list)
    last_miss: int | None = None

    def copy(self) -> _State:
        return _State(dict(self.fields), self.ends, self.steps, list(self.action_set))


class Pipeline:
    """A dump's flows indexed by table, ready to trace packets."""

    def __init__(self, dump: FlowDump, ports: Ports | None = None) -> None:
        self.dump = dump
        self.ports = ports or Ports()
        tables: dict[int, list[OfFlow]] = {}
        for f in dump.flows:
            tables.setdefault(f.table, []).append(f)
        # Highest priority first; among equals, flows we read before ones we could not.
        self.tables = {t: sorted(fs, key=_rank) for t, fs in tables.items()}
        # Flows matching one exact destination, indexed by it: a table of a
        # thousand host routes is then a dictionary lookup, not a scan.
        self._by_dst: dict[int, dict[int, list[OfFlow]]] = {}
        self._rest: dict[int, list[OfFlow]] = {}
        for t, fs in self.tables.items():
            index: dict[int, list[OfFlow]] = {}
            rest = []
            for f in fs:
                dst = next((m.value for m in f.match or () if m.field == "nw_dst"
                            and m.mask == 0xFFFFFFFF and isinstance(m.value, int)), None)
                if dst is None:
                    rest.append(f)
                else:
                    index.setdefault(dst, []).append(f)
            self._by_dst[t], self._rest[t] = index, rest
        # Conjunctive clauses by (table, conjunction id) and dimension.
        self.conjunctions: dict[tuple[int, int], dict[int, list[OfFlow]]] = {}
        for f in dump.flows:
            for a in f.actions or ():
                if a.kind == "conjunction":
                    dims = self.conjunctions.setdefault((f.table, int(a.args["id"])), {})
                    dims.setdefault(int(a.args["k"]), []).append(f)
        # Packets enter at table 0. A --names dump prints table 0 by its name
        # (and dumps list tables in id order), so there it is the first flow's.
        first = dump.flows[0].table if dump.flows else 0
        self.start = 0 if 0 in self.tables or first not in dump.table_names.values() else first

    # -- fields ------------------------------------------------------------------
    def _get(self, st: _State, name: str) -> Any:
        if name.startswith("xxreg"):
            n = int(name[5:])
            value = 0
            for i in range(4):
                part = st.fields.get(f"reg{4 * n + i}")
                if not isinstance(part, int):
                    return None
                value = (value << 32) | part
            return value
        if name.startswith("xreg"):
            n = int(name[4:])
            hi, lo = st.fields.get(f"reg{2 * n}"), st.fields.get(f"reg{2 * n + 1}")
            return None if hi is None or lo is None else (hi << 32) | lo
        return st.fields.get(name)

    def _set(self, st: _State, name: str, value: int | None, start: int | None = None,
             end: int | None = None) -> None:
        if start is not None and end is not None and value is not None:
            old = self._get(st, name)
            if old is None:
                value = None
            else:
                width = end - start + 1
                m = ((1 << width) - 1) << start
                value = (old & ~m) | ((value << start) & m)
        if name.startswith("xxreg"):
            n = int(name[5:])
            for i in range(4):
                st.fields[f"reg{4 * n + i}"] = None if value is None else (
                    value >> (32 * (3 - i))) & 0xFFFFFFFF
        elif name.startswith("xreg"):
            n = int(name[4:])
            st.fields[f"reg{2 * n}"] = None if value is None else (value >> 32) & 0xFFFFFFFF
            st.fields[f"reg{2 * n + 1}"] = None if value is None else value & 0xFFFFFFFF
        else:
            st.fields[name] = value

    def _read_subfield(self, st: _State, spec: Mapping[str, Any]) -> int | None:
        v = self._get(st, spec["field"])
        if v is None or not isinstance(v, int):
            return None
        if spec.get("start") is None:
            return v
        start, end = int(spec["start"]), int(spec["end"])
        return (v >> start) & ((1 << (end - start + 1)) - 1)

    # -- matching ----------------------------------------------------------------
    def _canon_port(self, x: int | str) -> int | str:
        """A port number; a reserved port's name (LOCAL...); else the name."""
        if isinstance(x, int):
            return x
        if x.upper() in _LEAVE:
            return x.upper()
        p = self.ports.by_name(x)
        return p.number if p is not None else x

    def _in_port_is(self, st: _State, want: int | str) -> bool | None:
        have = st.fields.get("in_port")
        if have is None:
            return None
        h, w = self._canon_port(have), self._canon_port(want)
        if h == w:
            return True
        if isinstance(h, int) == isinstance(w, int) or h in _LEAVE or w in _LEAVE:
            return False  # two numbers, two names (unique on a switch), or a reserved port
        num, name = (h, w) if isinstance(h, int) else (w, h)
        p = self.ports.by_number(int(num))
        return None if p is None else p.name == name

    def _matches(self, st: _State, m: Match) -> bool | None:
        f = st.fields
        if m.field == "never":
            return False
        if m.field == "proto":
            return m.value in ("ip", "ipv4", f.get("__proto"))
        if m.field == "packet_type":
            return f.get("packet_type") == m.value
        if m.field == "in_port":
            return self._in_port_is(st, m.value)
        if m.field == "ct_state":
            want = _ct_match(str(m.value))
            have = f.get("ct_state")
            if want is None or not isinstance(have, int):
                return None
            return (have & want[1]) == want[0]
        have = self._get(st, m.field)
        if have is None or not isinstance(m.value, int) or not isinstance(have, int):
            return None
        mask = m.mask if m.mask is not None else -1
        return (have & mask) == (m.value & mask)

    def _conjunction(self, st: _State, table: int, conj_id: int) -> bool | None:
        """A conj_id flow matches when every dimension has a clause that does."""
        dims = self.conjunctions.get((table, conj_id))
        if not dims:
            return False
        result: bool | None = True
        for clauses in dims.values():
            best: bool | None = False
            for clause in clauses:
                r, _ = self._flow_matches(st, clause, table)
                if r is True:
                    best = True
                    break
                if r is None:
                    best = None
            if best is False:
                return False
            if best is None:
                result = None
        return result

    def _flow_matches(self, st: _State, flow: OfFlow, table: int) -> tuple[bool | None, str]:
        assert flow.match is not None
        maybe = ""
        for m in flow.match:
            if m.field == "conj_id" and isinstance(m.value, int):
                r = self._conjunction(st, table, m.value)
            else:
                r = self._matches(st, m)
            if r is False:
                return False, ""
            if r is None and not maybe:
                maybe = m.field
        return (None, maybe) if maybe else (True, "")

    def _candidates(self, st: _State, table: int) -> Iterable[OfFlow]:
        dst = st.fields.get("nw_dst")
        index = self._by_dst.get(table)
        if not index or not isinstance(dst, int):
            return self.tables.get(table, ())
        return heapq.merge(index.get(dst, ()), self._rest[table], key=_rank)

    def _lookup(self, st: _State, table: int) -> OfFlow | None:
        """The flow that surely wins; raises _Unknown when one that may match outranks it."""
        for flow in self._candidates(st, table):
            if not flow.understood:
                st.steps.append(self._step(table, flow))
                raise _Unknown(f"line {flow.line} (table {self.dump.table_label(table)}, "
                               f"priority {flow.priority}) could not be read and may match")
            assert flow.actions is not None
            if any(a.kind == "conjunction" for a in flow.actions):
                continue  # a conjunctive clause: it matches only through its conj_id flow
            r, why = self._flow_matches(st, flow, table)
            if r is False:
                continue
            if r is None:
                st.steps.append(self._step(table, flow))
                raise _Unknown(f"line {flow.line} (table {self.dump.table_label(table)}) matches "
                               f"on {why}, which this packet's description leaves open")
            return flow
        return None

    def _step(self, table: int, flow: OfFlow | None) -> Step:
        name = self.dump.table_label(table)
        return Step(table, flow.line if flow else None, flow.text if flow else "table miss",
                    "" if name == str(table) else name)

    # -- actions -----------------------------------------------------------------
    def _table(self, st: _State, table: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise _Loop(f"resubmit depth over {MAX_DEPTH} at table {self.dump.table_label(table)}")
        flow = self._lookup(st, table)
        if flow is None:
            st.steps.append(self._step(table, None))
            st.last_miss = table
            return
        st.steps.append(self._step(table, flow))
        assert flow.actions is not None
        self._actions(st, flow.actions, table, depth)

    def _actions(self, st: _State, actions: Iterable[Action], table: int, depth: int) -> None:
        then: list[int] = []
        for a in actions:
            k = a.kind
            if k == "output":
                self._output(st, a.args["port"])
            elif k == "resubmit":
                saved = st.fields.get("in_port")
                if a.args["port"] is not None:
                    st.fields["in_port"] = a.args["port"]
                self._table(st, table if a.args["table"] is None else a.args["table"], depth + 1)
                st.fields["in_port"] = saved
            elif k == "goto_table":
                then.append(a.args["table"])
            elif k == "ct":
                self._ct(st, a)
                if a.args["table"] is not None:
                    then.append(int(a.args["table"]))
            elif k == "ct_clear":
                for name in ("ct_state", "ct_mark", "ct_label", "ct_zone"):
                    st.fields[name] = 0
            elif k == "set":
                self._set_field(st, a.args["field"], a.args["value"])
            elif k == "load":
                dst = a.args["dst"]
                self._set(st, dst["field"], int(a.args["value"]), dst.get("start"), dst.get("end"))
            elif k == "move":
                self._set(st, a.args["dst"]["field"], self._read_subfield(st, a.args["src"]),
                          a.args["dst"].get("start"), a.args["dst"].get("end"))
            elif k == "group":
                raise _Unknown(f"group {a.args['id']}: its buckets are not in dump-flows")
            elif k == "clone":
                inner = st.copy()
                self._actions(inner, a.args["actions"], table, depth + 1)
            elif k == "write_actions":
                st.action_set = list(a.args["actions"])
            elif k == "exit":
                raise _Exit()
            elif k == "unknown":
                raise _Unknown(f"action {a.args['name']} is not interpreted")
            # drop, learn, harmless: nothing for this packet's path
        for t in then:
            self._table(st, t, depth + 1)

    def _set_field(self, st: _State, name: str, value: Any) -> None:
        name = canonical_field(name)
        if value is None:
            st.fields[name] = None
            return
        text = str(value)
        if name in ("nw_dst", "nw_src", "tun_dst", "tun_src"):
            im = ip_and_mask(text)
            st.fields[name] = im[0] if im else None
            return
        v, _, m = text.partition("/")
        if ":" in v:
            st.fields[name] = mac_int(v)
            return
        try:
            val = int(v, 0)
        except ValueError:
            st.fields[name] = None
            return
        if m:
            old = self._get(st, name)
            mask = int(m, 0)
            val = None if old is None else (old & ~mask) | (val & mask)  # type: ignore[assignment]
        self._set(st, name, val)

    def _ct(self, st: _State, a: Action) -> None:
        zone = a.args.get("zone", "0")
        memory: dict[Any, tuple[int | None, int | None]] = st.fields.setdefault("__committed", {})
        if a.args["commit"]:
            scratch = st.copy()
            scratch.fields["ct_mark"], scratch.fields["ct_label"] = memory.get(zone, (0, 0))
            for x in a.args["exec"]:
                if x.kind == "set":
                    self._set_field(scratch, x.args["field"], x.args["value"])
                elif x.kind == "load":
                    d = x.args["dst"]
                    self._set(scratch, d["field"], int(x.args["value"]), d.get("start"), d.get("end"))
                elif x.kind == "move":
                    self._set(scratch, x.args["dst"]["field"],
                              self._read_subfield(scratch, x.args["src"]),
                              x.args["dst"].get("start"), x.args["dst"].get("end"))
            memory[zone] = (scratch.fields.get("ct_mark"), scratch.fields.get("ct_label"))
        if a.args["table"] is None:
            return
        before: Mapping[Any, tuple[int | None, int | None]] = st.fields.get("__known", {})
        state = _CT_BITS["trk"]
        if zone in before or st.fields.get("__reply"):  # a reply: its request committed
            state |= _CT_BITS["est"] | (_CT_BITS["rpl"] if st.fields.get("__reply") else 0)
            st.fields["ct_mark"], st.fields["ct_label"] = before.get(zone, (0, 0))
        else:
            state |= _CT_BITS["new"]
            st.fields["ct_mark"], st.fields["ct_label"] = 0, 0
        st.fields["ct_state"] = state

    def _output(self, st: _State, port: int | str) -> None:
        if isinstance(port, str):
            m = _SUBFIELD.match(port)
            if m:
                spec = {"field": canonical_field(m.group(1)),
                        "start": int(m.group(2)) if m.group(2) else None,
                        "end": int(m.group(3) or m.group(2)) if m.group(2) else None}
                n = self._read_subfield(st, spec)
                if n is None:
                    raise _Unknown(f"output to {port}, whose value is not known here")
                port = n
            elif port.upper() in _LEAVE:
                st.ends.append(("leaves", _LEAVE[port.upper()], None, None))
                return
            else:
                p = self.ports.by_name(port)
                if p is None:
                    raise _Unknown(f"output to port {port!r}, which the switch's port list "
                                   "does not name")
                port = p.number
        if port == st.fields.get("in_port"):
            return  # OpenFlow never sends a packet back out of its input port this way
        p = self.ports.by_number(port)
        if p is None:
            if self.ports.complete:
                return  # the switch has no such port: nothing goes out
            st.ends.append(("deliver", port, None, None))
        elif p.kind == "tunnel":
            dst = st.fields.get("tun_dst")
            remote = str(ipaddress.IPv4Address(dst)) if isinstance(dst, int) and dst else p.remote_ip
            vni = st.fields.get("tun_id")  # 0: not set by the pipeline, the port's key then
            vni = vni if isinstance(vni, int) and vni else p.key
            st.ends.append(("tunnel", p.name, remote, vni))
        elif p.kind == "local":
            st.ends.append(("deliver", p.name, None, None))
        else:
            st.ends.append(("leaves", p.name, None, None))

    # -- a whole trace -------------------------------------------------------------
    def _initial(self, pkt: Packet) -> dict[str, Any]:
        if pkt.proto not in _NW_PROTO:
            raise ValueError(f"protocol {pkt.proto!r} is not one of {', '.join(_NW_PROTO)}")
        im = ip_and_mask(pkt.dst)
        if im is None:
            raise ValueError(f"destination {pkt.dst!r} is not an IPv4 address")
        src = ip_and_mask(pkt.src)[0] if pkt.src and ip_and_mask(pkt.src) else None  # type: ignore[index]
        in_port: int | str | None = pkt.in_port
        if isinstance(in_port, str):
            p = self.ports.by_name(in_port)
            in_port = p.number if p else in_port
        port = self.ports.by_number(in_port) if isinstance(in_port, int) else None
        from_tunnel = port is not None and port.kind == "tunnel"
        fields: dict[str, Any] = {f"reg{i}": 0 for i in range(16)}
        fields.update({
            "in_port": in_port, "nw_dst": im[0], "nw_src": src, "metadata": 0, "pkt_mark": 0,
            "ct_state": 0, "ct_mark": 0, "ct_label": 0, "ct_zone": 0, "vlan_tci": 0,
            "packet_type": "0,0", "dl_type": 0x0800, "nw_proto": _NW_PROTO[pkt.proto],
            "__proto": pkt.proto,
            "tun_id": pkt.vni if pkt.vni is not None else (None if from_tunnel else 0),
            "tun_dst": None if from_tunnel else 0, "tun_src": None if from_tunnel else 0,
            "__reply": pkt.reply,
        })
        fields.update({canonical_field(k): v for k, v in pkt.fields.items()})
        if pkt.in_port is None and pkt.vni is not None:
            fields["tun_dst"] = fields["tun_src"] = None
        return fields

    def _run(self, pkt: Packet, known: Mapping[Any, Any],
             table: int | None) -> tuple[_State, Outcome | None]:
        st = _State(self._initial(pkt))
        st.fields["__known"] = known
        try:
            try:
                self._table(st, self.start if table is None else table, 0)
            except _Exit:
                pass
            if st.action_set:
                self._actions(st, st.action_set, 0, 0)
        except _Unknown as e:
            return st, Outcome("unknown", why=str(e), steps=tuple(st.steps))
        except _Loop as e:
            return st, Outcome("loop", why=str(e), steps=tuple(st.steps))
        return st, None

    def trace(self, pkt: Packet, table: int | None = None) -> Outcome:
        """Where the packet ends, entering at `table` (default: the pipeline's start)."""
        first, _ = self._run(pkt, {}, table)  # the flow's first packet: what does it commit?
        committed = first.fields.get("__committed", {})
        st, out = self._run(pkt, committed, table)
        if out is not None:
            return out
        ends = list(dict.fromkeys(st.ends))
        if len(ends) > 1:  # a copy to the controller beside a real output is a tap
            ends = [e for e in ends if e[1] != "CONTROLLER"] or ends
        steps = tuple(st.steps)
        if not ends:
            why = (f"no flow matches in table {self.dump.table_label(st.last_miss)}"
                   if st.last_miss is not None and steps and steps[-1].line is None
                   else "no action sends it out")
            return Outcome("drop", why=why, steps=steps)
        if len(ends) > 1:
            return Outcome("unknown", why="copies go out of several ports: "
                           + ", ".join(f"{e[0]} {e[1]}" for e in ends), steps=steps)
        end, port, remote, vni = ends[0]
        return Outcome(end, port=port, remote_ip=remote, vni=vni, steps=steps)
