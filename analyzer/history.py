"""Recent windows per pair, for people: the latency and loss charts of the
web page and `netskel history`. Bounded in pairs and points; the detector's
own history (healthy windows only) is a different thing with another job."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

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

    def record(self, windows: Iterable[WindowStats]) -> None:
        by_pair = self._by_pair
        for w in windows:
            key = pair_key(w.src, w.dst)
            d = by_pair.get(key)
            if d is None:
                if len(by_pair) >= self.max_pairs:
                    oldest = by_pair[next(iter(by_pair))]
                    if oldest and oldest[-1].start > w.window_start - self.stale_s:
                        continue  # full of live pairs: this one is not charted
                    by_pair.popitem(last=False)  # the pair heard from least recently
                d = by_pair[key] = deque(maxlen=self.points_per_pair)
            else:
                by_pair.move_to_end(key)
            d.append(Point(w.window_start, w.size, w.rtt_median, w.rtt_p75, w.sent, w.lost, w.src))

    def points(self, pair: Pair, since: float = 0.0) -> list[Point]:
        """Oldest first; empty for a pair never seen (or long evicted)."""
        d = self._by_pair.get(pair_key(*pair), ())
        return sorted((p for p in d if p.start >= since), key=lambda p: (p.start, p.size))

    def __contains__(self, pair: Pair) -> bool:
        return pair_key(*pair) in self._by_pair
