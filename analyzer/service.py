"""NetDiag servicer: decode, ask the analyzer, encode."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from analyzer.engine import Analyzer
from analyzer.localize import Pair
from netskel import serde
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.errors import UnavailableError
from netskel.grpcserver import map_errors
from netskel.model import Incident, WindowStats

POLL_S = 0.5


class IncidentHub:
    """Fans incident changes out to WatchIncidents streams."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: list[queue.Queue[Incident]] = []

    def publish(self, incidents: list[Incident]) -> None:
        with self._lock:
            for q in self._subs:
                for i in incidents:
                    q.put(i)

    def subscribe(self) -> queue.Queue[Incident]:
        q: queue.Queue[Incident] = queue.Queue()
        with self._lock:
            self._subs.append(q)
        return q

    def unsubscribe(self, q: queue.Queue[Incident]) -> None:
        with self._lock:
            if q in self._subs:
                self._subs.remove(q)


# Runs an active check through the controller: (pairs, probing seconds) ->
# (windows measured, {pair: why it was not checked}).
CheckRunner = Callable[[list[Pair], float], tuple[list[WindowStats], dict[Pair, str]]]


def _no_checks(pairs: list[Pair], seconds: float) -> tuple[list[WindowStats], dict[Pair, str]]:
    raise UnavailableError("active checks need the controller; this analyzer has none")


class NetDiagService(dpb_grpc.NetDiagServicer):
    def __init__(self, engine: Analyzer, lock: threading.Lock, hub: IncidentHub,
                 clock: Callable[[], float] = time.time,
                 run_check: CheckRunner = _no_checks) -> None:
        self.run_check = run_check
        self.engine = engine
        self.lock = lock
        self.hub = hub
        self.clock = clock

    @map_errors
    def Diagnose(self, request: dpb.DiagnoseRequest, context: grpc.ServicerContext
                 ) -> dpb.DiagnoseResponse:
        endpoints, pairs = list(request.endpoints), serde.pairs_from_pb(request.pairs)
        if request.active_check:
            with self.lock:
                checked = self.engine.check_pairs(endpoints, pairs)
            # Outside the lock: the check takes seconds, analysis goes on.
            windows, unchecked = self.run_check(checked, request.check_seconds)
        with self.lock:
            d = self.engine.diagnose(endpoints, pairs, request.start, request.end, self.clock())
            if request.active_check:
                d = self.engine.with_check(d, self.engine.judge_check(windows, self.clock()),
                                           unchecked)
        return dpb.DiagnoseResponse(
            verdict=serde.VERDICTS[d.verdict],
            incidents=[serde.incident_to_pb(i) for i in d.incidents],
            check_findings=[serde.incident_to_pb(i) for i in d.check_findings],
            pairs=[dpb.PairVerdict(pair=cpb.EndpointPair(a=v.pair[0], b=v.pair[1]),
                                   verdict=serde.VERDICTS[v.verdict], reason=v.reason,
                                   route_from=v.route_from, route=v.route)
                   for v in d.pairs])

    @map_errors
    def PairHistory(self, request: dpb.PairHistoryRequest, context: grpc.ServicerContext
                    ) -> dpb.PairHistoryResponse:
        a, b = request.pair.a, request.pair.b
        with self.lock:
            self.engine.require_known((a, b), "PairHistory")
            points = self.engine.history.points((a, b), request.since)
        return dpb.PairHistoryResponse(points=[
            dpb.HistoryPoint(window_start=p.start, size=p.size, rtt_median=p.median_us,
                             rtt_p75=p.p75_us, sent=p.sent, lost=p.lost, src=p.src)
            for p in points])

    @map_errors
    def ListIncidents(self, request: dpb.ListIncidentsRequest, context: grpc.ServicerContext
                      ) -> dpb.ListIncidentsResponse:
        with self.lock:
            found = self.engine.list_incidents(request.open_only, request.since)
            return dpb.ListIncidentsResponse(incidents=[serde.incident_to_pb(i) for i in found])

    def WatchIncidents(self, request: dpb.WatchIncidentsRequest, context: grpc.ServicerContext
                       ) -> Iterator[cpb.Incident]:
        q = self.hub.subscribe()
        try:
            while context.is_active():
                try:
                    inc = q.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                yield serde.incident_to_pb(inc)
        finally:
            self.hub.unsubscribe(q)
