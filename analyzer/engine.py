"""The analyzer's state: windows in, incidents and verdicts out.

Pure logic driven by the caller's clock: `tick(now)` processes every window
whose agents have all had time to report (its end plus a grace period), so
live and offline analysis run the very same code."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from analyzer import metrics
from analyzer.batch import WindowBatch
from analyzer.detect import (
    STATS,
    Detector,
    DriftReport,
    Observation,
    poisson_sf,
)
from analyzer.diagnose import asked_pairs, check_symptoms, diagnosis, require_known, time_range
from analyzer.history import PairHistory
from analyzer.incident_rules import (
    FLOW_FACTS,
    Streak,
    alike,
    continued,
    guessed,
    half_shared,
    joined,
    may_follow,
    next_streak,
    outranks,
    reported,
    stands_for,
)
from analyzer.localize import (
    CERTAIN,
    LOSSY,
    Finding,
    Pair,
    localize,
    rehome_stray_loss,
    unshared,
    worst_symptom,
)
from analyzer.onset import drift_onset, ending, onset
from analyzer.overlay import OverlayTables
from analyzer.paths import UnderlayPaths
from analyzer.pooling import PoolingGroups
from analyzer.routes import RouteEvidence
from analyzer.seen import SeenWindow, SeenWindows
from analyzer.store import IncidentStore
from analyzer.verdicts import CheckOutcome, Diagnosis
from analyzer.window_evidence import row_label, window_evidence
from analyzer.window_sums import WindowSums
from netskel.arrays import row_nanmedian, unique
from netskel.config import AnalyzerConfig
from netskel.model import LAYERS, AgentState, Incident, VSwitchDump, WindowStats, pair_key
from netskel.topology import Topology

log = logging.getLogger(__name__)

MIN_SUSTAINED_PROBES = 16  # probes that make "slow for most of the window" credible
DEPARTED_KEPT = 100_000  # departed endpoints remembered (a window's worth is what matters)
# Findings less certain than this wait a window longer before they open an incident.
WEAK_CONFIDENCE = 0.5
_FABRIC = {"link", "switch"}  # components an incident may be renamed between (_moves)
_LOCATED = {"link", "switch", "host"}  # components a pair may cross (_may_cross)


class _CleanRun(NamedTuple):
    """An open incident's clean windows in a row: how many, since when, and
    (a loss incident's) the probes its pairs were expected to lose in them
    at their healthy rates and lost."""
    windows: int
    since: float
    expected: float = 0.0
    lost: int = 0


@dataclasses.dataclass
class _Tally:
    """One window's findings being taken (Analyzer._update_incidents): what
    they are judged by, and what taking them has done so far."""

    start: float
    evidence: Mapping[Pair, dict[str, object]]
    anomalous: Mapping[Pair, str]
    strong: Container[Pair]
    counts: tuple[np.ndarray, np.ndarray] | None
    tail_only: Container[Pair]
    before: dict[tuple[str, str], Streak]  # last window's streaks, for findings that moved
    changed: list[Incident] = dataclasses.field(default_factory=list)
    seen_keys: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    advanced: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # streaks counted
    relapsing: set[str] = dataclasses.field(default_factory=set)  # incidents whose slowdown counted
    # Loss incidents whose findings this window were not their fault.
    faded: set[str] = dataclasses.field(default_factory=set)
    # Incidents a finding spoke for this window.
    spoken: set[str] = dataclasses.field(default_factory=set)
    # Per incident a loss finding spoke for this window, that finding's pairs.
    lossy_pairs: dict[str, set[Pair]] = dataclasses.field(default_factory=dict)
    # Pairs the incidents open at the window's start hold.
    held: set[Pair] = dataclasses.field(default_factory=set)
    # Per pair id, the share of its received probes in the slow tail this
    # window; None: not known (a tail is taken to have lasted the window).
    slow_share: np.ndarray | None = None
    # The components this window's findings name.
    named: set[tuple[str, str]] = dataclasses.field(default_factory=set)


class _Explained:
    """Pairs the faults of these incidents may account for: their own, and
    for a switch, link or host, every pair that may cross it."""

    def __init__(self, incidents: list[Incident],
                 may_cross: Callable[[Pair, tuple[str, str]], bool]) -> None:
        self._pairs = {p for inc in incidents for p in inc.pairs}
        self._fabric = [(inc.component.type, inc.component.id) for inc in incidents
                        if inc.component.type in _LOCATED]
        self._may_cross = may_cross

    def __contains__(self, pair: object) -> bool:
        if pair in self._pairs:
            return True
        return isinstance(pair, tuple) and any(self._may_cross(pair, c) for c in self._fabric)


class Analyzer:
    def __init__(self, topo: Topology, cfg: AnalyzerConfig, grace_s: float = 3.0) -> None:
        self.topo = topo
        self.cfg = cfg
        self.grace_s = grace_s
        self.paths = UnderlayPaths(topo)
        self._endpoints_of_host: dict[str, list[str]] | None = None
        self._pending_batches: dict[tuple[float, float], list[WindowBatch]] = defaultdict(list)
        self._seen = SeenWindows()
        self._by_endpoint: dict[str, set[Pair]] = defaultdict(set)
        self._pairs: list[Pair] = []            # pair id -> pair
        self._pair_id: dict[Pair, int] = {}
        self._row_pair = np.zeros(0, dtype=np.int64)  # detector row -> pair id
        self.groups = PoolingGroups(self._switches_of)  # detector row -> loss-pooling groups
        self._under: dict[str, set[str]] = {}  # switch -> endpoints whose NIC hangs off it
        # This window's probes sent and lost per pair id (refining an incident reads them).
        self._win_sent: np.ndarray = np.zeros(0)
        self._win_lost: np.ndarray = np.zeros(0)
        # The last windows' probes lost and received, and the received RTTs'
        # sum, per pair id: when an incident began (analyzer/onset.py).
        self._sums = WindowSums()
        self._onset_due: dict[str, float] = {}  # young incident -> its first window's start
        self.incidents: dict[str, Incident] = {}
        # Keyed by component: a loss that turns into unreachability is one incident.
        self._open: dict[tuple[str, str], str] = {}
        self._streak: dict[tuple[str, str], Streak] = {}
        self._window_len = 30.0  # of the windows being processed (set per window)
        self._open_drift: dict[tuple[str, str], str] = {}
        self._streak_drift: dict[tuple[str, str], Streak] = {}
        self.detector = Detector(cfg)
        self.history = PairHistory()
        self.routes = RouteEvidence(topo, self.paths, cfg)
        self._clean: dict[str, _CleanRun] = {}  # open incident -> its clean run
        # Component -> (its short-term incident, the window that closed it):
        # named again this soon, it is the same fault back (_reopened). One
        # entry a component, so at most the topology's; an incident retired
        # meanwhile is not reopened.
        self._closed_at: dict[tuple[str, str], tuple[str, float]] = {}
        # Open incident whose clean run has begun -> (slow windows, since) of
        # a slowdown on its pairs since: its fault back only once that would
        # open an incident of its own (_relapsed).
        self._relapse: dict[str, tuple[int, float]] = {}
        # Open link or switch incident -> the links and switches its windows
        # named, with the sum of their confidences: what it is named for (_moves).
        self._votes: dict[str, dict[tuple[str, str], float]] = {}
        # Link -> the links its findings' probes could not tell it from
        # (`evidence.indistinguishable_from`): one fault may be named by
        # either, or by a switch at either's end (_nodes). At most every link.
        self._twins: dict[str, set[str]] = defaultdict(set)
        # Incidents folded into another since the last tick, as last seen
        # (closed, `evidence.merged_into`): removed, and told to watchers once.
        self._merged: list[Incident] = []
        self._last_probe: dict[str, float] = {}  # endpoint -> start of its latest probing window
        self._silent: set[str] = set()
        self.overlay = OverlayTables(topo)
        self.dead: set[str] = set()
        # Endpoints whose agent deregistered (left on purpose), and when:
        # probes toward them around that time are lost by design.
        self.departed: dict[str, float] = {}
        self.known_endpoints: set[str] = set(topo.endpoints)
        self._seq = 0
        self._store: IncidentStore | None = None
        self.processed_until = 0.0

    def reconfigure(self, cfg: AnalyzerConfig) -> None:
        """Thresholds from a reloaded file (`netskel.config.take_live` keeps
        what sizes state as it was): the next window is judged by them."""
        self.cfg = self.detector.cfg = self.routes.cfg = cfg

    # -- input ----------------------------------------------------------------
    def add_windows(self, windows: Iterable[WindowStats]) -> list[str]:
        """Queue windows for analysis; return the reasons of those rejected."""
        return self.add_live(WindowBatch.from_windows(list(windows)))

    def add_live(self, batch: WindowBatch) -> list[str]:
        """Live windows in columns (as `serde` decodes an agent's report):
        validated, charted (the web page, PairHistory) and queued
        column-wise, with no Python object per window. Returns the reasons
        of those rejected."""
        n = len(batch)
        if not n:
            return []
        problems = batch.problems()
        bad = np.zeros(n, dtype=bool)
        bad[[i for i, _ in problems]] = True
        why = dict(problems)
        late = ~bad & (batch.end <= self.processed_until)
        for i in np.flatnonzero(late).tolist():
            why[i] = "window arrived after its time was analysed"
        keep = ~(bad | late)
        if self.departed:
            # A window that overlaps (or follows) one of its ends leaving:
            # its peer left on purpose, not evidence of anything.
            left = np.array([self.departed.get(x, math.inf) for x in batch.names])
            span = batch.end - batch.start
            keep &= ~((batch.end > left[batch.src] - span) | (batch.end > left[batch.dst] - span))
        rejected = [f"{batch.names[int(batch.src[i])]}->{batch.names[int(batch.dst[i])]}: "
                    f"{why[i]}" for i in sorted(why)]
        if not keep.all():
            batch = batch.take(np.flatnonzero(keep))
        self.history.record_batch(batch)
        for start, end, part in batch.by_window():
            self._pending_batches[(start, end)].append(part)
        return rejected

    def add_batch(self, batch: WindowBatch) -> list[str]:
        """Queue windows computed here from checked records (`netskel
        analyze`): as columns, never one object per window, and with no
        charts. Returns the reasons of those rejected."""
        rejected = []
        for start, end, part in batch.by_window():
            if end <= self.processed_until:
                rejected.append(f"{len(part)} windows of [{start}, {end}): "
                                "window arrived after its time was analysed")
                continue
            self._pending_batches[(start, end)].append(part)
        return rejected

    def set_agent(self, state: AgentState) -> None:
        self.known_endpoints.update(state.endpoints)
        if state.registered and state.ready:
            self.dead.difference_update(state.endpoints)
        elif state.registered:
            self.dead.update(state.endpoints)
        else:  # deregistered: gone on purpose, not a fault (nor a silent agent)
            self.dead.difference_update(state.endpoints)
            for e in state.endpoints:
                self._last_probe.pop(e, None)
            self.departed.update({e: state.last_heartbeat for e in state.endpoints})
            if len(self.departed) > DEPARTED_KEPT:  # containers come and go: forget the oldest
                for e, _ in sorted(self.departed.items(), key=lambda x: x[1])[:len(self.departed)
                                                                              - DEPARTED_KEPT]:
                    del self.departed[e]
        if state.registered:
            for e in state.endpoints:
                self.departed.pop(e, None)

    def set_vswitch(self, dump: VSwitchDump) -> None:
        """A live table from the host's agent replaces that host's snapshot."""
        if dump.host not in self.topo.hosts:
            log.warning("vswitch dump for unknown host %s ignored", dump.host)
            return
        self.overlay.set_host(dump)

    # -- processing -----------------------------------------------------------
    def tick(self, now: float, progress: Callable[[str, int, int], None] | None = None
             ) -> list[Incident]:
        """Analyse every window that is complete; return incidents that changed."""
        changed: dict[str, Incident] = {}
        due = sorted(k for k in self._pending_batches if k[1] + self.grace_s <= now)
        for n, key in enumerate(due):
            if progress is not None:
                progress("analysing windows", n, len(due))
            windows = WindowBatch.concat(self._pending_batches.pop(key))
            t0 = time.perf_counter()
            for inc in self.process(key[0], key[1], windows):
                changed[inc.id] = inc
            metrics.ANALYSIS_SECONDS.observe(time.perf_counter() - t0)
            self.processed_until = max(self.processed_until, key[1])
        if progress is not None and due:
            progress("analysing windows", len(due), len(due))
        self._prune(now)
        removed = self._retire(now) + [i.id for i in self._merged]
        gone, self._merged = self._merged, []
        changed = {k: v for k, v in changed.items() if k in self.incidents}
        if self._store is not None and (changed or removed):
            where = {**{v: "short" for v in self._open.values()},
                     **{v: "drift" for v in self._open_drift.values()}}
            self._store.save([(i, where.get(i.id, "")) for i in changed.values()], self._seq,
                             removed)
        open_now = [i for i in self.incidents.values() if i.end is None]
        open_by_layer = Counter(i.layer for i in open_now)
        for layer in LAYERS:
            metrics.INCIDENTS_OPEN.labels(layer=layer).set(open_by_layer[layer])
        metrics.OPEN_INCIDENTS.set(open_now)
        return list(changed.values()) + gone

    def attach_store(self, store: IncidentStore) -> None:
        """Incidents from before a restart: open ones stay open under their
        ids (their component is their key again); new ids follow the last."""
        incidents, seq = store.load()
        self._store = store
        self._seq = max(self._seq, seq)
        for inc, where in incidents:
            self.incidents[inc.id] = inc
            key = (inc.component.type, inc.component.id)
            if where == "short":
                self._open[key] = inc.id
            elif where == "drift":
                self._open_drift[key] = inc.id
        if incidents:
            log.info("%d incidents from before the restart (%d open)", len(incidents),
                     sum(1 for _, w in incidents if w))

    def _retire(self, now: float) -> list[str]:
        """Closed incidents past their retention (count and age) are removed."""
        closed = sorted((i.end or 0.0, i.id) for i in self.incidents.values() if i.end is not None)
        if not closed:
            return []
        too_many = max(0, len(closed) - self.cfg.incidents_kept)
        oldest = now - self.cfg.incidents_max_age_s if math.isfinite(now) else -math.inf
        gone = [iid for k, (end, iid) in enumerate(closed) if k < too_many or end < oldest]
        for iid in gone:
            del self.incidents[iid]
        return gone

    def flush(self, progress: Callable[[str, int, int], None] | None = None) -> list[Incident]:
        """Analyse everything pending (offline: the recording is complete)."""
        return self.tick(float("inf"), progress)

    def _strong_pairs(self, pid: np.ndarray, sustained: np.ndarray, received: np.ndarray
                      ) -> set[Pair]:
        """Pairs slow for most of the window by enough probes to say so: every
        row of the pair sustained and at least MIN_SUSTAINED_PROBES received
        among them (one row of 7 probes is slow by chance in a short burst)."""
        rows = np.bincount(pid, minlength=len(self._pairs))
        slow = np.bincount(pid[sustained], minlength=len(self._pairs))
        got = np.bincount(pid[sustained], weights=received[sustained], minlength=len(self._pairs))
        ok = np.flatnonzero((slow > 0) & (slow == rows) & (got >= MIN_SUSTAINED_PROBES))
        return {self._pairs[int(i)] for i in ok}

    def _tail_only_pairs(self, pid: np.ndarray, obs: Observation) -> set[Pair]:
        """Pairs whose only anomaly this window is a slow tail."""
        if obs.tail is None or not obs.tail.any():
            return set()
        other = (obs.latency & ~obs.tail) | obs.loss | obs.unreachable
        ids = np.setdiff1d(pid[obs.tail], pid[other])
        return {self._pairs[int(i)] for i in ids}

    @staticmethod
    def _slow_beside(f: Finding, anomalous: Mapping[Pair, str], edge: set[Pair]) -> Finding:
        """A slow finding is not made a loss finding by lossy pairs an open
        incident at the edge already explains: joined to a congested spine
        link's slow pairs (its route crossed it), one such pair made the
        congestion a loss finding, which opens at once where a slowdown must
        last. Those pairs are left to their own incident."""
        slow = [p for p in f.pairs if anomalous.get(p) == "latency"]
        if f.symptom == "latency" or not slow or \
                not all(p in edge for p in f.pairs if anomalous.get(p) != "latency"):
            return f
        return dataclasses.replace(f, pairs=slow, symptom="latency")

    def _held_at_edge(self) -> set[Pair]:
        """Pairs an open loss incident holds on a NIC's link, a NIC, a host
        or an agent: their losses are that edge's, wherever else their
        routes went (see `_slow_beside`)."""
        out: set[Pair] = set()
        for inc_id in self._open.values():
            inc = self.incidents[inc_id]
            c = inc.component
            if inc.symptom == "loss" and (c.type in ("nic", "host", "agent")
                                          or (c.type == "link" and self._host_of(c.id))):
                out.update(inc.pairs)
        return out

    def _localize(self, anomalous: dict[Pair, str], healthy: set[Pair],
                  clears: dict[str, int] | None = None,
                  switch_clears: Callable[[str], int] | None = None,
                  pooled: Mapping[Pair, str] | None = None,
                  partly_slow: Container[Pair] = ()) -> list[Finding]:
        def candidates(pair: Pair) -> dict[str, float]:
            symptom = anomalous.get(pair)
            return self.routes.accused(pair, symptom) if symptom else self.routes.candidates(pair)
        return rehome_stray_loss(
            localize(anomalous, healthy, self.dead | self._silent, candidates,
                     lambda p: self.overlay.round_trip(*p), self._switches_of, clears,
                     switch_clears, self._host_of, self._container_of, pooled, partly_slow),
            anomalous, self._may_cross)

    def _pooled_links(self, obs: Observation, pid: np.ndarray, anomalous: Mapping[Pair, str]
                      ) -> dict[Pair, str]:
        """Anomalous pairs whose losses the pooled test of a link all their
        paths cross explained, and that link: its pairs' losses together over
        the windows were significant, which says where even when this
        window's healthy pairs on it outnumber the lossy ones."""
        if obs.loss_group is None:
            return {}
        out: dict[Pair, str] = {}
        for i in np.flatnonzero(obs.loss_group >= 0).tolist():
            link = self.groups.link_of[int(obs.loss_group[i])]
            pair = self._pairs[int(pid[i])]
            if link and pair in anomalous:
                out.setdefault(pair, link)
        return out

    def _switches_of(self, link: str) -> tuple[str, ...]:
        return tuple(x for x in self.topo.links.get(link, ()) if x in self.topo.switches)

    def _open_incidents(self, kind: str) -> list[Incident]:
        return [inc for inc in (self.incidents[i] for i in self._open.values())
                if inc.component.type == kind]

    def _related(self, a: tuple[str, str], b: tuple[str, str]) -> bool:
        """Whether two findings can be one fault named twice: the same or
        touching components (a link and a switch or host at its end, two
        links of one switch), or a guess. Benign congestion of one switch,
        then of another, shares pairs too but is two episodes: chained, three
        short ones in a row made an incident."""
        if a == b or "endpoint" in (a[0], b[0]):
            return True
        return bool(self._nodes(a) & self._nodes(b))

    def _nodes(self, key: tuple[str, str]) -> set[str]:
        kind, ident = key
        if kind == "link":
            host = self._host_of(ident)
            ends = {x for t in (ident, *self._twins.get(ident, ())) for x in self.topo.links.get(t, ())}
            return ends | ({host} if host else set())
        if kind == "nic" and ident in self.topo.nics:
            return {ident, self.topo.nics[ident].host}
        return {ident}

    def _note_twins(self, findings: Sequence[Finding]) -> None:
        """Remember which links the probes cannot tell apart. A slow
        ToR-spine link on a rail of two ToRs was named for two windows, then
        once as the far ToR (where its twin ends); that switch was no
        neighbour of the link, so the run restarted and the incident opened
        a minute late (bench/inject.py --place 114, uplinklat: 62 s)."""
        for f in findings:
            twins = f.evidence.get("indistinguishable_from") if f.component.type == "link" else None
            for t in twins or ():
                self._twins[f.component.id].add(str(t))
                self._twins[str(t)].add(f.component.id)

    def _on_lossy_hosts(self) -> set[str]:
        """Endpoints of hosts an open incident says lose probes: like a stopped
        agent's, their losses are explained, and would make every link on
        their routes look lossy to the pairs beside them."""
        hosts = {inc.component.id for inc in self._open_incidents("host")
                 if inc.symptom in LOSSY}
        if not hosts:
            return set()
        if self._endpoints_of_host is None:  # once: this runs every window while one is open
            self._endpoints_of_host = defaultdict(list)
            for e in self.topo.endpoints:
                self._endpoints_of_host[self.topo.host_of_endpoint(e)].append(e)
        return {e for h in hosts for e in self._endpoints_of_host.get(h, ())}

    def _container_of(self, endpoint: str) -> str | None:
        ep = self.topo.endpoints.get(endpoint)
        return ep.container if ep else None

    def _host_of(self, link: str) -> str | None:
        return next((self.topo.nics[x].host for x in self.topo.links.get(link, ())
                     if x in self.topo.nics), None)

    def _note_probers(self, start: float, b: WindowBatch) -> None:
        """An endpoint that probed in recent windows and now sends nothing has
        a dead agent (it neither probes nor answers): offline this is the only
        sign; live it backs the heartbeat."""
        for i in unique(b.src).tolist():
            self._last_probe[b.names[i]] = start
        horizon = start - self.cfg.history_seconds
        # Past the horizon an endpoint that never probes again is forgotten,
        # except one an open agent incident names: while it stays silent its
        # pairs' failures stay the agent's, however long that lasts.
        held = {e for inc in self._open_incidents("agent")
                for e in [inc.component.id, *inc.evidence.get("endpoints", ())]}
        self._silent = {e for e, t in self._last_probe.items()
                        if (horizon <= t or e in held) and t < start and e not in self.departed}
        self.routes.note(b)

    def process(self, start: float, end: float, b: WindowBatch) -> list[Incident]:
        metrics.WINDOWS_ANALYZED.inc(len(b))
        if not len(b):
            return []
        self._window_len = end - start
        self._note_probers(start, b)
        rows = self.detector.rows_for_columns(b.names, b.src, b.dst, b.size, b.protos, b.proto)
        self._index_rows()
        stats, sent, lost, slow = b.stats, b.sent, b.lost, b.slow
        groups = self.groups.of_rows(rows)
        pid = self._row_pair[rows]
        pair_sent, pair_lost = self._sums.note(start, pid, stats, sent, lost, len(self._pairs))
        gone = self.dead | self._silent | self._on_lossy_hosts()
        explained = None
        if gone:
            ids = [i for i, n in enumerate(b.names) if n in gone]
            explained = np.isin(b.src, ids) | np.isin(b.dst, ids)
        obs, drift = self.detector.observe(rows, stats, sent, lost, start, end, groups,
                                           held=self._held_by_loss(pid), slow=slow,
                                           explained=explained)
        flagged = np.flatnonzero(obs.latency | obs.loss | obs.unreachable)
        bad_pairs = unique(pid[flagged])
        anomalous: dict[Pair, str] = {}
        evidence: dict[Pair, dict[str, object]] = {}
        if len(bad_pairs):
            by_pair: dict[int, list[int]] = defaultdict(list)
            for i in np.flatnonzero(np.isin(pid, bad_pairs)).tolist():
                by_pair[int(pid[i])].append(i)
            for p_id, idx in by_pair.items():
                pair = self._pairs[p_id]
                if all(obs.unreachable[i] for i in idx):
                    symptom = "unreachable"
                elif any(obs.loss[i] or obs.unreachable[i] for i in idx):
                    symptom = "loss"
                else:
                    symptom = "latency"
                anomalous[pair] = symptom
                evidence[pair] = {
                    row_label(b.names[b.src[i]], b.names[b.dst[i]], b.protos[b.proto[i]],
                              int(b.size[i])): window_evidence(b, obs, i) for i in idx}
        held_links = {inc.component.id for inc in self._open_incidents("link")
                      if inc.symptom == "loss"}
        for pair, ev in self.routes.lossy_links(len(b), set(anomalous), gone,
                                                held_links).items():
            if pair not in anomalous:
                anomalous[pair] = "loss"
                evidence[pair] = {"lossy_links": ev}
                bad_pairs = np.union1d(bad_pairs, [self._pair_id[pair]])
        # Pairs slow on their routes through a slow link and not on their
        # others: slow on a share of their probes, whatever their window's
        # statistics say (`localize`'s `partly_slow`).
        by_route = self.routes.slow_routes()
        for pair, slow_routes in by_route.items():
            if pair not in anomalous:
                anomalous[pair] = "latency"
                evidence[pair] = {"routes": slow_routes}
                bad_pairs = np.union1d(bad_pairs, [self._pair_id[pair]])
        seen_ids = unique(pid)
        self._seen.add(SeenWindow(start, end, seen_ids,
                                  {int(x): anomalous[self._pairs[int(x)]] for x in bad_pairs}))
        changed = []
        if anomalous or self._open:
            healthy = {self._pairs[i]
                       for i in np.setdiff1d(seen_ids, bad_pairs, assume_unique=True).tolist()}
            healthy_rows = np.flatnonzero(~np.isin(pid, bad_pairs))
            clears = self.groups.link_clears(groups, pid, healthy_rows)
            routed = self.routes.clears(healthy)
            for link, n in routed.items():
                clears[link] = max(clears.get(link, 0), n)
            memo: list[dict[str, int]] = []

            def switch_clears(sw: str) -> int:
                if not memo:
                    memo.append(self.groups.switch_clears(groups, pid, healthy_rows, routed))
                return memo[0].get(sw, 0)

            edge = self._held_at_edge()
            tail_only = self._tail_only_pairs(pid, obs)
            findings = [self._slow_beside(f, anomalous, edge) for f in self._localize(
                anomalous, healthy, clears, switch_clears, self._pooled_links(obs, pid, anomalous),
                tail_only | by_route.keys())]
            strong = self._strong_pairs(pid, obs.sustained, sent - lost)
            # Each pair's probes this window: a loss incident's "clean" windows
            # must really be clean, not merely short of significance.
            npairs = len(self._pairs)
            counts = (np.bincount(pid, weights=sent * obs.loss_baseline, minlength=npairs),
                      pair_lost)
            self._win_sent, self._win_lost = pair_sent, pair_lost
            received = pair_sent - pair_lost
            in_tail = np.bincount(pid, weights=slow, minlength=npairs)
            share = np.divide(in_tail, received, out=np.zeros(npairs), where=received > 0)
            before = len(self.incidents)
            changed += self._update_incidents(start, findings, evidence, healthy | set(anomalous),
                                              anomalous, self._open, self._streak, self._persist,
                                              strong, counts, tail_only, share)
            for inc_id in list(self.incidents)[before:]:
                self._onset_due[inc_id] = self.incidents[inc_id].start
        else:  # a quiet window ends every streak: persistence means windows in a row
            self._streak.clear()
        changed += [i for i in self._read_onsets(start) if i not in changed]
        if drift is not None:
            changed += self._drift_incidents(drift)
        return changed

    def _window_sums(self, inc: Incident, last: float | None = None
                     ) -> tuple[np.ndarray, np.ndarray] | None:
        """(window starts, (3, windows, pairs) lost / received / RTT sums) of
        the incident's pairs over the windows held, less those an open
        incident opened before it holds (unless that leaves none): their
        windows carry that other fault's change, and a slow spine link's
        incident holding a few pairs of a host slowed minutes earlier was
        dated between the two (bench/inject.py, hostslow then uplinklat).
        Read for the end of a fault last seen at `last`, any other incident
        still failing then is such a fault, whenever it opened: a slow
        spine's end was read where a second slow spine sharing most of its
        pairs ended, 77 s late (draw 5005 of session 67)."""
        older: set[Pair] = set()
        for other in self.incidents.values():
            if other is inc:
                if last is None:
                    break
                continue
            if other.end is None or (last is not None and other.end > last):
                older.update(other.pairs)
        own = [p for p in inc.pairs if p not in older] or inc.pairs
        return self._sums.of(np.array([self._pair_id[p] for p in own
                                       if p in self._pair_id], dtype=np.int64))

    def _read_onsets(self, now_start: float) -> list[Incident]:
        """Young short-term incidents start where their fault began, read
        from the windows around their first (analyzer/onset.py), once windows
        after it have come; revised until three have, then left alone."""
        changed = []
        w = self._window_len
        for inc_id, first in list(self._onset_due.items()):
            inc = self.incidents.get(inc_id)
            if inc is None or now_start >= first + 3 * w or inc.end is not None:
                del self._onset_due[inc_id]  # read a last time, if still held
            held = None if inc is None else self._window_sums(inc)
            if inc is None or held is None:
                continue
            lost, received, rtt_sum = held[1]
            began = onset(held[0], lost, received, rtt_sum, first, w, inc.symptom,
                          self._beside(inc))
            if began is not None and inc.end is not None:
                began = min(began, inc.end)  # read after it closed: never past its end
            if began is not None and began != inc.start:
                inc.start = round(began, 3)
                changed.append(inc)
        return changed

    def _beside(self, inc: Incident) -> list[tuple[float, float]]:
        """(start, end) of the other components' incidents on some of the
        incident's pairs: other faults that moved their windows too."""
        mine = set(inc.pairs)
        return [(o.start, math.inf if o.end is None else o.end)
                for o in self.incidents.values()
                if o is not inc and o.component != inc.component and not mine.isdisjoint(o.pairs)]

    def _read_end(self, inc: Incident, last: float) -> float:
        """Where a closing incident's fault ended, read from the windows
        around its last anomalous one (`last`); the first clean window's
        start when they cannot tell (analyzer/onset.py)."""
        fallback = last + self._window_len
        held = self._window_sums(inc, last)
        if held is None:
            return fallback
        lost, received, rtt_sum = held[1]
        end = ending(held[0], lost, received, rtt_sum, last, self._window_len, inc.symptom)
        return fallback if end is None else round(max(end, inc.start), 3)

    def _index_rows(self) -> None:
        """Pair id and loss-pooling groups of detector rows added since the
        last window: each pair's sizes pool together, and with every pair
        crossing the same link (links all its paths cross)."""
        keys = self.detector.keys
        start = len(self._row_pair)
        if start == len(keys):
            return
        new_pid = np.empty(len(keys) - start, dtype=np.int64)
        rows: list[tuple[Pair, list[str]]] = []
        for k, (src, dst, _size, _proto) in enumerate(keys[start:]):
            pair = pair_key(src, dst)
            p_id = self._pair_id.get(pair)
            if p_id is None:
                p_id = self._pair_id[pair] = len(self._pairs)
                self._pairs.append(pair)
                self._by_endpoint[pair[0]].add(pair)
                self._by_endpoint[pair[1]].add(pair)
            new_pid[k] = p_id
            rows.append((pair, [link for link, wt in self.routes.spread(pair).items()
                                if wt >= CERTAIN]))
        self._row_pair = np.concatenate([self._row_pair, new_pid])
        self.groups.extend(rows)

    def _pairs_crossing(self, link: str) -> np.ndarray:
        """Ids of the pairs all of whose paths cross the link."""
        return np.unique(self._row_pair[self.groups.rows_crossing(link)])

    def _lasted(self, symptom: str, first: float, start: float) -> bool:
        """A slowdown opens an incident only once it has lasted
        `latency_min_seconds` (from its first window's start to the current
        window's end): with short windows, more of them are needed."""
        if symptom != "latency":
            return True
        return start + self._window_len - first >= self.cfg.latency_min_seconds

    def _persist(self, symptom: str) -> int:
        if symptom == "latency":
            return self.cfg.latency_persist_windows
        return self.cfg.persist_windows

    def _drift_incidents(self, d: DriftReport) -> list[Incident]:
        """A completed long-term period: pairs whose RTT drifted from their
        reference become degradation findings; pairs tested clean close them."""
        by_pair: dict[Pair, list[int]] = defaultdict(list)
        for k, r in enumerate(d.rows.tolist()):
            src, dst, _, _ = self.detector.keys[r]
            by_pair[pair_key(src, dst)].append(k)
        anomalous = {p: "degradation" for p, ks in by_pair.items() if any(d.flagged[k] for k in ks)}
        if not anomalous and not self._open_drift:
            return []
        evidence: dict[Pair, dict[str, object]] = {}
        for p in anomalous:
            evidence[p] = {}
            for k in by_pair[p]:
                src, dst, size, proto = self.detector.keys[int(d.rows[k])]
                evidence[p][row_label(src, dst, proto, size)] = {
                    "ks_p_value": float(f"{d.pvalue[k]:.3g}"),
                    "median_shift": round(float(d.shift[k]), 4)}
        healthy = {p for p in by_pair if p not in anomalous}
        findings = self._localize(anomalous, healthy)
        # One incident per fault: a drift the short-term tests already
        # reported during the period (open, or closed within it) is that
        # incident, not a second one.
        end = d.period_start + self.cfg.drift_period_s
        during = [inc for iid, inc in self.incidents.items()
                  if iid not in self._open_drift.values() and inc.start < end
                  and (inc.end is None or inc.end >= d.period_start)]
        findings = [f for f in findings
                    if not any(half_shared(set(f.pairs), inc.pairs) for inc in during)]
        for f in findings:
            f.evidence["test"] = ("KS against a log-normal fitted to the pair's reference "
                                  f"period; Benjamini-Hochberg at FDR {self.cfg.drift_fdr}")
        before = len(self.incidents)
        changed = self._update_incidents(d.period_start, findings, evidence, by_pair, anomalous,
                                         self._open_drift, self._streak_drift, lambda _s: 1)
        for inc in list(self.incidents.values())[before:]:
            self._read_drift_start(inc, d, by_pair)
        return changed

    def _read_drift_start(self, inc: Incident, d: DriftReport,
                          by_pair: dict[Pair, list[int]]) -> None:
        """A new drift starts where its flagged rows' medians rose in the
        period (analyzer/onset.py), not at the period's start: that is up to
        30 min before the fault."""
        ks = [k for p in inc.pairs for k in by_pair.get(p, ()) if d.flagged[k]]
        if not ks:
            return
        at = (np.cumsum(d.flagged) - 1)[ks]  # their places among the flagged rows
        with np.errstate(invalid="ignore", divide="ignore"):
            excess = np.log(d.values[at].astype(np.float64)) - d.ref_mu[at, None]
        excess[~np.isfinite(excess)] = np.nan
        have = np.isfinite(excess).any(axis=0)
        if not have.any():
            return
        series = np.full(excess.shape[1], np.nan)
        series[have] = row_nanmedian(excess[:, have].T)
        began = drift_onset(series)
        if began is not None:
            inc.start = round(d.period_start + began * d.window_s, 3)
            inc.evidence["drift_began_window"] = int(began)

    def _prune(self, now: float) -> None:
        horizon = min(now, self.processed_until) - self.cfg.history_seconds
        self._seen.prune(horizon)

    def _update_incidents(self, start: float, findings: list[Finding],
                          evidence: dict[Pair, dict[str, object]],
                          observed: Container[Pair], anomalous: dict[Pair, str],
                          open_map: dict[tuple[str, str], str],
                          streaks: dict[tuple[str, str], Streak],
                          persist: Callable[[str], int], strong: Container[Pair] = (),
                          counts: tuple[np.ndarray, np.ndarray] | None = None,
                          tail_only: Container[Pair] = (),
                          slow_share: np.ndarray | None = None) -> list[Incident]:
        """Findings that persisted open (or grow) incidents; components whose
        pairs were seen healthy close theirs. `counts`: probes expected lost
        at each row's healthy rate and probes lost, per pair id this window,
        to tell a clean window from a quiet one. `strong`: pairs slow for most
        of the window; `tail_only`: pairs whose only anomaly is a slow tail;
        `slow_share`: per pair id, the share of its probes in the slow tail."""
        self._note_twins(findings)
        w = _Tally(start, evidence, anomalous, strong, counts, tail_only, before=dict(streaks),
                   held={p for i in open_map.values() for p in self.incidents[i].pairs},
                   slow_share=slow_share,
                   named={(f.component.type, f.component.id) for f in findings})
        for f in findings:
            self._take(f, findings, w, open_map, streaks, persist)
        self._fold_first_windows(w, open_map)
        for f in findings:
            if f.component.type == "agent" and open_map is self._open:
                w.changed += self._absorb_into_agent(f, open_map, start)
        for key in [k for k in streaks if k not in w.seen_keys]:
            del streaks[key]
        for inc_id in [i for i in self._relapse if i not in w.relapsing]:
            del self._relapse[inc_id]  # a slowdown in a row, or none
        self._close_clean(w, observed, open_map)
        return w.changed

    def _take(self, f: Finding, findings: Sequence[Finding], w: _Tally,
              open_map: dict[tuple[str, str], str], streaks: dict[tuple[str, str], Streak],
              persist: Callable[[str], int]) -> None:
        """One finding of the window: it refines or keeps open the incident
        it belongs to, or advances its streak and, once that persisted,
        opens one."""
        key = (f.component.type, f.component.id)
        if f.component.type == "vswitch_rule" and key not in open_map and \
                self._cut_off(f, findings, w.anomalous, open_map):
            return
        # One incident per fault: a finding about pairs an open incident
        # already holds refines that incident (a more certain component
        # replaces its guess, id kept) or just keeps it open.
        held = self._overlapping(f, open_map, key, w.anomalous, w.named)
        own = open_map.get(key) or (open_map[held] if held is not None else None)
        if own is not None and f.symptom == self.incidents[own].symptom == "loss" and \
                w.counts is not None and not self._still_lossy(self._as_refined(own, f), w.counts):
            # A probe or two lost on a few of a loss incident's pairs,
            # while its pairs together lose no more than healthy ones
            # do: the fault is over (a spine back up; the odd healthy
            # loss on a pair it crossed stands out only against the
            # fault's own windows). Neither a finding nor a reason to
            # keep the incident open.
            w.faded.add(own)
            return
        if own is not None and f.symptom == "latency" and own in self._clean and \
                not self._relapsed(own, f, w.strong, w.start, w.relapsing):
            return
        if held is not None:
            self._spoke(self._refine(f, held, key, w, open_map, streaks), f, w)
            return
        w.seen_keys.add(key)
        st = self._advance(f, key, w, streaks, open_map)
        # A finding nothing explains (an endpoint guess), or one the votes
        # barely favour (a link healthy pairs also cross, or one of
        # indistinguishable twins), or a link beside a failing switch its
        # pairs may cross, is weak evidence: it must hold a window longer
        # than a clear one.
        weak = (f.component.type == "endpoint" or f.confidence < WEAK_CONFIDENCE
                or self._beside_switch(f, findings))
        need = persist(f.symptom) + (1 if weak else 0)
        # A ToR's slowdown, no window of which was slow for most of its
        # length: every path of its pairs crosses it, so the share of their
        # probes in the slow tail is the share of the time it was slow. It
        # opens once those seconds reach twice latency_min_seconds, more
        # than two congestions shorter than that make, however many windows
        # they touched: windows carry no times inside them, and two short
        # congestions near one window boundary fill the windows around it
        # as one slowdown across it would. A ToR's 7 s and 8 s congestions
        # 27 s apart opened an incident (bench/inject.py busy 20 an hour,
        # seed 1415), its 14 s and 8 s ones 26 s apart (26.5 s of tail over
        # four windows; draw 1812 of session 60) and its 13 s and 16 s ones
        # 35 s apart (29.5 s; draw 3126 of session 61). A fault slowing a
        # share of a ToR's probes throughout is found once it outlasts two
        # congestions; one slowing all of them fills a window. Congestion
        # is a switch's; a NIC's, link's or host's slowdown is judged as
        # before (a fault slowing a few of their flows adds little tail a
        # window).
        brief = f.symptom == "latency" and not st.filled and self._is_tor(key) and \
            st.slow_s < 2 * self.cfg.latency_min_seconds
        if (st.count < need or not self._lasted(f.symptom, st.first, w.start) or brief) and \
                key not in open_map:
            return
        ev = dict(f.evidence)
        ev["windows"] = {f"{a}|{b}": w.evidence.get((a, b), {}) for a, b in f.pairs[:20]}
        inc_id = open_map.get(key) or self._reopened(key, st.first, open_map)
        if inc_id is None:
            self._seq += 1
            inc = Incident(id=f"inc-{self._seq:06d}", start=st.first, end=None,
                           symptom=f.symptom, layer=f.layer, component=f.component,
                           pairs=list(f.pairs), confidence=reported(f), evidence=ev)
            self.incidents[inc.id] = inc
            open_map[key] = inc.id
            self._vote(inc, f)
            log.warning("incident %s opened: %s %s %s (%d pairs)", inc.id, f.symptom,
                        f.component.type, f.component.id, len(f.pairs))
        else:
            inc = self.incidents[inc_id]
            self._vote(inc, f)
            inc.pairs = sorted(set(inc.pairs) | set(f.pairs))
            inc.confidence = max(inc.confidence, reported(f))
            inc.symptom = worst_symptom((inc.symptom, f.symptom))
            inc.evidence = ev
        self._spoke(inc, f, w)

    @staticmethod
    def _spoke(inc: Incident, f: Finding, w: _Tally) -> None:
        w.changed.append(inc)
        w.spoken.add(inc.id)
        if f.symptom in LOSSY:
            w.lossy_pairs.setdefault(inc.id, set()).update(f.pairs)

    def _fold_first_windows(self, w: _Tally, open_map: dict[tuple[str, str], str]) -> None:
        """Loss incidents a fault's first window opened on a link of a few of
        its pairs, folded into the incident its next window names. The
        pairs that lost probes first may meet on a link under either ToR of
        a lossy one; the one touching it is renamed (_moves), the one across
        was left open beside it and closed a window later, a second incident
        of one fault (bench/inject.py torloss, draw 4136 with 30 % of probes
        traced). A lossy host's first lost probes named one NIC's link and,
        traced, a spine link another NIC's flows crossed; the host took the
        first, the spine link's stayed open for the host's whole fault (draw
        4313, hostloss, likewise). One that began within a window of this
        one, on the fabric, none of whose pairs can miss this one's
        component, one of which lost probes on its finding, and no finding
        of its own this window, is the same fault (`evidence.merged`, as an
        agent's). The incidents folded into are this window's changed
        already (a finding spoke for each)."""
        for home_id, pairs in w.lossy_pairs.items():
            home = self.incidents.get(home_id)
            if home is None or home.symptom not in LOSSY or home.component.type not in _LOCATED:
                continue
            where = (home.component.type, home.component.id)
            for k, inc_id in list(open_map.items()):
                inc = self.incidents[inc_id]
                if inc_id != home_id and inc_id not in w.spoken and k[0] in _FABRIC \
                        and inc.symptom in LOSSY and abs(inc.start - home.start) <= self._window_len \
                        and self._may_explain(where, pairs, inc):
                    self._fold(home, k, open_map, w.start)

    def _fold(self, home: Incident, k: tuple[str, str], open_map: dict[tuple[str, str], str],
              start: float) -> None:
        """Open incident `k` folded into `home` (start, pairs; `evidence.merged`
        names it) and removed. Its watchers see it once more, closed at this
        window's start with `evidence.merged_into` naming `home`: without that
        a diagnosis engine would hold it open for ever."""
        inc_id = open_map.pop(k)
        inc = self.incidents.pop(inc_id)
        home.start = min(home.start, inc.start)
        home.pairs = sorted(set(home.pairs) | set(inc.pairs))
        home.evidence = {**home.evidence,
                         "merged": list(home.evidence.get("merged", [])) + [inc_id]}
        for held in (self._clean, self._votes, self._onset_due, self._relapse):
            held.pop(inc_id, None)
        self._merged.append(dataclasses.replace(
            inc, end=start, evidence={**inc.evidence, "merged_into": home.id}))
        log.warning("incident %s merged into %s", inc_id, home.id)

    def _cut_off(self, f: Finding, findings: Sequence[Finding], anomalous: Mapping[Pair, str],
                 open_map: Mapping[tuple[str, str], str]) -> bool:
        """Whether every pair of a broken rule's finding certainly crosses a
        switch that is down: most of the pairs of its finding this window,
        or of its open incident, unreachable. The tables are a dump of now,
        and a dead ToR cuts its pairs off whatever their rules say: a ToR
        went down, a loop began on a pair under it 19 minutes later and
        outlasted it, and the rule's incident began with the ToR's
        (bench/inject.py tordown + overlayloop over 30 congestions an hour,
        draw 4050 of session 62). The rule is found once the switch is
        back; a rule whose incident opened first keeps its pairs."""
        switches = [(g.component.id, g.pairs) for g in findings if g.component.type == "switch"]
        switches += [(self.incidents[i].component.id, self.incidents[i].pairs)
                     for k, i in open_map.items() if k[0] == "switch"]
        down = {sw for sw, pairs in switches
                if 2 * sum(anomalous.get(p) == "unreachable" for p in pairs) > len(pairs)}
        return bool(down) and all(
            down & {sw for link, wt in self.routes.spread(p).items() if wt >= CERTAIN
                    for sw in self._switches_of(link)} for p in f.pairs)

    def _refine(self, f: Finding, held: tuple[str, str], key: tuple[str, str], w: _Tally,
                open_map: dict[tuple[str, str], str], streaks: dict[tuple[str, str], Streak]
                ) -> Incident:
        """The open incident `held` names, kept open by a finding about its
        pairs, and renamed after it where the finding is the surer or
        better name for the same fault (id kept)."""
        inc = self.incidents[open_map[held]]
        w.seen_keys.add(held)
        self._vote(inc, f)
        # A host or a NIC names the incident only where at least half of its
        # pairs are theirs: a host among a spine's pairs (all of its partners
        # across the ToRs, no route traced) is a few of the spine's, and
        # took the spine's incident for the whole outage; a NIC whose
        # offloaded rules disagree, on one of a slow spine's 350 pairs that
        # hashed onto a rule it lacks, took a slow spine's twelve minutes in
        # (bench/inject.py spinelat, draw 4317: the dump carries no time).
        surer = outranks(f.component.type, inc.component.type) and (
            f.component.type not in ("host", "nic")
            or (2 * self._crossing(inc.pairs, key) >= len(inc.pairs)
                and (f.component.type == "nic" or self._slow_alike(f, w.strong))))
        if surer or self._widens(f, inc) or self._moves(f, inc):
            log.warning("incident %s refined: %s %s -> %s %s", inc.id,
                        inc.component.type, inc.component.id, f.component.type,
                        f.component.id)
            inc.component, inc.layer = f.component, f.layer
            inc.confidence = reported(f)
            inc.evidence = {**f.evidence, "refined_from": {"type": held[0], "id": held[1]}}
            open_map[key] = open_map.pop(held)
            streaks.pop(held, None)
            w.seen_keys.add(key)
            inc.pairs = sorted(set(inc.pairs) | set(f.pairs))
            inc.symptom = worst_symptom((inc.symptom, f.symptom))
        # A vaguer finding only keeps the incident open: its other
        # pairs are not this fault's.
        return inc

    def _slow_alike(self, f: Finding, strong: Container[Pair]) -> bool:
        """Whether a host's slow pairs are slow alike on each of its NICs:
        for most of the window on all of them, or on none. A host's fault
        slows every NIC's probes the same way; a slow tail on one NIC's
        pairs beside another's slow throughout is a short congestion that
        NIC's pairs crossed. A NIC link slow for 12 minutes became its
        host when a spine's 14 s congestion made a tail on another of the
        host's NICs (bench/inject.py nicslow over 30 congestions an hour,
        draw 3115 of session 61). Loss is judged as before."""
        if f.symptom != "latency":
            return True
        per_nic: dict[str, list[bool]] = defaultdict(list)
        for p in f.pairs:
            for e in p:
                ep = self.topo.endpoints.get(e)
                if ep is not None and self.topo.host_of_endpoint(e) == f.component.id:
                    per_nic[ep.nic].append(p in strong)
        slow_through = {2 * sum(v) > len(v) for v in per_nic.values()}
        return len(slow_through) <= 1

    def _advance(self, f: Finding, key: tuple[str, str], w: _Tally,
                 streaks: dict[tuple[str, str], Streak],
                 open_map: Container[tuple[str, str]] = ()) -> Streak:
        """The finding's streak, one window longer."""
        # The same fault may be named by another component from one window
        # to the next (its link, then its switch when other pairs join):
        # a streak follows the pairs, not the name. Not the streak of a
        # component with an open incident, though: a finding that got this
        # far is not that incident's fault (_overlapping), and the incident's
        # own windows are no evidence for another. A link's loss incident
        # kept up by weak windows on two of its pairs handed its run to
        # its rail's other ToR, which a 17 s congestion then named on 69
        # pairs including those two: an incident after one slow window
        # (bench/inject.py linkloss over 30 congestions an hour, draw 1809).
        st = (w.before.get(key)
              or continued(w.before, f.pairs,
                           lambda k: k not in open_map
                           and may_follow(f, w.before[k], k, self._related))
              or Streak(0, w.start))
        st = next_streak(st, f, w.start, tail_only=w.tail_only, strong=w.strong, held=w.held,
                         on_every_path=self._on_every_path(key), slow_s=self._slow_s(f, w))
        if key in w.advanced:
            st = joined(st, streaks[key])
        w.advanced.add(key)
        streaks[key] = st
        return st

    def _slow_s(self, f: Finding, w: _Tally) -> float:
        """Seconds of this window the finding's probes were in the slow tail:
        the median over its pairs of their tail's share, times the window (a
        window that lost probes counts whole: it was no congestion)."""
        if w.slow_share is None or f.symptom != "latency":
            return self._window_len
        ids = [self._pair_id[p] for p in f.pairs if p in self._pair_id]
        return float(np.median(w.slow_share[ids])) * self._window_len if ids else 0.0

    def _is_tor(self, key: tuple[str, str]) -> bool:
        sw = self.topo.switches.get(key[1]) if key[0] == "switch" else None
        return sw is not None and sw.tier == "tor"

    def _on_every_path(self, key: tuple[str, str]) -> bool:
        """Whether every flow of a finding's pairs crosses its component: a
        ToR, a NIC's link, a NIC, a host, an endpoint (a spine or a
        ToR-spine link carries some of a pair's flows only)."""
        kind, ident = key
        if kind == "switch":
            return self._is_tor(key)
        if kind == "link":
            return self._host_of(ident) is not None
        return kind in ("nic", "host", "endpoint")

    def _close_clean(self, w: _Tally, observed: Container[Pair],
                     open_map: dict[tuple[str, str], str]) -> None:
        """Open incidents no finding spoke for this window, whose pairs were
        seen: closed after close_windows clean windows in a row."""
        # A stopped agent's pairs fail for that reason alone: they keep its
        # own incident open, not one a network finding opened on them the
        # window it stopped. Likewise pairs whose trouble the fault of an
        # incident a finding spoke for this window may be (their pairs, and
        # those that may cross a failing switch or link or touch a host):
        # a lossy ToR's incident was held open 14 minutes past its fault by
        # its pairs' losses to a spine that went down meanwhile
        # (bench/inject.py torloss + spinedown, draw 824).
        gone = self.dead | self._silent
        other = _Explained([self.incidents[i] for i in sorted(w.spoken) if i in self.incidents],
                           self._may_cross)
        for key, inc_id in list(open_map.items()):
            if key in w.seen_keys:
                self._clean.pop(inc_id, None)
                continue
            inc = self.incidents[inc_id]
            seen = [p for p in inc.pairs if p in observed]
            stopped = gone if inc.component.type != "agent" else set()
            if not seen or (inc_id not in w.faded and
                            self._shows(inc, w.anomalous, stopped, other)):
                continue
            run = self._clean.get(inc_id) or _CleanRun(0, w.start)
            tally: tuple[float, int] = (0.0, 0)  # probes expected lost, lost
            if w.counts is not None and inc.symptom == "loss":
                tally = self._loss_tally(inc, w.counts, stopped, other)
                # Losses short of significance, but more than the pairs'
                # healthy rates explain, this window or summed over the
                # clean run so far: a weak fault between detections, not
                # its end. A link losing 1 % of five pairs' probes lost one
                # a window, each plausible alone, four in a row not: its
                # incident closed and opened again two minutes later
                # (bench/inject.py linkloss over 30 congestions an hour,
                # draw 4037 of session 62).
                if self._link_still_lossy(inc) or self._lossy(run.expected + tally[0],
                                                              run.lost + tally[1]):
                    self._clean.pop(inc_id, None)
                    continue
            # Closed after close_windows clean windows in a row: a weak
            # fault (a link losing 2 % of a few flows) skips windows.
            run = self._clean[inc_id] = _CleanRun(run.windows + 1, run.since,
                                                  run.expected + tally[0], run.lost + tally[1])
            if run.windows < self.cfg.close_windows:
                continue
            inc.end = (self._read_end(inc, run.since - self._window_len)
                       if open_map is self._open else run.since)
            del open_map[key]
            self._clean.pop(inc_id, None)
            self._votes.pop(inc_id, None)
            if open_map is self._open:
                self._closed_at[key] = (inc_id, w.start)
            w.changed.append(inc)
            log.warning("incident %s closed", inc.id)

    def _reopened(self, key: tuple[str, str], first: float,
                  open_map: dict[tuple[str, str], str]) -> str | None:
        """The incident of the component that closed at most close_windows
        windows before this finding's run began, open again (end cleared)
        under its own id: a weak fault's losses thin out by chance, and as
        many clean windows as close an incident may come and go inside it.
        A link losing 1 % of five pairs' probes lost 1 in four windows where
        it had lost 2-6 in each before: its incident closed, and the next
        window opened a second on the same link (bench/inject.py linkloss,
        draw 5006 of session 67). Later than that it is a new fault. Only
        short-term incidents: a drift's periods are half an hour."""
        if open_map is not self._open or key not in self._closed_at:
            return None
        inc_id, closed = self._closed_at.pop(key)
        inc = self.incidents.get(inc_id)
        if inc is None or first - closed > self.cfg.close_windows * self._window_len:
            return None
        inc.end = None
        open_map[key] = inc_id
        log.warning("incident %s reopened", inc_id)
        return inc_id

    def _absorb_into_agent(self, f: Finding, open_map: dict[tuple[str, str], str], start: float
                           ) -> list[Incident]:
        """Open incidents a stopped agent's finding explains, merged into the
        agent's: in the window an agent stops it is not yet known to have
        (it probed until then), and its failing pairs may open a link or
        host incident. One fault, one incident: an incident that began no
        earlier than a window before the agent's, at least half of whose
        pairs are the agent's (the rest lost a probe in that window too), is
        folded into it (_fold)."""
        home_id = open_map.get(("agent", f.component.id))
        if home_id is None:
            return []
        home = self.incidents[home_id]
        eps = set(f.evidence.get("endpoints") or [f.component.id])
        mine = set(f.pairs)
        merged = False
        for k, inc_id in list(open_map.items()):
            inc = self.incidents[inc_id]
            theirs = sum(1 for p in inc.pairs if p in mine or eps & set(p))
            if k[0] == "agent" or not inc.pairs or inc.start < home.start - self._window_len \
                    or 2 * theirs < len(inc.pairs):
                continue
            self._fold(home, k, open_map, start)
            merged = True
        return [home] if merged else []

    def _as_refined(self, inc_id: str, f: Finding) -> Incident:
        """The incident as the finding would leave it: a guess (an endpoint)
        the finding locates is judged as the component it is about to
        become, with the finding's pairs; its own few pairs losing nothing
        this window says nothing of the link, whose other pairs do. So is
        one the finding names again: it takes the finding's pairs (a spine
        link's incident on one pair, its loss on others each window, was
        closed for its one clean pair and opened again: --routes 0.3 of
        draw 4105, uplinkloss)."""
        inc = self.incidents[inc_id]
        if f.component != inc.component and not outranks(f.component.type, inc.component.type):
            return inc
        return dataclasses.replace(inc, component=f.component,
                                   pairs=sorted(set(inc.pairs) | set(f.pairs)))

    def _relapsed(self, inc_id: str, f: Finding, strong: Container[Pair], start: float,
                  counted: set[str]) -> bool:
        """Whether a slowdown on an incident whose clean run has begun is its
        fault back: only once it has lasted as a new one must to open an
        incident. A shorter one (a congestion burst on the switch a fault
        just left) neither keeps the incident open nor counts as clean, so
        the incident ends where its fault did, not after the burst."""
        count, first = self._relapse.get(inc_id, (0, start))
        if inc_id not in counted:
            counted.add(inc_id)
            count += 2 if any(p in strong for p in f.pairs) else 1
            self._relapse[inc_id] = (count, first)
        if count >= self._persist("latency") and self._lasted("latency", first, start):
            del self._relapse[inc_id]
            return True
        return False

    def _beside_switch(self, f: Finding, findings: Sequence[Finding]) -> bool:
        """A link named for a few pairs in the window a switch failing the
        same way is named for more, all of whose paths may cross that switch:
        most likely the switch's fault seen through pairs whose own paths the
        cover could not pin (the window the switch went down, its links still
        cleared by the probes before). It must hold a window longer, by which
        time the switch explains its pairs too; a fault of its own still
        opens, a window later."""
        if f.component.type != "link":
            return False
        return any(s.component.type == "switch" and len(s.pairs) > len(f.pairs)
                   and alike(s.symptom, f.symptom)
                   and all(self._may_cross(p, ("switch", s.component.id)) for p in f.pairs)
                   for s in findings)

    @staticmethod
    def _shows(inc: Incident, anomalous: Mapping[Pair, str],
               stopped: Collection[str] = (), other: Container[Pair] = ()) -> bool:
        """Whether this window's anomalies are the incident's kind: a flow's
        fact that lost probes is not kept open by its pairs being slow; nor
        is anything by pairs of a `stopped` endpoint, or by pairs whose
        trouble another incident's fault may be (`other`)."""
        lossy_only = inc.component.type in FLOW_FACTS and inc.symptom in LOSSY
        # Whether a pair failed first: `other` may walk its paths.
        return any((anomalous.get(p) in LOSSY if lossy_only else p in anomalous)
                   and p[0] not in stopped and p[1] not in stopped and p not in other
                   for p in inc.pairs)

    def _vote(self, inc: Incident, f: Finding) -> None:
        """Count a link or switch finding towards the incident it belongs to."""
        if {f.component.type, inc.component.type} <= _FABRIC and not guessed(f):
            votes = self._votes.setdefault(inc.id, {})
            key = (f.component.type, f.component.id)
            votes[key] = votes.get(key, 0.0) + f.confidence

    def _moves(self, f: Finding, inc: Incident) -> bool:
        """An incident opened on a neighbour of the faulty link or switch:
        the first window's few failing pairs happened to meet on the wrong
        link of a switch (a lossy core-spine link's pairs cross one link of
        the other pod's too), or on one link of a lossy switch. Each
        window's finding about the incident's pairs is a vote; once a link
        or switch touching the named one has more of them (confidences
        summed over the windows) than the name, the incident is renamed in
        place, its id kept: one incident per fault, named by the weight of
        its windows rather than by its first."""
        votes = self._votes.get(inc.id, {})
        held = (inc.component.type, inc.component.id)
        key = (f.component.type, f.component.id)
        # A weak finding on a touching component (a congestion beside the
        # fault) never renames; one covering every pair of a loss incident
        # may, though weak: a spine down with few routes traced is named
        # weakly each window (a pair's untraced flows could have crossed
        # any spine), against a ToR its first seconds named once.
        return ({f.component.type, inc.component.type} <= _FABRIC
                and ((unshared(f, self._switches_of) >= WEAK_CONFIDENCE
                      and self._related(held, key)) or self._covers(f, inc))
                and votes.get(key, 0.0) > votes.get(held, 0.0))

    def _covers(self, f: Finding, inc: Incident) -> bool:
        """A loss finding that speaks for some of a smaller loss incident's
        pairs, on a component every one of them may cross: the same fault,
        whose first few failing pairs met on a link away from it (a ToR
        losing 3 %: seconds into the fault, the pairs that had lost a probe
        were one host's under the other ToR, and named that host's link).
        Loss only: benign congestion slows a switch's pairs for a window
        and says nothing about an incident on one of them."""
        if not (f.symptom in LOSSY and inc.symptom in LOSSY and len(f.pairs) > len(inc.pairs)):
            return False
        return self._may_explain((f.component.type, f.component.id), f.pairs, inc)

    def _may_explain(self, component: tuple[str, str], seen: Collection[Pair],
                     inc: Incident) -> bool:
        """Whether a fault of `component`, seen failing `seen`, may be the
        incident's: one of its pairs is among them, and every one may cross
        the component."""
        return not set(inc.pairs).isdisjoint(seen) and \
            all(self._may_cross(p, component) for p in inc.pairs)

    def _widens(self, f: Finding, inc: Incident) -> bool:
        """A lossy ToR, named first for one of its links: the first window saw
        a few of the ToR's pairs fail and named a link they shared. The ToR
        is the better name for the same fault when, this window, it is
        accused by more failing pairs than healthy ones clear, and the pairs
        through it that cannot cross the link lose probes at least half as
        often as those that may (a link's own loss leaves the ToR's other
        pairs at their healthy rate; a spine link's leaves the ToR's own
        pairs clean). Loss only: a short congestion slows a whole switch for
        a window, which says nothing about where probes are lost."""
        net = f.evidence.get("failing_minus_healthy_pairs", {})
        if not (f.component.type == "switch" and inc.component.type == "link"
                and f.symptom in LOSSY and inc.symptom in LOSSY
                and isinstance(net, dict) and net.get(f.component.id, 0) > 0
                and f.component.id in self._switches_of(inc.component.id)):
            return False
        under = self._endpoints_under(f.component.id)
        counts = [np.zeros(2), np.zeros(2)]  # [sent, lost] of pairs that may cross the link, others
        for pair in {p for e in under for p in self._by_endpoint.get(e, ())}:
            k = self._pair_id[pair]
            if k < len(self._win_sent):
                may = inc.component.id in self.routes.candidates(pair)
                counts[0 if may else 1] += (self._win_sent[k], self._win_lost[k])
        (s_in, l_in), (s_out, l_out) = counts
        if s_in <= 0 or s_out <= 0:
            return False
        return bool(2 * l_out / s_out >= l_in / s_in)

    def _endpoints_under(self, switch: str) -> set[str]:
        """Endpoints whose NIC hangs off this switch (none for a spine)."""
        got = self._under.get(switch)
        if got is None:
            nics = {n for n in self.topo.neighbours.get(switch, ()) if n in self.topo.nics}
            got = self._under[switch] = {e for e, ep in self.topo.endpoints.items()
                                         if ep.nic in nics}
        return got

    def _held_by_loss(self, pid: np.ndarray) -> np.ndarray | None:
        """Which rows (by pair id) an open loss incident holds: a weak fault's
        quiet windows must not become the baseline its end is judged by."""
        ids = [self._pair_id[p] for iid in self._open.values()
               if self.incidents[iid].symptom == "loss"
               for p in self.incidents[iid].pairs if p in self._pair_id]
        return np.isin(pid, ids) if ids else None

    def _still_lossy(self, inc: Incident, counts: tuple[np.ndarray, np.ndarray],
                     stopped: Collection[str] = (), other: Container[Pair] = ()) -> bool:
        """Whether the incident's pairs lost more probes this window than
        their healthy rates make plausible (one-sided Poisson at
        close_loss_alpha; each row's rate is its own healthy history's),
        less those of a `stopped` endpoint or whose trouble another
        incident's fault may be (`other`)."""
        return self._link_still_lossy(inc) or self._lossy(
            *self._loss_tally(inc, counts, stopped, other))

    def _lossy(self, expected: float, lost: int) -> bool:
        """More probes lost than the expected number makes plausible."""
        return lost > 0 and float(poisson_sf(lost - 1, max(expected, 1e-12))) \
            < self.cfg.close_loss_alpha

    def _link_still_lossy(self, inc: Incident) -> bool:
        """A link losing a few % of whatever crosses it hits other pairs
        each window than those it was found on: its own routed probes tell."""
        if inc.component.type != "link" or inc.component.id not in self.routes.link_window:
            return False
        _sent, lost_l, expected_l = self.routes.link_window[inc.component.id]
        return self._lossy(expected_l, int(lost_l))

    def _loss_tally(self, inc: Incident, counts: tuple[np.ndarray, np.ndarray],
                    stopped: Collection[str], other: Container[Pair]) -> tuple[float, int]:
        """Probes the incident's pairs were expected to lose this window at
        their healthy rates, and lost (see _still_lossy)."""
        ids = [self._pair_id[p] for p in inc.pairs if p in self._pair_id]
        if inc.component.type == "link":
            # and every other pair all of whose paths cross the link: a slow
            # loss takes a probe of another of its pairs each window
            ids = sorted(set(ids) | set(self._pairs_crossing(inc.component.id).tolist()))
        if stopped or other:  # their probes are lost for want of an agent, or to another fault
            ids = [i for i in ids if self._pairs[i][0] not in stopped
                   and self._pairs[i][1] not in stopped and self._pairs[i] not in other]
        if not ids:
            return 0.0, 0
        return float(counts[0][ids].sum()), int(round(float(counts[1][ids].sum())))

    def _overlapping(self, f: Finding, open_map: dict[tuple[str, str], str],
                     key: tuple[str, str], anomalous: Mapping[Pair, str] | None = None,
                     named: Container[tuple[str, str]] = ()) -> tuple[str, str] | None:
        """The open incident (other than the finding's own) sharing at least
        half of the smaller of their pair sets, most shared first. A finding
        that lost probes is its lossy pairs (`anomalous`): the slow ones a
        congestion beside the fault added to it are another matter. One
        failing the other way (slow where the incident loses probes, or the
        reverse) on a component that does not touch the incident's is
        another fault: a spine down holds nearly every pair between ToRs, and
        a slow ToR-spine link elsewhere, its few pairs among them, went
        unreported for the spine's whole outage. So is one on a component
        not touching the incident's where the window also `named` that, a
        quarter of whose pairs (two at least) the incident does not hold:
        two slow spines share most of their pairs (each pair's flows cross
        several), and named side by side for seven minutes the second was
        held as the first's (bench/inject.py spinelat twice, draw 5005 of
        session 67). A finding all of whose pairs the incident holds is the
        cover's split of one fault's pairs."""
        if key in open_map:
            return None

        mine = set(f.pairs)
        if anomalous is not None and f.symptom in LOSSY:
            mine = {p for p in mine if anomalous.get(p) in LOSSY} or mine

        def apart(k: tuple[str, str]) -> bool:
            if k not in named or k[0] not in _FABRIC or f.component.type not in _FABRIC \
                    or self._related(k, key):
                return False
            outside = len(mine.difference(self.incidents[open_map[k]].pairs))
            return outside >= 2 and 4 * outside >= len(mine)

        best, best_n = None, 0
        for k, inc_id in open_map.items():
            inc = self.incidents[inc_id]
            n = half_shared(mine, inc.pairs)
            if n > best_n and stands_for(k[0], n, f) and (
                    alike(inc.symptom, f.symptom) or self._related(k, key)) \
                    and not self._beyond(f, mine, k) and not apart(k):
                best, best_n = k, n
        if best is None and f.component.type in _LOCATED:
            # An open guess about pairs that mostly may cross this component,
            # failing the same way: the same fault, now located. A switch's
            # or link's slowdown is not a guess's lost probes: a ToR's 5 s
            # congestion renamed a lost-probe guess on one pair (a NIC link's
            # first losses) to the ToR, a false loss incident of 75 pairs for
            # 3.5 minutes (bench/inject.py drift + linkloss, draw 5205 of
            # session 68).
            best = self._mostly_crossing(
                open_map, key, lambda k: k[0] == "endpoint" and (
                    f.component.type not in _FABRIC
                    or alike(self.incidents[open_map[k]].symptom, f.symptom)))
        if best is None and f.component.type == "host":
            # An open incident on a link of one of the host's NICs, failing
            # the same way: the host's fault, first seen on that NIC's pairs
            # (the window it began, one NIC's pairs had lost enough).
            best = next((k for k, inc_id in open_map.items()
                         if k[0] == "link" and self._host_of(k[1]) == f.component.id
                         and alike(self.incidents[inc_id].symptom, f.symptom)),
                        None)
        if best is None and f.component.type in _FABRIC:
            # An open incident on a touching link or switch (a sibling link
            # of one switch, a switch's own link) whose pairs mostly may
            # cross this one too: the same fault, first named where its
            # first few failing pairs met (_moves). Not a slowdown whose
            # pairs were clean the window before (a weak loss skips windows,
            # a slowdown shows in each): a fault on a neighbour began
            # meanwhile (a NIC link's incident, quiet three windows, held
            # its ToR's slow uplink's pairs for ten minutes: bench/inject.py
            # nicslow then uplinklat, draw 4081 of session 62).
            best = self._mostly_crossing(
                open_map, key, lambda k: k[0] in _FABRIC and not self._quiet_slowdown(open_map[k])
                and (self._related(k, key) or (self._covers(f, self.incidents[open_map[k]])
                                               and not apart(k))))
        if best is None and guessed(f):
            # Pairs nothing explained (or only their link's pooled loss),
            # most of which may cross an open link's or switch's incident:
            # that fault's unrouted victims.
            for k in open_map:
                if k[0] in _LOCATED:
                    n = self._crossing(f.pairs, k)
                    if 2 * n >= len(f.pairs) and n > best_n:
                        best, best_n = k, n
        return best

    def _quiet_slowdown(self, inc_id: str) -> bool:
        """A latency incident whose pairs were clean the window before."""
        return inc_id in self._clean and self.incidents[inc_id].symptom == "latency"

    def _beyond(self, f: Finding, mine: set[Pair], k: tuple[str, str]) -> bool:
        """Whether a located finding about the fabric holds pairs the fabric
        incident `k` cannot explain: a quarter of them (two at least) cannot
        cross its component. A ToR's fault loses no probe of a pair that
        never crosses it; a spine down beside a lossy ToR, sharing half
        of the ToR's pairs, was folded into the ToR's incident and went
        unreported."""
        if k[0] not in _FABRIC or f.component.type not in _FABRIC or guessed(f):
            return False
        outside = len(mine) - self._crossing(mine, k)
        return outside >= 2 and 4 * outside >= len(mine)

    def _mostly_crossing(self, open_map: dict[tuple[str, str], str], key: tuple[str, str],
                         admit: Callable[[tuple[str, str]], bool]) -> tuple[str, str] | None:
        """Among the open incidents `admit` lets in, the one most of whose
        pairs may cross component `key`, most such pairs first."""
        best, best_n = None, 0
        for k, inc_id in open_map.items():
            theirs = self.incidents[inc_id].pairs
            if admit(k) and theirs:
                n = self._crossing(theirs, key)
                if 2 * n >= len(theirs) and n > best_n:
                    best, best_n = k, n
        return best

    def _crossing(self, pairs: Iterable[Pair], component: tuple[str, str]) -> int:
        """How many of the pairs may cross the component."""
        return sum(1 for p in pairs if self._may_cross(p, component))

    def _may_cross(self, pair: Pair, component: tuple[str, str]) -> bool:
        if component[0] == "host":
            return any(self.topo.host_of_endpoint(e) == component[1] for e in pair
                       if e in self.topo.endpoints)
        if component[0] == "nic":
            return any(self.topo.endpoints[e].nic == component[1] for e in pair
                       if e in self.topo.endpoints)
        links = self.routes.spread(pair)
        if component[0] == "link":
            return component[1] in links
        return any(component[1] in self._switches_of(k) for k in links)

    # -- queries --------------------------------------------------------------
    def list_incidents(self, open_only: bool = False, since: float = 0.0) -> list[Incident]:
        out = [i for i in self.incidents.values()
               if (i.end is None or not open_only) and (i.end is None or i.end >= since)]
        return sorted(out, key=lambda i: (i.start, i.id))

    def require_known(self, endpoints: Iterable[str], rpc: str) -> None:
        require_known(endpoints, self.known_endpoints, rpc)

    def check_pairs(self, endpoints: Sequence[str], pairs: Sequence[Pair]) -> list[Pair]:
        """The monitored pairs an active check of these endpoints and pairs
        covers; unknown endpoints are an error, as for Diagnose."""
        return asked_pairs(endpoints, pairs, self._by_endpoint, self.known_endpoints)[0]

    def judge_check(self, windows: Sequence[WindowStats], now: float) -> CheckOutcome:
        """An active check's windows (one per pair and size, routes freshly
        traced) judged against each pair's history, then localized with the
        latest analysed window's healthy pairs clearing what they cross."""
        good = [w for w in windows if w.problem() is None]
        self.routes.note(WindowBatch.from_windows(good))
        stats = np.array([[getattr(w, k) for k in STATS] for w in good],
                         dtype=np.float64).reshape(len(good), len(STATS))
        flags = self.detector.judge_check(
            [(w.src, w.dst, w.size, w.proto) for w in good], stats,
            np.array([w.sent for w in good]), np.array([w.lost for w in good]))
        checked, reasons, anomalous = check_symptoms(good, *flags)
        healthy = checked - set(anomalous)
        healthy |= {self._pairs[i] for i in self._seen.latest_healthy()} - set(anomalous)
        findings = self._localize(anomalous, healthy) if anomalous else []
        return CheckOutcome(
            checked=checked, reasons=reasons,
            findings=[Incident(id=f"check-{k + 1}", start=now, end=now, symptom=f.symptom,
                               layer=f.layer, component=f.component, pairs=sorted(f.pairs),
                               confidence=reported(f), evidence=f.evidence)
                      for k, f in enumerate(findings)])

    def diagnose(self, endpoints: Sequence[str], pairs: Sequence[Pair], start: float, end: float,
                 now: float) -> Diagnosis:
        asked, lonely = asked_pairs(endpoints, pairs, self._by_endpoint, self.known_endpoints)
        start, end = time_range(start, end, now)
        return diagnosis(asked, lonely, self.incidents.values(),
                         lambda p: self._seen.judge(self._pair_id.get(p, -1), start, end,
                                                    self.cfg.close_windows),
                         self.routes.latest, start, end)
