"""Server plumbing shared by the controller and the analyzer: health
checking, reflection, error mapping."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from netskel.errors import InputError, NotFoundError, UnavailableError

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def map_errors(fn: F) -> F:
    """Turn domain errors into status codes; the servicer stays thin."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except InputError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except NotFoundError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except UnavailableError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    return wrapper  # type: ignore[return-value]


def map_errors_stream(fn: F) -> F:
    """map_errors for server-streaming handlers (generators)."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            yield from fn(self, request, context)
        except InputError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except NotFoundError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except UnavailableError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    return wrapper  # type: ignore[return-value]


def make_server(service_names: Iterable[str], add_servicers: Callable[[grpc.Server], None],
                addresses: Iterable[str], max_workers: int = 64
                ) -> tuple[grpc.Server, list[int], health.HealthServicer]:
    """A started server on every address (`host:0` picks a port); returns the
    bound ports in order."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers,
                                                    thread_name_prefix="grpc"),
                         options=[("grpc.so_reuseport", 0)])
    add_servicers(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(service_names)
    for name in names:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*names, reflection.SERVICE_NAME, health.SERVICE_NAME],
                                        server)
    ports = []
    for addr in addresses:
        port = server.add_insecure_port(addr)
        if port == 0 and not addr.startswith("unix:"):
            raise OSError(f"cannot listen on {addr}")
        ports.append(port)
    server.start()
    return server, ports, health_servicer
