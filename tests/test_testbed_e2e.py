"""netskel on a real namespace cluster: agents in container namespaces,
controller and analyzer on the root namespace, faults on real links.

One deployment serves the module; each test leaves the cluster healthy."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import grpc
import pytest

from analyzer.verdicts import NO_WINDOW
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.config import AnalyzerConfig
from testbed import faults
from testbed.deploy import Deployment
from testbed.layout import Layout
from tests.conftest import requires_prometheus, requires_testbed
from tests.helpers import chromium, render_page, wait_for

pytestmark = [requires_testbed, requires_prometheus, pytest.mark.testbed]
WINDOW_S = 10
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
EXAMPLE = ROOT / "examples" / "diagnose.py"
LATE_S = 30
# How long an incident may take to close once its fault is gone: the rest of
# the window the fault ended in, close_windows (4) clean windows, the agents'
# report and the analyzer's tick (~4 s), and four windows to spare (a loaded
# machine: a slow window on its pairs, a probe lost as routes settle). On a
# quiet machine a link's incident closed 45-51 s after the link came back
# (10 s less the fault's place in its window, plus 44 s: up to 54 s),
# and CI failed once at the 60 s this test had.
CLOSE_BUDGET_S = (1 + AnalyzerConfig().close_windows + 4) * WINDOW_S
DSCP = 26


@pytest.fixture(scope="module")
def dep():
    # Probes in the class of the job's RDMA traffic, as production would run them.
    with Deployment(Layout(hosts=4, rails=2, hosts_per_tor=2, spines=2), window_s=WINDOW_S,
                    agent_args=("--dscp", str(DSCP)), with_prometheus=True) as d:
        yield d


def test_late_container_is_not_probed_early_and_raises_no_incident(dep):
    lay = dep.layout
    t_start = time.time()
    dep.start_agents([0, 1, 2])
    early = [p for p in dep.all_pairs() if lay.container(3) not in p[0] + p[1]]
    late = [p for p in dep.all_pairs() if p not in early]
    wait_for(lambda: all(v == dpb.NETWORK_OK for v in dep.verdicts(early, t_start).values()),
             60, "the first three containers' pairs to be healthy", poll=1)
    # The scenario is a container starting LATE_S seconds late: wait it out.
    time.sleep(max(0.0, t_start + LATE_S - time.time()))
    v = dep.verdicts(late, t_start)
    assert all(x == dpb.INCONCLUSIVE for x in v.values()), \
        "nothing may be probed (or judged) before the late container's agent is ready"
    dep.start_agents([3])
    dep.wait_all_ok(timeout=60)
    resp = dep.netdiag.ListIncidents(dpb.ListIncidentsRequest())
    assert list(resp.incidents) == [], "a late container must not raise an incident"


def test_the_counters_inference_reads_hold_no_probe_traffic(dep):
    """The containers run no job: their interfaces carry the agents' probes
    alone (~46 KB/s each way an endpoint here). Counted in, their size
    cycle read as a data-parallel job in force (confidence 0.67); the
    agents now take their own traffic out of the counters they report.
    Judged over the last 8 s: an agent's first seconds hold a one-off
    ~15 KB (probes that reached its interface before it counted them). What
    is left is a probe or two the kernel counted and the agent not yet, at
    either end of the 8 s (up to 4 KB each): 0-520 B/s seen; the bound,
    4,000 B/s, is still a tenth of the probes' rate."""
    lay = dep.layout

    def recorded() -> dict[str, list] | None:
        """Each endpoint's samples once every one holds 12 s of them (the
        late container's agent started only seconds before this test)."""
        eps, samples = dep.controller.state.counter_snapshot(lay.job)
        per = {e: sorted((s for s in samples if s.endpoint == e), key=lambda s: s.ts)
               for e in eps}
        if all(m and m[-1].ts - m[0].ts >= 12.0 for m in per.values()):
            return per
        return None
    per = wait_for(recorded, 30, "12 s of counter samples from every endpoint", poll=0.5)
    rates = {}
    for e, got in per.items():
        mine = [s for s in got if s.ts >= got[-1].ts - 8.0]
        span = mine[-1].ts - mine[0].ts
        # 20 Hz asked; CI's loaded 2 cores deliver fewer (61 in 3 s seen).
        assert span >= 7.0 and len(mine) >= 40, f"{e}: {len(mine)} counter samples in {span:.1f} s"
        rates[e] = (round((mine[-1].tx_bytes - mine[0].tx_bytes) / span),
                    round((mine[-1].rx_bytes - mine[0].rx_bytes) / span))
    high = {e: r for e, r in rates.items() if max(r) >= 4000}
    assert not high, f"B/s (tx, rx) reported by idle endpoints: {high}; all: {rates}"
    view = dep.controller.state.skeleton_view()["jobs"]
    assert all(j.get("status") != "in force" for j in view), view


