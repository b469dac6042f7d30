"""Every Prometheus metric netskel exports, in one place.

Label sets are bounded: size classes, protocols, report kinds, and the
agent's own endpoints (a handful per container) — never a probe pair."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# controller
AGENTS_REGISTERED = Gauge("netskel_agents_registered", "Containers with a registered agent")
PINGLIST_TARGETS = Gauge("netskel_pinglist_targets", "Targets across all ping lists")
PINGLIST_ACTIVE = Gauge("netskel_pinglist_active_targets", "Targets whose agent is ready")
REPORTS_ACCEPTED = Counter("netskel_reports_accepted_total", "Report items accepted", ["kind"])
REPORTS_REJECTED = Counter("netskel_reports_rejected_total", "Report items rejected", ["kind"])
FEED_DROPPED = Counter("netskel_feed_dropped_total", "Report events dropped for a slow analyzer")
STREAM_OVERFLOWS = Counter("netskel_stream_overflows_total",
                           "Streams whose client fell too far behind: a ping list resent whole, "
                           "a report feed or incident watch cut off", ["stream"])

# agent
VSWITCH_DUMP_FAILURES = Counter("netskel_agent_vswitch_dump_failures_total",
                                "Virtual-switch table dumps that failed (the last good one stays)")
VSWITCH_LINES_NOT_UNDERSTOOD = Gauge("netskel_agent_vswitch_lines_not_understood",
                                     "Lines of the last virtual-switch dump read as unknowns")
ROUTE_TRACES = Counter("netskel_agent_route_traces_total",
                       "Underlay route traces by outcome: named (every hop a known switch), "
                       "partial (a hop silent or unknown), failed", ["outcome"])
PROBES_SENT = Counter("netskel_probes_sent_total", "Probes sent", ["proto", "size"])
PROBES_LOST = Counter("netskel_probes_lost_total", "Probes without a reply in time",
                      ["proto", "size"])
PROBE_RTT = Histogram("netskel_probe_rtt_microseconds", "Probe round-trip time", ["src"],
                      buckets=(5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000))
PROBES_ANSWERED = Counter("netskel_probes_answered_total", "Probes echoed by the responder")
PROBE_STAMPS = Counter("netskel_probe_timestamps_total",
                       "Probe RTTs by the clock of their send and receive stamps "
                       "(hardware, kernel or user)", ["clock"])
PROBES_REFUSED = Counter("netskel_probes_refused_total",
                         "Datagrams the responder did not answer", ["reason"])
CONTROLLER_RECONNECTS = Counter("netskel_controller_reconnects_total",
                                "Times the agent reconnected to the controller")

# analyzer
INCIDENTS_OPEN = Gauge("netskel_incidents_open", "Incidents without an end")
WINDOWS_ANALYZED = Counter("netskel_windows_analyzed_total", "Pair windows analysed")
ANALYSIS_SECONDS = Histogram("netskel_analysis_seconds", "Time to analyse one batch of windows")
INFERENCE_SECONDS = Histogram("netskel_inference_seconds", "Time to infer one job's skeleton")
