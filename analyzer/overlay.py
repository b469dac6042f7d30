"""Overlay forwarding, followed hop by hop through the virtual switches'
rules (contract section 1 `vswitch`, or the agents' live dumps).

A probe is a round trip, so both directions are traced. At each host the
rule for (VNI, destination) is the highest priority one, then the longest
prefix (contract 1.1). A missing (or drop) rule is a blackhole at that hop,
named HOST:VNI:DST (DST as the rule writes it); reaching a host twice is a
loop, named by the rule it was entered through. A rule that sends the
packet out of the model (`forward`) or could not be understood
(`unknown`), or a host whose table we do not have, ends the trace in
"unknown": it never blames a rule. Where the switch forwards
fine, each NIC on the way is checked: its offloaded copy of the rule for
this flow must equal the switch's."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from netskel.model import DatapathRule, FlowRule, VSwitchDump
from netskel.topology import Endpoint, Rule, Topology, rule_network


def rule_id(host: str, vni: int, dst: str) -> str:
    return f"{host}:{vni}:{dst}"


@dataclass(frozen=True)
class Trace:
    kind: str                     # ok | blackhole | loop | nic | unknown
    rule: str | None = None       # the rule where forwarding broke (HOST:VNI:DST)
    nic: str | None = None        # the NIC whose offloaded rule disagrees
    hops: tuple[str, ...] = ()    # rule ids followed
    detail: dict[str, Any] = field(default_factory=dict)


def _same_fate(a: Rule, b: Rule) -> bool:
    """What happens to the packet, whatever the rules' prefixes and
    priorities (a megaflow may match more narrowly than its rule)."""
    return a.action == b.action and a.to == b.to


def _rule_doc(r: Rule | None) -> dict[str, Any] | None:
    if r is None:
        return None
    doc: dict[str, Any] = {"vni": r.vni, "dst": r.dst, "action": r.action, "to": r.to}
    if r.priority:
        doc["priority"] = r.priority
    return doc


class _Rules:
    """One switch's (or NIC's) rules, looked up by (VNI, address)."""

    def __init__(self, cache: bool = False) -> None:
        # A datapath's cache (an agent's live read): a destination it does
        # not hold says nothing (flows come and go with traffic); only one it
        # holds with another fate than the switch's is a disagreement.
        self.cache = cache
        self.exact: dict[tuple[int, str], Rule] = {}
        self.ranked: dict[int, list[tuple[Any, Rule]]] = {}  # by VNI, best first
        self.top: dict[int, int] = {}                         # highest priority per VNI
        self._unsorted: set[int] = set()  # VNIs whose ranking waits for the next lookup

    def add(self, r: Rule) -> None:
        parsed = rule_network(r.dst)
        if parsed is None:
            return  # an agent's dump is read by the agent; nothing here can use this one
        net, host = parsed
        if host is not None:
            self.exact.setdefault((r.vni, host), r)
        self.ranked.setdefault(r.vni, []).append((net, r))
        # Sorted once, when first looked up: a host's thousands of rules are
        # added in one go (sorting after each add was quadratic).
        self._unsorted.add(r.vni)
        self.top[r.vni] = max(self.top.get(r.vni, r.priority), r.priority)

    def _ranked(self, vni: int) -> list[tuple[Any, Rule]]:
        ranked = self.ranked.get(vni, [])
        if vni in self._unsorted:
            ranked.sort(key=lambda x: (-x[1].priority, -x[0].prefixlen))  # stable: first added wins ties
            self._unsorted.discard(vni)
        return ranked

    def lookup(self, vni: int, ip: str) -> Rule | None:
        r = self.exact.get((vni, ip))
        if r is not None and r.priority >= self.top[vni]:
            return r  # a host route at the top priority: nothing can beat it
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return None
        for net, rule in self._ranked(vni):
            if addr in net:
                return rule
        return None

    def __len__(self) -> int:
        return sum(len(v) for v in self.ranked.values())


class OverlayTables:
    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.tables: dict[str, _Rules] = {}    # host -> its switch's rules
        self.offloaded: dict[str, _Rules] = {}  # NIC -> what its hardware holds
        for host, vs in topo.vswitch.items():
            self._put(host, vs.rules)
            for nic, rules in vs.offloaded.items():
                t = self.offloaded[nic] = _Rules()
                for r in rules:
                    t.add(r)
        # For reading agents' dumps, built once: the topology is fixed.
        self._ep_by_ip = {(e.vni, e.ip): e for e in topo.endpoints.values() if e.ip is not None}
        self._nic_by_ip = {n.ip: n.id for n in topo.nics.values() if n.ip}
        self._cache: dict[tuple[str, str], Trace] = {}
        # Per host, the last live dump applied: (rules, datapath flows).
        self._last: dict[str, tuple[tuple[FlowRule, ...], tuple[DatapathRule, ...] | None]] = {}

    @property
    def hosts(self) -> set[str]:
        """Hosts whose table is known."""
        return set(self.tables)

    def _put(self, host: str, rules: tuple[Rule, ...]) -> None:
        t = self.tables[host] = _Rules()
        for r in rules:
            t.add(r)

    def set_host(self, dump: VSwitchDump) -> None:
        """A live dump replaces that host's rules, and, where the agent read
        its datapath, its NICs' offloaded tables (else those stay); only
        traces are recomputed, not every host's index."""
        prev = self._last.get(dump.host)
        if prev is not None and prev[0] == dump.rules and dump.datapath in (None, prev[1]):
            return  # the same (a refresh, or another agent of the host): traces stand
        self._put(dump.host, self.rules_from_dump(dump))
        if dump.datapath is not None:
            self._put_datapath(dump)
        self._last[dump.host] = (dump.rules, dump.datapath if dump.datapath is not None
                                 else prev[1] if prev is not None else None)
        self._cache.clear()

    def _put_datapath(self, dump: VSwitchDump) -> None:
        """Each datapath flow belongs to the NIC it runs on: one leaving a
        local port to that port's endpoint's NIC (the switch's own
        deliveries say which endpoint sits behind a port), one arriving by
        tunnel to the NIC of the local endpoint it is for. Flows no NIC can
        be found for are left out. Where flows for one destination disagree
        (several megaflows), the one differing from the switch is kept."""
        host, topo = dump.host, self.topo
        port_ep = {}
        for r in dump.rules:
            ep = self._ep_by_ip.get((r.vni, r.dst)) if r.action == "deliver" and r.to else None
            if ep is not None and topo.nics[ep.nic].host == host:
                port_ep[r.to] = ep
        switch = self.tables[host]
        held: list[tuple[bool, str, Rule]] = []
        for f in dump.datapath or ():
            r = f.rule
            if f.from_tunnel:
                ep = self._ep_by_ip.get((r.vni, r.dst))
                if ep is None or topo.nics[ep.nic].host != host:
                    ep = port_ep.get(r.to) if r.action == "deliver" else None
            else:
                ep = port_ep.get(f.port)
            if ep is None:
                continue
            rule = self._from_dump(r, host, port_ep)
            parsed = rule_network(rule.dst)
            if parsed is None:
                continue
            mine = switch.lookup(rule.vni, str(parsed[1] or parsed[0].network_address))
            held.append((mine is not None and _same_fate(mine, rule), ep.nic, rule))
        tables = {nic: _Rules(cache=True) for nic in topo.hosts.get(host, ())}
        for _, nic, rule in sorted(held, key=lambda h: h[0]):  # first added wins ties
            tables.setdefault(nic, _Rules(cache=True)).add(rule)
        self.offloaded.update(tables)

    def rules_from_dump(self, dump: VSwitchDump) -> tuple[Rule, ...]:
        """An agent's dump in the contract's terms: a delivery names the local
        endpoint owning the destination (else the port the agent named); a
        tunnel names the NIC with its outer IP, or, when the tunnel device
        chooses, the destination endpoint's NIC (None for a prefix: the
        trace then takes each destination's own NIC)."""
        return tuple(self._from_dump(r, dump.host) for r in dump.rules)

    def _from_dump(self, r: FlowRule, host: str, port_ep: dict[str, Endpoint] | None = None
                   ) -> Rule:
        """`port_ep`: a datapath flow's delivery names the endpoint behind
        its output port (a wrong port is then a different endpoint)."""
        ep = self._ep_by_ip.get((r.vni, r.dst))
        if r.action == "deliver":
            if port_ep is not None and r.to in port_ep:
                return Rule(r.vni, r.dst, "deliver", port_ep[r.to].id, r.priority)
            here = ep is not None and self.topo.nics[ep.nic].host == host
            return Rule(r.vni, r.dst, "deliver",
                        ep.id if ep is not None and here else r.to or None, r.priority)
        if r.action == "tunnel":
            to = self._nic_by_ip.get(r.to) if r.to else (ep.nic if ep is not None else None)
            return Rule(r.vni, r.dst, "tunnel", to, r.priority)
        if r.action in ("forward", "unknown"):
            return Rule(r.vni, r.dst, r.action, r.to or None, r.priority)
        return Rule(r.vni, r.dst, "drop", None, r.priority)

    @property
    def known(self) -> bool:
        return any(len(t) for t in self.tables.values())

    def trace(self, src: str, dst: str) -> Trace:
        """One direction, endpoint to endpoint (cached: tables are a snapshot)."""
        got = self._cache.get((src, dst))
        if got is None:
            got = self._cache[(src, dst)] = self._trace(src, dst)
        return got

    def _trace(self, src: str, dst: str) -> Trace:
        topo = self.topo
        if not self.known:
            return Trace("unknown")
        s, d = topo.endpoints[src], topo.endpoints[dst]
        if d.ip is None or d.vni is None:
            return Trace("unknown")
        host, nic = topo.nics[s.nic].host, s.nic
        seen: list[str] = []
        hops: list[str] = []
        while True:
            table = self.tables.get(host)
            r = table.lookup(d.vni, d.ip) if table is not None else None
            rid = rule_id(host, d.vni, r.dst if r is not None else d.ip)
            if host in seen:
                # Named by the rule the packet entered the cycle through: the
                # one that sent it off its way (the rules before it led
                # towards the destination). `cycle` keeps the loop whole.
                cycle = hops[seen.index(host):]
                return Trace("loop", rule=cycle[0], hops=tuple(hops),
                             detail={"hosts": [*seen, host], "cycle": cycle})
            if table is None:  # no snapshot of this host: cannot say
                return Trace("unknown", hops=tuple(hops), detail={"host": host,
                                                                  "reason": "table not known"})
            seen.append(host)
            hops.append(rid)
            if r is None or r.action == "drop":
                # Named by the destination: what broke is the missing route
                # for it, not the covering drop that works for everyone else.
                detail: dict[str, Any] = {"host": host,
                                          "reason": "no rule" if r is None else "drop rule"}
                if r is not None and r.dst != d.ip:
                    detail["matched_rule"] = _rule_doc(r)
                return Trace("blackhole", rule=rule_id(host, d.vni, d.ip), hops=tuple(hops),
                             detail=detail)
            if r.action in ("forward", "unknown"):  # out of what the tables describe
                return Trace("unknown", hops=tuple(hops),
                             detail={"host": host, "rule": _rule_doc(r),
                                     "reason": "leaves the overlay model" if r.action == "forward"
                                     else "rule not understood"})
            off_table = self.offloaded.get(nic)
            off = off_table.lookup(d.vni, d.ip) if off_table is not None else None
            if off_table is not None and (
                    off != r if not off_table.cache else off is not None and not _same_fate(off, r)):
                return Trace("nic", rule=rid, nic=nic, hops=tuple(hops),
                             detail={"switch_rule": _rule_doc(r), "offloaded_rule": _rule_doc(off)})
            if r.action == "deliver":
                if r.to in topo.endpoints and r.to != dst:
                    return Trace("blackhole", rule=rid, hops=tuple(hops),
                                 detail={"host": host, "reason": f"delivers to {r.to}"})
                if topo.nics[d.nic].host != host:
                    return Trace("blackhole", rule=rid, hops=tuple(hops),
                                 detail={"host": host, "reason": f"delivers locally (to {r.to}) "
                                         "but the destination lives on another host"})
                return Trace("ok", hops=tuple(hops))
            to = r.to if r.to is not None else d.nic  # the tunnel device picks the far end
            if to not in topo.nics:
                return Trace("blackhole", rule=rid, hops=tuple(hops),
                             detail={"host": host, "reason": f"tunnels to unknown NIC {to}"})
            nic = str(to)
            host = topo.nics[nic].host

    def round_trip(self, a: str, b: str) -> Trace:
        """The first break on the way there or back."""
        there = self.trace(a, b)
        if there.kind != "ok":
            return there
        back = self.trace(b, a)
        if back.kind != "ok":
            return back
        return Trace("ok", hops=there.hops + back.hops)
