"""Candidate underlay links between two NICs: every link on some shortest
path (ECMP spreads packets over all of them), or exactly the traced route
when one is known."""

from __future__ import annotations

from collections import deque
from functools import lru_cache

from netskel.topology import Topology, link_id


class UnderlayPaths:
    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._dist = lru_cache(maxsize=65536)(self._bfs)

    def _bfs(self, start: str) -> dict[str, int]:
        """Hop distances from a NIC; other NICs are leaves, never transit."""
        dist = {start: 0}
        todo = deque([start])
        while todo:
            u = todo.popleft()
            if u != start and u in self.topo.nics:
                continue
            for v in self.topo.neighbours[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    todo.append(v)
        return dist

    def weighted_links(self, nic_a: str, nic_b: str) -> dict[str, float]:
        """Links on some shortest path, each weighted 1/(alternatives at its
        hop): 1 means every path crosses it. A NIC with one uplink (the usual
        case) adds that link to its switch's paths, which are shared by every
        NIC behind the same switches: computed once per switch pair."""
        up_a, up_b = self.topo.neighbours[nic_a], self.topo.neighbours[nic_b]
        if len(up_a) == 1 and len(up_b) == 1:
            (sa,), (sb,) = tuple(up_a), tuple(up_b)
            if sa == sb:
                return {link_id(nic_a, sa): 1.0, link_id(nic_b, sb): 1.0}
            inner = self._switch_links(sa, sb)
            if not inner:
                return {}
            return {link_id(nic_a, sa): 1.0, **inner, link_id(nic_b, sb): 1.0}
        return self._links(nic_a, nic_b)

    @lru_cache(maxsize=65536)  # noqa: B019 - one per analyzer, lives as long as it
    def _switch_links(self, sa: str, sb: str) -> dict[str, float]:
        return self._links(sa, sb)

    def _links(self, nic_a: str, nic_b: str) -> dict[str, float]:
        da, db = self._dist(nic_a), self._dist(nic_b)
        total = da.get(nic_b)
        if total is None:
            return {}
        stages: dict[int, set[str]] = {}
        for u, du in da.items():
            if du >= total:
                continue
            for v in self.topo.neighbours[u]:
                if v in db and du + 1 + db[v] == total:
                    stages.setdefault(du, set()).add(link_id(u, v))
        return {link: 1.0 / len(ls) for ls in stages.values() for link in ls}

    def route_links(self, nic_a: str, nic_b: str, switches: list[str]) -> dict[str, float]:
        """Links of a traced forward route (switch ids), bracketed by the NICs."""
        hops = [nic_a, *switches, nic_b]
        return {link_id(u, v): 1.0 for u, v in zip(hops, hops[1:], strict=False)}
