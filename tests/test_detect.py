"""Detection on simulated probe recordings, through `netskel analyze`'s path
(contract section 3 file -> windows -> detector -> incidents)."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest

from analyzer.detect import Detector
from analyzer.engine import Analyzer
from analyzer.offline import analyze_files
from netskel.config import AnalyzerConfig
from netskel.model import WindowStats
from netskel.probesim import ProbeFault, ProbeNoise, simulate_probes
from netskel.topology import parse_topology
from testbed.layout import Layout, layout_doc

LAY = Layout(hosts=8, rails=1, hosts_per_tor=4, spines=1)
H0 = LAY.host(0)
T0 = 1_733_988_600.0
LINK = f"{LAY.nic(0, 0)}~{LAY.tor(0, 0)}"


def analyze(tmp_path, faults, seconds=1200, noise=None, seed=1):
    doc = layout_doc(LAY)
    table, truth = simulate_probes(doc, seconds, faults, noise, seed=seed, t0=T0)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    pq.write_table(table, tmp_path / "p.parquet")
    return analyze_files(tmp_path / "t.json", tmp_path / "p.parquet")["incidents"], truth


@pytest.mark.parametrize("faults", [
    [],
    [ProbeFault("spike", 0)],                                        # single slow probes
    [ProbeFault("congestion", 600, 15, hosts=(H0,))],                # a 15 s queue
    [ProbeFault("congestion", 615, 19, hosts=(H0,))],                # straddling two windows
], ids=["healthy", "spikes", "congestion-15s", "congestion-19s-straddling"])
def test_noise_is_not_an_incident(tmp_path, faults):
    incidents, _ = analyze(tmp_path, faults)
    assert incidents == []


@pytest.mark.parametrize("fault, symptom", [
    (ProbeFault("step", 600, magnitude=50, hosts=(H0,)), "latency"),
    (ProbeFault("loss", 600, magnitude=0.01, hosts=(H0,)), "loss"),
    (ProbeFault("large_drop", 600, hosts=(H0,)), "loss"),
], ids=["latency-step-50us", "loss-1pct", "large-packets-only"])
def test_fault_is_one_incident_on_its_link(tmp_path, fault, symptom):
    incidents, truth = analyze(tmp_path, [fault])
    assert len(incidents) == 1, incidents
    inc = incidents[0]
    assert (inc["symptom"], inc["component"]["id"]) == (symptom, LINK)
    assert inc["start"] - T0 >= 600 - 30 and inc["start"] - T0 <= 660
    assert inc["end"] is None
    assert {tuple(p) for p in inc["pairs"]} <= {tuple(sorted(p)) for p in truth.affected[0]}
    if fault.kind == "large_drop":  # the evidence shows which sizes suffer
        ev = next(iter(inc["evidence"]["windows"].values()))
        by_size = defaultdict(list)
        for label, row in ev.items():
            by_size[label.rsplit(" ", 1)[1]].append(row)
        assert by_size["size_4096"] and by_size["size_64"]
        assert all(r["lost"] == r["sent"] for r in by_size["size_4096"])
        assert all(r["lost"] == 0 for r in by_size["size_64"])


def test_recovery_closes_the_incident(tmp_path):
    incidents, _ = analyze(tmp_path, [ProbeFault("step", 600, 240, magnitude=80, hosts=(H0,))])
    assert len(incidents) == 1 and incidents[0]["end"] is not None
    assert 840 <= incidents[0]["end"] - T0 <= 900


def test_slow_drift_is_a_degradation_incident(tmp_path):
    """20 % over 45 min: no 30 s window shows it; the 30-min test does."""
    noise = ProbeNoise(rate_hz=2, sizes=(64,))
    incidents, _ = analyze(tmp_path, [ProbeFault("drift", 1800, 2700, magnitude=0.2, hosts=(H0,))],
                           seconds=5400, noise=noise, seed=2)
    assert [(i["symptom"], i["component"]["id"]) for i in incidents] == [("degradation", LINK)]
    healthy, _ = analyze(tmp_path, [], seconds=5400, noise=noise, seed=2)
    assert healthy == []


def test_bad_statistics_are_rejected_and_do_not_poison_history():
    topo = parse_topology(layout_doc(LAY))
    eng = Analyzer(topo, AnalyzerConfig())
    a, b = LAY.endpoint(0, 0), LAY.endpoint(4, 0)

    def w(k, median, **kw):
        s = T0 + 30 * k
        base = dict(rtt_min=median - 5, rtt_p25=median - 2, rtt_median=median, rtt_p75=median + 2,
                    rtt_mean=median, rtt_std=2.0, rtt_max=median + 10)
        base.update(kw)
        return WindowStats(a, b, s, s + 30, 64, 300, 0, **base)
    rng = np.random.default_rng(0)
    for k in range(8):
        assert eng.add_windows([w(k, 100 + rng.normal(0, 1))]) == []
        eng.tick(T0 + 30 * (k + 1) + 5)
    bad = [w(8, math.nan), w(8, 100, rtt_mean=-3.0), w(8, 100, rtt_max=1e12)]
    reasons = eng.add_windows(bad)
    assert len(reasons) == 3 and all("absurd" in r for r in reasons)
    for k in (9, 10):  # a real step afterwards is still judged against the clean history
        eng.add_windows([w(k, 160)])
        eng.tick(T0 + 30 * (k + 1) + 5)
    assert [i.symptom for i in eng.list_incidents()] == ["latency"]


def test_detector_history_excludes_anomalous_windows():
    det = Detector(AnalyzerConfig())
    rows = det.rows_for([("a", "b", 64, "udp")])
    base = np.array([[98, 100, 102, 95, 100, 2, 110]], dtype=np.float64)
    for k in range(6):
        det.observe(rows, base + k * 0.1, np.array([300]), np.array([0]), 30.0 * k, 30.0 * k + 30)
    for k in range(6, 20):  # a lasting fault stays anomalous: it never becomes the baseline
        obs, _ = det.observe(rows, base + 60, np.array([300]), np.array([0]), 30.0 * k, 30.0 * k + 30)
        assert obs.latency[0]


def test_a_slow_loss_is_carried_to_the_next_window_and_kept_out_of_the_baseline():
    """Ten pairs cross one link; each window they lose a little more than the
    baseline allows, not enough to be significant alone. The first window is
    suspicious (its rows must not join the healthy history) and carries its
    probes; with them the second window is significant."""
    from analyzer.detect import Groups, pooled_loss_carried

    n = 10
    sent = np.full(n, 30)
    lost = np.array([1, 1, 1, 0, 1, 0, 1, 0, 0, 0])  # 5 of 300 against a 0.5 % baseline
    g = Groups(indptr=np.arange(n + 1), codes=np.zeros(n, dtype=np.int64), count=1)
    hist = np.zeros(n)
    args = dict(floor=0.005, alpha=0.005, min_lost=3, near_alpha=0.1)
    hit1, near1, carry, _ = pooled_loss_carried(g, sent, lost, hist, hist, **args)
    assert not hit1.any() and near1[lost > 0].all() and carry.lost_sum[0] == 5
    hit2, _, _, _ = pooled_loss_carried(g, sent, lost, hist, hist, carry=carry, **args)
    alone, _, _, _ = pooled_loss_carried(g, sent, lost, hist, hist, **args)
    assert hit2.any() and not alone.any()


def _one_link(n: int):
    from analyzer.detect import Groups

    return Groups(indptr=np.arange(n + 1), codes=np.zeros(n, dtype=np.int64), count=1)


# A window's test budget as the engine sets it for a few thousand rows and groups.
SLOW = dict(floor=1e-4, alpha=0.01 / 8000, min_lost=3, near_alpha=0.01)


def test_a_probe_lost_a_window_on_a_link_few_pairs_cross_adds_up_over_windows():
    """1 % loss on a NIC link four pairs cross (240 probes a window): one or
    two probes a window, never significant in one, nor in two when the
    first alone was not suspicious (a window with one loss is not: p 0.024).
    Over the windows it has lasted it is: found in the fourth, naming only
    the rows that lost probes in it, and again in the next."""
    from analyzer.detect import pooled_loss_carried

    n = 8
    g, sent, hist = _one_link(n), np.full(n, 30), np.zeros(n)
    carry = None
    found = []
    for k, row in enumerate([0, 3, 5, 1, 6]):
        lost = np.zeros(n, dtype=np.int64)
        lost[row] = 1 + k % 2
        hit, _, carry, _ = pooled_loss_carried(g, sent, lost, hist, hist, carry=carry, **SLOW)
        found.append(np.flatnonzero(hit).tolist())
    assert found == [[], [], [], [1], [6]]


def test_a_loss_that_stopped_is_not_summed_with_the_windows_after_it():
    """Eight rows share a spine's link. Three windows they lose half their
    probes (the spine down), then it is back: the next windows lose one
    probe between them, as healthy links now and then do. Summed with the
    fault's windows that one probe was significant, for as long as the
    ring held them, and named its row. This window's loss says the span's
    rate has stopped, so the span is not summed. A slow loss that goes on
    (one or two probes a window) is still found over its windows."""
    from analyzer.detect import pooled_loss_carried

    n = 8
    g, sent, hist = _one_link(n), np.full(n, 30), np.zeros(n)
    carry = None
    named = []
    for k in range(8):
        lost = np.full(n, 15) if k < 3 else np.zeros(n, dtype=np.int64)
        if k == 5:
            lost[2] = 1
        hit, _, carry, _ = pooled_loss_carried(g, sent, lost, hist, hist, carry=carry, **SLOW)
        named.append(np.flatnonzero(hit).tolist())
    assert named[:3] == [list(range(n))] * 3
    assert named[3:] == [[], [], [], [], []]
    carry, found = None, []
    for k, row in enumerate([0, 3, 5, 1, 6, 2]):
        lost = np.zeros(n, dtype=np.int64)
        lost[row] = 1 + k % 2
        hit, _, carry, _ = pooled_loss_carried(g, sent, lost, hist, hist, carry=carry, **SLOW)
        found += np.flatnonzero(hit).tolist()
    assert found == [1, 6, 2]


def test_a_loss_that_stopped_windows_ago_is_not_summed_with_a_later_lost_probe():
    """One pair (60 probes a window) loses everything for three windows (an
    overlay loop), then nothing for five: the fault has ended. In the sixth
    window it loses one probe, which at its healthy rate is not quiet in one
    window (p 0.006), so 'this window says the span ended' did not hold, and
    summed with the loop's last windows, still in the ring, it was named and
    opened a second incident. The five quiet windows after the span say it
    ended. A loss that comes back strongly is still found at once."""
    from analyzer.detect import pooled_loss_carried

    g, sent, hist = _one_link(1), np.full(1, 60), np.zeros(1)
    for back in (1, 40):
        carry, named = None, []
        for k in range(9):
            lost = np.full(1, 60 if k < 3 else 0)
            if k == 8:
                lost[0] = back
            hit, _, carry, _ = pooled_loss_carried(g, sent, lost, hist, hist, carry=carry,
                                                   **SLOW)
            named.append(bool(hit[0]))
        assert named[:3] == [True] * 3
        assert named[3:8] == [False] * 5
        assert named[8] is (back == 40)


def test_losses_at_the_healthy_rate_do_not_add_up_to_an_alarm():
    """The multi-window test spends the window's false-alarm budget across
    its scales: 200 windows of 50 links at the floor rate raise no more
    alarms than the budget allows (0.01 a window), for the same seed every
    run."""
    from analyzer.detect import Groups, pooled_loss_carried

    rng = np.random.default_rng(7)
    links, per = 50, 8
    n = links * per
    g = Groups(indptr=np.arange(n + 1), codes=np.repeat(np.arange(links), per), count=links)
    sent, hist = np.full(n, 30), np.zeros(n)
    args = dict(SLOW, floor=2e-3, alpha=0.01 / (n + links))
    carry, alarms = None, 0
    for _ in range(200):
        lost = rng.binomial(sent, 2e-3)
        hit, _, carry, _ = pooled_loss_carried(g, sent, lost, hist, hist, carry=carry, **args)
        alarms += int(hit.any())
    assert alarms <= 2


def test_a_pooled_slow_tail_blames_only_rows_whose_own_probes_are_slow():
    """Ten rows share one NIC link: five cross a slow spine link (3 of 8
    probes slow each), five stay under the ToR with the odd spike (1 of 8,
    at a healthy tail share of 5 %). The group is significant; only the rows
    whose own windows are unlikely at their own healthy share are slow.
    Before, the spikes were blamed too, and became a false 'unknown
    endpoint' incident beside a ToR-spine latency fault."""
    from analyzer.detect import OWN_ALPHA, Groups, pooled_loss_carried

    n = 10
    received = np.full(n, 8)
    slow = np.array([3, 3, 3, 3, 3, 1, 1, 1, 1, 1])
    g = Groups(indptr=np.arange(n + 1), codes=np.zeros(n, dtype=np.int64), count=1)
    h_recv, h_slow = np.full(n, 300.0), np.full(n, 15.0)  # 5 % of healthy probes slow
    args = dict(floor=0.02, alpha=0.005, min_lost=3, prior_probes=30.0)
    hit, _, _, _ = pooled_loss_carried(g, received, slow, h_recv, h_slow, own_alpha=OWN_ALPHA, **args)
    assert hit.tolist() == [True] * 5 + [False] * 5
    everyone, _, _, _ = pooled_loss_carried(g, received, slow, h_recv, h_slow, **args)
    assert everyone.all()


