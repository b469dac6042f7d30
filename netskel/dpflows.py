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

A flow that matches an IPv4 destination says what happens to packets for
it: tunnelled (toward the outer address a `set(tunnel(...))` or
`tnl_push(...)` names, else the tunnel port decides), delivered to a local
port, or dropped. Where it recirculates (conntrack), the flows of its
recirculation id from the same input port decide, though they match no
destination: a pipeline that routes before conntrack (OVN's order) caches
the lookup before `recirc` and only the output after it; the testbed's
route-first pipeline records that shape (tests/data/dpctl). Flows for
invalid connections (`+inv`) say nothing of valid traffic and are left
out; continuations that disagree among themselves, flows that branch
(clone, sample, check_pkt_len, an upcall) or output to several ports are
counted and skipped: they cannot be judged against one rule. A flow's VNI
is its tunnel key (matched when it arrived by tunnel, set when it leaves
by one), else the switch's configured VNI."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from netskel.model import DatapathRule, FlowRule

# Key fields by name: no other field of a datapath key contains these names.
# tunnel() nests one level (flags(...)).
_ETH_TYPE = re.compile(r"eth_type\(([^()]*)\)")
_IN_PORT = re.compile(r"in_port\(([^()]*)\)")
_IPV4_DST = re.compile(r"ipv4\([^()]*?\bdst=([^,()]*)")
_TUNNEL = re.compile(r"tunnel\(((?:[^()]|\([^()]*\))*)\)")
_RECIRC_ID = re.compile(r"recirc_id\(([^()]*)\)")
_CT_STATE = re.compile(r"ct_state\(([^()]*)\)")
_RECIRC = re.compile(r"(?:^|,)recirc\(([^()]*)\)$")
_CT_INVALID = 0x10
_MAX_RECIRCULATIONS = 4  # conntrack, then NAT or a second zone; deeper is not one rule
Fate = tuple[str, str, int]  # what a flow does to its packets: (action, to, VNI)
# Actions whose effect depends on more than the flow: never judged.
_BRANCHING = ("clone(", "sample(", "check_pkt_len(", "userspace(", "controller(")
# Actions written as a bare word, like a port: not outputs.
_BARE_ACTIONS = frozenset({"drop", "ct_clear", "pop_vlan", "pop_eth", "pop_nsh"})


@dataclass(frozen=True)
class DatapathRead:
    rules: tuple[DatapathRule, ...]
    flows: int           # lines read as flows
    skipped: int         # flows that say nothing about one IPv4 destination's fate
    followed: int = 0    # continuations a judged flow's recirculation was read through


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
    eth, port, ipv4, tun = (_ETH_TYPE.search(key), _IN_PORT.search(key), _IPV4_DST.search(key),
                            _TUNNEL.search(key))
    d = ipv4.group(1) if ipv4 is not None else None
    return (_int(eth.group(1)) if eth is not None else None,
            port.group(1) if port is not None else "",
            _ipv4_dst(d) if d is not None else None,
            tun is not None,
            _int(_args(tun.group(1)).get("tun_id", "")) if tun is not None else None)


def _fate(actions: str, tunnel_ports: frozenset[str], vni: int) -> Fate | None:
    """(action, to, VNI) of a terminal flow's actions; None when they branch
    or output to several ports."""
    if any(b in actions for b in _BRANCHING):
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
    if not outputs:
        return "drop", "", vni
    if len(outputs) > 1:
        return None  # flooded or mirrored: not one rule's effect
    if tunnel is not None:
        return "tunnel", tunnel[1], tunnel[0] if tunnel[0] is not None else vni
    if outputs[0] in tunnel_ports:
        return "tunnel", "", vni
    return "deliver", outputs[0], vni


def _recirculates_to(actions: str) -> int | None:
    """The recirculation id a flow ends in, when nothing before it outputs."""
    m = _RECIRC.search(actions)
    if m is None or "recirc(" in actions[:m.start()]:
        return None
    before = actions[:m.start()]
    if any(b in before for b in _BRANCHING) or any(
            "(" not in t and t not in _BARE_ACTIONS for t in split_top(before)):
        return None
    return _int(m.group(1))


def _invalid_only(key: str) -> bool:
    """The flow holds only packets conntrack called invalid (`+inv`)."""
    m = _CT_STATE.search(key)
    if m is None:
        return False
    v = m.group(1)
    if "inv" in v:
        return "+inv" in v
    value, _, mask = v.partition("/")
    got, care = _int(value), _int(mask) if mask else _int(value)
    return got is not None and care is not None and bool(got & care & _CT_INVALID)


def _covers(matched: str | None, dst: str) -> bool:
    """A continuation that matches a destination applies to `dst` only if
    it covers it (one that matches none applies to all)."""
    if matched is None:
        return True
    try:
        return ipaddress.IPv4Network(dst, strict=False).subnet_of(
            ipaddress.IPv4Network(matched, strict=False))
    except (ValueError, TypeError):
        return False


class _Continuations:
    """The flows after each recirculation, by (recirculation id, input
    port): those that match no destination (their distinct actions) and
    those that do. Indexed on first use (most dumps never need them); the
    fates of the first kind are worked out once per id, port and VNI, as
    every destination routed to one output shares them."""

    def __init__(self, flows: list[tuple[str, str]], tunnel_ports: frozenset[str]) -> None:
        self._flows = flows
        self._tunnel_ports = tunnel_ports
        self._by_id: dict[tuple[int, str], tuple[list[str], list[tuple[str, str]]]] | None = None
        self._generic: dict[tuple[int, str, int], set[Fate] | None] = {}
        # (id, port) of the continuations some judged flow was read through:
        # no rule of their own, yet not unread.
        self.followed: set[tuple[int, str]] = set()

    def _index(self) -> dict[tuple[int, str], tuple[list[str], list[tuple[str, str]]]]:
        if self._by_id is None:
            self._by_id = {}
            for key, actions in self._flows:
                rid = _continued_id(key)
                if not rid:
                    continue
                eth_type, port, matched, _, _ = key_fields(key)
                if eth_type not in (None, 0x0800):
                    continue
                generic, specific = self._by_id.setdefault((rid, port), ([], []))
                if matched is None:
                    if actions not in generic:
                        generic.append(actions)
                else:
                    specific.append((matched, actions))
        return self._by_id

    def _one(self, actions: str, port: str, dst: str, vni: int, depth: int) -> Fate | None:
        if "recirc(" in actions:
            nxt = _recirculates_to(actions)
            return None if nxt is None else self.fate(nxt, port, dst, vni, depth + 1)
        return _fate(actions, self._tunnel_ports, vni)

    def fate(self, rid: int, port: str, dst: str, vni: int, depth: int = 0) -> Fate | None:
        """The one fate every valid continuation of `rid` gives `dst`; None
        when none is held, they disagree or one branches."""
        if depth >= _MAX_RECIRCULATIONS:
            return None
        generic, specific = self._index().get((rid, port), ([], []))
        ck = (rid, port, vni)
        if ck in self._generic:
            fates = self._generic[ck]
        else:
            fates = set()
            for actions in generic:
                got = self._one(actions, port, dst, vni, depth)
                if got is None:
                    fates = None
                    break
                fates.add(got)
            if not any("recirc(" in a for a in generic):  # else it may depend on dst
                self._generic[ck] = fates
        if fates is None:
            return None
        fates = set(fates)
        for matched, actions in specific:
            if _covers(matched, dst):
                got = self._one(actions, port, dst, vni, depth)
                if got is None:
                    return None
                fates.add(got)
        if len(fates) != 1:
            return None
        self.followed.add((rid, port))
        return fates.pop()


def _rule(key: str, actions: str, tunnel_ports: frozenset[str], default_vni: int,
          continuations: _Continuations) -> DatapathRule | None:
    # Cheap refusals first: most of a dump is recirculations that match no
    # destination (conntrack before routing) and non-IPv4.
    if any(b in actions for b in _BRANCHING):
        return None
    if "recirc(" in actions:
        d = _IPV4_DST.search(key)
        if d is None or d.group(1).endswith("/0.0.0.0"):
            return None
    eth_type, in_port, dst, arrived_by_tunnel, tun_id = key_fields(key)
    if eth_type != 0x0800 or dst is None or not in_port:
        return None
    vni = tun_id if arrived_by_tunnel and tun_id is not None else default_vni
    if "recirc(" in actions:
        rid = _recirculates_to(actions)
        fate = (None if rid is None else
                continuations.fate(rid, in_port, dst, vni))
    else:
        fate = _fate(actions, tunnel_ports, vni)
    if fate is None:
        return None
    action, to, vni = fate
    return DatapathRule(in_port, arrived_by_tunnel or in_port in tunnel_ports,
                        FlowRule(vni, dst, action, to))


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
    lines = [ln for ln in text.splitlines() if ln.strip()]
    flows = [f for ln in lines if (f := flow_line(ln)) is not None]
    continuations = _Continuations(flows, tunnel_ports)
    unjudged = []
    for key, actions in flows:
        got = _rule(key, actions, tunnel_ports, default_vni, continuations)
        if got is None:
            unjudged.append(key)
        else:
            rules[got] = None
    if lines and not flows and not any(ln.startswith("flow-dump") for ln in lines):
        raise DatapathError(f"no datapath flow in {len(lines)} lines: {lines[0][:80]!r}")
    followed = 0
    if continuations.followed:  # else no flow was read through: nothing to parse again
        followed = sum(1 for key in unjudged if (rid := _continued_id(key))
                       and (rid, key_fields(key)[1]) in continuations.followed)
    return DatapathRead(tuple(rules), len(flows), len(unjudged) - followed, followed)


def _continued_id(key: str) -> int:
    """The recirculation id a flow continues (0: none), for valid
    connections' flows only (`+inv` ones are never read through)."""
    m = _RECIRC_ID.search(key)
    rid = _int(m.group(1)) if m is not None else 0
    return 0 if not rid or _invalid_only(key) else rid
