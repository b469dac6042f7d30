"""The cluster as contract section 1 describes it, validated on load.

Ids are opaque: every relation (NIC to host, endpoint to NIC, ToR to rail) is
taken from the explicit fields, never parsed out of an id.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netskel.errors import InputError

TIERS = ("tor", "spine", "core")
ACTIONS = ("tunnel", "deliver", "drop", "forward", "unknown")


def link_id(a: str, b: str) -> str:
    """A link's id is its two ends sorted as strings, joined by `~`."""
    lo, hi = sorted((a, b))
    return f"{lo}~{hi}"


@dataclass(frozen=True)
class Switch:
    id: str
    tier: str
    rail: int | None = None


@dataclass(frozen=True)
class Nic:
    id: str
    host: str
    rail: int
    ip: str | None = None


@dataclass(frozen=True)
class Endpoint:
    id: str
    container: str
    nic: str
    ip: str | None = None
    vni: int | None = None


@dataclass(frozen=True)
class Container:
    id: str
    host: str
    job: str | None
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True)
class Rule:
    vni: int
    dst: str             # an address or a CIDR prefix
    action: str
    to: str | None = None
    priority: int = 0    # the highest wins, then the longest prefix


@dataclass(frozen=True)
class VSwitch:
    rules: tuple[Rule, ...] = ()
    offloaded: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)


@dataclass
class Topology:
    switches: dict[str, Switch]
    nics: dict[str, Nic]
    hosts: dict[str, tuple[str, ...]]
    links: dict[str, tuple[str, str]]
    neighbours: dict[str, set[str]]
    containers: dict[str, Container]
    endpoints: dict[str, Endpoint]
    vswitch: dict[str, VSwitch]

    def nic_of(self, endpoint_id: str) -> Nic:
        return self.nics[self.endpoints[endpoint_id].nic]

    def host_of_endpoint(self, endpoint_id: str) -> str:
        return self.nic_of(endpoint_id).host

    def job_endpoints(self, job: str) -> list[Endpoint]:
        return [e for c in self.containers.values() if c.job == job for e in c.endpoints]

    def jobs(self) -> list[str]:
        return sorted({c.job for c in self.containers.values() if c.job is not None})


