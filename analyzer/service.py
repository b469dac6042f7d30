"""NetDiag servicer: decode, ask the analyzer, encode."""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from analyzer import metrics
from analyzer.engine import Analyzer
from analyzer.localize import Pair
from analyzer.verdicts import with_check
from netskel import serde
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.errors import InputError, UnavailableError
from netskel.grpcserver import Mailbox, Overflow, blocking, map_errors
from netskel.model import Incident, WindowStats
from netskel.security import Guard

Ctx = grpc.aio.ServicerContext[Any, Any]
# How often an idle stream wakes to check its client: rarely, since a client
# that cancels or vanishes cancels the handler at once (grpc.aio); at 32K
# streams a 5 s poll was 6,500 wake-ups a second.
POLL_S = 60.0
WATCH_QUEUE = 10_000   # incident changes a watcher may fall behind before it is cut off
MAX_DIAGNOSE_ITEMS = 100_000  # endpoints + pairs in one Diagnose


class IncidentHub:
    """Fans incident changes out to WatchIncidents streams, each bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: list[Mailbox[Incident]] = []

    def publish(self, incidents: list[Incident]) -> None:
        with self._lock:
            for box in self._subs:
                for i in incidents:
                    box.offer(i)

    def subscribe(self, box: Mailbox[Incident]) -> None:
        with self._lock:
            self._subs.append(box)

    def unsubscribe(self, box: Mailbox[Incident]) -> None:
        with self._lock:
            if box in self._subs:
                self._subs.remove(box)


# Runs an active check through the controller: (pairs, probing seconds) ->
# (windows measured, {pair: why it was not checked}).
CheckRunner = Callable[[list[Pair], float], tuple[list[WindowStats], dict[Pair, str]]]


def _no_checks(pairs: list[Pair], seconds: float) -> tuple[list[WindowStats], dict[Pair, str]]:
    raise UnavailableError("active checks need the controller; this analyzer has none")


PAGE_SIZE = 1000
MAX_PAGE_SIZE = 5000


def encode_page_token(last: Incident) -> str:
    """Where the next page starts: after this incident in (start, id) order.
    A position, not an offset, so incidents opened meanwhile shift nothing."""
    raw = json.dumps([last.start, last.id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_page_token(token: str) -> tuple[float, str] | None:
    if not token:
        return None
    try:
        start, ident = json.loads(base64.urlsafe_b64decode(token.encode()))
        return float(start), str(ident)
    except (ValueError, TypeError, binascii.Error):
        raise InputError("ListIncidents: page_token is not one this server gave") from None


def incident_page(ordered: list[Incident], size: int, after: tuple[float, str] | None
                  ) -> tuple[list[Incident], bool]:
    """The `size` incidents after `after` in (start, id) order, and whether more follow."""
    lo = 0 if after is None else bisect.bisect_right([(i.start, i.id) for i in ordered], after)
    return ordered[lo:lo + size], lo + size < len(ordered)


class NetDiagService(dpb_grpc.NetDiagServicer):
    def __init__(self, engine: Analyzer, lock: threading.Lock, hub: IncidentHub,
                 clock: Callable[[], float] = time.time,
                 run_check: CheckRunner = _no_checks, guard: Guard | None = None) -> None:
        self.run_check = run_check
        self.guard = guard or Guard()
        self.engine = engine
        self.lock = lock
        self.hub = hub
        self.clock = clock

    @map_errors
    async def Diagnose(self, request: dpb.DiagnoseRequest, context: Ctx
                       ) -> dpb.DiagnoseResponse:
        await self.guard.reader(context)
        return await blocking(self._diagnose, request)

    def _diagnose(self, request: dpb.DiagnoseRequest) -> dpb.DiagnoseResponse:
        endpoints, pairs = list(request.endpoints), serde.pairs_from_pb(request.pairs)
        if len(endpoints) + len(pairs) > MAX_DIAGNOSE_ITEMS:
            raise InputError(f"Diagnose: at most {MAX_DIAGNOSE_ITEMS} endpoints and pairs per "
                             f"call, got {len(endpoints) + len(pairs)}")
        if request.active_check:
            with self.lock:
                checked = self.engine.check_pairs(endpoints, pairs)
            # Outside the lock: the check takes seconds, analysis goes on.
            windows, unchecked = self.run_check(checked, request.check_seconds)
        with self.lock:
            d = self.engine.diagnose(endpoints, pairs, request.start, request.end, self.clock())
            if request.active_check:
                d = with_check(d, self.engine.judge_check(windows, self.clock()),
                               unchecked, set(checked))
        return dpb.DiagnoseResponse(
            verdict=serde.VERDICTS[d.verdict],
            incidents=[serde.incident_to_pb(i) for i in d.incidents],
            check_findings=[serde.incident_to_pb(i) for i in d.check_findings],
            pairs=[dpb.PairVerdict(pair=cpb.EndpointPair(a=v.pair[0], b=v.pair[1]),
                                   verdict=serde.VERDICTS[v.verdict], reason=v.reason,
                                   route_from=v.route_from, route=v.route)
                   for v in d.pairs])

    @map_errors
    async def PairHistory(self, request: dpb.PairHistoryRequest, context: Ctx
                          ) -> dpb.PairHistoryResponse:
        await self.guard.reader(context)
        return await blocking(self._pair_history, request)

    def _pair_history(self, request: dpb.PairHistoryRequest) -> dpb.PairHistoryResponse:
        a, b = request.pair.a, request.pair.b
        with self.lock:
            self.engine.require_known((a, b), "PairHistory")
            points = self.engine.history.points((a, b), request.since)
        return dpb.PairHistoryResponse(points=[
            dpb.HistoryPoint(window_start=p.start, size=p.size, rtt_median=p.median_us,
                             rtt_p75=p.p75_us, sent=p.sent, lost=p.lost, src=p.src)
            for p in points])

    @map_errors
    async def ListIncidents(self, request: dpb.ListIncidentsRequest, context: Ctx
                            ) -> dpb.ListIncidentsResponse:
        await self.guard.reader(context)
        return await blocking(self._list_incidents, request)

    def _list_incidents(self, request: dpb.ListIncidentsRequest) -> dpb.ListIncidentsResponse:
        size = request.page_size or PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            raise InputError(f"ListIncidents: page_size at most {MAX_PAGE_SIZE}, got {size}")
        after = decode_page_token(request.page_token)
        with self.lock:
            found = self.engine.list_incidents(request.open_only, request.since)
            page, more = incident_page(found, size, after)
            return dpb.ListIncidentsResponse(
                incidents=[serde.incident_to_pb(i) for i in page],
                next_page_token=encode_page_token(page[-1]) if more else "")

    async def WatchIncidents(self, request: dpb.WatchIncidentsRequest, context: Ctx
                             ) -> AsyncIterator[cpb.Incident]:
        await self.guard.reader(context)
        box: Mailbox[Incident] = Mailbox(asyncio.get_running_loop(), WATCH_QUEUE)
        self.hub.subscribe(box)
        try:
            while not context.done():
                try:
                    inc = await box.get(POLL_S)
                except Overflow:  # cut off, counted: it lists and watches again
                    metrics.STREAM_OVERFLOWS.labels(stream="incidents").inc()
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        f"fell {box.maxsize} incident changes behind; "
                                        "list and watch again")
                    return
                if inc is not None:
                    yield serde.incident_to_pb(inc)
        finally:
            box.close()
            self.hub.unsubscribe(box)
