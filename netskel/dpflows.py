"""What the fast path really holds: datapath flows
(`ovs-appctl dpctl/dump-flows -m --names [type=offloaded]`) said as the
topology contract's rules, one per (input port, VNI, destination).

A NIC that offloads the virtual switch (TC flower on ASAP2-style
eswitches, rte_flow under DPDK) forwards from its own copy: the megaflows
the switch pushed down, not the OpenFlow tables. When that copy goes
stale, the tables an operator dumps still look right while every packet
of the flow dies or turns in the NIC; the contract calls such a NIC
suspect (section 1, `offloaded`). `type=offloaded` lists exactly the
flows in hardware; without offload the same dump of the software
datapath's cache has the same grammar and the same failure class (a
cached flow that disagrees with its tables).

Only terminal flows (no recirculation) that match an IPv4 destination say
what happens to packets for it: tunnelled (toward the outer address a
`set(tunnel(...))` or `tnl_push(...)` names, else the tunnel port decides),
delivered to a local port, or dropped. Flows that branch (clone, sample,
check_pkt_len, an upcall) or output to several ports are counted and
skipped: they cannot be judged against one rule. A flow's VNI is its
tunnel key (matched when it arrived by tunnel, set when it leaves by one),
else the switch's configured VNI."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from netskel.model import DatapathRule, FlowRule

# Key fields by name: no other field of a datapath key contains these names.
# tunnel() nests one level (flags(...)).
_ETH_TYPE = re.compile(r"eth_type\(([^()]*)\)")
_IN_PORT = re.compile(r"in_port\(([^()]*)\)")
_IPV4 = re.compile(r"ipv4\(([^()]*)\)")
_TUNNEL = re.compile(r"tunnel\(((?:[^()]|\([^()]*\))*)\)")
# Actions whose effect depends on more than the flow: never judged.
_BRANCHING = ("clone(", "sample(", "check_pkt_len(", "userspace(", "controller(")
# Actions written as a bare word, like a port: not outputs.
_BARE_ACTIONS = frozenset({"drop", "ct_clear", "pop_vlan", "pop_eth", "pop_nsh"})


@dataclass(frozen=True)
class DatapathRead:
    rules: tuple[DatapathRule, ...]
    flows: int           # lines read as flows
    skipped: int         # flows that say nothing about one IPv4 destination's fate


class DatapathError(ValueError):
    """The text is not a datapath flow dump."""


def split_top(s: str, sep: str = ",") -> list[str]:
    """`s` cut at `sep` outside parentheses (flow keys and actions nest)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(s[start:i])
            start = i + 1
    out.append(s[start:])
    return [t.strip() for t in out if t.strip()]


def _fields(token: str) -> tuple[str, str]:
    """`name(args)` as (name, args); a bare word as (word, "")."""
    i = token.find("(")
    if i < 0 or not token.endswith(")"):
        return token, ""
    return token[:i], token[i + 1:-1]


def _args(args: str) -> dict[str, str]:
    out = {}
    for part in split_top(args):
        k, eq, v = part.partition("=")
        out[k.strip()] = v.strip() if eq else ""
    return out


def _ipv4_dst(value: str) -> str | None:
    """A matched destination as the contract writes it (an address or a
    prefix); None when the flow does not look at it (mask 0) or the mask is
    not a prefix."""
    addr, _, mask = value.partition("/")
    try:
        ip = ipaddress.IPv4Address(addr)
        if not mask:
            return str(ip)
        net = ipaddress.IPv4Network(f"{ip}/{mask}", strict=False)
    except ValueError:
        return None
    if net.prefixlen == 0:
        return None
    return str(ip) if net.prefixlen == 32 else str(net)


def _int(v: str) -> int | None:
    try:
        return int(v.partition("/")[0], 0)
    except ValueError:
        return None


def _tunnel_target(token: str) -> tuple[int | None, str] | None:
    """(VNI, outer destination) from `set(tunnel(...))` or `tnl_push(...)`."""
    name, args = _fields(token)
    if name == "set":
        inner, iargs = _fields(args)
        if inner != "tunnel":
            return None
        a = _args(iargs)
        return _int(a.get("tun_id", "")), a.get("dst", "")
    if name == "tnl_push":
        vni, dst = None, ""
        for part in split_top(args):
            pname, pargs = _fields(part)
            if pname != "header":
                continue
            for h in split_top(pargs):
                hname, hargs = _fields(h)
                if hname in ("ipv4", "ipv6"):
                    dst = _args(hargs).get("dst", "")
                elif hname in ("vxlan", "geneve", "gre"):
                    a = _args(hargs)
                    vni = _int(a.get("vni", a.get("key", "")))
        return vni, dst
    return None


