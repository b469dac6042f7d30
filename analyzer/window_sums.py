"""Per-pair sums of the recent windows, kept so an incident can be dated
where its fault began and ended (analyzer/onset.py) after it was found:
what was lost, received and the received RTTs' sum, a window each. Twelve
bytes a pair a window; which pairs an incident holds is known only later,
so every pair's sums are kept."""

from __future__ import annotations

from collections import deque

import numpy as np

from analyzer.batch import STAT_FIELDS

# How many windows are kept (onset.py reads two healthy ones, the one before,
# the first, three after; a slow loss found over up to 8 windows began as far
# back, and its change of rate needs healthy windows before it): at least
# MIN_WINDOWS, and as many more as BYTES hold, up to MAX_WINDOWS: a latency
# that creeps up for minutes is flagged late, and its rise is read back to
# where it began (faults last 5-25 min).
MIN_WINDOWS = 12
MAX_WINDOWS = 60
BYTES = 32 << 20


def _at(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """values[:, ids], 0 past the end (pairs first seen after those values)."""
    out = np.zeros((len(values), len(ids)), dtype=np.float64)
    inside = ids < values.shape[1]
    out[:, inside] = values[:, ids[inside]]
    return out


class WindowSums:
    def __init__(self) -> None:
        self._sums: deque[tuple[float, np.ndarray]] = deque()  # (start, (3, pairs))

    def note(self, start: float, pid: np.ndarray, stats: np.ndarray, sent: np.ndarray,
             lost: np.ndarray, npairs: int) -> tuple[np.ndarray, np.ndarray]:
        """One window's rows (pair id, stats, sent, lost each) summed per
        pair id below `npairs`; returns probes sent and lost per pair, which
        the loss tests read too."""
        pair_sent = np.bincount(pid, weights=sent, minlength=npairs)
        pair_lost = np.bincount(pid, weights=lost, minlength=npairs)
        # A row with nothing received has a NaN mean: 0 x NaN reads as 0.
        rtt_sum = np.nan_to_num(stats[:, STAT_FIELDS.index("rtt_mean")] * (sent - lost),
                                copy=False)
        sums = np.empty((3, npairs), dtype=np.float32)
        sums[0] = pair_lost
        np.subtract(pair_sent, pair_lost, out=sums[1])
        sums[2] = np.bincount(pid, weights=rtt_sum, minlength=npairs)
        self._sums.append((start, sums))
        keep = min(MAX_WINDOWS, max(MIN_WINDOWS, BYTES // max(sums.nbytes, 1)))
        while len(self._sums) > keep:
            self._sums.popleft()
        return pair_sent, pair_lost

    def of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(window starts, (3, windows, pairs) lost / received / RTT sums)
        of these pair ids over the windows held; None for no pair or no
        window."""
        if not len(ids) or not self._sums:
            return None
        starts = np.array([x[0] for x in self._sums])
        return starts, np.stack([_at(x, ids) for _, x in self._sums], axis=1)
