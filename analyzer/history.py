"""Recent windows per pair, for people: the latency and loss charts of the
web page and `netskel history`. Bounded in pairs and points; the detector's
own history (healthy windows only) is a different thing with another job."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from analyzer.batch import STAT_FIELDS, WindowBatch
from netskel.arrays import find_sorted
from netskel.model import WindowStats, pair_key

Pair = tuple[str, str]


@dataclass(frozen=True)
class Point:
    start: float
    size: int
    median_us: float  # NaN when every probe was lost
    p75_us: float
    sent: int
    lost: int
    src: str  # the prober: RTTs are measured from its side


def _key(a: int, c: int) -> int:
    """One int64 for the pair of endpoint numbers a and c, either order."""
    return (min(a, c) << 32) | max(a, c)


class PairHistory:
    """Once `max_pairs` are kept, a new pair takes the place of the one heard
    from least recently only when that one has been silent for `stale_s`:
    with more live pairs than room (half a million in a window), evicting on
    every new pair kept no pair's chart and cost a second per window; this
    way the kept pairs keep their charts and the rest are not recorded."""

    def __init__(self, max_pairs: int = 20000, points_per_pair: int = 600,
                 stale_s: float = 600.0) -> None:
        self.max_pairs = max_pairs
        self.points_per_pair = points_per_pair
        self.stale_s = stale_s
        self._by_pair: OrderedDict[Pair, deque[Point]] = OrderedDict()
        # Every endpoint id seen gets a number, so that a kept pair is one
        # int64 (smaller number << 32 | larger) and a report's rows are
        # matched against the kept pairs by one sorted search.
        self._number: dict[str, int] = {}
        self._kept: np.ndarray | None = np.zeros(0, dtype=np.int64)  # sorted; None: rebuild

    def record(self, windows: Iterable[WindowStats]) -> None:
        self.record_batch(WindowBatch.from_windows(list(windows)))

    def _kept_keys(self) -> np.ndarray:
        if self._kept is None:
            num = self._number
            self._kept = np.sort(np.array(
                [_key(num[a], num[c]) for a, c in self._by_pair], dtype=np.int64))
        return self._kept

    def record_batch(self, b: WindowBatch) -> None:
        """Rows of kept pairs are found by number, not by a dictionary
        lookup per row: with half a million live pairs and room for 20,000,
        the walk over every row cost a second a window for rows that are
        not charted."""
        n = len(b)
        if not n:
            return
        by_pair = self._by_pair
        names = b.names
        num = self._number
        numbers = np.array([num.setdefault(x, len(num)) for x in names], dtype=np.int64)
        a, c = numbers[b.src], numbers[b.dst]
        row_key = (np.minimum(a, c) << 32) | np.maximum(a, c)
        uniq, first, inverse = np.unique(row_key, return_index=True, return_inverse=True)
        charted = find_sorted(self._kept_keys(), uniq)[0]

        def pair_at(i: int) -> Pair:
            return pair_key(names[int(b.src[i])], names[int(b.dst[i])])

        def pair_of(u: int) -> Pair:
            return pair_at(int(first[u]))

        # Pairs heard from again move to the end (heard from most recently)
        # before room is made, so the room is taken from silent ones.
        for u in np.flatnonzero(charted).tolist():
            by_pair.move_to_end(pair_of(u))
        new = np.flatnonzero(~charted)
        if len(new):
            new = new[np.argsort(first[new], kind="stable")]  # in order of arrival
            latest = float(b.start[first[new]].max())
            room = self.max_pairs - len(by_pair)
            admitted = []
            for u in new.tolist():
                if room <= 0:
                    if not by_pair:
                        break  # no room at all
                    oldest = by_pair[next(iter(by_pair))]
                    heard = oldest[-1].start if oldest else latest  # empty: admitted just now
                    if heard > latest - self.stale_s:
                        break  # full of live pairs: the rest are not charted
                    if heard > float(b.start[first[u]]) - self.stale_s:
                        continue
                    by_pair.popitem(last=False)  # the pair heard from least recently
                    self._kept = None
                    room += 1
                by_pair[pair_of(u)] = deque(maxlen=self.points_per_pair)
                charted[u] = True
                admitted.append(int(uniq[u]))
                room -= 1
            if admitted and self._kept is not None:
                self._kept = np.sort(np.concatenate([self._kept, admitted]))
        med = b.stats[:, STAT_FIELDS.index("rtt_median")]
        p75 = b.stats[:, STAT_FIELDS.index("rtt_p75")]
        for i in np.flatnonzero(charted[inverse]).tolist():
            by_pair[pair_at(i)].append(Point(
                float(b.start[i]), int(b.size[i]), float(med[i]), float(p75[i]),
                int(b.sent[i]), int(b.lost[i]), names[int(b.src[i])]))

    def points(self, pair: Pair, since: float = 0.0) -> list[Point]:
        """Oldest first; empty for a pair never seen (or long evicted)."""
        d = self._by_pair.get(pair_key(*pair), ())
        return sorted((p for p in d if p.start >= since), key=lambda p: (p.start, p.size))

    def __contains__(self, pair: Pair) -> bool:
        return pair_key(*pair) in self._by_pair