def test_agents_trace_the_routes_the_kernel_takes(dep):
    """Every pair's route, traced by its prober from the host namespace and
    named through the switch-address inventory, is the path the kernel's
    ECMP choice sends that NIC pair's tunnel traffic along."""
    lay = dep.layout
    where = {lay.endpoint(h, r): (h, r) for h in range(lay.hosts) for r in range(lay.rails)}
    pairs = dep.all_pairs()

    def traced() -> dict[tuple[str, str], tuple[str, str]]:
        got = dep.diagnose(pairs, time.time() - 3 * WINDOW_S).pairs
        return {(v.pair.a, v.pair.b): (v.route_from, v.route) for v in got if v.route}
    wait_for(lambda: len(traced()) == len(pairs), 4 * WINDOW_S, "every pair to carry a route",
             poll=1)
    for (a, b), (src, route) in traced().items():
        dst = b if src == a else a
        (h_from, r), (h_to, _) = where[src], where[dst]
        assert route.split(">") == dep.cluster.trace_underlay(h_from, h_to, r), (src, dst)


def _faulty_link(dep) -> tuple[str, list[tuple[str, str]]]:
    """A ToR-spine link that some pair's traffic really crosses."""
    lay = dep.layout
    for r in range(lay.rails):
        for t in range(lay.tors_per_rail):
            for s in range(lay.spines):
                crossing = dep.crossing(lay.tor(r, t), lay.spine(s))
                if crossing:
                    return "~".join(sorted((lay.tor(r, t), lay.spine(s)))), crossing
    raise AssertionError("no ToR-spine link carries any pair")


def test_link_down_is_fault_for_crossing_pairs_ok_for_others(dep):
    dep.wait_all_ok(timeout=60)
    link, crossing = _faulty_link(dep)
    others = [p for p in dep.all_pairs() if p not in crossing]
    t_fault = time.time()
    undo = faults.link_down(dep.cluster, link)
    try:
        def every_crossing_pair_down() -> dpb.DiagnoseResponse | None:
            """Pairs' windows close a little apart: the first crossing pair
            can be judged a window before the other (seen in CI)."""
            r = dep.diagnose(dep.all_pairs(), since=t_fault)
            down = {(v.pair.a, v.pair.b) for v in r.pairs if v.verdict == dpb.NETWORK_FAULT}
            named = {(p.a, p.b) for i in r.incidents for p in i.pairs}
            return r if down >= set(crossing) and named >= set(crossing) else None
        wait_for(every_crossing_pair_down, 60, "every crossing pair NETWORK_FAULT", poll=1)
        took = time.time() - t_fault
        assert took <= 60
        not_ok: dict[tuple[str, str], str] = {}

        def others_ok() -> dpb.DiagnoseResponse | None:
            """The other pairs are judged OK during the fault, once each has a
            window in the range (an agent that reported after the analyzer's
            tick has none yet) and a lone slow window of one (machine noise,
            see wait_all_ok) has passed. CI failed once on asserting this at
            the moment the crossing pairs went down."""
            r = dep.diagnose(dep.all_pairs(), since=t_fault)
            not_ok.clear()
            not_ok.update({(v.pair.a, v.pair.b): v.reason for v in r.pairs
                           if (v.pair.a, v.pair.b) in others and v.verdict != dpb.NETWORK_OK})
            return None if not_ok else r
        try:
            resp = wait_for(others_ok, (2 + AnalyzerConfig().close_windows) * WINDOW_S,
                            "the pairs that do not cross the link to be NETWORK_OK", poll=1)
        except AssertionError as e:
            raise AssertionError(f"{e}: {not_ok}") from None
        assert resp.verdict == dpb.NETWORK_FAULT
        verdicts = {(v.pair.a, v.pair.b): v.verdict for v in resp.pairs}
        assert {p for p, v in verdicts.items() if v == dpb.NETWORK_FAULT} == set(crossing)
        named = {(p.a, p.b) for i in resp.incidents for p in i.pairs}
        assert named == set(crossing)
        inc = resp.incidents[0]
        assert inc.component.type == cpb.COMPONENT_TYPE_LINK and inc.layer == cpb.LAYER_UNDERLAY
        # Without traced routes ECMP alternatives tie: the faulty link is among the top votes.
        votes = dict(inc.evidence["votes"])
        assert votes[link] == max(votes.values())
        # The documented example client, run as a diagnosis engine would run it,
        # with the crossing pairs' endpoints: it names the same component.
        eps = sorted({e for p in crossing for e in p})
        ex = subprocess.run([sys.executable, str(EXAMPLE), f"127.0.0.1:{dep.analyzer.ports[0]}",
                             *eps], capture_output=True, text=True, timeout=30, cwd=ROOT)
        assert ex.returncode == 1, ex.stderr
        assert ex.stdout.startswith("NETWORK_FAULT") and f" {inc.component.id} (LAYER_UNDERLAY" \
            in ex.stdout, ex.stdout
        # A pair that does not cross the link, asked alone, is fine.
        if others:
            alone = dep.diagnose([others[0]], since=t_fault)
            assert alone.verdict == dpb.NETWORK_OK, [(v.pair, v.reason) for v in alone.pairs]
        # The network team's view: Prometheus, scraping the analyzer with the
        # shipped rules, pages for this incident and names its link.
        prom = dep.prometheus
        assert prom is not None
        (fired,) = wait_for(lambda: [a for a in prom.firing("NetskelNetworkFault")
                                     if a["incident"] == inc.id], 20,
                            "Prometheus to fire NetskelNetworkFault for the incident", poll=0.5)
        assert fired["severity"] == "critical" and fired["layer"] == "underlay", fired
        assert fired["component_type"] == "link" and fired["component"] == inc.component.id
    finally:
        undo()
    with _open_incidents_on_failure(dep):
        closed = wait_for(lambda: (r := dep.netdiag.ListIncidents(dpb.ListIncidentsRequest()))
                          .incidents and all(i.HasField("end") for i in r.incidents) and r,
                          CLOSE_BUDGET_S, "the incident to close once the link is back", poll=1)
    wait_for(lambda: not prom.firing("NetskelNetworkFault"), 20,
             "the alert to resolve once the incident closed", poll=0.5)
    dep.wait_all_ok(timeout=60, since=max(i.end for i in closed.incidents))


