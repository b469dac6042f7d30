"""The analyzer's Prometheus metrics, in its own registry: an analyzer
process exports these and its process figures, nothing of other roles.

Label sets are bounded: stream names, layers, and the open incidents'
components (a handful at a time, at most the fabric's), never a probe pair."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from netskel.metrics import config_gauges, process_registry
from netskel.model import LAYERS, Incident, as_likely

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


class OpenIncidents(Collector):
    """One series per open incident, its value the incident's confidence and
    its labels what it blames: an alert then names the link, switch, NIC,
    rule, host or agent in its own text, one alert per fault, and resolves
    when the incident closes. The engine hands over the open set after each
    tick; a scrape reads the last one whole."""

    LABELS = ("incident", "layer", "symptom", "component_type", "component", "as_likely")

    def __init__(self, registry: CollectorRegistry) -> None:
        self._rows: tuple[tuple[tuple[str, ...], float], ...] = ()
        registry.register(self)

    def set(self, open_now: Iterable[Incident]) -> None:
        self._rows = tuple(((i.id, i.layer, i.symptom, i.component.type, i.component.id,
                             ",".join(as_likely(i.evidence))), i.confidence) for i in open_now)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "netskel_incident_open",
            "Each open incident, valued at its confidence; `as_likely`: components the "
            "probes cannot tell from the one named", labels=self.LABELS)
        for labels, value in self._rows:
            family.add_metric(labels, value)
        yield family


OPEN_INCIDENTS = OpenIncidents(REGISTRY)
