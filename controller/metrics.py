"""The controller's Prometheus metrics, in its own registry: a controller
process exports these and its process figures, nothing of other roles.

Label sets are bounded: report kinds and stream names, never a probe pair."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from netskel.metrics import config_gauges, process_registry

REGISTRY: CollectorRegistry = process_registry()
CONFIG = config_gauges(REGISTRY)

AGENTS_REGISTERED = Gauge("netskel_agents_registered", "Containers with a registered agent",
                          registry=REGISTRY)
PINGLIST_TARGETS = Gauge("netskel_pinglist_targets", "Targets across all ping lists",
                         registry=REGISTRY)
PINGLIST_ACTIVE = Gauge("netskel_pinglist_active_targets", "Targets whose agent is ready",
                        registry=REGISTRY)
REPORTS_ACCEPTED = Counter("netskel_reports_accepted_total", "Report items accepted", ["kind"],
                           registry=REGISTRY)
REPORTS_REJECTED = Counter("netskel_reports_rejected_total", "Report items rejected", ["kind"],
                           registry=REGISTRY)
FEED_DROPPED = Counter("netskel_feed_dropped_total", "Report events dropped for a slow analyzer",
                       registry=REGISTRY)
STREAM_OVERFLOWS = Counter("netskel_stream_overflows_total",
                           "Streams whose client fell too far behind: a ping list resent whole "
                           "or a report feed cut off", ["stream"], registry=REGISTRY)
# Every kind's and stream's series exist from the start at 0, so rate() and
# increase() count a first burst of rejections (a series born at 5 loses
# them) and alerts on them have a series to read.
for _kind in ("window", "counter", "vswitch"):
    REPORTS_ACCEPTED.labels(kind=_kind)
    REPORTS_REJECTED.labels(kind=_kind)
for _stream in ("pinglist", "reports"):
    STREAM_OVERFLOWS.labels(stream=_stream)
INFERENCE_SECONDS = Histogram("netskel_inference_seconds", "Time to infer one job's skeleton",
                              registry=REGISTRY)
