"""The sidecar: registers, follows its ping list, probes, answers, reports.

The controller may go away at any time; the agent keeps probing and keeps
its statistics queued (bounded) and reconnects with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import grpc

from analyzer.batch import WindowBatch
from controller.pinglist import Target
from controller.registration import RegEndpoint, Registration
from netskel import serde
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.backoff import Backoff
from netskel.config import AgentConfig
from netskel.errors import InputError
from netskel.model import CounterSample, VSwitchDump
from netskel.security import Security, aio_channel, channel
from netskel.stopping import join_all
from probe_agent import check, counters, flowtrace, hwstamp, metrics, vswitch, wire
from probe_agent.rdma import RdmaAddress, RdmaProber, open_pingers
from probe_agent.udp import (
    HARDWARE,
    UDP_IP_OVERHEAD,
    USER,
    Prober,
    ProbeTarget,
    Reply,
    ReplyHook,
    Responder,
    Sent,
    SentHook,
)
from probe_agent.window import WindowAccumulator

log = logging.getLogger(__name__)
VERSION = "0.1.0"
REPORT_QUEUE = 10000
# One report per stream message; the servers refuse messages over 4 MB
# (netskel/grpcserver.py), which would fail the whole report stream.
_REPORT_MAX_BYTES = 3 * 1024 * 1024
STOP_JOIN_S = 4.0  # the threads' share of STOP_DEADLINE_S


def _prober_bytes(prober: Prober) -> dict[str, tuple[int, int]]:
    """A prober's own (sent, received) bytes per endpoint, traces in."""
    return {ep: (b[0] + prober.own_trace_bytes.get(ep, 0), b[1])
            for ep, b in list(prober.own_bytes.items())}


def parse_endpoint(spec: str) -> RegEndpoint:
    """`ID,NIC,IP[,IFNAME]` as given on the command line or in NETSKEL_ENDPOINTS."""
    parts = spec.split(",")
    if len(parts) not in (3, 4) or not all(parts[:3]):
        raise InputError(f"endpoint '{spec}': expected ID,NIC,IP[,IFNAME]")
    return RegEndpoint(id=parts[0], nic=parts[1], ip=parts[2],
                       ifname=parts[3] if len(parts) == 4 else "")


def size_classes(sizes: tuple[int, ...], mtu: int | None) -> tuple[int, ...]:
    """Configured sizes that fit one unfragmented datagram."""
    cap = (mtu - UDP_IP_OVERHEAD) if mtu else 1500 - UDP_IP_OVERHEAD
    kept = tuple(sorted({max(wire.MIN_SIZE, min(s, cap)) for s in sizes}))
    return kept or (wire.MIN_SIZE,)


def split_targets(targets: Iterable[Target], rdma_sources: set[str]
                  ) -> tuple[dict[tuple[str, str], RdmaAddress], list[Target]]:
    """Active targets by how they are probed: over RDMA when the source has
    a queue pair and the target registered one, else over UDP."""
    rdma: dict[tuple[str, str], RdmaAddress] = {}
    udp: list[Target] = []
    for t in targets:
        if not t.active:
            continue
        if t.src in rdma_sources and t.dst_rdma_qpn and t.dst_rdma_gid:
            rdma[t.key] = RdmaAddress(t.dst_rdma_gid, t.dst_rdma_qpn)
        else:
            udp.append(t)
    return rdma, udp


