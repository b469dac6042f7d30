"""Many simulated agents in one process, against a real controller over
real gRPC: each registers, follows its ping-list stream, turns ready,
reports windows for its targets. For load tests and `bench/agents.py`:
what one controller does with thousands of agents, not what one agent
measures (that is `probe_agent/`).

Agents share a few channels (one per `per_channel`), as sidecars on one
node would not, but the server sees one stream per agent either way.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from analyzer.batch import WindowBatch
from netskel import serde
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.model import WindowStats


def topology(agents: int, per_job: int = 8, hosts_per_tor: int = 32) -> dict[str, Any]:
    """One container with one endpoint per host, all on rail 0; jobs of
    `per_job` containers (each job's ping list is small: the load is the
    number of agents, not a quadratic list)."""
    tors = -(-agents // hosts_per_tor)
    switches: list[dict[str, Any]] = [{"id": f"tor{t:04d}", "tier": "tor", "rail": 0}
                                      for t in range(tors)]
    switches += [{"id": f"spine{s}", "tier": "spine"} for s in range(4)]
    links = [{"a": f"tor{t:04d}", "b": f"spine{s}"} for t in range(tors) for s in range(4)]
    hosts, containers = [], []
    for h in range(agents):
        nic = f"h{h:05d}/nic0"
        hosts.append({"id": f"h{h:05d}", "nics": [{"id": nic, "rail": 0,
                                                   "ip": f"10.{h >> 16}.{(h >> 8) & 255}.{h & 255}"}]})
        links.append({"a": nic, "b": f"tor{h // hosts_per_tor:04d}"})
        containers.append({"id": f"c{h:05d}", "job": f"job{h // per_job:04d}", "host": f"h{h:05d}",
                           "endpoints": [{"id": f"c{h:05d}/e0", "nic": nic,
                                          "ip": f"172.{16 + (h >> 16)}.{(h >> 8) & 255}.{h & 255}",
                                          "vni": 7}]})
    return {"version": 1, "switches": switches, "hosts": hosts, "links": links,
            "containers": containers}


def healthy(target: str) -> bool:
    """The server answers its health check SERVING (a blocking call: for
    waiting until a freshly started controller serves)."""
    with grpc.insecure_channel(target) as ch:
        try:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=1).status
        except grpc.RpcError:
            return False
    return bool(status == health_pb2.HealthCheckResponse.SERVING)


@dataclass
class SimAgent:
    container: dict[str, Any]
    targets: dict[tuple[str, str], pb.PingTarget] = field(default_factory=dict)
    version: int = 0
    first_list_at: float = 0.0
    registered_at: float = 0.0
    sent: int = 0
    accepted: int = 0
    error: str = ""
    phase: str = "start"  # the call it is in: what a stalled fleet waits on
    history: list[str] = field(default_factory=list)

    def apply(self, u: pb.PingListUpdate) -> None:
        # What arrived, in order (for a list that does not converge):
        # version, whole (F) or diff (d), the targets upserted (+ active), removals.
        self.history.append(f"v{u.version}{'F' if u.full else 'd'}["
                            + ",".join(f"{t.dst}{'+' if t.active else '-'}" for t in u.upsert)
                            + "]" + (f"-{len(u.remove)}" if u.remove else ""))
        if u.full:
            self.targets = {}
        for t in u.upsert:
            self.targets[(t.src, t.dst)] = t
        for t in u.remove:
            self.targets.pop((t.src, t.dst), None)
        self.version = u.version

    def request(self) -> pb.RegisterRequest:
        c = self.container
        return pb.RegisterRequest(container=c["id"], job=c["job"], host=c["host"], probe_port=7100,
                                  endpoints=[pb.EndpointInfo(id=e["id"], nic=e["nic"], ip=e["ip"],
                                                             vni=e.get("vni", 0))
                                             for e in c["endpoints"]])


@dataclass
class Fleet:
    """The outcome of `run`: every agent, and the health probe's view."""

    agents: list[SimAgent]
    health_ok: int = 0
    health_failed: int = 0
    health_worst_s: float = 0.0
    registered_s: float = 0.0
    lists_s: float = 0.0
    reports_s: float = 0.0
    wrong: int = -1  # agents whose list differs from the expected one after settling


