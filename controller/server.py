"""Runs the controller: topology, store, state, gRPC, expiry loop."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from controller.live import run_live_inference
from controller.service import ControllerService
from controller.state import ControllerState
from controller.store import Store
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.config import ControllerConfig
from netskel.grpcserver import AioServer, make_server
from netskel.security import Guard, Security, server_credentials
from netskel.stopping import join_all
from netskel.topology import load_switch_addresses, load_topology

log = logging.getLogger(__name__)
SERVICE = "netskel.api.v1.Controller"
STOP_JOIN_S = 3.0  # the threads' share of STOP_DEADLINE_S


@dataclass
class RunningController:
    server: AioServer
    ports: list[int]
    state: ControllerState
    store: Store
    _stop: threading.Event
    _threads: list[threading.Thread]

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        self.state.membership_changed.set()  # wake the inference loop
        self.server.stop(grace).wait()
        # An inference under way (tens of seconds for a big job, deaf to the
        # stop) is not waited out; what the store committed stays.
        join_all(self._threads, STOP_JOIN_S)
        self.store.close()


def start_controller(cfg: ControllerConfig, sec: Security | None = None) -> RunningController:
    """sec: TLS material (agents and the analyzer must present certificates
    naming who they are); None serves plaintext, as the testbed does."""
    sec = sec or Security()
    topo = load_topology(cfg.topology)
    store = Store(cfg.db)
    state = ControllerState(topo, store, now=time.time(),
                            heartbeat_timeout=cfg.heartbeat_timeout_s)
    names = load_switch_addresses(cfg.switch_addresses, topo) if cfg.switch_addresses else {}
    service = ControllerService(state, cfg.heartbeat_interval_ms, cfg.window_seconds,
                                switch_addresses=names, guard=Guard(tls=sec.tls is not None))
    creds = server_credentials(sec.tls, require_client_cert=True) if sec.tls else None
    server, ports, _ = make_server(
        [SERVICE], lambda s: pb_grpc.add_ControllerServicer_to_server(service, s), cfg.listen,
        creds)
    stop = threading.Event()

    def expire_loop() -> None:
        while not stop.wait(min(1.0, cfg.heartbeat_timeout_s / 4)):
            for c in state.expire(time.time()):
                log.warning("agent of %s stopped heartbeating", c)

    t = threading.Thread(target=expire_loop, name="expiry", daemon=True)
    t.start()
    threads = [t]
    if cfg.reinfer_seconds > 0:
        threads.append(threading.Thread(target=run_live_inference,
                                        args=(state, stop, cfg.reinfer_seconds),
                                        name="inference", daemon=True))
        threads[-1].start()
    log.info("controller serving on %s", ", ".join(f"{a} ({p})" for a, p in zip(cfg.listen, ports,
                                                                                  strict=True)))
    return RunningController(server=server, ports=ports, state=state, store=store, _stop=stop,
                             _threads=threads)

