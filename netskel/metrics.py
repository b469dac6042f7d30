"""What every role's metrics share: a registry of its own that also
carries the process's figures (CPU, memory, file descriptors, Python
collections), and the HTTP endpoint that serves it.

Each role keeps its metrics in its own module and registry
(controller/metrics.py, analyzer/metrics.py, probe_agent/metrics.py), so a
process exports what it does and nothing another role would: an operator
never reads a controller's idle probe counters as "no probes sent"."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
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
