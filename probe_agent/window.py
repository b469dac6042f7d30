"""Per-target, per-size window statistics, built from probe events.

Windows are aligned to multiples of the window length since the epoch, so
every agent's windows line up for the analyzer. A window is closed once the
probe timeout has passed after its end: by then every probe sent in it is
either answered or lost."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from netskel.model import CLOCKS, TAIL_SHIFT_US, WindowStats

Key = tuple[int, str, str, int]  # (window index, src, dst, size)


# A window's RTTs are only as exact as the least exact of them: its clock is
# the minimum rank over its RTTs, with an unknown clock (-1) making the
# window's unknown too.
NO_RTT = len(CLOCKS)  # the rank before any RTT
_RANK = {c: i for i, c in enumerate(CLOCKS)}


def clock_rank(clock: str) -> int:
    """Position in CLOCKS (least exact first); -1 for an unknown clock."""
    return _RANK.get(clock, -1)


def clock_name(rank: int) -> str:
    """The clock of a minimum rank; "" when unknown or no RTT came back."""
    return CLOCKS[rank] if 0 <= rank < len(CLOCKS) else ""


@dataclass
class _Acc:
    sent: int = 0
    rtts: list[float] = field(default_factory=list)
    clock: int = NO_RTT  # clock_rank of the least exact RTT so far


def summarize(src: str, dst: str, start: float, end: float, size: int, sent: int,
              rtts_us: list[float] | np.ndarray, proto: str = "udp", clock: str = ""
              ) -> WindowStats:
    """The contract statistics of one window; `clock`: of its RTTs."""
    r = np.asarray(rtts_us, dtype=np.float64)
    received = min(len(r), sent)
    if received == 0:
        return WindowStats(src=src, dst=dst, window_start=start, window_end=end, size=size,
                           sent=sent, lost=sent, proto=proto)
    p25, med, p75 = np.percentile(r, [25, 50, 75])
    return WindowStats(src=src, dst=dst, window_start=start, window_end=end, size=size, sent=sent,
                       lost=sent - received, rtt_min=float(r.min()), rtt_p25=float(p25),
                       rtt_median=float(med), rtt_p75=float(p75), rtt_mean=float(r.mean()),
                       rtt_std=float(r.std()), rtt_max=float(r.max()), proto=proto,
                       slow=min(received, int(np.count_nonzero(r >= p25 + TAIL_SHIFT_US))),
                       clock=clock)


class WindowAccumulator:
    def __init__(self, window_s: float, timeout_s: float, proto: str = "udp") -> None:
        if window_s <= 0 or timeout_s <= 0:
            raise ValueError("window and timeout must be positive")
        self.window_s = window_s
        self.timeout_s = timeout_s
        self.proto = proto
        self._acc: dict[Key, _Acc] = defaultdict(_Acc)

    def _index(self, t: float) -> int:
        return math.floor(t / self.window_s)

    def sent(self, src: str, dst: str, size: int, t_send: float) -> None:
        self._acc[(self._index(t_send), src, dst, size)].sent += 1

    def replied(self, src: str, dst: str, size: int, t_send: float, rtt_us: float,
                clock: str = "") -> None:
        """A reply later than the timeout counts as lost, like one never seen.
        `clock`: of this RTT (CLOCKS; "" unknown, which makes the window's
        unknown too)."""
        if not (0 <= rtt_us <= self.timeout_s * 1e6):
            return
        acc = self._acc.get((self._index(t_send), src, dst, size))
        if acc is not None:
            acc.rtts.append(rtt_us)
            acc.clock = min(acc.clock, clock_rank(clock))

    def close(self, now: float) -> list[WindowStats]:
        """Windows whose every probe has had its chance to return."""
        done = [k for k in self._acc if (k[0] + 1) * self.window_s + self.timeout_s <= now]
        out = []
        for k in sorted(done):
            idx, src, dst, size = k
            acc = self._acc.pop(k)
            start = idx * self.window_s
            out.append(summarize(src, dst, start, start + self.window_s, size, acc.sent,
                                 acc.rtts, self.proto, clock_name(acc.clock)))
        return out
