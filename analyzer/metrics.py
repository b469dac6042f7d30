"""The analyzer's Prometheus metrics, in its own registry: an analyzer
process exports these and its process figures, nothing of other roles.

Label sets are bounded: stream names, never a probe pair."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from netskel.metrics import process_registry

REGISTRY: CollectorRegistry = process_registry()

INCIDENTS_OPEN = Gauge("netskel_incidents_open", "Incidents without an end", registry=REGISTRY)
WINDOWS_ANALYZED = Counter("netskel_windows_analyzed_total", "Pair windows analysed",
                           registry=REGISTRY)
ANALYSIS_SECONDS = Histogram("netskel_analysis_seconds", "Time to analyse one batch of windows",
                             registry=REGISTRY)
STREAM_OVERFLOWS = Counter("netskel_stream_overflows_total",
                           "Incident watches whose client fell too far behind and were cut off",
                           ["stream"], registry=REGISTRY)
