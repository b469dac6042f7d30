"""The host's virtual switch, read the way an operator would: `ovs-ofctl
dump-flows` for the pipeline and `ovs-ofctl show` for its ports, then the
whole pipeline run by the interpreter (`netskel.ofpipeline`) and said as
the topology contract's rules (`netskel.ofrules`) for the analyzer.

Ports named as tunnels in the configuration are tunnels (their far end
chosen per flow by `tun_dst`, else by the tunnel device); `LOCAL` leaves
the model; every other port is a local endpoint's. Lines that cannot be
interpreted stay in the dump as explicit unknowns, are counted, and are
logged once each: they never stop the dump."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from dataclasses import dataclass

from netskel.dpflows import DatapathError, DatapathRead, read_datapath
from netskel.model import FlowRule
from netskel.ofdump import DumpError, FlowDump, NotUnderstood, read_dump
from netskel.ofpipeline import Pipeline, Port, Ports
from netskel.ofrules import contract_rules
from probe_agent import metrics

log = logging.getLogger(__name__)
_SHOW_PORT = re.compile(r"^\s*(\d+)\((.+?)\):\s*addr:", re.MULTILINE)
_LOGGED_MAX = 1000  # distinct not-understood lines remembered for log-once
# Counters and ages change every dump; the pipeline only when these do not.
_STATS = re.compile(r"\b(duration|n_packets|n_bytes|idle_age|hard_age)=[^,\s]*,?\s*")


@dataclass(frozen=True)
class VSwitchSource:
    target: str                    # ovs-ofctl target, e.g. unix:/run/openvswitch/br0.mgmt
    tunnel_ports: tuple[int, ...]  # OpenFlow ports that are tunnels
    vni: int                       # VNI of those tunnels when rules do not say
    db: str = ""                   # ovsdb of the switch (ovs-vsctl --db): tunnel ports' far ends
    datapath: str = ""             # ovs-appctl target of its daemon: datapath flows; "" = none
    datapath_type: str = "offloaded"  # dpctl/dump-flows type=


@dataclass(frozen=True)
class VSwitchRead:
    rules: tuple[FlowRule, ...]
    not_understood: tuple[NotUnderstood, ...]
    ports: Ports


_TUNNEL_TYPES = frozenset({"vxlan", "geneve", "gre", "stt", "lisp", "erspan", "ip6gre",
                           "ip6erspan", "gtpu", "bareudp", "srv6"})


def parse_interfaces(vsctl_json: str) -> dict[int, Port]:
    """`ovs-vsctl --format=json --columns=name,ofport,type,options list
    Interface` as ports: native tunnels with their far end and key (a value
    of "flow" means the flows choose, left None)."""
    doc = json.loads(vsctl_json)
    heads = doc.get("headings", [])
    out: dict[int, Port] = {}
    for row in doc.get("data", []):
        rec = dict(zip(heads, row, strict=False))
        ofport, kind = rec.get("ofport"), rec.get("type")
        if not isinstance(ofport, int) or ofport <= 0:
            continue
        opts = {}
        if isinstance(rec.get("options"), list) and len(rec["options"]) == 2:
            opts = {str(k): str(v) for k, v in rec["options"][1]}
        if kind in _TUNNEL_TYPES:
            remote = opts.get("remote_ip")
            key = opts.get("key", opts.get("out_key"))
            out[ofport] = Port(ofport, str(rec.get("name", ofport)), "tunnel",
                               None if remote in (None, "flow") else remote,
                               int(key, 0) if key and key != "flow" else None)
        elif kind == "patch":
            out[ofport] = Port(ofport, str(rec.get("name", ofport)), "patch")
        elif kind == "internal":
            out[ofport] = Port(ofport, str(rec.get("name", ofport)), "internal")
    return out


def parse_ports(show: str, tunnel_ports: tuple[int, ...],
                interfaces: dict[int, Port] | None = None) -> Ports:
    """`ovs-ofctl show` text as the switch's port list; the database's
    interface types, where known, say which are tunnels (and to where),
    patches or internal ports; the configured tunnel ports are tunnels."""
    known = interfaces or {}
    ports = []
    for n, name in _SHOW_PORT.findall(show):
        num = int(n)
        p = known.get(num)
        if num in tunnel_ports:
            p = Port(num, name, "tunnel", p.remote_ip if p else None, p.key if p else None)
        ports.append(Port(num, name, p.kind, p.remote_ip, p.key) if p else Port(num, name))
    seen = {p.number for p in ports}
    ports += [Port(n, str(n), "tunnel") for n in tunnel_ports if n not in seen]
    return Ports(tuple(ports), complete=bool(seen))


def parse_dump_flows(text: str, tunnel_ports: tuple[int, ...], default_vni: int,
                     show: str = "") -> VSwitchRead:
    """Raises netskel.ofdump.DumpError when the text is not a dump at all."""
    return _compile(read_dump(text), parse_ports(show, tunnel_ports), default_vni)


def _compile(dump: FlowDump, ports: Ports, default_vni: int) -> VSwitchRead:
    vnis = {default_vni}
    for f in dump.flows:
        for m in f.match or ():
            if m.field == "tun_id" and isinstance(m.value, int) and m.mask is None and m.value:
                vnis.add(m.value)
    rules = contract_rules(Pipeline(dump, ports), vnis)
    return VSwitchRead(tuple(rules), dump.not_understood, ports)


def _whole(text: str, error: type[Exception]) -> None:
    """OVS's tools end every line: output that does not was cut short."""
    if text and not text.endswith("\n"):
        raise error(f"output ends mid-line after {len(text)} bytes")