def _host_rail(dep, endpoint: str) -> tuple[int, int]:
    lay = dep.layout
    return next((h, r) for h in range(lay.hosts) for r in range(lay.rails)
                if lay.endpoint(h, r) == endpoint)


def _fault_incidents(dep, crossing, since):
    """Diagnose the crossing pairs until they are a NETWORK_FAULT; the response."""
    return wait_for(lambda: (r := dep.diagnose(crossing, since=since))
                    .verdict == dpb.NETWORK_FAULT and r.incidents and r, 75,
                    "NETWORK_FAULT on the pairs crossing the faulty link", poll=1)


@contextlib.contextmanager
def _open_incidents_on_failure(dep):
    """A closure that times out says what stayed open and why (intermittent
    in CI once: a loss incident that did not close after its fault)."""
    try:
        yield
    except AssertionError as e:
        still = [i for i in dep.netdiag.ListIncidents(dpb.ListIncidentsRequest()).incidents
                 if not i.HasField("end")]
        raise AssertionError(f"{e}; still open: {still}") from None


def _after_fault(dep, ended: float) -> None:
    """Until every pair has a whole window after the fault ended: agents
    report a pair's windows in order, so the windows that saw the fault are
    in the analyzer by then. Without this, a fault that opened no incident
    while it lasted (the active check's, ~10 s) could open one from a late
    window after the test had found "nothing open" (CI, once: the next test
    then waited on it)."""
    clear = ended + WINDOW_S
    left: list[tuple[str, str]] = []

    def every_pair_reported() -> bool:
        # A window, whatever it says: a pair with one anomalous window that
        # did not persist is INCONCLUSIVE until close_windows healthy ones
        # follow it (the range starts at `clear` and never moves on). CI once
        # failed here on a restarted agent's pair, INCONCLUSIVE for 60 s;
        # whether it had no window or such a window is not known (the
        # message now says).
        if time.time() <= clear:
            return False
        left[:] = sorted(p for p, why in dep.reasons(dep.all_pairs(), since=clear).items()
                         if why == NO_WINDOW)
        return not left

    try:
        wait_for(every_pair_reported, 3 * WINDOW_S + 30,
                 "a whole window after the fault from every pair", poll=1)
    except AssertionError as e:  # which pairs, to tell a slow agent from a lost window
        hosts = sorted({_host_rail(dep, ep)[0] for pair in left for ep in pair})
        logs = {h: _log_tail(dep.cluster.run_dir / f"agent-{h}.log") for h in hosts}
        raise AssertionError(f"{e}; no window since {clear:.1f} for {left}; "
                             f"their agents' last log lines: {logs}; skeletons: "
                             f"{dep.controller.state.skeleton_view()}; reasons now: "
                             f"{dep.reasons(left, since=clear)}") from None