def key_fields(key: str) -> tuple[int | None, str, str | None, bool, int | None]:
    """(eth_type, in_port, IPv4 destination, arrived by tunnel, tunnel key)
    of a flow key, by pattern: the key is most of a line and most lines are
    refused on these alone (tests hold it to a full parse with split_top)."""
    eth, port, ipv4, tun = (_ETH_TYPE.search(key), _IN_PORT.search(key), _IPV4.search(key),
                            _TUNNEL.search(key))
    d = _args(ipv4.group(1)).get("dst") if ipv4 is not None else None
    return (_int(eth.group(1)) if eth is not None else None,
            port.group(1) if port is not None else "",
            _ipv4_dst(d) if d is not None else None,
            tun is not None,
            _int(_args(tun.group(1)).get("tun_id", "")) if tun is not None else None)


def _rule(key: str, actions: str, tunnel_ports: frozenset[str],
          default_vni: int) -> DatapathRule | None:
    # Cheap refusals first: most of a dump is recirculations and non-IPv4.
    if "recirc(" in actions or any(b in actions for b in _BRANCHING):
        return None
    eth_type, in_port, dst, arrived_by_tunnel, tun_id = key_fields(key)
    if eth_type != 0x0800 or dst is None or not in_port:
        return None
    outputs: list[str] = []
    tunnel: tuple[int | None, str] | None = None
    for tok in split_top(actions):
        if tok in _BARE_ACTIONS:
            continue
        t = _tunnel_target(tok)
        if t is not None:
            tunnel = t
            if tok.startswith("tnl_push("):  # userspace: encapsulates and outputs in one
                outputs.append(tok)
            continue
        if "(" not in tok:
            outputs.append(tok)
    vni = tun_id if arrived_by_tunnel and tun_id is not None else default_vni
    from_tunnel = arrived_by_tunnel or in_port in tunnel_ports
    if not outputs:
        return DatapathRule(in_port, from_tunnel, FlowRule(vni, dst, "drop", ""))
    if len(outputs) > 1:
        return None  # flooded or mirrored: not one rule's effect
    if tunnel is not None:
        return DatapathRule(in_port, from_tunnel, FlowRule(
            tunnel[0] if tunnel[0] is not None else vni, dst, "tunnel", tunnel[1]))
    if outputs[0] in tunnel_ports:
        return DatapathRule(in_port, from_tunnel, FlowRule(vni, dst, "tunnel", ""))
    return DatapathRule(in_port, from_tunnel, FlowRule(vni, dst, "deliver", outputs[0]))


def flow_line(line: str) -> tuple[str, str] | None:
    """A dump line as (key, actions): the key without its ufid and
    statistics (as `dpctl/mod-flow` takes it), the actions without the
    datapath's extra info; None for a line that is no flow."""
    head, sep, actions = line.partition("actions:")
    if not sep:
        return None
    key = head.split(", packets:", 1)[0] if ", packets:" in head else head.rstrip(", ")
    if key.startswith("ufid:"):
        key = key.partition(",")[2]
    return key.strip(), actions.split(", dp-extra-info:", 1)[0].strip()


def read_datapath(text: str, tunnel_ports: frozenset[str], default_vni: int) -> DatapathRead:
    """Every line `... actions:...` is a flow; other lines (a dump's
    headers, `flow-dump from pmd on cpu core: N`) are not. Raises
    DatapathError when nothing in a non-empty text reads as a flow."""
    rules: dict[DatapathRule, None] = {}
    flows = skipped = 0
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in lines:
        flow = flow_line(line)
        if flow is None:
            continue
        flows += 1
        got = _rule(*flow, tunnel_ports, default_vni)
        if got is None:
            skipped += 1
        else:
            rules[got] = None
    if lines and not flows and not any(ln.startswith("flow-dump") for ln in lines):
        raise DatapathError(f"no datapath flow in {len(lines)} lines: {lines[0][:80]!r}")
    return DatapathRead(tuple(rules), flows, skipped)