class _Reader:
    """Walks a decoded JSON document and names the exact place of a problem."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> InputError:
        return InputError(f"{self.source}: {where}: {problem}")

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, "expected an object")
        return value

    def arr(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, "expected an array")
        return value

    def string(self, d: Mapping[str, Any], key: str, where: str, required: bool = True) -> str | None:
        value = d.get(key)
        if value is None:
            if required:
                raise self.fail(where, f"missing required field '{key}'")
            return None
        if not isinstance(value, str) or (required and not value):
            raise self.fail(f"{where}.{key}", "expected a non-empty string")
        return value

    def integer(self, d: Mapping[str, Any], key: str, where: str, required: bool = True) -> int | None:
        value = d.get(key)
        if value is None:
            if required:
                raise self.fail(where, f"missing required field '{key}'")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(f"{where}.{key}", "expected a non-negative integer")
        return value


def _unique(reader: _Reader, seen: dict[str, str], ident: str, where: str) -> None:
    if ident in seen:
        raise reader.fail(where, f"duplicate id '{ident}' (also at {seen[ident]})")
    seen[ident] = where


_INT_OR_NONE = (int, type(None))


@functools.lru_cache(maxsize=65536)
def rule_network(dst: str) -> tuple[Any, str | None] | None:
    """(the network, its address when it is a single host) of a rule's
    destination, or None when it is neither an address nor a prefix. Every
    host holds rules for the same few hundred addresses: each is parsed
    once, for the topology check and the overlay lookups alike (ipaddress is
    slow enough to show in `netskel infer`)."""
    try:
        net = ipaddress.ip_network(dst, strict=False)
    except ValueError:
        return None
    return net, (str(net.network_address) if net.num_addresses == 1 else None)


def _rules(reader: _Reader, raw: Any, where: str,
           seen: dict[tuple[Any, ...], Rule] | None = None) -> tuple[Rule, ...]:
    """A rule list, validated. `seen`: rules already validated, by their
    fields; a topology repeats each host's rules in every NIC's offloaded
    copy (a 128-endpoint job: 9,216 rules, a fifth of `netskel infer`), and
    the same fields make the same (immutable) rule."""
    rules = []
    for i, r in enumerate(reader.arr(raw, where)):
        key = None
        if seen is not None and type(r) is dict:
            try:
                # Types too: 1, 1.0 and True are equal keys, but only 1 is a VNI.
                key = tuple((k, type(v), v) for k, v in r.items())
                hit = seen.get(key)
            except TypeError:  # an unhashable value: validated (and refused) below
                key = hit = None
            if hit is not None:
                rules.append(hit)
                continue
        w = f"{where}[{i}]"
        d = reader.obj(r, w)
        action = reader.string(d, "action", w)
        if action not in ACTIONS:
            raise reader.fail(f"{w}.action", f"'{action}' is not one of {', '.join(ACTIONS)}")
        vni = reader.integer(d, "vni", w)
        dst = reader.string(d, "dst", w)
        assert vni is not None and dst is not None
        if rule_network(dst) is None:
            raise reader.fail(f"{w}.dst", f"'{dst}' is not an address or a CIDR prefix")
        to = reader.string(d, "to", w, required=action in ("tunnel", "deliver"))
        priority = d.get("priority", 0)
        if priority is None:
            priority = 0
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise reader.fail(f"{w}.priority", "expected an integer")
        rule = Rule(vni=vni, dst=dst, action=action, to=to, priority=priority)
        if key is not None and seen is not None:
            seen[key] = rule
        rules.append(rule)
    return tuple(rules)


def _same_rules(copy: Any, valid: Any) -> bool:
    """Whether a rule list repeats one already validated, value for value
    and type for type. A NIC's offloaded table usually repeats its host's
    rules (a 128-endpoint job: 8 copies per host of 128 rules each, most of
    the time spent reading its topology). Equal JSON values can differ in
    type only as numbers (1 == 1.0 == True), so the integer fields'
    types are checked too."""
    return (type(copy) is list and copy == valid
            and all(type(r.get("vni")) is int and type(r.get("priority")) in _INT_OR_NONE
                    for r in copy))


def parse_topology(doc: Any, source: str = "topology") -> Topology:
    """Validate a decoded topology document; raise InputError naming the place."""
    rd = _Reader(source)
    top = rd.obj(doc, "document")
    if top.get("version") != 1:
        raise rd.fail("version", f"expected 1, got {top.get('version')!r}")
    for key in ("switches", "hosts", "links"):
        if key not in top:
            raise rd.fail("document", f"missing required field '{key}'")
    ids: dict[str, str] = {}

    switches: dict[str, Switch] = {}
    for i, s in enumerate(rd.arr(top["switches"], "switches")):
        w = f"switches[{i}]"
        d = rd.obj(s, w)
        sid = rd.string(d, "id", w)
        tier = rd.string(d, "tier", w)
        assert sid is not None
        if tier not in TIERS:
            raise rd.fail(f"{w}.tier", f"'{tier}' is not one of {', '.join(TIERS)}")
        rail = rd.integer(d, "rail", w, required=False)
        if tier == "tor" and rail is None:
            raise rd.fail(w, f"ToR '{sid}' has no 'rail'")
        _unique(rd, ids, sid, w)
        switches[sid] = Switch(id=sid, tier=tier, rail=rail)

    nics: dict[str, Nic] = {}
    hosts: dict[str, tuple[str, ...]] = {}
    for i, h in enumerate(rd.arr(top["hosts"], "hosts")):
        w = f"hosts[{i}]"
        d = rd.obj(h, w)
        hid = rd.string(d, "id", w)
        assert hid is not None
        _unique(rd, ids, hid, w)
        if "nics" not in d:
            raise rd.fail(w, "missing required field 'nics'")
        names = []
        for j, n in enumerate(rd.arr(d["nics"], f"{w}.nics")):
            wn = f"{w}.nics[{j}]"
            dn = rd.obj(n, wn)
            nid = rd.string(dn, "id", wn)
            rail = rd.integer(dn, "rail", wn)
            assert nid is not None and rail is not None
            _unique(rd, ids, nid, wn)
            nics[nid] = Nic(id=nid, host=hid, rail=rail, ip=rd.string(dn, "ip", wn, required=False))
            names.append(nid)
        hosts[hid] = tuple(names)

    links: dict[str, tuple[str, str]] = {}
    neighbours: dict[str, set[str]] = {k: set() for k in (*switches, *nics)}
    for i, link in enumerate(rd.arr(top["links"], "links")):
        w = f"links[{i}]"
        d = rd.obj(link, w)
        a, b = rd.string(d, "a", w), rd.string(d, "b", w)
        assert a is not None and b is not None
        for end in (a, b):
            if end not in switches and end not in nics:
                raise rd.fail(w, f"unknown link end '{end}' (neither a switch nor a NIC)")
        if a == b:
            raise rd.fail(w, f"link joins '{a}' to itself")
        if a in nics and b in nics:
            raise rd.fail(w, f"link joins two NICs '{a}' and '{b}'")
        nic_end, sw_end = (a, b) if a in nics else (b, a)
        if nic_end in nics:
            sw = switches[sw_end]
            if sw.tier != "tor":
                raise rd.fail(w, f"NIC '{nic_end}' linked to {sw.tier} '{sw_end}' (NICs attach to ToRs)")
        links[link_id(a, b)] = (a, b)
        neighbours[a].add(b)
        neighbours[b].add(a)

    containers: dict[str, Container] = {}
    endpoints: dict[str, Endpoint] = {}
    for i, c in enumerate(rd.arr(top.get("containers") or [], "containers")):
        w = f"containers[{i}]"
        d = rd.obj(c, w)
        cid = rd.string(d, "id", w)
        host = rd.string(d, "host", w)
        assert cid is not None and host is not None
        _unique(rd, ids, cid, w)
        if host not in hosts:
            raise rd.fail(f"{w}.host", f"unknown host '{host}'")
        if "endpoints" not in d:
            raise rd.fail(w, "missing required field 'endpoints'")
        eps = []
        for j, e in enumerate(rd.arr(d["endpoints"], f"{w}.endpoints")):
            we = f"{w}.endpoints[{j}]"
            de = rd.obj(e, we)
            eid = rd.string(de, "id", we)
            nic = rd.string(de, "nic", we)
            assert eid is not None and nic is not None
            _unique(rd, ids, eid, we)
            if nic not in nics:
                raise rd.fail(f"{we}.nic", f"unknown NIC '{nic}'")
            if nics[nic].host != host:
                raise rd.fail(f"{we}.nic", f"NIC '{nic}' is on host '{nics[nic].host}', not '{host}'")
            ep = Endpoint(id=eid, container=cid, nic=nic,
                          ip=rd.string(de, "ip", we, required=False),
                          vni=rd.integer(de, "vni", we, required=False))
            endpoints[eid] = ep
            eps.append(ep)
        containers[cid] = Container(id=cid, host=host, job=rd.string(d, "job", w, required=False),
                                    endpoints=tuple(eps))

    vswitch: dict[str, VSwitch] = {}
    seen_rules: dict[tuple[Any, ...], Rule] = {}
    for hid, v in rd.obj(top.get("vswitch") or {}, "vswitch").items():
        w = f"vswitch.{hid}"
        if hid not in hosts:
            raise rd.fail(w, f"unknown host '{hid}'")
        d = rd.obj(v, w)
        raw = d.get("rules") or []
        rules = _rules(rd, raw, f"{w}.rules", seen_rules)
        offloaded = {}
        for nic, copy in rd.obj(d.get("offloaded") or {}, f"{w}.offloaded").items():
            if nic not in nics:
                raise rd.fail(f"{w}.offloaded", f"unknown NIC '{nic}'")
            offloaded[nic] = (rules if _same_rules(copy, raw)
                              else _rules(rd, copy, f"{w}.offloaded.{nic}", seen_rules))
        vswitch[hid] = VSwitch(rules=rules, offloaded=offloaded)

    return Topology(switches=switches, nics=nics, hosts=hosts, links=links,
                    neighbours=neighbours, containers=containers, endpoints=endpoints,
                    vswitch=vswitch)


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; every failure is one InputError line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not UTF-8 text") from None
    if not text.strip():
        raise InputError(f"{p}: empty file")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{p}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    return parse_topology(doc, str(p))


def load_switch_addresses(path: str | Path, topo: Topology) -> dict[str, str]:
    """{router interface address: switch id} from an inventory file (JSON
    object). The topology contract has no switch addresses, but a route
    trace sees only addresses; every id must be a switch of `topo`."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{p}: not a JSON document ({e})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{p}: expected an object of address -> switch id")
    for addr, sw in doc.items():
        if not isinstance(sw, str) or sw not in topo.switches:
            raise InputError(f"{p}: address '{addr}' names unknown switch {sw!r}")
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            raise InputError(f"{p}: '{addr}' is not an IP address") from None
    return dict(doc)


