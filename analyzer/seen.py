"""The analysed windows Diagnose answers from when no incident holds a pair:
healthy, anomalous but not yet persistent, or never seen. A window keeps its
pair ids sorted and its anomalous ones with their symptom, so a million
pairs cost one array a window, not a record each."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from analyzer.verdicts import INCONCLUSIVE, NO_WINDOW, OK


@dataclass(frozen=True)
class SeenWindow:
    start: float
    end: float
    pairs: np.ndarray  # sorted pair ids
    anomalous: dict[int, str]  # pair id -> its symptom in this window

    def holds(self, p_id: int) -> bool:
        i = int(np.searchsorted(self.pairs, p_id))
        return i < len(self.pairs) and int(self.pairs[i]) == p_id


class SeenWindows:
    """Windows in the order they were analysed, oldest dropped first."""

    def __init__(self) -> None:
        self._windows: deque[SeenWindow] = deque()

    def add(self, window: SeenWindow) -> None:
        self._windows.append(window)

    def prune(self, horizon: float) -> None:
        """Forget windows that ended before `horizon`."""
        while self._windows and self._windows[0].end < horizon:
            self._windows.popleft()

    def latest_healthy(self) -> set[int]:
        """Pairs the latest window saw healthy: an active check's anomalies
        are localized against them (nothing seen yet: none)."""
        if not self._windows:
            return set()
        last = self._windows[-1]
        return {int(i) for i in last.pairs.tolist()} - set(last.anomalous)

    def judge(self, p_id: int, start: float, end: float) -> tuple[str, str]:
        """A pair's verdict and reason from the windows overlapping
        [start, end]; persistent faults are the incidents' to answer."""
        seen = [w for w in self._in_range(start, end) if w.holds(p_id)]
        odd = [w for w in seen if p_id in w.anomalous]
        if odd:
            return INCONCLUSIVE, _not_yet(odd, p_id, len(seen))
        if seen:
            return OK, f"{len(seen)} healthy window(s)"
        return INCONCLUSIVE, NO_WINDOW

    def _in_range(self, start: float, end: float) -> Iterator[SeenWindow]:
        return (w for w in self._windows if w.end > start and w.start <= end)


def _not_yet(odd: list[SeenWindow], p_id: int, n_seen: int) -> str:
    """Which symptoms, in how many of the windows asked about, and the last
    one's end: a caller told only "anomalous" cannot tell a passing queue
    from the first window of a loss."""
    counts = Counter(w.anomalous[p_id] for w in odd)
    what = ", ".join(f"{sym} in {n}" for sym, n in sorted(counts.items()))
    return (f"anomalous window(s) not yet persistent: {what} of {n_seen} window(s), "
            f"the last ending at {max(w.end for w in odd):.0f}")
