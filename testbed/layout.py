"""A rail-optimised cluster described as contract section 1.

Hosts have one NIC per rail; each rail has its own ToRs, `hosts_per_tor`
hosts under each; every ToR links to every spine. One container per host
runs one job with one endpoint per rail."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    hosts: int = 4
    rails: int = 2
    hosts_per_tor: int = 2
    spines: int = 2
    job: str = "job7"
    vni: int = 7
    # Switches hash ECMP on the 5-tuple (fib_multipath_hash_policy=1), as
    # fabrics carrying RoCE do, instead of on the addresses alone: each of
    # a pair's flows (tunnel source ports) then takes its own spine.
    ecmp_ports: bool = False

    def host(self, h: int) -> str:
        return f"h{h:04d}"

    def nic(self, h: int, r: int) -> str:
        return f"{self.host(h)}/rnic{r}"

    def tor_index(self, h: int) -> int:
        return h // self.hosts_per_tor

    def tor(self, r: int, t: int) -> str:
        return f"tor-r{r}-{t}"

    def spine(self, s: int) -> str:
        return f"spine-{s}"

    def container(self, h: int) -> str:
        return f"{self.job}-w{h:03d}"

    def endpoint(self, h: int, r: int) -> str:
        return f"{self.container(h)}/rnic{r}"

    @property
    def tors_per_rail(self) -> int:
        return -(-self.hosts // self.hosts_per_tor)

    def underlay_ip(self, h: int, r: int) -> str:
        return f"10.{r}.{self.tor_index(h)}.{2 + h % self.hosts_per_tor}"

    def overlay_ip(self, h: int, r: int) -> str:
        """192.168.(10 + rail).(host + 1) as the testbed has always used;
        hosts past 253 (benches of thousands) move to 100.(64 + rail).0.0/16,
        since 192.168.10.256 is no address."""
        if h < 254:
            return f"192.168.{10 + r}.{h + 1}"
        return f"100.{64 + r}.{h // 250}.{h % 250 + 1}"


def layout_doc(lay: Layout, overlay_ip: Callable[[int, int], str] | None = None,
               containers: bool = True) -> dict[str, Any]:
    ov = overlay_ip or lay.overlay_ip
    switches: list[dict[str, Any]] = [
        {"id": lay.tor(r, t), "tier": "tor", "rail": r}
        for r in range(lay.rails) for t in range(lay.tors_per_rail)]
    switches += [{"id": lay.spine(s), "tier": "spine"} for s in range(lay.spines)]
    hosts = [{"id": lay.host(h), "nics": [{"id": lay.nic(h, r), "rail": r,
                                           "ip": lay.underlay_ip(h, r)}
                                          for r in range(lay.rails)]}
             for h in range(lay.hosts)]
    links = [{"a": lay.nic(h, r), "b": lay.tor(r, lay.tor_index(h))}
             for h in range(lay.hosts) for r in range(lay.rails)]
    links += [{"a": lay.tor(r, t), "b": lay.spine(s)}
              for r in range(lay.rails) for t in range(lay.tors_per_rail)
              for s in range(lay.spines)]
    doc: dict[str, Any] = {"version": 1, "switches": switches, "hosts": hosts, "links": links}
    if containers:
        doc["containers"] = [
            {"id": lay.container(h), "job": lay.job, "host": lay.host(h),
             "endpoints": [{"id": lay.endpoint(h, r), "nic": lay.nic(h, r), "ip": ov(h, r),
                            "vni": lay.vni} for r in range(lay.rails)]}
            for h in range(lay.hosts)]
    return doc