def _log_tail(path: Path, lines: int = 8) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as e:
        return [f"({path}: {e.strerror})"]


def _wait_closed(dep):
    """Called as the fault is undone."""
    _after_fault(dep, time.time())
    with _open_incidents_on_failure(dep):
        wait_for(lambda: all(i.HasField("end") for i in
                             dep.netdiag.ListIncidents(dpb.ListIncidentsRequest()).incidents),
                 CLOSE_BUDGET_S, "every incident to close once the fault is gone", poll=1)


def test_link_loss_is_detected_live(dep):
    dep.wait_all_ok(timeout=60)
    link, crossing = _faulty_link(dep)
    t_fault = time.time()
    undo = faults.random_loss(dep.cluster, link, 5)
    try:
        resp = _fault_incidents(dep, crossing, t_fault)
        inc = next(i for i in resp.incidents if "votes" in i.evidence and link in i.evidence["votes"])
        assert inc.symptom == cpb.SYMPTOM_LOSS
        votes = dict(inc.evidence["votes"])
        assert votes[link] == max(votes.values())
        assert {(p.a, p.b) for p in inc.pairs} <= set(crossing)
        _page_shows_fault(dep, inc)
    finally:
        undo()
    _wait_closed(dep)


def test_a_fault_of_the_jobs_traffic_class_alone_is_found(dep):
    """Only packets of the probes' class are dropped on the link (a lossless
    queue gone wrong): found only because the probes carry the class, the
    tunnel copies it outward and the underlay sees it on the outer header."""
    dep.wait_all_ok(timeout=60)
    link, crossing = _faulty_link(dep)
    t_fault = time.time()
    undo = faults.class_loss(dep.cluster, link, DSCP, 10)
    try:
        resp = _fault_incidents(dep, crossing, t_fault)
        inc = next(i for i in resp.incidents if "votes" in i.evidence and link in i.evidence["votes"])
        assert inc.symptom == cpb.SYMPTOM_LOSS
        votes = dict(inc.evidence["votes"])
        assert votes[link] == max(votes.values())  # its twin on every path may tie
    finally:
        undo()
    _wait_closed(dep)


def _page_shows_fault(dep, inc) -> None:
    """The web page's state lists the open incident and blames its link (or
    switch); rendered by headless Chromium (where installed: scripts/setup.sh
    installs it) the page lists and draws it, and a screenshot is kept in
    artifacts/ for people. Without Chromium the test goes on: its closure
    check still runs."""
    with urllib.request.urlopen(f"http://127.0.0.1:{dep.analyzer.web.port}/api/state",
                                timeout=10) as r:
        state = json.loads(r.read())
    listed = [i for i in state["incidents"] if i["id"] == inc.id]
    assert listed and listed[0]["end"] is None, "the open incident must be in the page's state"
    kind = "link" if inc.component.type == cpb.COMPONENT_TYPE_LINK else "switch"
    assert inc.component.id in state["blamed"][f"{kind}s"]
    if chromium() is None:
        warnings.warn("chromium is not installed: the page's rendering was not checked",
                      stacklevel=2)
        return
    shot = ARTIFACTS / "web-fault.png"
    shot.parent.mkdir(exist_ok=True)
    shot.unlink(missing_ok=True)
    dom = render_page(f"http://127.0.0.1:{dep.analyzer.web.port}/", str(shot))
    assert 'data-ready="1"' in dom, "the page's script did not render the state"
    row = re.search(rf'<tr class="incident open" data-component="{re.escape(inc.component.id)}"',
                    dom)
    assert row, "the open incident must be listed"
    drawn = re.search(rf'<(?:line|rect)[^>]*class="{kind} blamed"[^>]*data-{kind}='
                      rf'"{re.escape(inc.component.id)}"', dom)
    assert drawn, f"the blamed {kind} must be drawn in red"
    assert re.search(r'<div class="chart" data-pair="', dom), "the incident's pairs get charts"
    assert shot.stat().st_size > 10_000


