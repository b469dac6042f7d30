"""Windows as columns: what `netskel analyze` computes from Parquet and the
engine reads, with no Python object per window.

An hour of probes is close to a million windows; building a WindowStats
(and its RouteStats) for each and taking the numbers back out of them cost
more than everything numpy did with them. Live windows still arrive one
message at a time and are turned into a batch once per analysis window;
the few windows an incident shows as evidence are materialized back."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from netskel.arrays import csr_rows
from netskel.model import RTT_STATS, RouteStats, WindowStats

STAT_FIELDS = RTT_STATS  # the RTT statistics' columns, in the detector's order
_STATS_OF = attrgetter(*STAT_FIELDS)


@dataclass
class WindowBatch:
    """Row i is one window. Endpoint, protocol and route strings are codes
    into the name lists (-1: no route). Window i's probes by traced route are
    r_*[r_ptr[i]:r_ptr[i + 1]]."""

    names: list[str]
    src: np.ndarray     # int64 codes into names
    dst: np.ndarray
    start: np.ndarray   # float64 seconds
    end: np.ndarray
    size: np.ndarray    # int64
    sent: np.ndarray    # int64
    lost: np.ndarray
    stats: np.ndarray   # (N, 7) float64 in STAT_FIELDS order, NaN when every probe was lost
    slow: np.ndarray    # int64
    protos: list[str]
    proto: np.ndarray   # int64 codes into protos
    clocks: list[str]   # RTT clocks (netskel.model.CLOCKS, "" unknown)
    clock: np.ndarray   # int64 codes into clocks
    route_names: list[str]
    route: np.ndarray   # the window's traced route (the last seen), -1 when none
    r_ptr: np.ndarray   # (N + 1,) int64
    r_route: np.ndarray  # codes into route_names
    r_sent: np.ndarray
    r_lost: np.ndarray
    r_median: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def empty(cls) -> WindowBatch:
        return cls.from_windows(())

    def take(self, idx: np.ndarray) -> WindowBatch:
        """The windows at idx, in that order."""
        idx = np.asarray(idx, dtype=np.int64)
        ptr, at = csr_rows(self.r_ptr, idx)
        return WindowBatch(self.names, self.src[idx], self.dst[idx], self.start[idx],
                           self.end[idx], self.size[idx], self.sent[idx], self.lost[idx],
                           self.stats[idx], self.slow[idx], self.protos, self.proto[idx],
                           self.clocks, self.clock[idx], self.route_names, self.route[idx], ptr,
                           self.r_route[at],
                           self.r_sent[at], self.r_lost[at], self.r_median[at])

    def problems(self) -> list[tuple[int, str]]:
        """(row, why it cannot be trusted) for every bad row, in row order:
        `WindowStats.problem`'s rules, first failing rule named, in one
        numpy pass instead of one Python call per window (half a million
        live windows a window cost a second)."""
        n = len(self)
        if not n:
            return []
        empty = np.array([not x for x in self.names], dtype=bool)
        sent, lost, slow = self.sent, self.lost, self.slow
        with np.errstate(invalid="ignore"):
            st = self.stats
            absurd = ~((st >= 0) & (st < 1e8)).all(axis=1)
            lo, q1, med, q3, hi = (st[:, STAT_FIELDS.index(f)] for f in (
                "rtt_min", "rtt_p25", "rtt_median", "rtt_p75", "rtt_max"))
            unordered = ((q1 < lo - 1e-6) | (med < q1 - 1e-6) | (q3 < med - 1e-6)
                         | (hi < q3 - 1e-6))
        answered = lost < sent
        rules: list[tuple[np.ndarray, str | None]] = [
            (empty[self.src] | empty[self.dst], "empty src or dst"),
            (self.src == self.dst, "src equals dst"),
            (~(np.isfinite(self.start) & np.isfinite(self.end)), "non-finite window bounds"),
            (self.end <= self.start, "window ends before it starts"),
            ((sent < 0) | (lost < 0) | (lost > sent), None),  # counts named per row
            ((slow < 0) | (slow > sent - lost), None),
            (sent == 0, "no probe sent"),
            (answered & absurd, "RTT statistics missing, negative or absurd"),
            (answered & unordered, "RTT quantiles out of order"),
        ]
        reason = np.full(n, -1, dtype=np.int64)
        for k, (bad, _) in enumerate(rules):
            reason[(reason < 0) & bad] = k
        out = []
        for i in np.flatnonzero(reason >= 0).tolist():
            k = int(reason[i])
            why = rules[k][1]
            if k == 4:
                why = f"impossible counts sent={int(sent[i])} lost={int(lost[i])}"
            elif k == 5:
                why = (f"impossible slow count {int(slow[i])} of "
                       f"{int(sent[i]) - int(lost[i])} received")
            out.append((i, str(why)))
        return out

    def by_window(self) -> Iterator[tuple[float, float, WindowBatch]]:
        """(start, end, its windows in their order here), earliest first."""
        if not len(self):
            return
        s0, e0 = self.start[0], self.end[0]
        if (self.start == s0).all() and (self.end == e0).all():
            yield float(s0), float(e0), self  # an agent's report: one window
            return
        spans = np.stack([self.start, self.end], axis=1)
        order = np.lexsort((self.end, self.start))  # stable: rows keep their order within
        s = spans[order]
        cut = np.flatnonzero(np.r_[True, np.any(s[1:] != s[:-1], axis=1), True])
        for lo, hi in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True):
            yield float(s[lo, 0]), float(s[lo, 1]), self.take(order[lo:hi])

    def window(self, i: int) -> WindowStats:
        """Window i as the object the contract and the web page speak."""
        lo, hi = int(self.r_ptr[i]), int(self.r_ptr[i + 1])
        routes = tuple(RouteStats(self.route_names[int(r)], int(n), int(k), float(m))
                       for r, n, k, m in zip(self.r_route[lo:hi], self.r_sent[lo:hi],
                                             self.r_lost[lo:hi], self.r_median[lo:hi],
                                             strict=True))
        st = dict(zip(STAT_FIELDS, self.stats[i].tolist(), strict=True))
        rc = int(self.route[i])
        return WindowStats(src=self.names[int(self.src[i])], dst=self.names[int(self.dst[i])],
                           window_start=float(self.start[i]), window_end=float(self.end[i]),
                           size=int(self.size[i]), sent=int(self.sent[i]),
                           lost=int(self.lost[i]), proto=self.protos[int(self.proto[i])],
                           route=self.route_names[rc] if rc >= 0 else "", routes=routes,
                           slow=int(self.slow[i]), clock=self.clocks[int(self.clock[i])],
                           **st)

    def windows(self) -> list[WindowStats]:
        return [self.window(i) for i in range(len(self))]

    @classmethod
    def from_windows(cls, ws: Sequence[WindowStats]) -> WindowBatch:
        """Live windows (one message each) as one batch."""
        names: dict[str, int] = {}
        protos: dict[str, int] = {}
        clocks: dict[str, int] = {}
        routes: dict[str, int] = {}
        n = len(ws)
        src = np.fromiter((names.setdefault(w.src, len(names)) for w in ws), np.int64, n)
        dst = np.fromiter((names.setdefault(w.dst, len(names)) for w in ws), np.int64, n)
        proto = np.fromiter((protos.setdefault(w.proto, len(protos)) for w in ws), np.int64, n)
        clock = np.fromiter((clocks.setdefault(w.clock, len(clocks)) for w in ws), np.int64, n)
        route = np.fromiter((routes.setdefault(w.route, len(routes)) if w.route else -1
                             for w in ws), np.int64, n)
        lens = np.fromiter((len(w.routes) for w in ws), np.int64, n)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=ptr[1:])
        flat = [r for w in ws for r in w.routes]
        m = len(flat)
        stats = (np.array(list(map(_STATS_OF, ws)), dtype=np.float64) if n
                 else np.zeros((0, len(STAT_FIELDS))))
        r_route = np.fromiter((routes.setdefault(r.route, len(routes)) for r in flat), np.int64, m)
        return cls(
            names=list(names), src=src, dst=dst,
            start=np.fromiter((w.window_start for w in ws), np.float64, n),
            end=np.fromiter((w.window_end for w in ws), np.float64, n),
            size=np.fromiter((w.size for w in ws), np.int64, n),
            sent=np.fromiter((w.sent for w in ws), np.int64, n),
            lost=np.fromiter((w.lost for w in ws), np.int64, n),
            stats=stats, slow=np.fromiter((w.slow for w in ws), np.int64, n),
            protos=list(protos), proto=proto, clocks=list(clocks), clock=clock,
            route_names=list(routes), route=route, r_ptr=ptr, r_route=r_route,
            r_sent=np.fromiter((r.sent for r in flat), np.int64, m),
            r_lost=np.fromiter((r.lost for r in flat), np.int64, m),
            r_median=np.fromiter((r.rtt_median for r in flat), np.float64, m))

    @classmethod
    def concat(cls, parts: Sequence[WindowBatch]) -> WindowBatch:
        """One batch of several, codes remapped onto shared name lists."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        names: dict[str, int] = {}
        protos: dict[str, int] = {}
        clocks: dict[str, int] = {}
        routes: dict[str, int] = {}

        def remap(table: dict[str, int], local: list[str]) -> np.ndarray:
            # -1 stays -1 (the appended last entry)
            return np.array([table.setdefault(x, len(table)) for x in local] + [-1],
                            dtype=np.int64)

        cols: dict[str, list[np.ndarray]] = {k: [] for k in (
            "src", "dst", "proto", "clock", "route", "r_route")}
        ptrs = [np.zeros(1, dtype=np.int64)]
        base = 0
        for p in parts:
            to_name, to_route = remap(names, p.names), remap(routes, p.route_names)
            cols["src"].append(to_name[p.src])
            cols["dst"].append(to_name[p.dst])
            cols["proto"].append(remap(protos, p.protos)[p.proto])
            cols["clock"].append(remap(clocks, p.clocks)[p.clock])
            cols["route"].append(to_route[p.route])
            cols["r_route"].append(to_route[p.r_route])
            ptrs.append(p.r_ptr[1:] + base)
            base += int(p.r_ptr[-1])

        def cat(attr: str) -> np.ndarray:
            return np.concatenate([getattr(p, attr) for p in parts])
        return cls(names=list(names), src=np.concatenate(cols["src"]),
                   dst=np.concatenate(cols["dst"]), start=cat("start"), end=cat("end"),
                   size=cat("size"), sent=cat("sent"), lost=cat("lost"), stats=cat("stats"),
                   slow=cat("slow"), protos=list(protos), proto=np.concatenate(cols["proto"]),
                   clocks=list(clocks), clock=np.concatenate(cols["clock"]),
                   route_names=list(routes), route=np.concatenate(cols["route"]),
                   r_ptr=np.concatenate(ptrs), r_route=np.concatenate(cols["r_route"]),
                   r_sent=cat("r_sent"), r_lost=cat("r_lost"), r_median=cat("r_median"))

