"""What an agent says about itself, checked against the topology."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from netskel.errors import InputError
from netskel.topology import Topology

_HEX = set("0123456789abcdefABCDEF")


def gid_bytes(gid: str) -> bytes:
    """A GID string (8 groups of 4 hex digits, as pyverbs prints one) as its
    16 raw bytes; ValueError for anything else. The controller checks
    registrations with it and the agent packs GIDs into probes with it."""
    groups = gid.split(":")
    if len(groups) != 8 or not all(len(g) == 4 and all(c in _HEX for c in g) for g in groups):
        raise ValueError(f"not a GID: {gid!r}")
    return bytes.fromhex("".join(groups))


@dataclass(frozen=True)
class RegEndpoint:
    id: str
    nic: str
    ip: str
    vni: int | None = None
    ifname: str = ""
    rdma_gid: str = ""  # the endpoint's RDMA UD queue pair, when it has a device
    rdma_qpn: int = 0


@dataclass(frozen=True)
class Registration:
    container: str
    job: str | None
    host: str
    endpoints: tuple[RegEndpoint, ...]
    probe_port: int
    ready: bool = False
    last_heartbeat: float = 0.0
    agent_version: str = ""

    def with_heartbeat(self, ready: bool, now: float) -> Registration:
        return replace(self, ready=ready, last_heartbeat=now)


def validate_registration(reg: Registration, topo: Topology, owners: Mapping[str, str]) -> None:
    """Raise InputError when the agent's identity contradicts what we know.
    `owners`: endpoint id -> the registered container holding it.

    A container absent from the topology snapshot may join (containers come
    and go), but its host and NICs must exist."""
    if not reg.container:
        raise InputError("registration: empty container id")
    if not reg.endpoints:
        raise InputError(f"registration of '{reg.container}': no endpoints")
    if not 0 < reg.probe_port < 65536:
        raise InputError(f"registration of '{reg.container}': bad probe port {reg.probe_port}")
    if reg.host not in topo.hosts:
        raise InputError(f"registration of '{reg.container}': unknown host '{reg.host}'")
    known = topo.containers.get(reg.container)
    if known is not None:
        if known.host != reg.host:
            raise InputError(f"registration of '{reg.container}': host '{reg.host}' but the "
                             f"topology places it on '{known.host}'")
        if {e.id for e in known.endpoints} != {e.id for e in reg.endpoints}:
            raise InputError(f"registration of '{reg.container}': endpoints differ from the "
                             "topology's")
    seen: set[str] = set()
    for e in reg.endpoints:
        if not e.id or e.id in seen:
            raise InputError(f"registration of '{reg.container}': empty or repeated endpoint id")
        seen.add(e.id)
        topo_ep = topo.endpoints.get(e.id)
        owner = owners.get(e.id) or (topo_ep.container if topo_ep is not None else None)
        if owner is not None and owner != reg.container:
            raise InputError(f"registration of '{reg.container}': endpoint '{e.id}' belongs "
                             f"to container '{owner}'")
        nic = topo.nics.get(e.nic)
        if nic is None:
            raise InputError(f"registration of '{reg.container}': unknown NIC '{e.nic}'")
        if nic.host != reg.host:
            raise InputError(f"registration of '{reg.container}': NIC '{e.nic}' is on host "
                             f"'{nic.host}', not '{reg.host}'")
        if not e.ip:
            raise InputError(f"registration of '{reg.container}': endpoint '{e.id}' has no "
                             "overlay address")
        if e.rdma_qpn or e.rdma_gid:
            try:
                gid_bytes(e.rdma_gid)
                good = 0 < e.rdma_qpn < 1 << 24
            except ValueError:
                good = False
            if not good:
                raise InputError(f"registration of '{reg.container}': endpoint '{e.id}' has a "
                                 f"bad RDMA address (GID '{e.rdma_gid}', QPN {e.rdma_qpn})")
