"""gRPC servicer for agents and the analyzer feed: decode, call the state,
encode. No logic of its own."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from analyzer.batch import WindowBatch
from controller import metrics
from controller.state import ControllerState, ListUpdate, ReportEvent
from netskel import serde
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.errors import InputError, NotFoundError
from netskel.grpcserver import Mailbox, Overflow, blocking, map_errors, map_errors_stream
from netskel.model import AgentState, VSwitchDump
from netskel.security import ANALYZER, OPERATOR, Guard

log = logging.getLogger(__name__)
Ctx = grpc.aio.ServicerContext[Any, Any]
# How often an idle stream wakes to check its client: rarely, since a client
# that cancels or vanishes cancels the handler at once (grpc.aio); at 32K
# streams a 5 s poll was 6,500 wake-ups a second.
POLL_S = 60.0
LIST_QUEUE = 256  # list updates an agent may fall behind before it is resynced
DEFAULT_CHECK_S = 3.0  # active check: probing time when the caller names none
MAX_CHECK_S = 30.0
CHECK_SLACK_S = 9.0    # beyond the probing time: probe timeout, route traces, reporting
CHECK_RATE_HZ = 50.0   # probes per second per target during a check
FEED_EVENT_WINDOWS = 8192  # windows (and as many route entries) per report-feed event, at most


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(self, state: ControllerState, heartbeat_interval_ms: int, window_seconds: int,
                 clock: Callable[[], float] = time.time,
                 switch_addresses: dict[str, str] | None = None,
                 guard: Guard | None = None) -> None:
        self.state = state
        self.guard = guard or Guard()
        self.switch_addresses = dict(switch_addresses or {})
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.window_seconds = window_seconds
        self.clock = clock

    @map_errors
    async def Register(self, request: pb.RegisterRequest, context: Ctx) -> pb.RegisterResponse:
        await self.guard.agent(context, request.container)
        await blocking(self.state.register, serde.registration_from_pb(request), self.clock())
        log.info("registered %s (%d endpoints)", request.container, len(request.endpoints))
        return pb.RegisterResponse(heartbeat_interval_ms=self.heartbeat_interval_ms,
                                   window_seconds=self.window_seconds,
                                   switch_addresses=self.switch_addresses)

    @map_errors
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Ctx) -> pb.HeartbeatResponse:
        await self.guard.agent(context, request.container)
        known = await blocking(self.state.heartbeat, request.container, request.ready,
                               self.clock())
        return pb.HeartbeatResponse(known=known)

    @map_errors
    async def Deregister(self, request: pb.DeregisterRequest, context: Ctx
                         ) -> pb.DeregisterResponse:
        await self.guard.agent(context, request.container)
        await blocking(self.state.deregister, request.container, self.clock())
        return pb.DeregisterResponse()

    @map_errors_stream
    async def WatchPingList(self, request: pb.WatchPingListRequest, context: Ctx
                            ) -> AsyncIterator[pb.PingListUpdate]:
        await self.guard.agent(context, request.container)
        box: Mailbox[ListUpdate] = Mailbox(asyncio.get_running_loop(), LIST_QUEUE)
        snapshot = await blocking(self.state.subscribe_list, request.container, box)
        try:
            yield serde.list_update_to_pb(snapshot)
            while not context.done():
                try:
                    update = await box.get(POLL_S)
                except Overflow:  # the agent fell behind: it gets the whole list again
                    metrics.STREAM_OVERFLOWS.labels(stream="pinglist").inc()
                    update = await blocking(self.state.resync_list, request.container, box.reset)
                if update is not None:
                    yield serde.list_update_to_pb(update)
        finally:
            box.close()
            await blocking(self.state.unsubscribe_list, request.container, box)

    async def Report(self, request_iterator: AsyncIterator[pb.AgentReport], context: Ctx
                     ) -> pb.ReportAck:
        accepted = rejected = 0
        checked = ""
        async for report in request_iterator:
            if report.container != checked:  # one agent per stream: checked once
                await self.guard.agent(context, report.container)
                checked = report.container
            try:
                a, r = await blocking(self._accept, report)
            except NotFoundError as e:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
            accepted += a
            rejected += r
        return pb.ReportAck(accepted=accepted, rejected=rejected)

    def _accept(self, report: pb.AgentReport) -> tuple[int, int]:
        kind = report.WhichOneof("body")
        if kind == "windows":
            try:
                windows = serde.window_batch_from_pb(report.windows)
            except InputError as e:  # columns that do not fit: the report, not the stream
                log.warning("report from %s rejected: %s", report.container, e)
                metrics.REPORTS_REJECTED.labels(kind="window").inc()
                return 0, 1
            return self.state.accept_windows(report.container, windows)
        if kind == "vswitch":
            return self.state.accept_vswitch(report.container,
                                             serde.vswitch_from_pb(report.vswitch))
        if kind == "check":
            return self.state.accept_check(report.container, report.check.id,
                                           [serde.window_from_pb(w) for w in report.check.windows])
        if kind == "counters":
            return self.state.accept_counters(
                report.container, [serde.counter_from_pb(s) for s in report.counters.samples])
        return 0, 1

    @map_errors
    async def ActiveCheck(self, request: pb.ActiveCheckRequest, context: Ctx
                          ) -> pb.ActiveCheckResponse:
        await self.guard.role(context, ANALYZER, OPERATOR)
        duration = request.duration_s or DEFAULT_CHECK_S
        if not 0 < duration <= MAX_CHECK_S:
            raise InputError(f"ActiveCheck: duration_s must be in (0, {MAX_CHECK_S}]")
        timeout = request.timeout_s or duration + CHECK_SLACK_S
        check_id, unchecked = await blocking(
            self.state.start_check, [(p.a, p.b) for p in request.pairs], duration, CHECK_RATE_HZ)
        windows, silent, missing = await blocking(self.state.wait_check, check_id, timeout)
        if silent:
            log.warning("check %s: no results from %s", check_id, ", ".join(silent))
        for (a, b), why in missing:
            log.warning("check %s: %s - %s not checked: %s", check_id, a, b, why)
        return pb.ActiveCheckResponse(
            windows=[serde.window_to_pb(w) for w in windows],
            unchecked=[pb.UncheckedPair(pair=cpb.EndpointPair(a=a, b=b), reason=why)
                       for (a, b), why in unchecked + missing])

    async def WatchReports(self, request: pb.WatchReportsRequest, context: Ctx
                           ) -> AsyncIterator[pb.ReportEvent]:
        await self.guard.role(context, ANALYZER, OPERATOR)
        box: Mailbox[ReportEvent] = Mailbox(asyncio.get_running_loop(), self.state.feed_queue)
        await blocking(self.state.subscribe_feed, self.clock(), box)
        try:
            while not context.done():
                try:
                    event = await box.get(POLL_S)
                except Overflow:  # cut off, counted: it reconnects and starts afresh
                    metrics.STREAM_OVERFLOWS.labels(stream="reports").inc()
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        f"fell {box.maxsize} events behind; reconnect")
                    return
                if event is None:
                    continue
                if isinstance(event, AgentState):
                    yield pb.ReportEvent(agent=serde.agent_state_to_pb(event))
                elif isinstance(event, VSwitchDump):
                    yield pb.ReportEvent(vswitch=serde.vswitch_to_pb(event))
                else:
                    yield pb.ReportEvent(windows=serde.window_batch_to_pb(_coalesce(event, box)))
        finally:
            box.close()
            await blocking(self.state.unsubscribe_feed, box)


def _coalesce(first: WindowBatch, box: Mailbox[ReportEvent]) -> WindowBatch:
    """`first` and the window batches queued right behind it, as one event:
    an analyzer that has fallen behind (every agent reports at once, after
    each window) catches up with one decode for many agents' reports, not
    one each. Agent and vswitch events keep their place in the feed; the
    event stays far inside the message size limit (~150 bytes a window,
    ~20 a route entry: ~1.4 MB at the bound)."""
    room = [FEED_EVENT_WINDOWS - len(first), FEED_EVENT_WINDOWS - len(first.r_route)]

    def fits(e: ReportEvent) -> bool:
        if not isinstance(e, WindowBatch) or len(e) > room[0] or len(e.r_route) > room[1]:
            return False
        room[0] -= len(e)
        room[1] -= len(e.r_route)
        return True
    more = [e for e in box.take_while(fits) if isinstance(e, WindowBatch)]
    return WindowBatch.concat([first, *more]) if more else first
