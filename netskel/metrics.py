"""What every role's metrics share: a registry of its own that also
carries the process's figures (CPU, memory, file descriptors, Python
collections), and the HTTP endpoint that serves it.

Each role keeps its metrics in its own module and registry
(controller/metrics.py, analyzer/metrics.py, probe_agent/metrics.py), so a
process exports what it does and nothing another role would: an operator
never reads a controller's idle probe counters as "no probes sent"."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

from netskel.errors import InputError


def process_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def serve(port: int, addr: str, registry: CollectorRegistry) -> None:
    """/metrics of `registry` on addr:port (0: not served)."""
    if port:
        try:
            start_http_server(port, addr=addr, registry=registry)
        except OSError as e:
            raise InputError(f"metrics port {addr}:{port}: {e.strerror or e}") from None


@dataclass(frozen=True)
class ConfigGauges:
    """Whether the role's last read of its settings succeeded, and when one
    last did: the pair Prometheus and Alertmanager export for their own
    files, so one alert (`netskel_config_last_reload_successful == 0`)
    covers every role. The read at start counts: a role runs only if it
    succeeded."""

    successful: Gauge
    success_time: Gauge

    def read(self, ok: bool) -> None:
        self.successful.set(1 if ok else 0)
        if ok:
            self.success_time.set_to_current_time()


def config_gauges(registry: CollectorRegistry) -> ConfigGauges:
    return ConfigGauges(
        Gauge("netskel_config_last_reload_successful",
              "1 if the last read of the settings (at start, or --config on SIGHUP) succeeded",
              registry=registry),
        Gauge("netskel_config_last_reload_success_timestamp_seconds",
              "When the settings were last read successfully", registry=registry))
