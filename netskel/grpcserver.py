"""Server plumbing shared by the controller and the analyzer: an asyncio
gRPC server on its own event-loop thread (a stream costs a coroutine, not
a thread: with a thread pool, 32 agents' streams used to lock the
controller), health checking, reflection, keepalive enforcement, message
limits, error mapping, and `Mailbox`, the bounded hand-off from the
domain's threads to a stream.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AioHealthServicer
from grpc_reflection.v1alpha import reflection

from netskel.errors import InputError, NotFoundError, UnavailableError

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
STOP_SLACK_S = 3.0  # beyond a stop's grace before it is given up
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Keepalive: ping idle connections, drop dead ones, refuse clients that
    # ping more often than every 10 s (two strikes).
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]


async def _abort(context: grpc.aio.ServicerContext[Any, Any], e: Exception) -> None:
    code = (grpc.StatusCode.INVALID_ARGUMENT if isinstance(e, InputError) else
            grpc.StatusCode.NOT_FOUND if isinstance(e, NotFoundError) else
            grpc.StatusCode.UNAVAILABLE)
    await context.abort(code, str(e))


def map_errors(fn: F) -> F:
    """Turn domain errors into status codes; the servicer stays thin."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await fn(self, request, context)
        except (InputError, NotFoundError, UnavailableError) as e:
            await _abort(context, e)

    return wrapper  # type: ignore[return-value]


def map_errors_stream(fn: F) -> F:
    """map_errors for server-streaming handlers (async generators)."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
                      ) -> AsyncIterator[Any]:
        try:
            async for item in fn(self, request, context):
                yield item
        except (InputError, NotFoundError, UnavailableError) as e:
            await _abort(context, e)

    return wrapper  # type: ignore[return-value]


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Domain calls take locks other threads hold: never on the event loop."""
    return await asyncio.to_thread(fn, *args)


class Overflow(Exception):
    """The consumer fell `maxsize` items behind; what was queued is gone."""


class Mailbox(Generic[T]):
    """Bounded hand-off from any thread to one coroutine. A consumer that
    falls behind is not waited for: the mailbox empties itself and the next
    `get` raises Overflow, so the stream resyncs or ends — never a silent
    drop, never unbounded memory."""

    def __init__(self, loop: asyncio.AbstractEventLoop, maxsize: int) -> None:
        self._loop = loop
        self.maxsize = maxsize
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self.overflowed = False
        self.closed = False

    def offer(self, item: T) -> bool:
        with self._lock:
            if self.overflowed or self.closed:
                return False
            if len(self._items) >= self.maxsize:
                self._items.clear()
                self.overflowed = True
            else:
                self._items.append(item)
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the server's loop has stopped
            pass
        return not self.overflowed

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def reset(self) -> None:
        """After a resync: accept again."""
        with self._lock:
            self.overflowed = False
            self._items.clear()

    def take_while(self, fits: Callable[[T], bool]) -> list[T]:
        """The items queued now, from the front, while `fits` accepts the
        next (it may count what it accepted); never waits."""
        out: list[T] = []
        with self._lock:
            while self._items and not self.overflowed and fits(self._items[0]):
                out.append(self._items.popleft())
        return out

    async def get(self, timeout: float) -> T | None:
        """The next item; None after `timeout` seconds without one."""
        while True:
            with self._lock:
                if self.overflowed:
                    raise Overflow()
                if self._items:
                    return self._items.popleft()
                self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return None


@dataclass
class _Stopped:
    def wait(self, timeout: float | None = None) -> bool:
        return True


class AioServer:
    """A grpc.aio server on its own thread; start and stop from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-aio",
                                        daemon=True)
        self._thread.start()
        self.server: grpc.aio.Server = self.run(self._make())

    async def _make(self) -> grpc.aio.Server:
        return grpc.aio.server(options=SERVER_OPTIONS)

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        """`coro` on the server's loop; raises concurrent.futures.TimeoutError
        past `timeout`."""
        return asyncio.run_coroutine_threadsafe(
            coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def stop(self, grace: float | None = None) -> _Stopped:
        """Stops within `grace` plus STOP_SLACK_S: grpc's own stop can hang
        while RPCs are in flight (grpc/grpc#40834); the loop's thread is a
        daemon, so the process can still exit."""
        if self._thread.is_alive():
            within = (grace or 0.0) + STOP_SLACK_S
            try:
                self.run(self.server.stop(grace), within)
            except concurrent.futures.TimeoutError:
                log.warning("grpc server did not stop within %.1f s; leaving it", within)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(timeout=STOP_SLACK_S)
        return _Stopped()


def make_server(service_names: Iterable[str], add_servicers: Callable[[grpc.aio.Server], None],
                addresses: Iterable[str], credentials: grpc.ServerCredentials | None = None
                ) -> tuple[AioServer, list[int], Any]:
    """A started server on every address (`host:0` picks a port), TLS when
    `credentials` are given; returns the bound ports in order."""
    srv = AioServer()
    server = srv.server
    add_servicers(server)
    health_servicer = AioHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(service_names)
    for name in [*names, ""]:
        srv.run(health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING))
    reflection.enable_server_reflection([*names, reflection.SERVICE_NAME, health.SERVICE_NAME],
                                        server)
    ports = []
    try:
        for addr in addresses:
            try:
                port = (server.add_secure_port(addr, credentials) if credentials is not None
                        else server.add_insecure_port(addr))
            except RuntimeError:  # grpc's "Failed to bind": in use, or no such address here
                port = 0
            if port == 0 and not addr.startswith("unix:"):
                raise InputError(f"listen '{addr}': cannot listen there (the port is in use, "
                                 "or the address is not this machine's)")
            ports.append(port)
        srv.run(server.start())
    except BaseException:
        srv.stop(0)
        raise
    return srv, ports, health_servicer
