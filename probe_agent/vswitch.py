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

import logging
import re
import subprocess
from dataclasses import dataclass

from netskel import metrics
from netskel.model import FlowRule
from netskel.ofdump import NotUnderstood, read_dump
from netskel.ofpipeline import Pipeline, Port, Ports
from netskel.ofrules import contract_rules

log = logging.getLogger(__name__)
_SHOW_PORT = re.compile(r"^\s*(\d+)\((.+?)\):\s*addr:", re.MULTILINE)
_LOGGED_MAX = 1000  # distinct not-understood lines remembered for log-once


@dataclass(frozen=True)
class VSwitchSource:
    target: str                    # ovs-ofctl target, e.g. unix:/run/openvswitch/br0.mgmt
    tunnel_ports: tuple[int, ...]  # OpenFlow ports that are tunnels
    vni: int                       # VNI of those tunnels when rules do not say


@dataclass(frozen=True)
class VSwitchRead:
    rules: tuple[FlowRule, ...]
    not_understood: tuple[NotUnderstood, ...]
    ports: Ports


def parse_ports(show: str, tunnel_ports: tuple[int, ...]) -> Ports:
    """`ovs-ofctl show` text as the switch's port list."""
    ports = [Port(int(n), name, "tunnel" if int(n) in tunnel_ports else "local")
             for n, name in _SHOW_PORT.findall(show)]
    seen = {p.number for p in ports}
    ports += [Port(n, str(n), "tunnel") for n in tunnel_ports if n not in seen]
    return Ports(tuple(ports), complete=bool(seen))


def parse_dump_flows(text: str, tunnel_ports: tuple[int, ...], default_vni: int,
                     show: str = "") -> VSwitchRead:
    """Raises netskel.ofdump.DumpError when the text is not a dump at all."""
    dump = read_dump(text)
    ports = parse_ports(show, tunnel_ports)
    vnis = {default_vni}
    for f in dump.flows:
        for m in f.match or ():
            if m.field == "tun_id" and isinstance(m.value, int) and m.mask is None and m.value:
                vnis.add(m.value)
    rules = contract_rules(Pipeline(dump, ports), vnis)
    return VSwitchRead(tuple(rules), dump.not_understood, ports)


class Reader:
    """Dumps one switch; remembers which lines it already logged."""

    def __init__(self, src: VSwitchSource, timeout: float = 5.0) -> None:
        self.src = src
        self.timeout = timeout
        self._logged: set[str] = set()

    def _ofctl(self, command: str) -> str:
        return subprocess.run(["ovs-ofctl", command, self.src.target], capture_output=True,
                              text=True, timeout=self.timeout, check=True).stdout

    def read(self) -> VSwitchRead:
        """The current pipeline; raises on a failed command or a non-dump
        (the caller counts it and keeps its last good table)."""
        text = self._ofctl("dump-flows")
        try:
            show = self._ofctl("show")
        except (OSError, subprocess.SubprocessError) as e:  # ports help; the flows matter
            log.warning("ovs-ofctl show %s failed (%s): ports taken as local", self.src.target, e)
            show = ""
        got = parse_dump_flows(text, self.src.tunnel_ports, self.src.vni, show)
        metrics.VSWITCH_LINES_NOT_UNDERSTOOD.set(len(got.not_understood))
        for bad in got.not_understood:
            if bad.text not in self._logged and len(self._logged) < _LOGGED_MAX:
                self._logged.add(bad.text)
                log.warning("vswitch line not understood (%s): %s", bad.why, bad.text)
        return got
