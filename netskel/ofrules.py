"""An OpenFlow pipeline said in the topology contract's terms (section 1,
version 1.1): RULEs keyed by (VNI, destination prefix).

Two views. `line_rules`: each dump line on its own, for people reading a
dump (`netskel vswitch parse`). `contract_rules`: what the whole pipeline
does with a probe toward each destination, for the analyzer's overlay
trace — found by running the interpreter, not by reading single lines.

How `contract_rules` asks: the destinations that can behave differently
are the prefixes the flows match on; one address per prefix that no more
specific prefix covers stands for all of it, and the rule takes that
prefix with the longest-prefix order the contract uses. The contract has
no ingress port, so a destination's rule is what a probe toward it meets
where it enters this host's overlay: arriving from a tunnel when the
pipeline delivers it to a local port from there (the destination lives
here), else sent by a local container. A local container's port is left
open first; only when the answer depends on it are the switch's local
ports tried one by one, and ports that disagree give `unknown`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from netskel.model import FlowRule
from netskel.ofdump import Action, FlowDump, OfFlow
from netskel.ofpipeline import Outcome, Packet, Pipeline, Ports

MAX_LOCAL_PORTS = 16  # ports tried one by one when the answer depends on the input port
_FULL = 0xFFFFFFFF


def _prefix_len(mask: int) -> int | None:
    n = bin(mask).count("1")
    return n if mask == (_FULL << (32 - n)) & _FULL else None


def _dst_text(value: int, length: int) -> str:
    addr = str(ipaddress.IPv4Address(value))
    return addr if length == 32 else f"{addr}/{length}"


def destination_prefixes(dump: FlowDump) -> list[tuple[int, int]]:
    """(network, length) of every IPv4 destination prefix matched, plus 0/0."""
    out = {(0, 0)}
    for f in dump.flows:
        for m in f.match or ():
            if m.field == "nw_dst" and isinstance(m.value, int):
                n = _prefix_len(m.mask if m.mask is not None else _FULL)
                if n is not None:
                    out.add((m.value, n))
    return sorted(out, key=lambda p: (p[1], p[0]))


def _inside(addr: int, net: int, length: int) -> bool:
    mask = (_FULL << (32 - length)) & _FULL if length else 0
    return (addr & mask) == net


def representative(net: int, length: int, prefixes: list[tuple[int, int]]) -> int | None:
    """An address of the prefix that no longer listed prefix covers."""
    if length == 32:
        return net
    inner = [(n, ln) for n, ln in prefixes if ln > length and _inside(n, net, length)]
    size = 1 << (32 - length)
    # Candidates in order: ends of the range, then the ends of each gap
    # right after an inner prefix (its last address + 1).
    cands = [net, net + size - 1, net + 1, net + size - 2]
    cands += [n + (1 << (32 - ln)) for n, ln in inner]
    cands += [n - 1 for n, _ in inner]
    for c in cands:
        if _inside(c, net, length) and not any(_inside(c, n, ln) for n, ln in inner):
            return c
    return None


def _same(outs: list[Outcome]) -> Outcome:
    keys = {(o.end, o.port if o.end in ("deliver", "leaves") else None, o.remote_ip, o.vni)
            for o in outs}
    if len(keys) == 1:
        return outs[0]
    return Outcome("unknown", why="local ports disagree: "
                   + ", ".join(sorted(f"{k[0]} {k[1] or k[2] or ''}".strip() for k in keys)))


def _local(pipe: Pipeline, dst: str) -> Outcome:
    out = pipe.trace(Packet(dst))
    if out.end != "unknown" or "in_port" not in out.why:
        return out
    local = [p for p in pipe.ports.ports if p.kind == "local"]
    if not local or len(local) > MAX_LOCAL_PORTS:
        return out
    return _same([pipe.trace(Packet(dst, in_port=p.number)) for p in local])


def _rule(vni: int, dst: str, out: Outcome) -> FlowRule:
    if out.end == "tunnel":
        return FlowRule(vni if out.vni is None else out.vni, dst, "tunnel", out.remote_ip or "")
    if out.end == "deliver":
        return FlowRule(vni, dst, "deliver", str(out.port))
    if out.end == "leaves":
        return FlowRule(vni, dst, "forward", str(out.port))
    if out.end == "unknown":
        return FlowRule(vni, dst, "unknown")
    return FlowRule(vni, dst, "drop")  # drop, and a loop, which Open vSwitch ends by dropping


def contract_rules(pipe: Pipeline, vnis: Iterable[int]) -> list[FlowRule]:
    prefixes = destination_prefixes(pipe.dump)
    tunnels = [p for p in pipe.ports.ports if p.kind == "tunnel"]
    rules: dict[tuple[int, str], FlowRule] = {}
    local_cache: dict[int, Outcome] = {}
    for vni in sorted(set(vnis)):
        for net, length in prefixes:
            rep = representative(net, length, prefixes)
            if rep is None:
                continue
            dst = str(ipaddress.IPv4Address(rep))
            out: Outcome | None = None
            if tunnels:
                arriving = pipe.trace(Packet(dst, in_port=tunnels[0].number, vni=vni))
                if arriving.end == "deliver":
                    out = arriving
            if out is None:
                if rep not in local_cache:
                    local_cache[rep] = _local(pipe, dst)
                out = local_cache[rep]
            rule = _rule(vni, _dst_text(net, length), out)
            if length == 0 and rule.action == "drop":
                continue  # no rule means drop: the catch-all drop says nothing
            rules.setdefault((rule.vni, rule.dst), rule)
    return sorted(rules.values(), key=lambda r: (r.vni, r.dst))


# -- one line at a time ---------------------------------------------------------------
def _port_action(ports: Ports, port: Any) -> tuple[str, str]:
    if isinstance(port, str) and port.upper() in ("NORMAL", "LOCAL", "IN_PORT", "FLOOD", "ALL",
                                                  "CONTROLLER"):
        return "forward", port.upper()
    if isinstance(port, str) and "[" in port:
        return "unknown", port
    p = ports.by_name(port) if isinstance(port, str) else ports.by_number(port)
    if p is None:
        return ("unknown", str(port)) if isinstance(port, str) else ("deliver", str(port))
    if p.kind == "tunnel":
        return "tunnel", p.remote_ip or ""
    return ("deliver", p.name) if p.kind == "local" else ("forward", p.name)


def _line_effect(ports: Ports, actions: tuple[Action, ...], names: FlowDump,
                 ) -> tuple[str, str, list[str], str]:
    """(action, to, next tables, tunnel destination) of one line's actions."""
    outs: list[tuple[str, str]] = []
    nxt: list[str] = []
    tun_dst = ""
    for a in actions:
        if a.kind == "output":
            outs.append(_port_action(ports, a.args["port"]))
        elif a.kind in ("resubmit", "goto_table") and a.args.get("table") is not None:
            nxt.append(names.table_label(int(a.args["table"])))
        elif a.kind == "resubmit":
            nxt.append("this table")
        elif a.kind == "ct" and a.args.get("table") is not None:
            nxt.append(names.table_label(int(a.args["table"])))
        elif a.kind == "group":
            outs.append(("unknown", f"group:{a.args['id']}"))
        elif a.kind == "unknown":
            outs.append(("unknown", str(a.args["name"])))
        elif a.kind in ("clone", "write_actions"):
            act, to, more, td = _line_effect(ports, a.args["actions"], names)
            if act != "drop":
                outs.append((act, to))
            nxt += more
            tun_dst = tun_dst or td
        elif a.kind == "set" and a.args["field"] == "tun_dst":
            tun_dst = str(a.args["value"]).split("/")[0]
    kinds = {o[0] for o in outs}
    if len(kinds) == 1:
        act, to = outs[0]
        if act == "tunnel" and tun_dst:
            to = tun_dst
        return act, to, nxt, tun_dst
    if len(kinds) > 1:
        return "unknown", ", ".join(f"{k} {t}" for k, t in outs), nxt, tun_dst
    if nxt:  # its effect is decided in the next table: `vswitch trace` follows it
        return "unknown", "", nxt, tun_dst
    return "drop", "", nxt, tun_dst