async def _health(target: str, stop: asyncio.Event, fleet: Fleet, every: float) -> None:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                ok = r.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.aio.AioRpcError:
                ok = False
            fleet.health_worst_s = max(fleet.health_worst_s, time.perf_counter() - t0)
            if ok:
                fleet.health_ok += 1
            else:
                fleet.health_failed += 1
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                pass


# In-flight unary calls per simulated process. Hundreds at once stall a
# grpc.aio client process here (some calls are never answered and end
# CANCELLED at their deadline; 3 runs in 4 at 500 agents per process, none
# with 125 or with this cap): a limit of the one-process fleet, not of the
# controller, which sees the same burst either way. A real sidecar is one
# process with one call at a time.
IN_FLIGHT = 32


async def _agent(stub: Any, a: SimAgent, go_ready: asyncio.Event,
                 got_list: asyncio.Event, done: asyncio.Event, reports: int,
                 t0: float, calls: asyncio.Semaphore) -> None:
    a.phase = "register"
    async with calls:
        await stub.Register(a.request(), timeout=120)
    a.registered_at = time.perf_counter() - t0
    cid = a.container["id"]
    stream = stub.WatchPingList(pb.WatchPingListRequest(container=cid))

    async def follow() -> None:
        try:
            async for u in stream:
                a.apply(u)
                if not a.first_list_at:
                    a.first_list_at = time.perf_counter() - t0
                    got_list.set()
        except grpc.aio.AioRpcError as e:
            if not done.is_set():
                a.error = f"ping-list stream: {e.code().name}: {e.details()}"
                got_list.set()

    a.phase = "first list"
    reader = asyncio.create_task(follow())
    try:
        await go_ready.wait()
        if a.error:
            raise RuntimeError(f"{cid}: {a.error}")
        a.phase = "heartbeat"
        async with calls:
            await stub.Heartbeat(pb.HeartbeatRequest(container=cid, ready=True), timeout=120)
        if reports:
            now = time.time() // 30 * 30

            def batches() -> Any:
                for k in range(reports):
                    ws = [WindowStats(src, dst, now + 30 * k, now + 30 * k + 30, 64, 300, 0,
                                      5.0, 6.0, 7.0, 8.0, 7.0, 1.0, 20.0)
                          for src, dst in sorted(a.targets)]
                    a.sent += len(ws)
                    yield pb.AgentReport(container=cid, windows=serde.window_batch_to_pb(
                        WindowBatch.from_windows(ws)))

            a.phase = "report"
            ack = await stub.Report(batches(), timeout=300)
            a.accepted += ack.accepted
        a.phase = "done"
        await done.wait()
    finally:
        stream.cancel()
        reader.cancel()


def _phases(agents: list[SimAgent]) -> dict[str, int]:
    return dict(Counter(a.phase for a in agents))


