"""The host's virtual-switch table, read the way an operator would:
`ovs-ofctl dump-flows`, parsed into the topology contract's RULE terms.

Only table 0, IPv4 rules matching one overlay destination (nw_dst) are
forwarding rules here; for each destination the highest priority wins. An
output to a tunnel port is a tunnel (its outer destination when the rule
sets tun_dst), to any other port a local delivery, no output a drop. The
VNI is the rule's tun_id when it matches or sets one, else the tunnel
port's VNI (given)."""

from __future__ import annotations

import ipaddress
import re
import subprocess
from dataclasses import dataclass

from netskel.model import FlowRule

_FIELD = re.compile(r"(\w+)=([^,\s]+)")


@dataclass(frozen=True)
class VSwitchSource:
    target: str                    # ovs-ofctl target, e.g. unix:/run/openvswitch/br0.mgmt
    tunnel_ports: tuple[int, ...]  # OpenFlow ports that are tunnels
    vni: int                       # VNI of those tunnels when rules do not say


def _int(v: str) -> int:
    return int(v, 16) if v.lower().startswith("0x") else int(v)


def parse_dump_flows(text: str, tunnel_ports: tuple[int, ...], default_vni: int) -> list[FlowRule]:
    best: dict[tuple[int, str], tuple[int, FlowRule]] = {}
    for line in text.splitlines():
        line = line.strip()
        if "actions=" not in line or line.startswith(("NXST_FLOW", "OFPST_FLOW")):
            continue
        match, actions = line.split("actions=", 1)
        fields = dict(_FIELD.findall(match))
        if fields.get("table", "0") != "0" or "nw_dst" not in fields:
            continue
        dst = fields["nw_dst"].split("/")[0]
        try:
            ipaddress.IPv4Address(dst)
        except ValueError:
            continue
        prio = int(fields.get("priority", "32768"))
        vni = _int(fields["tun_id"]) if "tun_id" in fields else default_vni
        out_ports: list[int] = []
        tun_dst = ""
        for act in re.split(r",(?![^()]*\))", actions.strip()):
            act = act.strip()
            if act.startswith("output:"):
                out_ports.append(_int(act.split(":", 1)[1]))
            elif act.isdigit():
                out_ports.append(int(act))
            elif act.startswith("set_field:") and "->tun_id" in act:
                vni = _int(act[len("set_field:"):].split("->")[0])
            elif act.startswith("set_field:") and "->tun_dst" in act:
                tun_dst = act[len("set_field:"):].split("->")[0]
            elif act.startswith("load:") and "TUN_IPV4_DST" in act:
                tun_dst = str(ipaddress.IPv4Address(_int(act[len("load:"):].split("->")[0])))
        if not out_ports:
            rule = FlowRule(vni=vni, dst=dst, action="drop")
        elif any(p in tunnel_ports for p in out_ports):
            rule = FlowRule(vni=vni, dst=dst, action="tunnel", to=tun_dst)
        else:
            rule = FlowRule(vni=vni, dst=dst, action="deliver")
        key = (vni, dst)
        if key not in best or prio > best[key][0]:
            best[key] = (prio, rule)
    return [r for _, r in sorted(best.values(), key=lambda x: (x[1].vni, x[1].dst))]


def dump(src: VSwitchSource, timeout: float = 5.0) -> list[FlowRule]:
    """The current table; raises OSError/CalledProcessError (the caller records it)."""
    out = subprocess.run(["ovs-ofctl", "dump-flows", src.target], capture_output=True, text=True,
                         timeout=timeout, check=True).stdout
    return parse_dump_flows(out, src.tunnel_ports, src.vni)