def _match_doc(flow: OfFlow) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for m in flow.match or ():
        if m.field in ("nw_dst", "nw_src", "tun_dst", "tun_src") and isinstance(m.value, int):
            n = _prefix_len(m.mask if m.mask is not None else _FULL)
            doc[m.field] = (_dst_text(m.value, n) if n is not None else
                            f"{ipaddress.IPv4Address(m.value)}/{ipaddress.IPv4Address(m.mask or 0)}")
        elif isinstance(m.value, int) and m.mask is not None and m.field != "in_port":
            doc[m.field] = f"{m.value:#x}/{m.mask:#x}"
        elif m.field == "proto":
            doc.setdefault("proto", []).append(m.value)
        else:
            doc[m.field] = m.value
    return doc


def line_rules(dump: FlowDump, ports: Ports | None = None) -> list[dict[str, Any]]:
    """Each understood line as a contract RULE plus what it keeps: line,
    table, priority, match. A line that hands the packet to another table
    has action `unknown` and names the tables in `next` (its end depends
    on them); it is never reported as `drop`."""
    ports = ports or Ports()
    out = []
    for f in dump.flows:
        if not f.understood or f.actions is None:
            continue
        if any(a.kind == "conjunction" for a in f.actions):
            action, to, nxt = "unknown", "", list[str]()
            why = "a conjunctive clause: its conj_id flow acts"
        else:
            action, to, nxt, _ = _line_effect(ports, f.actions, dump)
            why = ""
        match = _match_doc(f)
        vni = match.get("tun_id", 0)
        for a in f.actions:
            if a.kind == "set" and a.args["field"] == "tun_id":
                vni = str(a.args["value"])
            elif a.kind == "load" and a.args["dst"]["field"] == "tun_id":
                vni = int(a.args["value"])
        if isinstance(vni, str):
            try:
                vni = int(vni.split("/")[0], 0)
            except ValueError:
                vni = 0
        rule: dict[str, Any] = {"vni": int(vni), "dst": match.get("nw_dst", "0.0.0.0/0"),
                                "action": action, "priority": f.priority, "line": f.line,
                                "table": dump.table_label(f.table), "match": match}
        if to:
            rule["to"] = to
        if nxt:
            rule["next"] = nxt
        if why:
            rule["why"] = why
        out.append(rule)
    return out
