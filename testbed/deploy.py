"""netskel deployed on a testbed: controller and analyzer on the root
namespace, one agent process inside every container namespace."""

from __future__ import annotations

import logging
import subprocess
import time
from dataclasses import dataclass, field
from types import TracebackType
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import start_http_server

from analyzer import metrics as analyzer_metrics
from analyzer.server import RunningAnalyzer, start_analyzer
from controller import metrics as controller_metrics
from controller.server import RunningController, start_controller
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.config import AnalyzerConfig, ControllerConfig
from netskel.model import pair_key
from testbed.cluster import Cluster, create_cluster
from testbed.layout import Layout
from testbed.prometheus import Prometheus, start_prometheus

log = logging.getLogger(__name__)


@dataclass
class Deployment:
    layout: Layout
    window_s: int = 10
    agent_args: tuple[str, ...] = ()  # more agent flags (after the testbed's; the later wins)
    # A real Prometheus scraping the controller and analyzer with the
    # shipped alerts (testbed/prometheus.py); their /metrics on loopback.
    with_prometheus: bool = False
    cluster: Cluster = field(init=False)
    controller: RunningController | None = None
    analyzer: RunningAnalyzer | None = None
    agents: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    channel: grpc.Channel | None = None
    prometheus: Prometheus | None = None
    _metrics_servers: list[WSGIServer] = field(default_factory=list)

    def __enter__(self) -> Deployment:
        self.cluster = create_cluster(self.layout)
        try:
            self.start_controller()
            self.analyzer = start_analyzer(AnalyzerConfig(
                topology=str(self.cluster.topology_path),
                controller=self.cluster.controller_socket, listen=("127.0.0.1:0",),
                # Software switches on two shared cores: RTTs of a few hundred us that
                # wander with scheduling. A real slowdown here is a queue of milliseconds.
                latency_min_shift_us=300.0, latency_rel_shift=0.5, web_listen="127.0.0.1:0"),
                skeleton=self._skeleton)
            self.channel = grpc.insecure_channel(f"127.0.0.1:{self.analyzer.ports[0]}")
            if self.with_prometheus:
                self._start_prometheus()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _start_prometheus(self) -> None:
        """The roles' own registries on loopback ports, as `--metrics-port`
        serves them (they run in this process), and Prometheus on them."""
        targets = {}
        for job, registry in (("netskel-controller", controller_metrics.REGISTRY),
                              ("netskel-analyzer", analyzer_metrics.REGISTRY)):
            server, _thread = start_http_server(0, "127.0.0.1", registry)
            self._metrics_servers.append(server)
            targets[job] = [f"127.0.0.1:{server.server_port}"]
        self.prometheus = start_prometheus(self.cluster.run_dir, targets, self.cluster.created)

    def _skeleton(self) -> dict[str, object]:
        return self.controller.state.skeleton_view() if self.controller is not None else {}

    def start_controller(self) -> None:
        self.controller = start_controller(ControllerConfig(
            topology=str(self.cluster.topology_path), listen=(self.cluster.controller_socket,),
            db=str(self.cluster.run_dir / "controller.sqlite"), window_seconds=self.window_s,
            heartbeat_interval_ms=500, heartbeat_timeout_s=5.0,
            switch_addresses=str(self.cluster.switch_addresses_path)))

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.controller.stop(0)
            self.controller = None

    def start_agents(self, hosts: list[int] | None = None) -> None:
        for h in hosts if hosts is not None else range(self.layout.hosts):
            self.agents[h] = self.cluster.start_agent(h, self.agent_args)

    def kill_agent(self, h: int) -> None:
        p = self.agents.pop(h)
        p.kill()
        p.wait()

    def close(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        for server in self._metrics_servers:
            server.shutdown()
            server.server_close()
        if self.channel is not None:
            self.channel.close()
        for p in self.agents.values():
            p.terminate()
        for p in self.agents.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.analyzer is not None:
            self.analyzer.stop(0)
        self.stop_controller()
        if hasattr(self, "cluster"):
            problems = self.cluster.destroy()
            if problems:
                log.error("cleanup left: %s", problems)

    # -- what a diagnosis engine would do ---------------------------------------
    @property
    def netdiag(self) -> dpb_grpc.NetDiagStub:
        assert self.channel is not None
        return dpb_grpc.NetDiagStub(self.channel)

    def all_pairs(self) -> list[tuple[str, str]]:
        """Every rail-aligned endpoint pair of the job."""
        lay = self.layout
        return sorted({pair_key(lay.endpoint(a, r), lay.endpoint(b, r))
                       for r in range(lay.rails) for a in range(lay.hosts)
                       for b in range(lay.hosts) if a != b})

    def diagnose(self, pairs: list[tuple[str, str]], since: float = 0.0
                 ) -> dpb.DiagnoseResponse:
        return self.netdiag.Diagnose(dpb.DiagnoseRequest(
            pairs=[cpb.EndpointPair(a=a, b=b) for a, b in pairs], start=since), timeout=10)

    def verdicts(self, pairs: list[tuple[str, str]], since: float = 0.0) -> dict[tuple[str, str], int]:
        resp = self.diagnose(pairs, since)
        return {pair_key(v.pair.a, v.pair.b): v.verdict for v in resp.pairs}

    def reasons(self, pairs: list[tuple[str, str]], since: float = 0.0
                ) -> dict[tuple[str, str], str]:
        """Each pair's verdict reason: NO_WINDOW (analyzer/engine.py) where
        the analyzer holds no window of it in the range. An INCONCLUSIVE
        verdict alone does not say that: a pair with an anomalous window in
        the range that did not persist, and that close_windows healthy ones
        have not yet followed, is INCONCLUSIVE too."""
        resp = self.diagnose(pairs, since)
        return {pair_key(v.pair.a, v.pair.b): v.reason for v in resp.pairs}

    def wait_all_ok(self, timeout: float, since: float | None = None) -> float:
        """Until every pair's latest window (after `since`) is healthy and
        none is in an open incident; returns when. A lone anomalous window
        that did not persist ages out with the next one: here such windows
        came at 4 % of pair-windows on some minutes (8 in 150 s over 12
        pairs, one after a stale datapath flow was undone), so a test that
        waited for two and a half quiet windows on every pair found none for
        111 s, and CI's 60 s ran out once. Without `since`, the last window_s:
        every reporting pair has a window ending in it, so a healthy cluster
        passes at once rather than after its next window (10 s a test in the
        e2e module)."""
        start = since if since is not None else time.time() - self.window_s

        def recent() -> float:  # the latest window: the analyzer's tick lags its end by ~4 s
            return max(start, time.time() - 1.5 * self.window_s)

        deadline = time.monotonic() + timeout
        pairs = self.all_pairs()
        bad: list[tuple[str, str, str]] = []
        while time.monotonic() < deadline:
            # Why, from the last judgement that failed: a fresh one after the
            # deadline may pass (CI once printed an empty list of bad pairs).
            bad = [(v.pair.a, v.pair.b, v.reason) for v in self.diagnose(pairs, recent()).pairs
                   if v.verdict != dpb.NETWORK_OK]
            if not bad:
                return time.time()
            time.sleep(1)
        raise TimeoutError(f"pairs not all healthy within {timeout}s: {bad}")

    def crossing(self, a: str, b: str) -> list[tuple[str, str]]:
        """Pairs whose traffic crosses the link between switches a and b in
        either direction, per the kernel's current ECMP choices."""
        lay = self.layout
        out = []
        for r in range(lay.rails):
            for x in range(lay.hosts):
                for y in range(x + 1, lay.hosts):
                    hops = (self.cluster.trace_underlay(x, y, r)
                            + ["|"] + self.cluster.trace_underlay(y, x, r))
                    steps = set(zip(hops, hops[1:], strict=False))
                    if (a, b) in steps or (b, a) in steps:
                        out.append(pair_key(lay.endpoint(x, r), lay.endpoint(y, r)))
        return sorted(out)
