"""The analysed windows Diagnose answers from when no incident holds a pair:
healthy, anomalous but passed, anomalous and maybe persisting, or never
seen. A window keeps its pair ids sorted and its anomalous ones with their
symptom, so a million pairs cost one array a window, not a record each."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from analyzer.verdicts import INCONCLUSIVE, NO_WINDOW, OK
from netskel.arrays import find_sorted


@dataclass(frozen=True)
class SeenWindow:
    start: float
    end: float
    pairs: np.ndarray  # sorted pair ids
    anomalous: dict[int, str]  # pair id -> its symptom in this window

    def holds(self, p_id: int) -> bool:
        return bool(find_sorted(self.pairs, np.array([p_id]))[0][0])


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

    def judge(self, p_id: int, start: float, end: float, settle: int) -> tuple[str, str]:
        """A pair's verdict and reason from the windows overlapping
        [start, end]; persistent faults are the incidents' to answer. An
        anomaly that did not persist and was followed by `settle` healthy
        windows (the engine's close_windows: as many as end an incident)
        passed (benign congestion does so a few times an hour on a
        busy fabric): OK, and the reason says so. One that may still
        persist cannot be judged yet."""
        seen = [w for w in self._in_range(start, end) if w.holds(p_id)]
        odd = [w for w in seen if p_id in w.anomalous]
        if odd:
            what = _symptoms(odd, p_id)
            if self._settled(p_id, odd[-1], settle):
                return OK, (f"{len(seen) - len(odd)} healthy window(s); {what} passed without "
                            f"an incident ({settle} healthy after it)")
            return INCONCLUSIVE, (f"anomalous window(s) not yet persistent: {what} of "
                                  f"{len(seen)} window(s), the last ending at {odd[-1].end:.0f}")
        if seen:
            return OK, f"{len(seen)} healthy window(s)"
        return INCONCLUSIVE, NO_WINDOW

    def _settled(self, p_id: int, last_odd: SeenWindow, settle: int) -> bool:
        """The pair's next `settle` windows after `last_odd` were all held
        and healthy (those past the asked range count: they say how the
        anomaly ended)."""
        after = 0
        for w in self._windows:
            if w.start < last_odd.end or not w.holds(p_id):
                continue
            if p_id in w.anomalous:
                return False
            after += 1
            if after >= settle:
                return True
        return False

    def _in_range(self, start: float, end: float) -> Iterator[SeenWindow]:
        return (w for w in self._windows if w.end > start and w.start <= end)


def _symptoms(odd: list[SeenWindow], p_id: int) -> str:
    """Which symptoms in how many windows: a caller told only "anomalous"
    cannot tell a passing queue from the first window of a loss."""
    counts = Counter(w.anomalous[p_id] for w in odd)
    return ", ".join(f"{sym} in {n}" for sym, n in sorted(counts.items()))
