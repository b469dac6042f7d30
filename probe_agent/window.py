"""Per-target, per-size window statistics, built from probe events.

A pair's probes are spread over several flows (UDP source ports), each
hashed onto its own ECMP path; the window keeps them apart by flow so that,
once a flow's route is traced, its probes count on that route (RouteStats):
the analyzer then blames the path the lost or slow probes took.

Windows are aligned to multiples of the window length since the epoch, so
every agent's windows line up for the analyzer. A window is closed once the
probe timeout has passed after its end: by then every probe sent in it is
either answered or lost. Closed windows are computed all at once by the
offline reader's code (analyzer/windows.py), so an agent's windows and
`netskel analyze`'s are the same statistics by construction."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from analyzer.batch import WindowBatch
from analyzer.windows import grouped, route_columns, rtt_stats
from netskel.model import CLOCKS, WindowStats

if TYPE_CHECKING:
    from probe_agent.udp import Reply, Sent

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
class FlowProbes:
    """One window's probes of one pair and size, by flow."""

    sent: dict[int, int] = field(default_factory=dict)  # by flow
    rtts: dict[int, list[float]] = field(default_factory=dict)  # by flow
    clock: int = NO_RTT  # clock_rank of the least exact RTT so far

    def add_sent(self, flow: int) -> None:
        self.sent[flow] = self.sent.get(flow, 0) + 1

    def add_rtt(self, flow: int, rtt_us: float, clock: str) -> None:
        """An RTT counts on a flow this window sent on; `clock`: of this RTT
        (CLOCKS; "" unknown, which makes the window's unknown too)."""
        if flow in self.sent:
            self.rtts.setdefault(flow, []).append(rtt_us)
            self.clock = min(self.clock, clock_rank(clock))


# One window of one pair and size: (start, end, src, dst, size, its probes).
FlowWindow = tuple[float, float, str, str, int, FlowProbes]


def summarize_windows(windows: Sequence[FlowWindow], proto: str = "udp",
                      route_of: RouteOf | None = None) -> WindowBatch:
    """The contract statistics of every window at once, as the offline
    reader computes them from probe records (analyzer/windows.py: one
    numpy pass, no object per window; a numpy call per statistic and
    window cost ~0.4 ms a window, ~10 % of an agent's CPU). A flow's RTTs
    beyond its sends are not counted. With `route_of`, each window also
    carries its probes by their flows' traced routes, and its main route
    (most probes, first by name on a tie). Windows with no send are left
    out (nothing to say)."""
    windows = [w for w in windows if sum(w[5].sent.values()) > 0]
    n = len(windows)
    if not n:
        return WindowBatch.empty()
    routes: dict[str, int] = {}
    counts: list[int] = []  # probes per (window, flow), then its window, RTTs and route
    flow_row: list[int] = []
    got: list[float] = []
    flow_route: list[int] = []
    for i, (_, _, a, b, _, acc) in enumerate(windows):
        for flow, k in acc.sent.items():
            flow_row.append(i)
            rtts = acc.rtts.get(flow, [])[:k]
            got.extend(rtts)
            got.extend([math.nan] * (k - len(rtts)))
            counts.append(k)
            traced = route_of(a, b, flow) if route_of is not None else ""
            flow_route.append(routes.setdefault(traced, len(routes)) if traced else -1)
    per_flow = np.asarray(counts, dtype=np.int64)
    group = np.repeat(np.asarray(flow_row, dtype=np.int64), per_flow)
    rtt = np.asarray(got, dtype=np.float64)
    _, _, sent, received, gr, rt, starts, order = grouped(group[:, None], rtt)
    stats, slow = rtt_stats(received, gr, rt, starts)
    # Route codes numbered by name: the main route's tie rule reads them so.
    route_names = sorted(routes)
    rank = {r: i for i, r in enumerate(route_names)}
    by_name = np.array([rank[r] for r in routes] + [-1], dtype=np.int64)
    code = np.repeat(by_name[np.asarray(flow_route, dtype=np.int64)], per_flow)
    route, r_ptr, r_route, r_sent, r_lost, r_median = route_columns(group, code, rtt, order, n)
    names: dict[str, int] = {}
    src = np.fromiter((names.setdefault(w[2], len(names)) for w in windows), np.int64, n)
    dst = np.fromiter((names.setdefault(w[3], len(names)) for w in windows), np.int64, n)
    clocks: dict[str, int] = {}
    clock = np.fromiter((clocks.setdefault(clock_name(w[5].clock), len(clocks))
                         for w in windows), np.int64, n)
    return WindowBatch(
        names=list(names), src=src, dst=dst,
        start=np.fromiter((w[0] for w in windows), np.float64, n),
        end=np.fromiter((w[1] for w in windows), np.float64, n),
        size=np.fromiter((w[4] for w in windows), np.int64, n),
        sent=sent.astype(np.int64), lost=(sent - received).astype(np.int64), stats=stats,
        slow=slow, protos=[proto], proto=np.zeros(n, dtype=np.int64), clocks=list(clocks),
        clock=clock, route_names=route_names, route=route, r_ptr=r_ptr, r_route=r_route,
        r_sent=r_sent, r_lost=r_lost, r_median=r_median)


class WindowAccumulator:
    def __init__(self, window_s: float, timeout_s: float, proto: str = "udp") -> None:
        if window_s <= 0 or timeout_s <= 0:
            raise ValueError("window and timeout must be positive")
        self.window_s = window_s
        self.timeout_s = timeout_s
        self.proto = proto
        self._acc: dict[Key, FlowProbes] = defaultdict(FlowProbes)

    def sent(self, src: str, dst: str, size: int, t_send: float, flow: int = 0) -> None:
        self.sent_many([(src, dst, size, t_send, flow)])

    def replied(self, src: str, dst: str, size: int, t_send: float, rtt_us: float,
                clock: str = "", flow: int = 0) -> None:
        self.replied_many([(src, dst, size, t_send, rtt_us, flow, clock)])

    def sent_many(self, events: Iterable[Sent]) -> None:
        """Probes sent: (src, dst, size, t_send_s, flow) each. One loop
        over a prober's batch: this runs for every probe an agent sends."""
        acc, window_s = self._acc, self.window_s
        for src, dst, size, t_send, flow in events:
            acc[(math.floor(t_send / window_s), src, dst, size)].add_sent(flow)

    def replied_many(self, replies: Iterable[Reply]) -> None:
        """Replies: (src, dst, size, t_send_s, rtt_us, flow, clock) each.
        A reply later than the timeout counts as lost, like one never seen."""
        acc, window_s, limit = self._acc, self.window_s, self.timeout_s * 1e6
        for src, dst, size, t_send, rtt_us, flow, clock in replies:
            if 0 <= rtt_us <= limit:
                probes = acc.get((math.floor(t_send / window_s), src, dst, size))
                if probes is not None:
                    probes.add_rtt(flow, rtt_us, clock)

    def close_batch(self, now: float, route_of: RouteOf | None = None) -> WindowBatch:
        """Windows whose every probe has had its chance to return, as one
        batch; with `route_of`, each carries its probes by their flows'
        traced routes."""
        done = sorted(k for k in self._acc if (k[0] + 1) * self.window_s + self.timeout_s <= now)
        return summarize_windows(
            [(idx * self.window_s, (idx + 1) * self.window_s, src, dst, size,
              self._acc.pop((idx, src, dst, size))) for idx, src, dst, size in done],
            self.proto, route_of)

    def close(self, now: float, route_of: RouteOf | None = None) -> list[WindowStats]:
        """close_batch's windows as objects."""
        return self.close_batch(now, route_of).windows()
