"""Overlay forwarding, followed hop by hop through the virtual switches'
rules (contract section 1 `vswitch`, or the agents' live dumps).

A probe is a round trip, so both directions are traced. A missing (or drop)
rule is a blackhole at that hop, named HOST:VNI:DST; reaching a host twice is
a loop. Where the switch forwards fine, each NIC on the way is checked: its
offloaded copy of the rule for this flow must equal the switch's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from netskel.model import VSwitchDump
from netskel.topology import Rule, Topology


def rule_id(host: str, vni: int, dst: str) -> str:
    return f"{host}:{vni}:{dst}"


@dataclass(frozen=True)
class Trace:
    kind: str                     # ok | blackhole | loop | nic | unknown
    rule: str | None = None       # the rule where forwarding broke (HOST:VNI:DST)
    nic: str | None = None        # the NIC whose offloaded rule disagrees
    hops: tuple[str, ...] = ()    # rule ids followed
    detail: dict[str, Any] = field(default_factory=dict)


def _rule_doc(r: Rule | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {"vni": r.vni, "dst": r.dst, "action": r.action, "to": r.to}


class OverlayTables:
    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.rules: dict[tuple[str, int, str], Rule] = {}
        self.offloaded: dict[tuple[str, int, str], Rule] = {}
        self.offloading: set[str] = set()  # NICs that report an offloaded table
        self.hosts: set[str] = set()       # hosts whose table is known
        self._keys: dict[str, list[tuple[str, int, str]]] = {}  # host -> its rules' keys
        for host, vs in topo.vswitch.items():
            self._put(host, vs.rules)
            for nic, rules in vs.offloaded.items():
                self.offloading.add(nic)
                for r in rules:
                    self.offloaded[(nic, r.vni, r.dst)] = r
        # For reading agents' dumps, built once: the topology is fixed.
        self._ep_by_ip = {(e.vni, e.ip): e for e in topo.endpoints.values() if e.ip is not None}
        self._nic_by_ip = {n.ip: n.id for n in topo.nics.values() if n.ip}
        self._cache: dict[tuple[str, str], Trace] = {}

    def _put(self, host: str, rules: tuple[Rule, ...]) -> None:
        self.hosts.add(host)
        keys = self._keys.setdefault(host, [])
        for r in rules:
            self.rules[(host, r.vni, r.dst)] = r
            keys.append((host, r.vni, r.dst))

    def set_host(self, dump: VSwitchDump) -> None:
        """A live dump replaces that host's rules (its NICs' offloaded tables
        stay); only traces are recomputed, not every host's index."""
        for key in self._keys.pop(dump.host, []):
            self.rules.pop(key, None)
        self._put(dump.host, self.rules_from_dump(dump))
        self._cache.clear()

    def rules_from_dump(self, dump: VSwitchDump) -> tuple[Rule, ...]:
        """An agent's dump in the contract's terms: a delivery names the local
        endpoint owning the destination; a tunnel names the NIC with its outer
        IP, or, when the tunnel device chooses, the destination endpoint's NIC."""
        out = []
        for r in dump.rules:
            ep = self._ep_by_ip.get((r.vni, r.dst))
            if r.action == "deliver":
                here = ep is not None and self.topo.nics[ep.nic].host == dump.host
                out.append(Rule(r.vni, r.dst, "deliver",
                                ep.id if ep is not None and here else r.to or None))
            elif r.action == "tunnel":
                to = self._nic_by_ip.get(r.to) if r.to else (ep.nic if ep is not None else None)
                out.append(Rule(r.vni, r.dst, "tunnel", to))
            else:
                out.append(Rule(r.vni, r.dst, "drop"))
        return tuple(out)

    @property
    def known(self) -> bool:
        return bool(self.rules)

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
            rid = rule_id(host, d.vni, d.ip)
            if host in seen:  # named by the cycle's smallest rule: one incident per loop
                cycle = hops[seen.index(host):]
                return Trace("loop", rule=min(cycle), hops=tuple(hops),
                             detail={"hosts": [*seen, host], "cycle": cycle})
            if host not in self.hosts:  # no snapshot of this host: cannot say
                return Trace("unknown", hops=tuple(hops))
            seen.append(host)
            hops.append(rid)
            r = self.rules.get((host, d.vni, d.ip))
            if r is None or r.action == "drop":
                return Trace("blackhole", rule=rid, hops=tuple(hops),
                             detail={"host": host, "reason": "no rule" if r is None else "drop rule"})
            off = self.offloaded.get((nic, d.vni, d.ip))
            if nic in self.offloading and off != r:
                return Trace("nic", rule=rid, nic=nic, hops=tuple(hops),
                             detail={"switch_rule": _rule_doc(r), "offloaded_rule": _rule_doc(off)})
            if r.action == "deliver":
                if r.to != dst:
                    return Trace("blackhole", rule=rid, hops=tuple(hops),
                                 detail={"host": host, "reason": f"delivers to {r.to}"})
                return Trace("ok", hops=tuple(hops))
            if r.to not in topo.nics:
                return Trace("blackhole", rule=rid, hops=tuple(hops),
                             detail={"host": host, "reason": f"tunnels to unknown NIC {r.to}"})
            nic = str(r.to)
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