def topology_to_doc(topo: Topology) -> dict[str, Any]:
    """Contract section 1 document for a topology (used by the testbed)."""

    def rule(r: Rule) -> dict[str, Any]:
        d: dict[str, Any] = {"vni": r.vni, "dst": r.dst, "action": r.action}
        if r.to is not None:
            d["to"] = r.to
        if r.priority:
            d["priority"] = r.priority
        return d

    doc: dict[str, Any] = {
        "version": 1,
        "switches": [{"id": s.id, "tier": s.tier, **({"rail": s.rail} if s.rail is not None else {})}
                     for s in topo.switches.values()],
        "hosts": [{"id": h, "nics": [{"id": n, "rail": topo.nics[n].rail,
                                      **({"ip": topo.nics[n].ip} if topo.nics[n].ip else {})}
                                     for n in nic_ids]}
                  for h, nic_ids in topo.hosts.items()],
        "links": [{"a": a, "b": b} for a, b in topo.links.values()],
        "containers": [{"id": c.id, "host": c.host, **({"job": c.job} if c.job else {}),
                        "endpoints": [{"id": e.id, "nic": e.nic,
                                       **({"ip": e.ip} if e.ip else {}),
                                       **({"vni": e.vni} if e.vni is not None else {})}
                                      for e in c.endpoints]}
                       for c in topo.containers.values()],
    }
    if topo.vswitch:
        doc["vswitch"] = {h: {"rules": [rule(r) for r in v.rules],
                              "offloaded": {n: [rule(r) for r in rs] for n, rs in v.offloaded.items()}}
                          for h, v in topo.vswitch.items()}
    return doc