async def run(target: str, doc: dict[str, Any], reports: int = 1, per_channel: int = 64,
              settle: Any = None, health_every: float = 0.25, phase_s: float = 120.0) -> Fleet:
    """Register every container of `doc`, wait until each has its first
    list, turn all ready, report `reports` windows per target, then call
    `settle(fleet)` (an async check that lists converged) before hanging up."""
    agents = [SimAgent(c) for c in doc["containers"]]
    fleet = Fleet(agents)
    stop = asyncio.Event()
    # health_every 0: no probe here (one process of a fleet probes for all).
    health = asyncio.create_task(_health(target, stop, fleet, health_every) if health_every > 0
                                 else stop.wait())
    # A local subchannel pool per channel: each its own connection, as real
    # sidecars have (channels with equal arguments otherwise share one, and
    # every stream of the process queues on that single connection).
    channels = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(-(-len(agents) // per_channel))]
    go_ready, done = asyncio.Event(), asyncio.Event()
    got = [asyncio.Event() for _ in agents]
    t0 = time.perf_counter()
    stubs: list[Any] = [pb_grpc.ControllerStub(ch) for ch in channels]  # async use: the stubs'
    # types are the synchronous API's
    calls = asyncio.Semaphore(IN_FLIGHT)
    tasks = [asyncio.create_task(_agent(stubs[i // per_channel], a,
                                        go_ready, got[i], done, reports, t0, calls))
             for i, a in enumerate(agents)]
    try:
        waiters = [asyncio.create_task(e.wait()) for e in got]
        pending = set(waiters) | set(tasks)
        deadline = time.monotonic() + phase_s
        while not all(e.is_set() for e in got):
            finished, pending = await asyncio.wait(pending, timeout=1.0,
                                                   return_when=asyncio.FIRST_COMPLETED)
            for f in finished:
                if f in tasks and f.exception() is not None:
                    raise f.exception()  # type: ignore[misc]
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"after {phase_s:.0f} s: {sum(1 for x in agents if not x.registered_at)} "
                    f"agents not registered, {sum(1 for x in agents if not x.first_list_at)} "
                    f"without a first list; agents by call: {_phases(agents)}")
        failed = [x.error for x in agents if x.error]
        if failed:
            raise RuntimeError(f"{len(failed)} agents failed: {failed[0]}")
        fleet.registered_s = max(a.registered_at for a in agents)
        fleet.lists_s = max(a.first_list_at for a in agents)
        t1 = time.perf_counter()
        go_ready.set()
        deadline = time.monotonic() + phase_s
        while any(a.sent == 0 and a.targets for a in agents) or \
                any(a.accepted < a.sent for a in agents):
            for t in tasks:
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            if time.monotonic() > deadline:
                raise TimeoutError(f"after {phase_s:.0f} s: reports of "
                                   f"{sum(1 for a in agents if a.accepted < a.sent)} agents "
                                   f"not acknowledged; agents by call: {_phases(agents)}")
            await asyncio.sleep(0.05)
        fleet.reports_s = time.perf_counter() - t1
        if settle is not None:
            await settle(fleet)
    finally:
        done.set()
        # A stalled call must not hold the answer back: a grace, then cancel.
        _, late = await asyncio.wait(tasks, timeout=10.0)
        for t in late:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stop.set()
        await health
        for ch in channels:
            await ch.close(None)
    return fleet


# Agents per simulated process: 2,000 to 8,192 agents in 500s pass with
# IN_FLIGHT capping the unary bursts; a fleet is several such processes.
PER_PROCESS = 500


def expected_lists(doc: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    """Every container's list once all are registered and ready."""
    from controller.pinglist import Member, MemberEndpoint, build_lists

    members = {c["id"]: Member(id=c["id"], job=c["job"], host=c["host"], probe_port=7100,
                               active=True,
                               endpoints=tuple(MemberEndpoint(e["id"], e["nic"], c["host"], 0,
                                                              e["ip"]) for e in c["endpoints"]))
               for c in doc["containers"]}
    return {cid: set(plist) for cid, plist in build_lists(members).items()}


def _view(targets: dict[tuple[str, str], bool], want: set[tuple[str, str]]) -> str:
    return (f"{len(targets)} targets, {sum(not x for x in targets.values())} inactive, "
            f"{len(set(targets) - want)} extra, {len(want - set(targets))} missing")


async def _diagnose(target: str, a: SimAgent, want: set[tuple[str, str]]) -> str:
    """A list that did not converge: the agent's view against the
    controller's own list now (a fresh stream's first message), so a lost
    or late update tells itself apart from a wrong list."""
    cid = a.container["id"]
    mine = {k: t.active for k, t in a.targets.items()}
    version, seen = a.version, len(a.history)
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            stream = pb_grpc.ControllerStub(ch).WatchPingList(
                pb.WatchPingListRequest(container=cid), timeout=30)
            snap: pb.PingListUpdate = await stream.read()  # type: ignore[assignment]
            stream.cancel()
    except grpc.aio.AioRpcError as e:
        return f"{cid}: agent v{version} ({_view(mine, want)}); controller: {e.code().name}"
    theirs = {(t.src, t.dst): t.active for t in snap.upsert}
    late = a.history[seen:]
    return (f"{cid}: agent v{version} ({_view(mine, want)}); controller v{snap.version} "
            f"({_view(theirs, want)}); inactive at the agent "
            f"{sorted(k[1] for k, v in mine.items() if not v)}; received "
            f"{' '.join(a.history[:seen][-8:])}"
            + (f"; arriving while this was read: {' '.join(late)}" if late else ""))


def _worker(target: str, doc: dict[str, Any], part: int, parts: int, reports: int,
            settle_s: float, per_channel: int, phase_s: float, out: Any,
            all_ready: Any = None) -> None:
    want = expected_lists(doc)
    mine = dict(doc, containers=doc["containers"][part::parts])

    details: list[str] = []

    async def settle(fleet: Fleet) -> None:
        # The settle starts once every process's agents are ready and have
        # reported: a list cannot converge before its peers are ready, and
        # a slow process's peers turned ready long after a fast one's settle
        # had begun (what "not converged" at 32,768 agents was: updates
        # arriving after the deadline, not lost).
        if all_ready is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, all_ready.wait, phase_s)
            except threading.BrokenBarrierError:
                pass  # a process failed or stalled: its error is reported; settle anyway
        deadline = time.monotonic() + settle_s
        while True:
            wrong = [a for a in fleet.agents if set(a.targets) != want[a.container["id"]]
                     or not all(t.active for t in a.targets.values())]
            if not wrong or time.monotonic() > deadline:
                fleet.wrong = len(wrong)
                details.extend([await _diagnose(target, a, want[a.container["id"]])
                                for a in wrong[:3]])
                return
            await asyncio.sleep(0.2)

    try:
        f = asyncio.run(run(target, mine, reports=reports, settle=settle,
                            health_every=0.25 if part == 0 else 0.0,
                               per_channel=per_channel, phase_s=phase_s))
        out.put({"part": part, "agents": len(f.agents), "registered_s": f.registered_s,
                 "lists_s": f.lists_s, "reports_s": f.reports_s,
                 "sent": sum(a.sent for a in f.agents),
                 "accepted": sum(a.accepted for a in f.agents),
                 "wrong": f.wrong, "wrong_detail": details, "health_failed": f.health_failed,
                 # ping-list streams that ended with an error after the first list
                 "stream_errors": sum(1 for a in f.agents if a.error),
                 "stream_error_first": next((a.error for a in f.agents if a.error), ""),
                 "health_worst_s": f.health_worst_s})
    except BaseException as e:  # the parent reports it, with where it happened
        out.put({"part": part, "error": f"{type(e).__name__}: {e}",
                 "tb": traceback.format_exc()[-3000:]})


def run_fleet(target: str, doc: dict[str, Any], reports: int = 1, settle_s: float = 120.0,
              per_process: int = PER_PROCESS, timeout: float = 600.0,
              per_channel: int = 64, phase_s: float = 120.0) -> list[dict[str, Any]]:
    """`run` over several processes; one summary per process."""
    import multiprocessing as mp

    parts = max(1, -(-len(doc["containers"]) // per_process))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    all_ready = ctx.Barrier(parts)
    procs = [ctx.Process(target=_worker, args=(target, doc, p, parts, reports, settle_s,
                                               per_channel, phase_s, out, all_ready),
                         daemon=True) for p in range(parts)]
    for p in procs:
        p.start()
    try:
        return [out.get(timeout=timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
