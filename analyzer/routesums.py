"""Each analysis window's routed probes, summed per (pair, prober, route)
as arrays, with every entry's links: the per-link loss test, the slow-link
vote and the links healthy pairs clear are bincounts over them, not loops
over a dict per pair (an hour is a million entries)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.localize import Pair
from netskel.arrays import csr_rows, unique


@dataclass
class RouteSums:
    """This window's probes of each pair by (prober, forward route), one
    entry per row, pairs in runs: [sent, lost, received-weighted sum of
    (route median - its row's median), received, received-weighted sum of
    the row medians, rows (sizes) with an RTT on the route, rows where it
    was slow]; each entry's known links as link ids (CSR)."""

    pairs: list[Pair]
    index: dict[Pair, int]
    pstart: np.ndarray   # (P + 1,) first entry of each pair
    pidx: np.ndarray     # (U,) entry -> pair
    src: list[str]
    route: list[str]
    v: np.ndarray        # (U, 7)
    lptr: np.ndarray     # (U + 1,)
    lid: np.ndarray

    @classmethod
    def empty(cls) -> RouteSums:
        z = np.zeros(0, dtype=np.int64)
        return cls([], {}, np.zeros(1, dtype=np.int64), z, [], [], np.zeros((0, 7)),
                   np.zeros(1, dtype=np.int64), z)

    def slow(self) -> np.ndarray:
        """Entries most of whose size rows (two at least) found the route slow."""
        return np.asarray((self.v[:, 6] >= 2) & (self.v[:, 6] >= 0.75 * self.v[:, 5]))

    def expand(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(entry, link id) for every link of every entry in mask."""
        e = np.flatnonzero(mask)
        start, at = csr_rows(self.lptr, e)
        return np.repeat(e, np.diff(start)), self.lid[at]

    def pairs_per_link(self, ent: np.ndarray, lid: np.ndarray, links: int) -> np.ndarray:
        """Distinct pairs per link id among these (entry, link) rows."""
        key = unique(self.pidx[ent] * max(links, 1) + lid)
        return np.bincount(key % max(links, 1), minlength=links)

    def of(self, pair: Pair) -> dict[tuple[str, str], list[float]]:
        k = self.index.get(pair)
        if k is None:
            return {}
        return {(self.src[e], self.route[e]): self.v[e].tolist()
                for e in range(int(self.pstart[k]), int(self.pstart[k + 1]))}
