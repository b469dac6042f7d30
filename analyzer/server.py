"""Runs the analyzer: follows the controller's report feed, ticks the
engine, serves NetDiag."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import grpc

from analyzer.engine import Analyzer
from analyzer.localize import Pair
from analyzer.service import CheckRunner, IncidentHub, NetDiagService
from analyzer.store import IncidentStore
from analyzer.web import SkeletonSource, WebServer
from netskel import serde
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.backoff import Backoff
from netskel.config import AnalyzerConfig
from netskel.errors import InputError, UnavailableError
from netskel.grpcserver import AioServer, make_server
from netskel.model import WindowStats, pair_key
from netskel.security import Guard, Security, channel, server_credentials
from netskel.stopping import join_all
from netskel.topology import load_topology

log = logging.getLogger(__name__)
SERVICE = "netskel.api.v1.NetDiag"
STOP_JOIN_S = 3.0  # the threads' share of STOP_DEADLINE_S


@dataclass
class RunningAnalyzer:
    server: AioServer
    ports: list[int]
    engine: Analyzer
    lock: threading.Lock
    _stop: threading.Event
    _threads: list[threading.Thread]
    web: WebServer | None = None
    store: IncidentStore | None = None

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        if self.web is not None:
            self.web.stop()
        self.server.stop(grace).wait()
        join_all(self._threads, STOP_JOIN_S)
        if self.store is not None:
            self.store.close()


def _follow_feed(cfg: AnalyzerConfig, engine: Analyzer, lock: threading.Lock,
                 stop: threading.Event, sec: Security) -> None:
    backoff = Backoff()
    while not stop.is_set():
        ch = channel(cfg.controller, Security(sec.tls))
        stream = pb_grpc.ControllerStub(ch).WatchReports(pb.WatchReportsRequest())
        watcher = threading.Thread(target=lambda s=stream: (stop.wait(), s.cancel()), daemon=True)
        watcher.start()
        try:
            for ev in stream:
                backoff.reset()
                with lock:
                    if ev.HasField("agent"):
                        engine.set_agent(serde.agent_state_from_pb(ev.agent))
                    elif ev.HasField("vswitch"):
                        engine.set_vswitch(serde.vswitch_from_pb(ev.vswitch))
                    else:
                        try:
                            rejected = engine.add_live(serde.window_batch_from_pb(ev.windows))
                        except InputError as e:
                            rejected = [f"a report: {e}"]
                        for r in rejected[:3]:
                            log.warning("window rejected: %s", r)
        except grpc.RpcError as e:
            if not stop.is_set():
                log.warning("report feed from %s: %s", cfg.controller, e.code())
        finally:
            ch.close()
        stop.wait(backoff.next())


def controller_checks(target: str, sec: Security | None = None) -> CheckRunner:
    """Active checks through the controller's ActiveCheck (one channel)."""
    stub = pb_grpc.ControllerStub(channel(target, Security((sec or Security()).tls)))

    def run(pairs: list[Pair], seconds: float) -> tuple[list[WindowStats], dict[Pair, str]]:
        req = pb.ActiveCheckRequest(pairs=[cpb.EndpointPair(a=a, b=b) for a, b in pairs],
                                    duration_s=seconds)
        try:
            resp = stub.ActiveCheck(req, timeout=(seconds or 3.0) + 15.0)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.INVALID_ARGUMENT,):
                raise InputError(f"active check: {e.details()}") from None
            raise UnavailableError(f"active check: controller {target}: {e.code().name}") from None
        return ([serde.window_from_pb(w) for w in resp.windows],
                {pair_key(u.pair.a, u.pair.b): u.reason for u in resp.unchecked})
    return run


def start_analyzer(cfg: AnalyzerConfig, tick_s: float = 1.0,
                   skeleton: SkeletonSource | None = None,
                   sec: Security | None = None) -> RunningAnalyzer:
    """skeleton: where the web page reads jobs' skeletons (the controller's
    state, when both run in one process). sec: TLS material (this analyzer's
    certificate also serves as its identity towards the controller) and the
    bearer token NetDiag and the web page accept; with a token, clients need
    no certificate (the TLS handshake cannot ask for "a certificate or a
    token"), without one they must present one."""
    sec = sec or Security()
    topo = load_topology(cfg.topology)
    engine = Analyzer(topo, cfg)
    store = IncidentStore(cfg.db) if cfg.db else None
    if store is not None:
        engine.attach_store(store)
    lock = threading.Lock()
    hub = IncidentHub()
    guard = Guard(tls=sec.tls is not None, token=sec.token)
    service = NetDiagService(engine, lock, hub, run_check=controller_checks(cfg.controller, sec),
                             guard=guard)
    creds = (server_credentials(sec.tls, require_client_cert=not sec.token) if sec.tls
             else None)
    server, ports, _ = make_server(
        [SERVICE], lambda s: dpb_grpc.add_NetDiagServicer_to_server(service, s), cfg.listen,
        creds)
    stop = threading.Event()

    def tick_loop() -> None:
        while not stop.wait(tick_s):
            with lock:
                changed = engine.tick(time.time())
            if changed:
                hub.publish(changed)

    threads = [threading.Thread(target=_follow_feed, args=(cfg, engine, lock, stop, sec),
                                name="feed", daemon=True),
               threading.Thread(target=tick_loop, name="tick", daemon=True)]
    for t in threads:
        t.start()
    web = None
    if cfg.web_listen:
        host, _, port = cfg.web_listen.rpartition(":")
        try:
            web = WebServer((host or "127.0.0.1", int(port)), engine, lock, skeleton,
                            sec).start()
        except (ValueError, OSError) as e:
            server.stop(0)
            stop.set()
            raise InputError(f"web_listen '{cfg.web_listen}': {e}") from None
        log.info("analyzer web page on %s://%s:%d/", "https" if sec.tls else "http",
                 host or "127.0.0.1", web.port)
    log.info("analyzer serving NetDiag on %s", ports)
    return RunningAnalyzer(server=server, ports=ports, engine=engine, lock=lock, _stop=stop,
                           _threads=threads, web=web, store=store)
