"""The controller's state machine: registrations in, ping-list diffs out.

No sockets and no clock here: callers pass `now`. Every mutation recomputes
the affected lists, persists what changed and hands the diffs to the
subscribers (the gRPC streams)."""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from analyzer.batch import WindowBatch
from controller import metrics
from controller.pinglist import (
    JobSkeleton,
    ListDiff,
    Member,
    MemberEndpoint,
    PingList,
    Target,
    build_lists,
    diff_lists,
)
from controller.registration import Registration, validate_registration
from controller.store import Store
from netskel.errors import NotFoundError
from netskel.model import AgentState, CounterSample, VSwitchDump, WindowStats
from netskel.topology import Topology

log = logging.getLogger(__name__)

REJECTS_LOGGED = 3  # rejected windows logged per report (all are counted)
COUNTER_HISTORY = 6000  # samples kept per endpoint: 10 min at 10 Hz


@dataclass(frozen=True)
class CheckOrder:
    """Probe these targets now (every size, routes traced) and report."""

    id: str
    targets: tuple[Target, ...]
    duration_s: float
    rate_hz: float


@dataclass(frozen=True)
class ListUpdate:
    version: int
    full: bool
    diff: ListDiff
    check: CheckOrder | None = None  # rides on the list stream; the list is unchanged


@dataclass
class _PendingCheck:
    waiting: set[str]  # containers that have not reported yet
    ordered: dict[str, list[tuple[str, str]]]  # prober -> the pairs (as asked) it was told to check
    windows: list[WindowStats] = field(default_factory=list)
    rejected: dict[frozenset[str], str] = field(default_factory=dict)  # pair -> why its window was
    done: threading.Event = field(default_factory=threading.Event)


ReportEvent = WindowBatch | AgentState | VSwitchDump
T_contra = TypeVar("T_contra", contravariant=True)


class Sink(Protocol[T_contra]):
    """Where a stream's items go (netskel.grpcserver.Mailbox): bounded, never
    blocking; False when the item was not taken."""

    def offer(self, item: T_contra) -> bool: ...


