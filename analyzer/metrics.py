"""The analyzer's Prometheus metrics, in its own registry: an analyzer
process exports these and its process figures, nothing of other roles.

Label sets are bounded: stream names and layers, never a probe pair."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from netskel.metrics import config_gauges, process_registry
from netskel.model import LAYERS

REGISTRY: CollectorRegistry = process_registry()
CONFIG = config_gauges(REGISTRY)

# One series per layer, each always present (0 when none is open), so an
# alert on `netskel_incidents_open{layer="underlay"} > 0` never reads an
# absent series; the layers are the contract's six.
INCIDENTS_OPEN = Gauge("netskel_incidents_open", "Incidents without an end, by layer", ["layer"],
                       registry=REGISTRY)
for _layer in LAYERS:
    INCIDENTS_OPEN.labels(layer=_layer)
WINDOWS_ANALYZED = Counter("netskel_windows_analyzed_total", "Pair windows analysed",
                           registry=REGISTRY)
ANALYSIS_SECONDS = Histogram("netskel_analysis_seconds", "Time to analyse one batch of windows",
                             registry=REGISTRY)
STREAM_OVERFLOWS = Counter("netskel_stream_overflows_total",
                           "Incident watches whose client fell too far behind and were cut off",
                           ["stream"], registry=REGISTRY)
STREAM_OVERFLOWS.labels(stream="incidents")  # at 0 from the start, as the controller's
