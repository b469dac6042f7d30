"""The probe agent's Prometheus metrics, in its own registry: a sidecar
exports these and its process figures, nothing of other roles.

Label sets are bounded: size classes, protocols, clocks, outcomes and the
agent's own endpoints (a handful per container), never a probe pair."""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from netskel.metrics import config_gauges, process_registry

REGISTRY: CollectorRegistry = process_registry()
CONFIG = config_gauges(REGISTRY)

VSWITCH_READS = Counter("netskel_agent_vswitch_reads_total",
                        "Virtual-switch table reads, by what asked: the interval, or an active "
                        "check (read at once, so its overlay trace sees the table of the moment)",
                        ["why"], registry=REGISTRY)
for _why in ("interval", "check"):
    VSWITCH_READS.labels(why=_why)
VSWITCH_DUMP_FAILURES = Counter("netskel_agent_vswitch_dump_failures_total",
                                "Virtual-switch table dumps that failed (the last good one stays)",
                                registry=REGISTRY)
VSWITCH_DATAPATH_FAILURES = Counter("netskel_agent_vswitch_datapath_failures_total",
                                    "Datapath flow reads that failed (the analyzer keeps the NICs' "
                                    "last tables)", registry=REGISTRY)
VSWITCH_DATAPATH_FLOWS = Gauge("netskel_agent_vswitch_datapath_flows",
                               "Flows of the last datapath read, by whether they said one "
                               "destination's fate (alone or as the continuation a judged "
                               "flow recirculates to)", ["judged"], registry=REGISTRY)
VSWITCH_LINES_NOT_UNDERSTOOD = Gauge("netskel_agent_vswitch_lines_not_understood",
                                     "Lines of the last virtual-switch dump read as unknowns",
                                     registry=REGISTRY)
ROUTE_TRACES = Counter("netskel_agent_route_traces_total",
                       "Underlay route traces of probe flows by outcome: named (every hop a "
                       "known switch), "
                       "partial (a hop silent or unknown), failed", ["outcome"], registry=REGISTRY)
PROBES_SENT = Counter("netskel_probes_sent_total", "Probes sent", ["proto", "size"],
                      registry=REGISTRY)
PROBES_LOST = Counter("netskel_probes_lost_total", "Probes without a reply in time",
                      ["proto", "size"], registry=REGISTRY)


def _le(bound: float) -> str:
    """A bucket's `le` label as Prometheus clients write it: 5.0, +Inf."""
    return "+Inf" if bound == math.inf else repr(float(bound))


class RttCounts:
    """One prober's RTT histogram for one source: counts per bucket (the
    last: +Inf) and their sum. One writer (its prober's thread); a scrape
    reads it as it is."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def add(self, other: RttCounts) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total


class RttHistogram(Collector):
    """Probe RTTs by source endpoint, exported as a Prometheus histogram.
    The prober observes every reply: prometheus_client's Histogram takes a
    lock for its sum and its bucket each time (3-5 us a reply, ~5 % of an
    agent's CPU at 640 probes/s); here a bisect and two additions, no lock:
    each prober has children of its own (an active check's prober runs
    beside the regular one), summed by source on a scrape and folded into
    the source's total when the prober closes. A scrape's count is its
    buckets' total; its sum may miss the one reply being added meanwhile."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = tuple(float(b) for b in buckets)
        if list(self.bounds) != sorted(self.bounds):
            raise ValueError("buckets not in order")
        self._live: dict[str, list[RttCounts]] = {}
        self._retired: dict[str, RttCounts] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def child(self, src: str) -> RttCounts:
        """A new histogram of `src` for one prober to write alone."""
        counts = RttCounts(self.bounds)
        with self._lock:
            self._live.setdefault(src, []).append(counts)
        return counts

    def retire(self, src: str, counts: RttCounts) -> None:
        """A prober is done with its child: its counts stay in the source's."""
        with self._lock:
            self._live[src].remove(counts)
            self._retired.setdefault(src, RttCounts(self.bounds)).add(counts)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["src"])
        parts: dict[str, list[RttCounts]] = defaultdict(list)
        with self._lock:
            for src, live in self._live.items():
                parts[src].extend(live)
            for src, retired in self._retired.items():
                parts[src].append(retired)
        for src, children in parts.items():
            total = RttCounts(self.bounds)
            for c in children:
                total.add(c)
            cumulative = list(accumulate(total.counts))
            family.add_metric([src], [(_le(b), c) for b, c in
                                      zip((*self.bounds, math.inf), cumulative, strict=True)],
                              total.total)
        yield family


PROBE_RTT = RttHistogram("netskel_probe_rtt_microseconds", "Probe round-trip time",
                         (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000), REGISTRY)
PROBES_ANSWERED = Counter("netskel_probes_answered_total", "Probes echoed by the responder",
                          registry=REGISTRY)
PROBE_STAMPS = Counter("netskel_probe_timestamps_total",
                       "Probe RTTs by the clock of their send and receive stamps "
                       "(hardware, kernel or user)", ["clock"], registry=REGISTRY)
PROBE_DWELLS = Counter("netskel_probe_dwells_total",
                       "Probe RTTs by where the responder's dwell came from: its follow-up "
                       "(kernel stamps) or the reply alone (up to just before its send; an old "
                       "responder, or a follow-up read after its reply)", ["source"],
                       registry=REGISTRY)
PROBES_REFUSED = Counter("netskel_probes_refused_total",
                         "Datagrams the responder did not answer", ["reason"], registry=REGISTRY)
CONTROLLER_RECONNECTS = Counter("netskel_controller_reconnects_total",
                                "Times the agent reconnected to the controller", registry=REGISTRY)