class ControllerState:
    def __init__(self, topo: Topology, store: Store | None, now: float,
                 heartbeat_timeout: float = 15.0, feed_queue: int = 10000) -> None:
        self.topo = topo
        self.store = store
        self.heartbeat_timeout = heartbeat_timeout
        self.feed_queue = feed_queue  # events a slow analyzer may fall behind before it is cut off
        self._lock = threading.RLock()
        self._list_subs: dict[str, list[Sink[ListUpdate]]] = {}
        self._feed_subs: list[Sink[ReportEvent]] = []
        self.counters: dict[str, deque[CounterSample]] = {}
        self._live: dict[str, bool] = {}
        self.regs: dict[str, Registration] = {}
        self.lists: dict[str, PingList] = {}
        self.versions: dict[str, int] = {}
        self.skeletons: dict[str, JobSkeleton] = {}
        self.inference: dict[str, dict[str, object]] = {}  # last result per job, for people
        self.membership_changed = threading.Event()
        self._checks: dict[str, _PendingCheck] = {}
        self._check_ids = itertools.count(1)
        # Topology containers that deregistered: gone until they register again.
        self.departed: set[str] = set()
        self._by_job: dict[str | None, set[str]] = {}
        self._member_job: dict[str, str | None] = {}  # the inverse of _by_job
        self._owner: dict[str, str] = {}  # endpoint id -> registered container
        self._targets = self._active = 0   # across all lists, for the gauges
        if store is not None:
            # A restart: registrations are kept, their heartbeats start afresh.
            self.regs = {c: r.with_heartbeat(r.ready, now)
                         for c, r in store.load_registrations().items()}
            for c, (version, plist) in store.load_lists().items():
                self.versions[c] = version
                if plist:  # an empty list keeps a departed member's version only
                    self.lists[c] = plist
                    self._count(plist, +1)
            self.departed = store.load_departed() - set(self.regs)
        self._owner = {e.id: c for c, r in self.regs.items() for e in r.endpoints}
        self._recompute()
        metrics.AGENTS_REGISTERED.set(len(self.regs))
        log.info("controller state: %d registrations, %d lists",
                 len(self.regs), len(self.lists))

    # -- membership ---------------------------------------------------------
    def _member_endpoint(self, id: str, nic: str, host: str, ip: str | None,
                         rdma_gid: str = "", rdma_qpn: int = 0) -> MemberEndpoint:
        n = self.topo.nics[nic]
        return MemberEndpoint(id=id, nic=nic, host=host, rail=n.rail, ip=ip or "",
                              nic_ip=n.ip or "", rdma_gid=rdma_gid, rdma_qpn=rdma_qpn)

    def _member(self, cid: str) -> Member | None:
        r = self.regs.get(cid)
        if r is not None:
            eps = tuple(self._member_endpoint(e.id, e.nic, r.host, e.ip, e.rdma_gid, e.rdma_qpn)
                        for e in r.endpoints)
            return Member(id=cid, job=r.job, host=r.host, endpoints=eps,
                          probe_port=r.probe_port, active=r.ready)
        c = self.topo.containers.get(cid)
        if c is None or cid in self.departed:
            return None
        eps = tuple(self._member_endpoint(e.id, e.nic, c.host, e.ip) for e in c.endpoints)
        return Member(id=cid, job=c.job, host=c.host, endpoints=eps, probe_port=0, active=False)

    def _job_of(self, cid: str) -> tuple[bool, str | None]:
        """(is a member, its job)."""
        r = self.regs.get(cid)
        if r is not None:
            return True, r.job
        c = self.topo.containers.get(cid)
        if c is None or cid in self.departed:
            return False, None
        return True, c.job

    def _index(self, cid: str) -> None:
        """Keep `_by_job` right for one container after it changed (in O(1):
        a scan of every job's members made registration O(jobs))."""
        if cid in self._member_job:
            self._by_job.get(self._member_job.pop(cid), set()).discard(cid)
        member, job = self._job_of(cid)
        if member:
            self._by_job.setdefault(job, set()).add(cid)
            self._member_job[cid] = job

    def _recompute(self, jobs: set[str | None] | None = None, also: set[str] | None = None,
                   ) -> None:
        """Rebuild the lists of these jobs' containers (all jobs: None) and of
        `also` (containers that just left a job). A list depends only on its
        job's members, so one registration costs its job, not the cluster."""
        if jobs is None:
            self._by_job, self._member_job = {}, {}
            for cid in set(self.topo.containers) | set(self.regs):
                self._index(cid)
            scope = set(self.lists) | {c for cs in self._by_job.values() for c in cs}
        else:
            scope = set(also or ())
            for j in jobs:
                scope |= self._by_job.get(j, set())
        members = {cid: m for cid in scope if (m := self._member(cid)) is not None}
        new_lists = build_lists(members, self.skeletons)
        changed: dict[str, tuple[int, PingList]] = {}
        for cid in scope:
            old = self.lists.get(cid, {})
            new = new_lists.get(cid)
            if new is None:  # no longer a member; its version is kept (versions only grow)
                if cid in self.lists:
                    self._count(old, -1)
                    del self.lists[cid]
                    if cid in self.versions:
                        changed[cid] = (self.versions[cid], {})
                continue
            d = diff_lists(old, new)
            if d or cid not in self.versions:
                version = self.versions.get(cid, 0) + 1
                self.versions[cid] = version
                changed[cid] = (version, new)
                for q in self._list_subs.get(cid, []):
                    q.offer(ListUpdate(version=version, full=False, diff=d))
            self._count(old, -1)
            self._count(new, +1)
            self.lists[cid] = new
        if changed and self.store is not None:
            self.store.save_lists(changed)
        metrics.PINGLIST_TARGETS.set(self._targets)
        metrics.PINGLIST_ACTIVE.set(self._active)

    def _count(self, plist: PingList, sign: int) -> None:
        self._targets += sign * len(plist)
        self._active += sign * sum(t.active for t in plist.values())

    def register(self, reg: Registration, now: float) -> None:
        with self._lock:
            validate_registration(reg, self.topo, self._owner)
            prev = self.regs.get(reg.container)
            _, old_job = self._job_of(reg.container)
            # Re-registering keeps readiness only if the agent says so again.
            reg = reg.with_heartbeat(ready=False, now=now)
            self.regs[reg.container] = reg
            if prev is not None:
                for e in prev.endpoints:
                    self._owner.pop(e.id, None)
            self._owner.update({e.id: reg.container for e in reg.endpoints})
            was_gone = reg.container in self.departed
            self.departed.discard(reg.container)
            self._live[reg.container] = True
            if self.store is not None:
                self.store.save_registration(reg)
                if was_gone:
                    self.store.arrived(reg.container)
            if prev is None or prev != reg:
                self._index(reg.container)
                self._recompute({old_job, reg.job}, also={reg.container})
                self.membership_changed.set()
            self._publish(self._agent_state(reg, now))
            metrics.AGENTS_REGISTERED.set(len(self.regs))

    def heartbeat(self, container: str, ready: bool, now: float) -> bool:
        """Record liveness; False when the container is unknown (re-register)."""
        with self._lock:
            reg = self.regs.get(container)
            if reg is None:
                return False
            was_live = self._live.get(container, True)
            self.regs[container] = reg.with_heartbeat(ready, now)
            self._live[container] = True
            if reg.ready != ready:
                if self.store is not None:
                    self.store.save_registration(self.regs[container])
                self._recompute({reg.job})
            if reg.ready != ready or not was_live:
                self._publish(self._agent_state(self.regs[container], now))
            return True

    def deregister(self, container: str, now: float) -> None:
        with self._lock:
            reg = self.regs.pop(container, None)
            if reg is None:
                raise NotFoundError(f"unknown container '{container}'")
            self._live.pop(container, None)
            self.departed.add(container)
            for e in reg.endpoints:
                self._owner.pop(e.id, None)
            if self.store is not None:
                self.store.delete_registration(container, departed=True)
            self._index(container)
            self._recompute({reg.job}, also={container})
            self.membership_changed.set()
            self._publish(AgentState(container=container,
                                     endpoints=tuple(e.id for e in reg.endpoints),
                                     registered=False, ready=False, last_heartbeat=now))
            metrics.AGENTS_REGISTERED.set(len(self.regs))

    def expire(self, now: float) -> list[str]:
        """Agents silent for longer than the timeout: announce them to the
        analyzer (a crashed agent is not a network fault). Their targets stay
        in the lists so a real outage keeps showing."""
        with self._lock:
            gone = [c for c, r in self.regs.items()
                    if self._live.get(c, True) and now - r.last_heartbeat > self.heartbeat_timeout]
            for c in gone:
                self._live[c] = False
                self._publish(self._agent_state(self.regs[c], now))
            return gone

    def _agent_state(self, reg: Registration, now: float) -> AgentState:
        live = self._live.get(reg.container, True)
        return AgentState(container=reg.container, endpoints=tuple(e.id for e in reg.endpoints),
                          registered=True, ready=reg.ready and live,
                          last_heartbeat=reg.last_heartbeat)

    def agent_states(self, now: float) -> list[AgentState]:
        with self._lock:
            return [self._agent_state(r, now) for r in self.regs.values()]

    # -- skeleton inference -------------------------------------------------
    def counter_snapshot(self, job: str) -> tuple[list[str], list[CounterSample]]:
        """The job's registered endpoints and their recent counter samples."""
        with self._lock:  # the job's members, not every registration (once per job)
            eps = [e.id for c in sorted(self._by_job.get(job, ()))
                   if (r := self.regs.get(c)) is not None for e in r.endpoints]
            samples = [s for e in eps for s in self.counters.get(e, ())]
            return eps, samples

    def skeleton_view(self) -> dict[str, object]:
        """Each job's skeleton as people read it: the latest inference and
        how many pairs its ping lists hold now."""
        with self._lock:
            probed: dict[str, int] = {}
            job_of = {e.id: r.job for r in self.regs.values() for e in r.endpoints}
            for plist in self.lists.values():
                for src, _dst in plist:
                    job = job_of.get(src)
                    if job is not None:
                        probed[job] = probed.get(job, 0) + 1
            jobs = sorted(set(probed) | set(self.inference))
            return {"jobs": [{**self.inference.get(j, {"job": j, "status":
                                                       "rail-aligned: not inferred yet"}),
                              "ping_pairs": probed.get(j, 0)} for j in jobs]}

    def apply_skeleton(self, job: str, skeleton: JobSkeleton | None,
                       summary: dict[str, object]) -> None:
        """Put a job's new skeleton in force (None: back to rail-aligned);
        agents get only the changes."""
        with self._lock:
            self.inference[job] = summary
            if skeleton is None:
                self.skeletons.pop(job, None)
            else:
                self.skeletons[job] = skeleton
            self._recompute({job})

    def jobs(self) -> list[str]:
        with self._lock:
            return sorted({r.job for r in self.regs.values() if r.job})

    # -- ping-list streams --------------------------------------------------
    def subscribe_list(self, container: str, sink: Sink[ListUpdate]) -> ListUpdate:
        """Future diffs go to `sink`; the full list now is returned, atomically."""
        with self._lock:
            snapshot = self.list_snapshot(container)
            self._list_subs.setdefault(container, []).append(sink)
            return snapshot

    def list_snapshot(self, container: str) -> ListUpdate:
        """The whole list now (a new stream, or one that fell behind)."""
        with self._lock:
            if container not in self.lists:
                raise NotFoundError(f"unknown container '{container}'")
            plist = self.lists[container]
            return ListUpdate(version=self.versions[container], full=True,
                              diff=ListDiff(upsert=tuple(plist[k] for k in sorted(plist)),
                                            remove=()))

    def resync_list(self, container: str, reset: Callable[[], None]) -> ListUpdate:
        """After a stream fell behind: empty its sink (`reset`) and take the
        whole list in one step under the lock. Updates are offered under the
        same lock, so every one the sink takes afterwards is newer than the
        list returned; emptied first and read after, an update in between
        went out after the newer whole list and undid part of it (a target
        turned back inactive, the version wound back)."""
        with self._lock:
            reset()
            return self.list_snapshot(container)

    def unsubscribe_list(self, container: str, sink: Sink[ListUpdate]) -> None:
        with self._lock:
            subs = self._list_subs.get(container, [])
            if sink in subs:
                subs.remove(sink)

    # -- active checks ------------------------------------------------------
    def start_check(self, pairs: Sequence[tuple[str, str]], duration_s: float, rate_hz: float
                    ) -> tuple[str, list[tuple[tuple[str, str], str]]]:
        """Order the probing agents of these pairs to check them now; returns
        the check id and the pairs that cannot be checked, with why."""
        with self._lock:
            owner = {k: cid for cid, plist in self.lists.items() for k in plist}
            orders: dict[str, list[Target]] = {}
            asked: dict[str, list[tuple[str, str]]] = {}
            unchecked: list[tuple[tuple[str, str], str]] = []
            for a, b in pairs:
                key = (a, b) if (a, b) in owner else (b, a)
                cid = owner.get(key)
                if cid is None:
                    unchecked.append(((a, b), "not a monitored pair"))
                elif not self.lists[cid][key].active:
                    unchecked.append(((a, b), "the target's agent is not ready"))
                elif not self._list_subs.get(cid):
                    unchecked.append(((a, b), f"the prober {cid} is not connected"))
                else:
                    orders.setdefault(cid, []).append(self.lists[cid][key])
                    asked.setdefault(cid, []).append((a, b))
            check_id = f"chk-{next(self._check_ids)}"
            pending = _PendingCheck(waiting=set(orders), ordered=asked)
            self._checks[check_id] = pending
            for cid, targets in orders.items():
                update = self._riding(cid, CheckOrder(check_id, tuple(targets), duration_s,
                                                      rate_hz))
                if not any([q.offer(update) for q in self._list_subs[cid]]):
                    # Its stream fell behind and is being resynced: the
                    # order went nowhere, so nobody waits for its answer.
                    pending.waiting.discard(cid)
                    unchecked += [(pair, f"the prober {cid} is catching up with its list; "
                                         "try again") for pair in asked.pop(cid)]
            if not pending.waiting:
                pending.done.set()
            self._wake_switch_readers(check_id, orders)
            return check_id, unchecked

    def _wake_switch_readers(self, check_id: str, orders: dict[str, list[Target]]) -> None:
        """Each overlay path a check traces ends in its target host's switch
        table: one connected agent on every target host no prober runs on
        gets an order with no targets, which only makes it read its switch
        now. Nobody waits for an answer to it."""
        hosts = {self.regs[cid].host for cid in orders if cid in self.regs}
        for target in (t for ts in orders.values() for t in ts):
            cid = self._owner.get(target.dst)
            reg = self.regs.get(cid) if cid is not None else None
            if cid is None or reg is None or reg.host in hosts or not self._list_subs.get(cid):
                continue
            hosts.add(reg.host)
            wake = self._riding(cid, CheckOrder(check_id, (), 0.0, 0.0))
            for q in self._list_subs[cid]:
                q.offer(wake)

    def _riding(self, container: str, order: CheckOrder) -> ListUpdate:
        """A check order on the container's list stream, the list unchanged."""
        return ListUpdate(version=self.versions.get(container, 0), full=False,
                          diff=ListDiff(upsert=(), remove=()), check=order)

    def accept_check(self, container: str, check_id: str, windows: Sequence[WindowStats]
                     ) -> tuple[int, int]:
        """One agent's check results; windows for targets it was not asked
        to check are rejected (so are results for an unknown or finished check)."""
        with self._lock:
            pending = self._checks.get(check_id)
            if pending is None or container not in pending.waiting:
                return 0, len(windows)
            mine = {e.id for e in self.regs[container].endpoints} if container in self.regs \
                else set()
            ok = []
            for w in windows:
                why = "not its own endpoint's" if w.src not in mine else w.problem()
                if why is None:
                    ok.append(w)
                else:
                    pending.rejected[frozenset((w.src, w.dst))] = why
            pending.windows.extend(ok)
            pending.waiting.discard(container)
            if not pending.waiting:
                pending.done.set()
            return len(ok), len(windows) - len(ok)

    def wait_check(self, check_id: str, timeout_s: float
                   ) -> tuple[list[WindowStats], list[str], list[tuple[tuple[str, str], str]]]:
        """(the windows reported, the containers that did not report in time,
        the ordered pairs without a window and why). A pair its prober
        reported no window for is named, never left to look checked: the
        caller would otherwise read an older verdict as the check's."""
        with self._lock:
            pending = self._checks.get(check_id)
        if pending is None:
            raise NotFoundError(f"unknown check '{check_id}'")
        pending.done.wait(timeout_s)
        with self._lock:
            self._checks.pop(check_id, None)
            answered = {frozenset((w.src, w.dst)) for w in pending.windows}

            def why(cid: str, pair: frozenset[str]) -> str:
                if cid in pending.waiting:
                    return "the prober's agent did not report in time"
                if pair in pending.rejected:
                    return (f"the prober's agent {cid} sent a window that cannot be trusted: "
                            f"{pending.rejected[pair]}")
                return f"the prober's agent {cid} reported no window for it"

            missing = [(pair, why(cid, frozenset(pair)))
                       for cid, asked in sorted(pending.ordered.items()) for pair in asked
                       if frozenset(pair) not in answered]
            return list(pending.windows), sorted(pending.waiting), missing

    # -- reports ------------------------------------------------------------
    def accept_windows(self, container: str, windows: WindowBatch) -> tuple[int, int]:
        """Pass an agent's windows on to the analyzers, less those it cannot
        vouch for: bad numbers (`WindowBatch.problems`) or a prober that is
        not its own. Column-wise: half a million windows arrive every 30 s."""
        with self._lock:
            reg = self.regs.get(container)
            if reg is None:
                raise NotFoundError(f"unknown container '{container}'")
            own = {e.id for e in reg.endpoints}
            n = len(windows)
            why = dict(windows.problems())
            foreign = np.array([x not in own for x in windows.names], dtype=bool)
            for i in np.flatnonzero(foreign[windows.src]).tolist():
                why.setdefault(i, f"src '{windows.names[int(windows.src[i])]}' is not an "
                                  f"endpoint of '{container}'")
            for i in sorted(why)[:REJECTS_LOGGED]:
                log.warning("window from %s rejected: %s", container, why[i])
            if why:
                metrics.REPORTS_REJECTED.labels(kind="window").inc(len(why))
                keep = np.ones(n, dtype=bool)
                keep[list(why)] = False
                windows = windows.take(np.flatnonzero(keep))
            if len(windows):
                self._publish(windows)
            metrics.REPORTS_ACCEPTED.labels(kind="window").inc(len(windows))
            return len(windows), n - len(windows)

    def accept_counters(self, container: str, samples: Sequence[CounterSample]) -> tuple[int, int]:
        with self._lock:
            reg = self.regs.get(container)
            if reg is None:
                raise NotFoundError(f"unknown container '{container}'")
            own = {e.id for e in reg.endpoints}
            ok = 0
            for s in samples:
                if s.problem() is None and s.endpoint in own:
                    self.counters.setdefault(s.endpoint, deque(maxlen=COUNTER_HISTORY)).append(s)
                    ok += 1
                else:
                    metrics.REPORTS_REJECTED.labels(kind="counter").inc()
            metrics.REPORTS_ACCEPTED.labels(kind="counter").inc(ok)
            return ok, len(samples) - ok

    def accept_vswitch(self, container: str, dump: VSwitchDump) -> tuple[int, int]:
        """A host's virtual-switch table, for the analyzer's overlay tracing;
        only an agent on that host may speak for it."""
        with self._lock:
            reg = self.regs.get(container)
            if reg is None:
                raise NotFoundError(f"unknown container '{container}'")
            if dump.host != reg.host:
                log.warning("vswitch dump from %s names host %s, not its own %s", container,
                            dump.host, reg.host)
                metrics.REPORTS_REJECTED.labels(kind="vswitch").inc()
                return 0, 1
            self._publish(dump)
            metrics.REPORTS_ACCEPTED.labels(kind="vswitch").inc()
            return 1, 0

    def subscribe_feed(self, now: float, sink: Sink[ReportEvent]) -> None:
        """Reports for the analyzer, starting with every agent's state."""
        with self._lock:
            for s in self.agent_states(now):
                sink.offer(s)
            self._feed_subs.append(sink)

    def unsubscribe_feed(self, sink: Sink[ReportEvent]) -> None:
        with self._lock:
            if sink in self._feed_subs:
                self._feed_subs.remove(sink)

    def _publish(self, event: ReportEvent) -> None:
        for q in self._feed_subs:
            if not q.offer(event):
                metrics.FEED_DROPPED.inc()