def test_queueing_delay_from_a_rate_limit_is_detected_live(dep):
    dep.wait_all_ok(timeout=60)
    link, crossing = _faulty_link(dep)
    engine = dep.analyzer.engine
    need = engine.cfg.lof_min_history

    def history_ready() -> bool:  # the latency test needs earlier windows to judge against
        with dep.analyzer.lock:
            det = engine.detector
            # each pair's 64 B row, either direction, over whichever protocol probes it
            rows = [next((r for k, r in det.index.items()
                          if k[:3] in ((a, b, 64), (b, a, 64))), None)
                    for a, b in crossing]
            return all(r is not None and int(det.hvalid[r].sum()) >= need for r in rows)
    wait_for(history_ready, 120, f"{need} healthy windows of history on the crossing pairs", poll=1)
    (ha, r), (hb, _) = _host_rail(dep, crossing[0][0]), _host_rail(dep, crossing[0][1])
    t_fault = time.time()
    undo = faults.rate_limit(dep.cluster, link, rate="20mbit", load_mbit=40, seconds=150,
                             load_from=(ha, hb, r))
    def slow_windows() -> list[dict]:
        resp = dep.diagnose(crossing, since=t_fault)
        if resp.verdict != dpb.NETWORK_FAULT:
            return []
        return [w for i in resp.incidents for w in _window_evidence(i)
                if "latency" in w.get("anomalies", ())]

    try:
        # The full queue also drops: a loss incident may come first (one
        # window), the latency one after the 20 s a slowdown must last.
        slow = wait_for(slow_windows, 75, "the queue to show as a latency anomaly", poll=1)
        assert all(w["rtt_us"]["median"] >= w["usual_median_us"] + 20 for w in slow)
        # Which clock the RTTs came from travels with them to the evidence.
        assert all(w.get("rtt_clock") in ("kernel", "hardware", "user") for w in slow), slow
    finally:
        undo()
    _wait_closed(dep)


def _window_evidence(inc) -> list[dict]:
    from google.protobuf.json_format import MessageToDict
    ev = MessageToDict(inc.evidence)
    return [size_ev for pair_ev in ev.get("windows", {}).values() for size_ev in pair_ev.values()]


def test_deleted_overlay_rule_is_named_from_the_live_switch_table(dep):
    dep.wait_all_ok(timeout=60)
    lay = dep.layout
    pair = tuple(sorted((lay.endpoint(0, 0), lay.endpoint(1, 0))))
    rule = f"{lay.host(0)}:{lay.vni}:{lay.overlay_ip(1, 0)}"
    t_fault = time.time()
    undo = faults.delete_overlay_rule(dep.cluster, 0, lay.overlay_ip(1, 0))
    try:
        resp = wait_for(lambda: (r := dep.diagnose([pair], since=t_fault)).verdict
                        == dpb.NETWORK_FAULT and any(i.component.id == rule for i in r.incidents)
                        and r, 75, f"an incident naming {rule}", poll=1)
        inc = next(i for i in resp.incidents if i.component.id == rule)
        assert inc.component.type == cpb.COMPONENT_TYPE_VSWITCH_RULE
        assert inc.layer == cpb.LAYER_OVERLAY
        others = dep.diagnose([p for p in dep.all_pairs() if p != pair], since=t_fault)
        assert all(i.layer != cpb.LAYER_UNDERLAY for i in others.incidents), \
            "a vanished overlay rule must not be blamed on the underlay"
    finally:
        undo()
    _wait_closed(dep)


def test_a_stale_datapath_flow_is_named_as_its_nic_not_a_link(dep):
    """A NIC whose cached (offloaded) flow drops one destination's packets
    while the switch's tables stay right: the agents' datapath reads name
    that NIC, not the underlay and not a rule."""
    dep.wait_all_ok(timeout=60)
    lay = dep.layout
    pair = tuple(sorted((lay.endpoint(0, 0), lay.endpoint(1, 0))))
    nic = lay.nic(0, 0)
    t_fault = time.time()
    undo = faults.stale_datapath_flow(dep.cluster, 0, 0, lay.overlay_ip(1, 0))
    try:
        resp = wait_for(lambda: (r := dep.diagnose([pair], since=t_fault)).verdict
                        == dpb.NETWORK_FAULT and any(i.component.id == nic for i in r.incidents)
                        and r, 75, f"an incident naming {nic}", poll=1)
        inc = next(i for i in resp.incidents if i.component.id == nic)
        assert (inc.component.type, inc.layer) == (cpb.COMPONENT_TYPE_NIC, cpb.LAYER_NIC)
        others = dep.diagnose([p for p in dep.all_pairs() if p != pair], since=t_fault)
        assert all(i.layer != cpb.LAYER_UNDERLAY for i in [*resp.incidents, *others.incidents]), \
            "a NIC's stale flow must not be blamed on the underlay"
    finally:
        undo()
    _wait_closed(dep)