def test_binomial_and_poisson_tails_agree_with_scipy_stats():
    """The detector's tails come from scipy.special (scipy.stats is slow to
    import); scipy.stats is the reference, edges included."""
    from scipy import stats

    from analyzer.detect import binom_cdf, binom_sf, poisson_cdf, poisson_sf

    rng = np.random.default_rng(3)
    k = rng.integers(-1, 40, 2000)
    n = np.maximum(k, 0) + rng.integers(0, 50, 2000)
    p = rng.random(2000) * 0.4
    mu = rng.random(2000) * 30 + 1e-12
    np.testing.assert_allclose(binom_sf(k, n, p), stats.binom.sf(k, n, p), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(binom_cdf(k, n, p), stats.binom.cdf(k, n, p), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(poisson_sf(k, mu), stats.poisson.sf(k, mu), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(poisson_cdf(k, mu), stats.poisson.cdf(k, mu), rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("kind,magnitude,start,duration", [
    ("step", 12.0, 2400.0, 1300.0),  # +12 us: under what a 30 s window may call slow
    ("drift", 0.15, 1900.0, 900.0),  # a rise to +15 % over 15 min, then held
], ids=["small-step", "ramp"])
def test_a_drift_starts_where_it_began_in_its_period(tmp_path, kind, magnitude, start,
                                                     duration):
    """Only the 30-min test sees these, at the end of their period (1,800 to
    3,600 s); the incident starts where the pairs' medians left their level,
    not at the period's start, which would be up to 30 min early."""
    noise = ProbeNoise(rate_hz=2, sizes=(64,))
    incidents, _ = analyze(tmp_path, [ProbeFault(kind, start, duration, magnitude=magnitude,
                                                 hosts=(H0,))],
                           seconds=3700, noise=noise, seed=2)
    assert [(i["symptom"], i["component"]["id"]) for i in incidents] == [("degradation", LINK)]
    assert incidents[0]["start"] - T0 == pytest.approx(start, abs=45)


def test_separate_short_congestions_do_not_add_up(tmp_path):
    """Three 15 s congestions of one switch minutes apart: each is one slow
    window, and quiet windows between them end the streak."""
    faults = [ProbeFault("congestion", t, 15, hosts=(H0,)) for t in (300, 600, 900)]
    quiet = ProbeNoise(benign_per_hour=0.0, spikes_per_pair_hour=0.0)
    incidents, _ = analyze(tmp_path, faults, noise=quiet)
    assert incidents == []


def test_a_streak_follows_its_pairs_when_the_named_component_changes(tmp_path):
    """A +50 us step on one NIC's link starting late in a window: its finding
    names the link, then (benign noise adds pairs) the ToR, then the link
    again. One fault, one streak: the incident starts in the fault's first
    window, not after the name settled (and, within it, where the step
    began: analyzer/onset.py)."""
    start = 618.376188
    incidents, _ = analyze(tmp_path, [ProbeFault("step", start, magnitude=50, hosts=(H0,))],
                           seconds=start + 180, seed=10)
    assert len(incidents) == 1, [(i["component"], i["start"] - T0) for i in incidents]
    assert incidents[0]["start"] - T0 == pytest.approx(start, abs=3.0)


def test_a_drift_of_minutes_is_found_against_the_slow_reference(tmp_path):
    """RTT up 40 % over 15 minutes (a few us a minute): each window is
    judged against the last few, which crept along, so the recent history
    alone never sees it. Against the median of the last half hour's blocks
    it is one latency incident on the link once the rise reaches the size
    that counts. Without the slow reference: nothing."""
    fault = ProbeFault("drift", 900, 900, magnitude=0.4, hosts=(H0,))
    incidents, _ = analyze(tmp_path, [fault], seconds=2100)
    assert [(i["symptom"], i["component"]["id"]) for i in incidents] == [("latency", LINK)]
    assert 900 <= incidents[0]["start"] - T0 <= 1800
    ev = next(iter(incidents[0]["evidence"]["windows"].values()))
    assert any("slow_reference_median_us" in w for w in ev.values())
    blind = analyze_files(tmp_path / "t.json", tmp_path / "p.parquet",
                          cfg=AnalyzerConfig(slow_reference_blocks=0))["incidents"]
    assert blind == []


def test_a_drift_reported_short_term_is_not_reported_again_by_the_period_test(tmp_path):
    """RTT up 60 % over 45 min: the slow reference reports it as latency
    once the rise is large enough; the 30-min period test, whose healthy
    windows hold the drift's early part, flags the same pairs at the
    period's end. One fault, one incident."""
    noise = ProbeNoise(rate_hz=2, sizes=(64,))
    fault = ProbeFault("drift", 1800, 2700, magnitude=0.6, hosts=(H0,))
    incidents, _ = analyze(tmp_path, [fault], seconds=5400, noise=noise, seed=2)
    assert [(i["symptom"], i["component"]["id"]) for i in incidents] == [("latency", LINK)]


def test_rows_something_else_explains_stay_out_of_the_pooled_groups():
    """A failed host's pairs lose 10 % of their probes; beside them, on the
    same links, other pairs lose one probe each (the fabric's odd drop).
    Pooled with the host's losses, the link groups are significant and the
    bystanders' single losses were blamed with them (a false ToR incident
    beside a host fault). Rows an open incident explains are tested on
    their own and left out of the pools."""
    from analyzer.detect import Groups

    det = Detector(AnalyzerConfig())
    n = 12  # rows 0-5 the host's pairs, 6-11 bystanders; all cross one link
    rows = det.rows_for([("h", f"x{i}", 64, "udp") if i < 6 else ("y", f"x{i}", 64, "udp")
                         for i in range(n)])
    stats = np.tile(np.array([98, 100, 102, 95, 100, 2, 110], dtype=np.float64), (n, 1))
    sent = np.full(n, 30)
    g = Groups(indptr=np.arange(n + 1), codes=np.zeros(n, dtype=np.int64), count=1)
    for k in range(3):  # a healthy history
        det.observe(rows, stats, sent, np.zeros(n, dtype=np.int64), 30.0 * k, 30.0 * k + 30, g)
    lost = np.array([3] * 6 + [1, 1, 0, 0, 0, 0])
    host = np.arange(n) < 6
    obs, _ = det.observe(rows, stats, sent, lost, 90.0, 120.0, g, explained=host)
    assert not obs.loss[~host].any()
    det2 = Detector(AnalyzerConfig())
    rows2 = det2.rows_for([("h", f"x{i}", 64, "udp") if i < 6 else ("y", f"x{i}", 64, "udp")
                           for i in range(n)])
    for k in range(3):
        det2.observe(rows2, stats, sent, np.zeros(n, dtype=np.int64), 30.0 * k, 30.0 * k + 30, g)
    pooled, _ = det2.observe(rows2, stats, sent, lost, 90.0, 120.0, g)
    assert pooled.loss[6:8].all()  # without: the bystanders are blamed


def test_short_congestions_of_different_switches_in_a_row_do_not_chain(tmp_path):
    """Three short congestions in three windows in a row, each of another
    switch (a rail-1 ToR, a spine, a rail-0 ToR), each window's slow pairs
    sharing half of the last window's: a streak followed the pairs across
    unrelated switches and made one 'latency' incident of three benign
    episodes. A streak continues only across the same or touching
    components (a link and its switch)."""
    lay = Layout(hosts=8, rails=2, hosts_per_tor=2, spines=2)
    doc = layout_doc(lay)
    faults = [ProbeFault("congestion", 307, 6, switch=lay.tor(1, 0)),
              ProbeFault("congestion", 340, 19, switch=lay.spine(1)),
              ProbeFault("congestion", 363, 6, switch=lay.tor(0, 0))]
    quiet = ProbeNoise(rate_hz=2.0, benign_per_hour=0.0, spikes_per_pair_hour=0.0)
    table, _ = simulate_probes(doc, 900, faults, quiet, seed=4, t0=T0)
    (tmp_path / "t.json").write_text(json.dumps(doc))
    pq.write_table(table, tmp_path / "p.parquet")
    incidents = analyze_files(tmp_path / "t.json", tmp_path / "p.parquet")["incidents"]
    assert incidents == [], [(i["component"], i["start"] - T0) for i in incidents]


@pytest.mark.parametrize("packed", [True, False])
def test_rows_by_packed_keys_number_windows_as_a_dictionary_would(packed):
    """Rows are found by packed int64 keys and a sorted search; the
    reference numbers (src, dst, size, protocol) keys in a dictionary, new
    keys in order of first appearance. Batches name their endpoints and
    protocols in any order; tuple and column calls share one numbering; a
    pair's RDMA and UDP probes of one size are two rows (two instruments,
    two histories); past the packing's room the dictionary alone numbers
    them the same."""
    rng = np.random.default_rng(5)
    det = Detector(AnalyzerConfig())
    det._packed = packed
    ref: dict[tuple[str, str, int, str], int] = {}
    eps = [f"h{i}/rnic0" for i in range(40)]
    for call in range(8):
        n = int(rng.integers(1, 300))
        a, b = rng.integers(0, len(eps), n), rng.integers(0, len(eps), n)
        size = rng.choice([64, 256, 1024, 4096, 70_000], n)
        proto = rng.choice(["rdma", "udp"], n)
        keys = [(eps[x], eps[y], int(s), str(p))
                for x, y, s, p in zip(a, b, size, proto, strict=True)]
        want = [ref.setdefault(k, len(ref)) for k in keys]
        if call % 2:
            got = det.rows_for(keys)
        else:
            names = [eps[i] for i in rng.permutation(len(eps))]
            code = {x: i for i, x in enumerate(names)}
            protos = ["udp", "rdma"] if call % 4 else ["rdma", "udp"]
            got = det.rows_for_columns(names, np.array([code[k[0]] for k in keys]),
                                       np.array([code[k[1]] for k in keys]), size, protos,
                                       np.array([protos.index(k[3]) for k in keys]))
        assert got.tolist() == want
        assert det.keys == list(ref)
    assert len({k[:3] for k in ref}) < len(ref)  # some pair and size over both protocols
