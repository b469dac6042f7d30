"""Per-target, per-size window statistics, built from probe events.

A pair's probes are spread over several flows (UDP source ports), each
hashed onto its own ECMP path; the window keeps them apart by flow so that,
once a flow's route is traced, its probes count on that route (RouteStats):
the analyzer then blames the path the lost or slow probes took.

Windows are aligned to multiples of the window length since the epoch, so
every agent's windows line up for the analyzer. A window is closed once the
probe timeout has passed after its end: by then every probe sent in it is
either answered or lost."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from netskel.model import CLOCKS, TAIL_SHIFT_US, RouteStats, WindowStats

Key = tuple[int, str, str, int]  # (window index, src, dst, size)
# The traced route of one flow of a pair: (src, dst, flow) -> switch ids
# joined by ">", "" when not (fully) traced.
RouteOf = Callable[[str, str, int], str]


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
    sent: dict[int, int] = field(default_factory=dict)  # by flow
    rtts: dict[int, list[float]] = field(default_factory=dict)  # by flow
    clock: int = NO_RTT  # clock_rank of the least exact RTT so far


def route_stats(src: str, dst: str, sent: dict[int, int], rtts: dict[int, list[float]],
                route_of: RouteOf) -> tuple[RouteStats, ...]:
    """The window's probes by the traced route of their flow, in route
    order; flows with no route are left out (their probes still count in
    the window's own statistics)."""
    by_route: dict[str, tuple[int, list[float]]] = {}
    for flow, n in sent.items():
        route = route_of(src, dst, flow)
        if not route:
            continue
        got = rtts.get(flow, [])[:n]
        total, acc = by_route.get(route, (0, []))
        by_route[route] = (total + n, acc + got)
    return tuple(RouteStats(route=r, sent=n, lost=n - len(got),
                            rtt_median=float(np.median(got)) if got else math.nan)
                 for r, (n, got) in sorted(by_route.items()))


def main_route(routes: tuple[RouteStats, ...]) -> str:
    """The route most of the window's probes took, the first by name on a
    tie (`max` keeps the first of equals; `route_stats` sorts by name), as
    the offline reader picks it (analyzer/windows.py)."""
    return max(routes, key=lambda r: r.sent).route if routes else ""


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


def summarize_flows(src: str, dst: str, start: float, end: float, size: int,
                    sent: dict[int, int], rtts: dict[int, list[float]], proto: str = "udp",
                    clock: str = "", route_of: RouteOf | None = None) -> WindowStats:
    """`summarize` of probes kept by flow (sent and RTTs per flow; a flow's
    RTTs beyond its sends are not counted); with `route_of`, the window
    also carries them by their flows' traced routes."""
    got = [r for flow, n in sent.items() for r in rtts.get(flow, [])[:n]]
    w = summarize(src, dst, start, end, size, sum(sent.values()), got, proto, clock)
    routes = route_stats(src, dst, sent, rtts, route_of) if route_of is not None else ()
    return dataclasses.replace(w, route=main_route(routes), routes=routes) if routes else w


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

    def sent(self, src: str, dst: str, size: int, t_send: float, flow: int = 0) -> None:
        sent = self._acc[(self._index(t_send), src, dst, size)].sent
        sent[flow] = sent.get(flow, 0) + 1

    def replied(self, src: str, dst: str, size: int, t_send: float, rtt_us: float,
                clock: str = "", flow: int = 0) -> None:
        """A reply later than the timeout counts as lost, like one never seen.
        `clock`: of this RTT (CLOCKS; "" unknown, which makes the window's
        unknown too)."""
        if not (0 <= rtt_us <= self.timeout_s * 1e6):
            return
        acc = self._acc.get((self._index(t_send), src, dst, size))
        if acc is not None and flow in acc.sent:
            acc.rtts.setdefault(flow, []).append(rtt_us)
            acc.clock = min(acc.clock, clock_rank(clock))

    def close(self, now: float, route_of: RouteOf | None = None) -> list[WindowStats]:
        """Windows whose every probe has had its chance to return; with
        `route_of`, each carries its probes by their flows' traced routes."""
        done = [k for k in self._acc if (k[0] + 1) * self.window_s + self.timeout_s <= now]
        out = []
        for k in sorted(done):
            idx, src, dst, size = k
            acc = self._acc.pop(k)
            start = idx * self.window_s
            out.append(summarize_flows(src, dst, start, start + self.window_s, size, acc.sent,
                                       acc.rtts, self.proto, clock_name(acc.clock), route_of))
        return out