def test_killed_agent_is_an_agent_problem_not_a_link(dep):
    dep.wait_all_ok(timeout=60)
    lay = dep.layout
    victim = 3
    mine = [p for p in dep.all_pairs() if lay.container(victim) in p[0] + p[1]]
    t_fault = time.time()
    dep.kill_agent(victim)
    try:
        resp = wait_for(lambda: (r := dep.diagnose(mine, since=t_fault)).incidents and r, 75,
                        "an incident for the killed agent's pairs", poll=1)
        assert {i.layer for i in resp.incidents} == {cpb.LAYER_AGENT}
        assert {i.component.type for i in resp.incidents} == {cpb.COMPONENT_TYPE_AGENT}
        # The agent serves the container's endpoints: named by its container
        # when they stop together, by an endpoint when only one's pairs show.
        assert {i.component.id for i in resp.incidents} <= {lay.endpoint(victim, r)
                                                           for r in range(lay.rails)} | {
            lay.container(victim)}
    finally:
        dep.start_agents([victim])
    _wait_closed(dep)


def test_active_check_finds_a_large_packet_drop_within_15s(dep):
    """A link starts dropping packets above 1,000 bytes; a diagnosis engine
    asks at once with active_check and need not wait for a window: every
    pair is probed now at every size, routes are traced, and the answer
    names the crossing pairs and the link within 15 s."""
    dep.wait_all_ok(timeout=60)
    link, crossing = _faulty_link(dep)
    undo = faults.drop_above(dep.cluster, link, 1000)
    try:
        t0 = time.monotonic()
        resp = dep.netdiag.Diagnose(dpb.DiagnoseRequest(
            pairs=[cpb.EndpointPair(a=a, b=b) for a, b in dep.all_pairs()], active_check=True),
            timeout=30)
        took = time.monotonic() - t0
    finally:
        undo()
    assert took <= 15, f"answered in {took:.1f} s"
    assert resp.verdict == dpb.NETWORK_FAULT
    bad = {(v.pair.a, v.pair.b) for v in resp.pairs if v.verdict == dpb.NETWORK_FAULT}
    assert bad == set(crossing), {f"{v.pair.a}|{v.pair.b}": v.reason for v in resp.pairs
                                  if (v.pair.a, v.pair.b) in bad ^ set(crossing)}
    for v in resp.pairs:
        if (v.pair.a, v.pair.b) in bad:  # small probes pass, large ones do not
            assert "1024 B" in v.reason and "64 B:" not in v.reason and "256 B" not in v.reason, \
                v.reason
    top = resp.check_findings[0]
    assert top.component.id == link and top.layer == cpb.LAYER_UNDERLAY
    _wait_closed(dep)


def test_controller_restart_mid_run_loses_nothing(dep):
    dep.wait_all_ok(timeout=60)
    before_regs = {c: (r.host, r.endpoints) for c, r in dep.controller.state.regs.items()}
    before_lists = {c: dict(pl) for c, pl in dep.controller.state.lists.items()}
    dep.stop_controller()
    dep.start_controller()
    assert {c: (r.host, r.endpoints) for c, r in dep.controller.state.regs.items()} == before_regs
    assert {c: dict(pl) for c, pl in dep.controller.state.lists.items()} == before_lists
    t = time.time()
    dep.wait_all_ok(timeout=60, since=t)
    assert dep.netdiag.ListIncidents(dpb.ListIncidentsRequest(open_only=True)).incidents == []


def test_netdiag_rejects_bad_requests_and_keeps_serving(dep):
    with pytest.raises(grpc.RpcError) as e:
        dep.diagnose([("job7-w000/rnic0", "nobody/rnic0")])
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nobody/rnic0" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        dep.netdiag.Diagnose(dpb.DiagnoseRequest(), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    port = dep.analyzer.ports[0]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(bytes(range(256)) * 4)
    assert dep.diagnose(dep.all_pairs()[:1]).verdict in (dpb.NETWORK_OK, dpb.NETWORK_FAULT)
