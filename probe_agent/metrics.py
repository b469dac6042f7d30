"""The probe agent's Prometheus metrics, in its own registry: a sidecar
exports these and its process figures, nothing of other roles.

Label sets are bounded: size classes, protocols, clocks, outcomes and the
agent's own endpoints (a handful per container), never a probe pair."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from netskel.metrics import process_registry

REGISTRY: CollectorRegistry = process_registry()

VSWITCH_DUMP_FAILURES = Counter("netskel_agent_vswitch_dump_failures_total",
                                "Virtual-switch table dumps that failed (the last good one stays)",
                                registry=REGISTRY)
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
PROBE_RTT = Histogram("netskel_probe_rtt_microseconds", "Probe round-trip time", ["src"],
                      buckets=(5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000),
                      registry=REGISTRY)
PROBES_ANSWERED = Counter("netskel_probes_answered_total", "Probes echoed by the responder",
                          registry=REGISTRY)
PROBE_STAMPS = Counter("netskel_probe_timestamps_total",
                       "Probe RTTs by the clock of their send and receive stamps "
                       "(hardware, kernel or user)", ["clock"], registry=REGISTRY)
PROBES_REFUSED = Counter("netskel_probes_refused_total",
                         "Datagrams the responder did not answer", ["reason"], registry=REGISTRY)
CONTROLLER_RECONNECTS = Counter("netskel_controller_reconnects_total",
                                "Times the agent reconnected to the controller", registry=REGISTRY)
