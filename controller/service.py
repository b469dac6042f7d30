"""gRPC servicer for agents and the analyzer feed: decode, call the state,
encode. No logic of its own."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Iterator

import grpc

from controller.state import ControllerState, ListUpdate, ReportEvent
from netskel import serde
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.errors import NotFoundError
from netskel.grpcserver import map_errors, map_errors_stream
from netskel.model import AgentState, VSwitchDump

log = logging.getLogger(__name__)
POLL_S = 0.5  # how often a blocked stream notices its client went away


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(self, state: ControllerState, heartbeat_interval_ms: int, window_seconds: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.window_seconds = window_seconds
        self.clock = clock

    @map_errors
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext
                 ) -> pb.RegisterResponse:
        self.state.register(serde.registration_from_pb(request), self.clock())
        log.info("registered %s (%d endpoints)", request.container, len(request.endpoints))
        return pb.RegisterResponse(heartbeat_interval_ms=self.heartbeat_interval_ms,
                                   window_seconds=self.window_seconds)

    @map_errors
    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
                  ) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(known=self.state.heartbeat(request.container, request.ready,
                                                               self.clock()))

    @map_errors
    def Deregister(self, request: pb.DeregisterRequest, context: grpc.ServicerContext
                   ) -> pb.DeregisterResponse:
        self.state.deregister(request.container, self.clock())
        return pb.DeregisterResponse()

    @map_errors_stream
    def WatchPingList(self, request: pb.WatchPingListRequest, context: grpc.ServicerContext
                      ) -> Iterator[pb.PingListUpdate]:
        q, snapshot = self.state.subscribe_list(request.container)
        try:
            yield serde.list_update_to_pb(snapshot)
            while context.is_active():
                try:
                    update: ListUpdate = q.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                yield serde.list_update_to_pb(update)
        finally:
            self.state.unsubscribe_list(request.container, q)

    def Report(self, request_iterator: Iterator[pb.AgentReport], context: grpc.ServicerContext
               ) -> pb.ReportAck:
        accepted = rejected = 0
        for report in request_iterator:
            try:
                kind = report.WhichOneof("body")
                if kind == "windows":
                    a, r = self.state.accept_windows(
                        report.container, [serde.window_from_pb(w) for w in report.windows.windows])
                elif kind == "vswitch":
                    a, r = self.state.accept_vswitch(report.container,
                                                     serde.vswitch_from_pb(report.vswitch))
                elif kind == "counters":
                    a, r = self.state.accept_counters(
                        report.container,
                        [serde.counter_from_pb(s) for s in report.counters.samples])
                else:
                    a, r = 0, 1
            except NotFoundError as e:
                context.abort(grpc.StatusCode.NOT_FOUND, str(e))
            accepted += a
            rejected += r
        return pb.ReportAck(accepted=accepted, rejected=rejected)

    def WatchReports(self, request: pb.WatchReportsRequest, context: grpc.ServicerContext
                     ) -> Iterator[pb.ReportEvent]:
        q = self.state.subscribe_feed(self.clock())
        try:
            while context.is_active():
                try:
                    event: ReportEvent = q.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if isinstance(event, AgentState):
                    yield pb.ReportEvent(agent=serde.agent_state_to_pb(event))
                elif isinstance(event, VSwitchDump):
                    yield pb.ReportEvent(vswitch=serde.vswitch_to_pb(event))
                else:
                    yield pb.ReportEvent(windows=pb.WindowBatch(
                        windows=[serde.window_to_pb(w) for w in event]))
        finally:
            self.state.unsubscribe_feed(q)
