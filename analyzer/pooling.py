"""Loss-pooling groups of the detector's rows: each row (a pair at one
probe size) pools with its pair's other sizes, and with every pair that
crosses a link all of its own paths cross. A link losing a little of
everything through it is significant over its group long before any one
pair's share is; the same groups say how many healthy pairs clear a link
or a switch. Kept as CSR arrays, so a window's groups are gathered and
counted without a Python loop over rows."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

import numpy as np

from analyzer.detect import Groups
from analyzer.localize import Pair
from netskel.arrays import csr_rows, unique


class PoolingGroups:
    """Which groups each detector row pools its losses with, and the
    healthy pairs per link and switch those groups count."""

    def __init__(self, switches_of: Callable[[str], tuple[str, ...]]) -> None:
        self._switches_of = switches_of
        # detector row -> its groups' codes, as CSR arrays
        self._ptr = np.zeros(1, dtype=np.int64)
        self._codes = np.zeros(0, dtype=np.int64)
        self._ids: dict[tuple[str, str, str], int] = {}
        self.link_of: list[str] = []  # group code -> link id ("" for a pair group)
        self._ends = np.zeros((0, 2), dtype=np.int64)  # group code -> its switches (-1: none)
        self._switch_index: dict[str, int] = {}

    def extend(self, rows: Iterable[tuple[Pair, Iterable[str]]]) -> None:
        """Groups of the detector rows added since the last call, in row
        order: each row's pair and the links every path of the pair crosses
        (a traced route is one flow's path, not all of the pair's probes)."""
        codes: list[int] = []
        ptr: list[int] = []
        base = int(self._ptr[-1])
        gid = self._ids
        for pair, links in rows:
            for g in [("pair", *pair)] + [("link", link, "") for link in links]:
                code = gid.get(g)
                if code is None:
                    code = gid[g] = len(gid)
                    self.link_of.append(g[1] if g[0] == "link" else "")
                codes.append(code)
            ptr.append(base + len(codes))
        self._codes = np.concatenate([self._codes, np.asarray(codes, dtype=np.int64)])
        self._ptr = np.concatenate([self._ptr, np.asarray(ptr, dtype=np.int64)])

    def rows_crossing(self, link: str) -> np.ndarray:
        """The rows in the link's group: pairs all of whose paths cross it."""
        code = self._ids.get(("link", link, ""))
        if code is None:
            return np.zeros(0, dtype=np.int64)
        at = np.flatnonzero(self._codes == code)
        return np.searchsorted(self._ptr, at, side="right") - 1

    def of_rows(self, rows: np.ndarray) -> Groups:
        indptr, idx = csr_rows(self._ptr, rows)
        return Groups(indptr, self._codes[idx], len(self._ids))

    @staticmethod
    def _healthy_pair_groups(groups: Groups, pid: np.ndarray, healthy_rows: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
        """(owner, group code) for each group of each healthy pair, one row
        per pair (a pair's sizes share its groups): pairs counted once."""
        order = np.argsort(pid[healthy_rows], kind="stable")
        hr = healthy_rows[order]
        keep = np.concatenate([[True], pid[hr][1:] != pid[hr][:-1]]) if len(hr) else hr.astype(bool)
        rows = hr[keep]
        starts, idx = csr_rows(groups.indptr, rows)
        return np.repeat(np.arange(len(rows)), np.diff(starts)), groups.codes[idx]

    def link_clears(self, groups: Groups, pid: np.ndarray, healthy_rows: np.ndarray
                    ) -> dict[str, int]:
        """Healthy pairs per link, counted once per pair, in one bincount."""
        counts = np.bincount(self._healthy_pair_groups(groups, pid, healthy_rows)[1],
                             minlength=groups.count)
        return {self.link_of[g]: int(counts[g]) for g in np.flatnonzero(counts).tolist()
                if self.link_of[g]}

    def switch_clears(self, groups: Groups, pid: np.ndarray, healthy_rows: np.ndarray,
                      routed: dict[str, int]) -> dict[str, int]:
        """Healthy pairs per switch: those with a link every path crosses
        ending at it (counted once per pair, like `link_clears`), or, where
        more, half the routed pairs over its links (a routed path through a
        switch uses two of its links: how a spine is cleared)."""
        owner, codes = self._healthy_pair_groups(groups, pid, healthy_rows)
        names = self._switch_index
        have = len(self._ends)
        if have < len(self.link_of):  # groups added since: their links' switches
            more = np.full((len(self.link_of) - have, 2), -1, dtype=np.int64)
            for g, link in enumerate(self.link_of[have:]):
                for j, sw in enumerate(self._switches_of(link) if link else ()):
                    more[g, j] = names.setdefault(sw, len(names))
            self._ends = np.concatenate([self._ends, more])
        sw_idx = self._ends[codes]  # (entries, 2)
        who = np.repeat(owner, 2)
        flat = sw_idx.ravel()
        ok = flat >= 0
        n = max(len(names), 1)
        key = unique(who[ok] * n + flat[ok])
        counts = np.bincount(key % n, minlength=n)
        out = {sw: int(counts[i]) for sw, i in names.items()}
        halves: dict[str, float] = defaultdict(float)
        for link, c in routed.items():
            for sw in self._switches_of(link):
                halves[sw] += c / 2
        for sw, h in halves.items():
            out[sw] = max(out.get(sw, 0), int(h))
        return out
