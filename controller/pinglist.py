"""Ping lists as a function of membership and readiness.

Preload keeps only same-rail, cross-host endpoint pairs of one job (NCCL
moves cross-rail and same-host traffic over NVLink). Each unordered pair is
probed from one side only, chosen by a stable hash so that membership
changes never reshuffle the pairs that stay. Activation: a target is probed
only once its own agent registered and said ready.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MemberEndpoint:
    id: str
    nic: str
    host: str
    rail: int
    ip: str
    nic_ip: str = ""  # the NIC's underlay address: where route traces start and end
    rdma_gid: str = ""  # its RDMA queue pair, when its agent registered one
    rdma_qpn: int = 0


@dataclass(frozen=True)
class Member:
    """A container the controller knows, from the topology or a registration."""

    id: str
    job: str | None
    host: str
    endpoints: tuple[MemberEndpoint, ...]
    probe_port: int
    active: bool  # registered and ready


@dataclass(frozen=True)
class Target:
    src: str
    dst: str
    dst_ip: str
    dst_port: int
    active: bool
    src_nic_ip: str = ""  # underlay addresses of both NICs, for the agent's route traces
    dst_nic_ip: str = ""
    dst_rdma_gid: str = ""  # the target's RDMA queue pair: probed over RDMA when set
    dst_rdma_qpn: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.src, self.dst)


PingList = dict[tuple[str, str], Target]


@dataclass(frozen=True)
class ListDiff:
    upsert: tuple[Target, ...]
    remove: tuple[tuple[str, str], ...]

    def __bool__(self) -> bool:
        return bool(self.upsert or self.remove)


_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def id_hash(ident: str) -> int:
    return int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=8).digest(), "big")


def owner_bit(h_lo: int, h_hi: int) -> int:
    """0: the smaller id probes, 1: the larger. Same rule as owner_bits."""
    return (((h_lo * _MIX) & _MASK) ^ h_hi) >> 17 & 1


def owner_bits(h_lo: np.ndarray, h_hi: np.ndarray) -> np.ndarray:
    """owner_bit for arrays of uint64 hashes."""
    with np.errstate(over="ignore"):
        mixed = (h_lo.astype(np.uint64) * np.uint64(_MIX)) ^ h_hi.astype(np.uint64)
    return ((mixed >> np.uint64(17)) & np.uint64(1)).astype(np.int8)


def probe_owner(a: str, b: str) -> str:
    """The end of an unordered pair that probes it: stable under membership
    changes, about half each."""
    lo, hi = sorted((a, b))
    return lo if owner_bit(id_hash(lo), id_hash(hi)) == 0 else hi


def rail_aligned_pairs(endpoints: Iterable[MemberEndpoint]) -> list[tuple[str, str]]:
    """Every same-rail, cross-host pair (sorted ids), each once."""
    by_rail: dict[int, list[MemberEndpoint]] = defaultdict(list)
    for e in endpoints:
        by_rail[e.rail].append(e)
    pairs = []
    for eps in by_rail.values():
        eps.sort(key=lambda e: e.id)
        for i, a in enumerate(eps):
            for b in eps[i + 1:]:
                if a.host != b.host:
                    pairs.append((a.id, b.id))
    return pairs


@dataclass(frozen=True)
class JobSkeleton:
    """An inferred skeleton in force for a job: the pairs to probe among the
    endpoints it covered. Endpoints that joined later keep their
    rail-aligned pairs until the next inference covers them."""

    covered: frozenset[str]
    pairs: frozenset[tuple[str, str]]


def job_pairs(eps: list[MemberEndpoint], skeleton: JobSkeleton | None) -> list[tuple[str, str]]:
    rail = rail_aligned_pairs(eps)
    if skeleton is None:
        return rail
    present = {e.id for e in eps}
    kept = [p for p in skeleton.pairs if p[0] in present and p[1] in present]
    newcomers = [p for p in rail if p[0] not in skeleton.covered or p[1] not in skeleton.covered]
    return sorted(set(kept) | set(newcomers))


def build_lists(members: Mapping[str, Member],
                skeletons: Mapping[str, JobSkeleton] | None = None) -> dict[str, PingList]:
    """Every member container's list, keyed by container: a job's confident
    skeleton where there is one, its rail-aligned pairs otherwise."""
    by_job: dict[str, list[Member]] = defaultdict(list)
    for m in members.values():
        if m.job is not None:
            by_job[m.job].append(m)
    owner_of: dict[str, Member] = {}
    ep_of: dict[str, MemberEndpoint] = {}
    for m in members.values():
        for e in m.endpoints:
            owner_of[e.id] = m
            ep_of[e.id] = e
    lists: dict[str, PingList] = {cid: {} for cid in members}
    for job_members in by_job.values():
        eps = [e for m in job_members for e in m.endpoints]
        job = job_members[0].job
        for a, b in job_pairs(eps, (skeletons or {}).get(job) if job else None):
            src = probe_owner(a, b)
            dst = b if src == a else a
            dst_member = owner_of[dst]
            t = Target(src=src, dst=dst, dst_ip=ep_of[dst].ip, dst_port=dst_member.probe_port,
                       active=dst_member.active, src_nic_ip=ep_of[src].nic_ip,
                       dst_nic_ip=ep_of[dst].nic_ip, dst_rdma_gid=ep_of[dst].rdma_gid,
                       dst_rdma_qpn=ep_of[dst].rdma_qpn)
            lists[owner_of[src].id][t.key] = t
    return lists


def diff_lists(old: PingList, new: PingList) -> ListDiff:
    upsert = tuple(t for k, t in sorted(new.items()) if old.get(k) != t)
    remove = tuple(sorted(k for k in old if k not in new))
    return ListDiff(upsert=upsert, remove=remove)