class Reader:
    """Dumps one switch; remembers which lines it already logged."""

    def __init__(self, src: VSwitchSource, timeout: float = 5.0) -> None:
        self.src = src
        self.timeout = timeout
        self._logged: set[str] = set()
        self._last: tuple[tuple[str, Ports], VSwitchRead] | None = None

    def _ofctl(self, command: str) -> str:
        return subprocess.run(["ovs-ofctl", command, self.src.target], capture_output=True,
                              text=True, timeout=self.timeout, check=True).stdout

    def read_datapath(self, ports: Ports) -> DatapathRead:
        """The datapath's flows of the configured type (what the NICs hold
        when it is `offloaded`); raises on a failed command or a non-dump."""
        text = subprocess.run(["ovs-appctl", "-t", self.src.datapath, "dpctl/dump-flows", "-m",
                               "--names", f"type={self.src.datapath_type}"], capture_output=True,
                              text=True, timeout=self.timeout, check=True).stdout
        _whole(text, DatapathError)  # cut short, its last flow may say a wrong port
        got = read_datapath(text, frozenset(p.name for p in ports.ports if p.kind == "tunnel"),
                            self.src.vni)
        metrics.VSWITCH_DATAPATH_FLOWS.labels(judged="yes").set(got.flows - got.skipped)
        metrics.VSWITCH_DATAPATH_FLOWS.labels(judged="no").set(got.skipped)
        return got

    def read(self) -> VSwitchRead:
        """The current pipeline; raises on a failed command or a non-dump
        (the caller counts it and keeps its last good table)."""
        text = self._ofctl("dump-flows")
        _whole(text, DumpError)
        try:
            show = self._ofctl("show")
        except (OSError, subprocess.SubprocessError) as e:  # ports help; the flows matter
            log.warning("ovs-ofctl show %s failed (%s): ports taken as local", self.src.target, e)
            show = ""
        interfaces: dict[int, Port] = {}
        if self.src.db:
            try:
                interfaces = parse_interfaces(subprocess.run(
                    ["ovs-vsctl", f"--db={self.src.db}", f"--timeout={int(self.timeout)}",
                     "--format=json", "--data=json", "--", "--columns=name,ofport,type,options",
                     "list", "Interface"], capture_output=True, text=True, timeout=self.timeout,
                    check=True).stdout)
            except (OSError, subprocess.SubprocessError, ValueError) as e:
                log.warning("ovs-vsctl --db=%s failed (%s): tunnel ends from flows only",
                            self.src.db, e)
        ports = parse_ports(show, self.src.tunnel_ports, interfaces)
        key = (_STATS.sub("", text), ports)
        if self._last is not None and self._last[0] == key:
            return self._last[1]  # same pipeline: same rules, without running it again
        got = _compile(read_dump(text), ports, self.src.vni)
        self._last = (key, got)
        metrics.VSWITCH_LINES_NOT_UNDERSTOOD.set(len(got.not_understood))
        for bad in got.not_understood:
            if bad.text not in self._logged and len(self._logged) < _LOGGED_MAX:
                self._logged.add(bad.text)
                log.warning("vswitch line not understood (%s): %s", bad.why, bad.text)
        return got