async def _first(*waits: Awaitable[object]) -> None:
    """Until the first of `waits` is done (the others cancelled)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


class Agent:
    def __init__(self, cfg: AgentConfig, sec: Security | None = None) -> None:
        """sec: this container's certificate (its SAN names the container);
        None speaks plaintext, as the testbed does."""
        self.sec = sec or Security()
        if not cfg.container or not cfg.host:
            raise InputError("agent: container and host are required")
        self.cfg = cfg
        self.endpoints = tuple(parse_endpoint(s) for s in cfg.endpoints)
        if not self.endpoints:
            raise InputError("agent: at least one endpoint is required")
        self.window_s = float(cfg.window_seconds)
        self.stop_event = threading.Event()
        # Set by an active check (or the stop): the switch is read now, not
        # at the next interval, so the check's overlay trace sees its table
        # as it is while the check probes.
        self._vswitch_now = threading.Event()
        self.reports: queue.Queue[pb.AgentReport] = queue.Queue(maxsize=REPORT_QUEUE)
        # What each NIC stamps (and, if asked, hardware stamping turned on)
        # before the sockets ask for stamps.
        self.stamping = {e.ifname: hwstamp.prepare(e.ifname, cfg.hw_timestamps)
                         for e in self.endpoints if e.ifname}
        for _on, note in self.stamping.values():
            log.info("timestamps: %s", note)
        self.responder = Responder([e.ip for e in self.endpoints], cfg.probe_port,
                                   busy_poll_us=cfg.busy_poll_us, dscp=cfg.dscp)
        self.probe_port = self.responder.port
        sizes = {e.id: size_classes(cfg.sizes, counters.interface_mtu(e.ifname) if e.ifname
                                    else None) for e in self.endpoints}
        self.sizes = sizes
        self._acc_lock = threading.Lock()
        self.accs = self._accumulators()  # by proto: the probers' window statistics
        self.prober = Prober({e.id: e.ip for e in self.endpoints}, sizes, cfg.probe_rate_hz,
                             cfg.probe_timeout_s, *self._recorders("udp"),
                             busy_poll_us=cfg.busy_poll_us, flows=cfg.flows, dscp=cfg.dscp)
        # RDMA where the endpoint's interface has a device (UD queue pairs,
        # probe_agent/rdma.py); every other endpoint and target stays on UDP.
        pingers, addresses, self.rdma_note = ({}, {}, "off by configuration") if cfg.rdma == "off" \
            else open_pingers({e.id: e.ifname for e in self.endpoints},
                              *self._rdma_recorders(), max(cfg.sizes), dscp=cfg.dscp)
        self.rdma = RdmaProber(pingers, cfg.probe_rate_hz, sizes, cfg.probe_timeout_s)
        # Active checks' probers (own sockets) while they run, and what the
        # finished ones sent and received: the agent's own traffic too.
        self._checks_lock = threading.Lock()
        self._check_probers: list[Prober] = []
        self._checks_done: dict[str, list[int]] = {}
        self.endpoints = tuple(dataclasses.replace(e, rdma_gid=addresses[e.id].gid,
                                                   rdma_qpn=addresses[e.id].qpn)
                               if e.id in addresses else e for e in self.endpoints)
        log.info("RDMA probing from %d of %d endpoints (%s)", len(pingers), len(self.endpoints),
                 self.rdma_note)
        self.targets: dict[tuple[str, str], Target] = {}
        self.switch_names: dict[str, str] = {}  # router address -> switch id, from the controller
        # (src endpoint, dst endpoint, flow) -> the flow's traced route
        self.routes: dict[tuple[str, str, int], str] = {}
        self._trace_now = threading.Event()
        self.list_version = 0
        self.registered = False
        self.ready = True  # the responder sockets are bound
        self._threads: list[threading.Thread] = []
        # Set by the control loop while it runs: wake its report stream;
        # end it (from any thread).
        self._queued = asyncio.Event()  # a report was queued (the control loop's)
        self._wake: Callable[[], object] = lambda: None
        self._stop_loop: Callable[[], object] = lambda: None

    # -- probe bookkeeping --------------------------------------------------
    def _accumulators(self) -> dict[str, WindowAccumulator]:
        return {p: WindowAccumulator(self.window_s, self.cfg.probe_timeout_s, proto=p)
                for p in ("udp", "rdma")}

    def _recorders(self, proto: str) -> tuple[SentHook, ReplyHook]:
        """A prober's hooks into its protocol's accumulator, looked up at each
        call (registration replaces the accumulators when the controller sets
        the window length), under the lock the window loop closes them with:
        one lock per batch of probes."""
        def sent(events: list[Sent]) -> None:
            with self._acc_lock:
                self.accs[proto].sent_many(events)

        def replied(replies: list[Reply]) -> None:
            with self._acc_lock:
                self.accs[proto].replied_many(replies)

        return sent, replied

    def _rdma_recorders(self) -> tuple[Callable[[str, str, int, float, int], None],
                                       Callable[[str, str, int, float, float, int], None]]:
        """The RDMA pingers report a probe at a time. An RTT's clock is the
        NIC's completion clock where the device has one, else host times
        taken in user space."""
        sent, replied = self._recorders("rdma")

        def one_sent(src: str, dst: str, size: int, t: float, flow: int) -> None:
            sent([(src, dst, size, t, flow)])

        def one_reply(src: str, dst: str, size: int, t: float, rtt_us: float, flow: int) -> None:
            pinger = self.rdma.pingers.get(src)
            clock = "" if pinger is None else (HARDWARE if pinger.hw_clock else USER)
            replied([(src, dst, size, t, rtt_us, flow, clock)])

        return one_sent, one_reply

    def _enqueue(self, report: pb.AgentReport) -> None:
        while True:
            try:
                self.reports.put_nowait(report)
                self._wake()
                return
            except queue.Full:
                try:  # keep the newest: drop the oldest
                    self.reports.get_nowait()
                except queue.Empty:
                    pass

    def _close_windows(self) -> WindowBatch:
        routes = self.routes

        def route_of(src: str, dst: str, flow: int) -> str:
            return routes.get((src, dst, flow), "")

        with self._acc_lock:
            now = time.time()
            return WindowBatch.concat([acc.close_batch(now, route_of)
                                       for acc in self.accs.values()])

    def _window_loop(self) -> None:
        while not self.stop_event.wait(1.0):
            done = self._close_windows()
            if len(done):
                self._enqueue(pb.AgentReport(container=self.cfg.container,
                                             windows=serde.window_batch_to_pb(done)))

    def _counter_loop(self) -> None:
        ifaces = {e.id: e.ifname for e in self.endpoints if e.ifname}
        if not ifaces:
            return
        period = 1.0 / self.cfg.counter_hz
        batch: list[CounterSample] = []
        next_flush = time.monotonic() + 1.0
        next_t = time.monotonic()
        without_own = counters.WithoutOwnTraffic()
        while not self.stop_event.is_set():
            own = self._own_bytes()  # before the counters: see WithoutOwnTraffic
            for c in counters.sample(ifaces):
                tx, rx = without_own.correct(c.endpoint, (c.tx_bytes, c.rx_bytes),
                                             own.get(c.endpoint, (0, 0)))
                batch.append(CounterSample(c.endpoint, c.ts, tx, rx))
            if time.monotonic() >= next_flush:
                self._enqueue(pb.AgentReport(container=self.cfg.container, counters=pb.CounterBatch(
                    samples=[serde.counter_to_pb(s) for s in batch])))
                batch = []
                next_flush += 1.0
            next_t += period
            self.stop_event.wait(max(0.0, next_t - time.monotonic()))

    def _check_prober(self, prober: Prober, running: bool) -> None:
        """An active check's prober: its bytes are this agent's own traffic
        while it runs and, once it closed, in the finished checks' total."""
        with self._checks_lock:
            if running:
                self._check_probers.append(prober)
                return
            self._check_probers.remove(prober)
            for ep, (tx, rx) in _prober_bytes(prober).items():
                done = self._checks_done.setdefault(ep, [0, 0])
                done[0] += tx
                done[1] += rx

    def _own_bytes(self) -> dict[str, tuple[int, int]]:
        """Per endpoint, (sent, received) bytes of this agent's own UDP
        probing: probes, traces, replies to others' probes and active
        checks. (RDMA probes are not counted: a few KB/s against the port
        counters' GB/s.)"""
        with self._checks_lock:
            parts = [_prober_bytes(self.prober),
                     {ep: (b[0], b[1]) for ep, b in self._checks_done.items()},
                     *(_prober_bytes(p) for p in self._check_probers)]
        answered = self.responder.own_bytes
        out = {}
        for e in self.endpoints:
            r = answered.get(e.ip, (0, 0))
            tx, rx = r[0], r[1]
            for part in parts:
                got = part.get(e.id, (0, 0))
                tx, rx = tx + got[0], rx + got[1]
            out[e.id] = (tx, rx)
        return out

    def _vswitch_loop(self) -> None:
        """The host's switch table every interval (jittered), for the
        analyzer's overlay tracing. A failed or unreadable dump is logged and
        counted and nothing is sent, so the last good table stays in use."""
        if not self.cfg.vswitch:
            return
        reader = vswitch.Reader(vswitch.VSwitchSource(
            self.cfg.vswitch, self.cfg.vswitch_tunnel_ports, self.cfg.vswitch_vni,
            self.cfg.vswitch_db, self.cfg.vswitch_datapath, self.cfg.vswitch_datapath_type))
        last: tuple[object, object] | None = None  # (rules, datapath) last sent
        last_sent = 0.0
        while True:
            asked = self._wait_turn(lambda: self.cfg.vswitch_interval_s, self._vswitch_now)
            self._vswitch_now.clear()
            if self.stop_event.is_set():
                return
            metrics.VSWITCH_READS.labels(why="check" if asked else "interval").inc()
            try:
                got = reader.read()
            except Exception as e:  # any failure: the analyzer keeps the last good table
                log.warning("vswitch dump from %s failed: %s: %s", self.cfg.vswitch,
                            type(e).__name__, e)
                metrics.VSWITCH_DUMP_FAILURES.inc()
                continue
            datapath = None
            if self.cfg.vswitch_datapath:
                try:
                    datapath = reader.read_datapath(got.ports).rules
                except Exception as e:  # the tables still go; the NICs' last tables stay
                    log.warning("datapath flows from %s failed: %s: %s",
                                self.cfg.vswitch_datapath, type(e).__name__, e)
                    metrics.VSWITCH_DATAPATH_FAILURES.inc()
            now = time.monotonic()
            if last == (got.rules, datapath) and now - last_sent < self.cfg.vswitch_refresh_s:
                continue  # nothing new for the analyzer
            dump = VSwitchDump(host=self.cfg.host, ts=time.time(), rules=got.rules,
                               datapath=datapath)
            report = pb.AgentReport(container=self.cfg.container,
                                    vswitch=serde.vswitch_to_pb(dump))
            size = report.ByteSize()
            if size > _REPORT_MAX_BYTES and datapath:
                # A report over the limit would fail the whole report stream.
                log.warning("datapath flows of %s (%d rules) would make the dump %d bytes: "
                            "tables sent without them", self.cfg.host, len(datapath), size)
                metrics.VSWITCH_DATAPATH_FAILURES.inc()
                report.vswitch.datapath_read = False
                del report.vswitch.datapath[:]
                size = report.ByteSize()
            if size > _REPORT_MAX_BYTES:
                log.warning("vswitch dump of %s is %d bytes, over %d: not sent", self.cfg.host,
                            size, _REPORT_MAX_BYTES)
                metrics.VSWITCH_DUMP_FAILURES.inc()
                continue
            self._enqueue(report)
            last, last_sent = (got.rules, datapath), now

    def _trace_loop(self) -> None:
        """Each probe flow's underlay route (probe_agent/flowtrace.py): soon
        after the list changes, then every interval (jittered). Routes
        follow the windows to the analyzer, which then blames the links the
        lost or slow probes' flows really crossed instead of all their ECMP
        alternatives."""
        if not self.cfg.underlay_netns:
            return
        try:
            tracer = flowtrace.FlowTracer(self.cfg.underlay_netns, self.prober.trace_token,
                                          self.cfg.tunnel_port)
        except OSError as e:
            log.warning("no route traces: cannot listen in %s: %s", self.cfg.underlay_netns, e)
            return
        self.prober.on_trace_reply = tracer.replied
        self.stop_event.wait(random.uniform(0.5, 2.0))  # stagger agents started together
        try:
            while not self.stop_event.is_set():
                self._trace_now.clear()
                self.routes = self._trace_flows(tracer)
                self._wait_turn(lambda: self.cfg.trace_interval_s, self._trace_now)
        finally:
            self.prober.on_trace_reply = None
            tracer.close()

    def _trace_flows(self, tracer: flowtrace.FlowTracer, gap_s: float = 0.05
                     ) -> dict[tuple[str, str, int], str]:
        """Every flow of every UDP target once, a target's flows together,
        targets spaced out so the routers' ICMP rate limits and the probed
        links see a trickle."""
        names = self.switch_names
        routes: dict[tuple[str, str, int], str] = {}
        prober = self.prober
        for t in prober.targets():
            if self.stop_event.is_set():
                return routes

            traces = tracer.trace_many(prober.flow_senders(t.src, t.dst_ip, t.dst_port),
                                       t.src, t.dst)
            for flow, tr in traces.items():
                route = tr.route(names)
                routes[(t.src, t.dst, flow)] = route
                outcome = "failed" if tr.error else ("named" if route else "partial")
                metrics.ROUTE_TRACES.labels(outcome).inc()
                if tr.error:
                    log.info("trace %s -> %s flow %d: %s", t.src, t.dst, flow, tr.error)
            self.stop_event.wait(gap_s)
        return routes

    # -- ping list ----------------------------------------------------------
    def _run_check(self, order: pb.CheckOrder) -> None:
        """An active check beside the regular probing; its windows go back
        on the report stream, tagged with the check's id."""
        o = serde.check_order_from_pb(order)
        self._vswitch_now.set()
        if not o.targets:  # this host's switch table only, for another agent's check
            return
        windows = check.run_check(o.targets, o.duration_s, o.rate_hz,
                                  {e.id: e.ip for e in self.endpoints}, self.sizes,
                                  self.cfg.probe_timeout_s, self.cfg.underlay_netns,
                                  self.switch_names, self.stop_event, self.cfg.flows,
                                  self.cfg.tunnel_port, self._check_prober)
        log.info("check %s: %d targets, %d windows", o.id, len(o.targets), len(windows))
        self._enqueue(pb.AgentReport(container=self.cfg.container, check=pb.CheckResult(
            id=o.id, windows=[serde.window_to_pb(w) for w in windows])))

    def apply_update(self, u: pb.PingListUpdate) -> None:
        if u.HasField("check"):
            threading.Thread(target=self._run_check, args=(u.check,), name="check",
                             daemon=True).start()
            if not (u.full or u.upsert or u.remove):
                return
        if not u.full and u.version <= self.list_version:
            # Older than the list in force (versions only grow): applied, it
            # would wind part of the list back.
            log.warning("ping list: ignored update v%d, older than v%d in force", u.version,
                        self.list_version)
            return
        if u.full:
            self.targets = {}
        for m in u.upsert:
            t = serde.target_from_pb(m)
            self.targets[t.key] = t
        for m in u.remove:
            self.targets.pop((m.src, m.dst), None)
        self.list_version = u.version
        rdma, udp = split_targets(self.targets.values(), set(self.rdma.pingers))
        self.rdma.set_targets(rdma)
        self.prober.set_targets(ProbeTarget(t.src, t.dst, t.dst_ip, t.dst_port) for t in udp)
        self._trace_now.set()
        log.info("ping list v%d: %d targets, %d active", u.version, len(self.targets),
                 sum(t.active for t in self.targets.values()))

    # -- control session ----------------------------------------------------
    def registration(self) -> Registration:
        return Registration(container=self.cfg.container, job=self.cfg.job or None,
                            host=self.cfg.host, endpoints=self.endpoints,
                            probe_port=self.probe_port, agent_version=VERSION)

    async def _reports(self, end: asyncio.Event) -> AsyncIterator[pb.AgentReport]:
        """The queued reports as a stream; waits without polling (producers
        in other threads wake the loop through `_enqueue`)."""
        while not end.is_set():
            try:
                yield self.reports.get_nowait()
                continue
            except queue.Empty:
                pass
            self._queued.clear()
            if self.reports.empty():  # a put after this sets _queued again
                await _first(self._queued.wait(), end.wait())

    async def _session(self, ch: grpc.aio.Channel, stopping: asyncio.Event) -> None:
        """One connection's life; returns when it breaks or the agent stops."""
        stub = pb_grpc.ControllerStub(ch)
        if self.registered:
            known = (await stub.Heartbeat(pb.HeartbeatRequest(container=self.cfg.container,
                                                              ready=self.ready), timeout=5)).known
            self.registered = known
        if not self.registered:
            resp = await stub.Register(serde.registration_to_pb(self.registration()), timeout=5)
            self.registered = True
            self.heartbeat_s = resp.heartbeat_interval_ms / 1000 or 1.0
            self.switch_names = dict(resp.switch_addresses)
            if resp.window_seconds and resp.window_seconds != self.window_s:
                self.window_s = float(resp.window_seconds)
                with self._acc_lock:
                    self.accs = self._accumulators()
        end = asyncio.Event()
        watch = stub.WatchPingList(pb.WatchPingListRequest(container=self.cfg.container))

        async def follow() -> None:
            try:
                async for update in watch:
                    self.apply_update(update)
            except grpc.RpcError as e:
                log.info("ping-list stream ended: %s", e.code())
            finally:
                end.set()

        async def report() -> None:
            try:
                await stub.Report(self._reports(end))
            except grpc.RpcError as e:
                log.info("report stream ended: %s", e.code())
            finally:
                end.set()

        async def stop_when_asked() -> None:
            await stopping.wait()
            end.set()

        tasks = [asyncio.create_task(f()) for f in (follow, report, stop_when_asked)]
        try:
            while not end.is_set():
                known = (await stub.Heartbeat(pb.HeartbeatRequest(container=self.cfg.container,
                                                                  ready=self.ready),
                                              timeout=max(2.0, 2 * self.heartbeat_s))).known
                if not known:
                    self.registered = False
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(end.wait(), self.heartbeat_s)
        finally:
            end.set()
            watch.cancel()
            await asyncio.wait(tasks, timeout=5)
            for t in tasks:
                t.cancel()

    async def _control(self) -> None:
        """Register, follow the list, report, heartbeat: one event loop on
        gRPC's asyncio client. The sync client polls every blocking call and
        stream every 100 ms (a thread per stream): an idle sidecar's largest
        cost (bench/agent_overhead.py)."""
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()

        def soon(event: asyncio.Event) -> Callable[[], None]:
            def set_it() -> None:
                with contextlib.suppress(RuntimeError):  # the loop has closed: stopping
                    loop.call_soon_threadsafe(event.set)
            return set_it

        self._wake, self._stop_loop = soon(self._queued), soon(stopping)
        if self.stop_event.is_set():
            return
        backoff = Backoff()
        self.heartbeat_s = 1.0
        while not stopping.is_set():
            started = time.monotonic()
            ch = aio_channel(self.cfg.controller, self.sec)
            try:
                await self._session(ch, stopping)
            except grpc.RpcError as e:
                log.warning("controller %s: %s: %s", self.cfg.controller, e.code().name,
                            e.details())
            finally:
                await ch.close(None)
            if stopping.is_set():
                break
            if time.monotonic() - started > 10:
                backoff.reset()
            metrics.CONTROLLER_RECONNECTS.inc()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), backoff.next())

    def _control_loop(self) -> None:
        asyncio.run(self._control())

    def _wait_turn(self, interval_s: Callable[[], float], wake: threading.Event) -> bool:
        """Until a loop's next turn: its interval (jittered, so agents
        started together drift apart) or `wake`, True if woken. The interval
        is read again every second, so a reloaded one applies to the turn
        under way, not only after an hour-long wait ends."""
        jitter, began = random.uniform(0.9, 1.1), time.monotonic()
        while not self.stop_event.is_set():
            left = began + interval_s() * jitter - time.monotonic()
            if left <= 0:
                return False
            if wake.wait(min(1.0, left)):
                return True
        return False

    def reconfigure(self, cfg: AgentConfig) -> None:
        """Settings from a reloaded file (`netskel.config.take_live` keeps
        the rest as they were): the probers take a new rate at each target's
        next probe, the switch-read and trace loops their intervals at once."""
        if cfg.probe_rate_hz != self.cfg.probe_rate_hz:
            self.prober.set_rate(cfg.probe_rate_hz)
            self.rdma.rate_hz = cfg.probe_rate_hz
        self.cfg = cfg

    def start(self) -> None:
        for name, fn in (("responder", lambda: self.responder.serve(self.stop_event)),
                         ("prober", lambda: self.prober.run(self.stop_event)),
                         ("windows", self._window_loop), ("counters", self._counter_loop),
                         ("vswitch", self._vswitch_loop), ("trace", self._trace_loop),
                         ("control", self._control_loop)):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        for src in self.rdma.pingers:
            t = threading.Thread(target=self.rdma.run, args=(src, self.stop_event),
                                 name=f"rdma-{src}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, deregister: bool = False) -> None:
        """Stop probing; with `deregister` (a clean stop: SIGTERM), tell the
        controller this container is leaving, so its peers drop it and no
        incident opens. A crash does not: that is an agent-layer incident.
        The session is told to end and the controller told before any thread
        is waited for: a thread slow to stop (a switch dump, a trace) must not
        outlast the process's stop deadline with the controller never told.
        Threads then share one join budget."""
        self.stop_event.set()
        self._vswitch_now.set()
        self._stop_loop()  # first: a session that saw itself forgotten would register again
        if deregister and self.registered:
            try:
                with channel(self.cfg.controller, self.sec) as ch:
                    pb_grpc.ControllerStub(ch).Deregister(
                        pb.DeregisterRequest(container=self.cfg.container), timeout=3)
                self.registered = False
                log.info("deregistered %s", self.cfg.container)
            except grpc.RpcError as e:
                log.warning("deregistering %s: %s", self.cfg.container, e.code().name)
        join_all(self._threads, STOP_JOIN_S)
        self.prober.close()
        self.responder.close()
        for p in self.rdma.pingers.values():
            p.close()
