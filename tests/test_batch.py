"""Windows as columns (analyzer/batch.py): the batch `netskel analyze`
computes says what the objects said, and the engine's per-route sums over
it agree with the per-window loop they replaced."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.batch import STAT_FIELDS, WindowBatch
from analyzer.engine import Analyzer
from analyzer.records import read_probe_records
from analyzer.windows import window_batch
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import controller_pb2 as pb
from netskel.config import AnalyzerConfig
from netskel.errors import InputError
from netskel.model import RouteStats, WindowStats, pair_key
from netskel.probesim import ProbeFault, ProbeNoise, simulate_probes, with_overlay
from netskel.serde import window_batch_from_pb, window_batch_to_pb, window_from_pb
from netskel.topology import parse_topology
from testbed.layout import Layout, layout_doc

LAY = Layout(hosts=8, rails=1, hosts_per_tor=2, spines=2)
T0 = 1_733_988_600.0


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    doc = with_overlay(layout_doc(LAY))
    fault = ProbeFault("step", 200, magnitude=100,
                       link="~".join(sorted((LAY.tor(0, 1), LAY.spine(1)))))
    table, _ = simulate_probes(doc, 300.0, [fault], ProbeNoise(rate_hz=2.0), seed=2, t0=T0)
    d = tmp_path_factory.mktemp("rec")
    pq.write_table(table, d / "p.parquet")
    topo = parse_topology(json.loads(json.dumps(doc)))
    return topo, window_batch(read_probe_records(d / "p.parquet", topo), 30.0)


def _same(a: WindowStats, b: WindowStats) -> bool:
    """Equal, NaN equal to NaN."""
    def norm(w: WindowStats) -> tuple[object, ...]:
        flat = [getattr(w, f.name) for f in dataclasses.fields(w) if f.name != "routes"]
        flat += [x for r in w.routes for x in (r.route, r.sent, r.lost, r.rtt_median)]
        return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in flat)
    return norm(a) == norm(b)


def test_objects_round_trip_through_a_batch(recording):
    _, batch = recording
    ws = batch.windows()
    assert len(ws) == len(batch) > 0
    assert any(w.routes for w in ws) and any(w.lost for w in ws)
    again = WindowBatch.from_windows(ws)
    assert all(_same(a, b) for a, b in zip(again.windows(), ws, strict=True))
    # take, concat and by_window keep every window exactly once, unchanged.
    half = len(batch) // 2
    idx = np.arange(len(batch))
    parts = [batch.take(idx[:half]), WindowBatch.from_windows(ws[half:])]
    joined = WindowBatch.concat(parts).windows()
    assert all(_same(a, b) for a, b in zip(joined, ws, strict=True))
    spans = [(s, e, p.windows()) for s, e, p in batch.by_window()]
    assert [s for s, _, _ in spans] == sorted({w.window_start for w in ws})
    assert sum(len(p) for _, _, p in spans) == len(ws)
    for s, e, p in spans:
        assert all(w.window_start == s and w.window_end == e for w in p)


def _reference_by_route(engine: Analyzer, windows: list[WindowStats]
                        ) -> dict[tuple[str, str], dict[tuple[str, str], list[float]]]:
    """The per-window loop the batch sums replaced (slow, obviously right)."""
    cfg = engine.cfg
    out: dict[tuple[str, str], dict[tuple[str, str], list[float]]] = defaultdict(dict)
    for w in windows:
        if not w.routes:
            continue
        per = out[pair_key(w.src, w.dst)]
        for j, r in enumerate(w.routes):
            # The row's median or its fastest other route's, whichever is lower.
            level = min([w.rtt_median, *(o.rtt_median for i, o in enumerate(w.routes)
                                         if i != j and math.isfinite(o.rtt_median))])
            need = max(cfg.latency_min_shift_us, cfg.latency_rel_shift * level)
            v = per.setdefault((w.src, r.route), [0.0] * 7)
            v[0] += r.sent
            v[1] += r.lost
            if r.sent > r.lost and math.isfinite(r.rtt_median) and math.isfinite(level):
                n = r.sent - r.lost
                v[2] += (r.rtt_median - level) * n
                v[3] += n
                v[4] += level * n
                v[5] += 1
                v[6] += r.rtt_median - level >= need
    return dict(out)


def test_route_sums_agree_with_the_per_window_loop(recording):
    topo, batch = recording
    engine = Analyzer(topo, AnalyzerConfig())
    checked = 0
    for _, _, part in batch.by_window():
        engine.routes.note(part)
        want = _reference_by_route(engine, part.windows())
        got = {p: engine.routes.sums.of(p) for p in engine.routes.sums.pairs}
        assert got.keys() == want.keys()
        for pair, per in want.items():
            assert got[pair].keys() == per.keys()
            for k, v in per.items():
                assert got[pair][k] == pytest.approx(v), (pair, k)
        checked += sum(len(p) for p in want.values())
    assert checked > 100
    # Some routes were found slow: the fault is in the recording.
    assert engine.routes.sums.slow().any()


def test_live_and_offline_windows_give_the_same_incidents(recording):
    """The live path (objects, one message each) and the offline one
    (columns) are one analysis."""
    topo, batch = recording
    a, b = Analyzer(topo, AnalyzerConfig()), Analyzer(topo, AnalyzerConfig())
    assert a.add_windows(batch.windows()) == []
    assert b.add_batch(batch) == []
    a.flush()
    b.flush()
    got = [i.to_doc() for i in b.list_incidents()]
    assert got == [i.to_doc() for i in a.list_incidents()]
    assert got, "the slow spine link made an incident"
    late = WindowBatch.from_windows([WindowStats("x", "y", T0, T0 + 30, 64, 10, 0, *[1.0] * 7,
                                                 routes=(RouteStats("s", 10, 0, 1.0),))])
    assert b.add_batch(late) == [f"1 windows of [{T0}, {T0 + 30}): "
                                 "window arrived after its time was analysed"]


_NAMES = st.sampled_from(["", "a/rnic0", "b/rnic0", "c/rnic1"])
_RTT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0.0, 300.0))


@st.composite
def _garbage_window(draw: st.DrawFn) -> WindowStats:
    """Windows as a broken or hostile agent could send them."""
    start = draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                           st.sampled_from([T0, T0 + 30.0])))
    return WindowStats(draw(_NAMES), draw(_NAMES), start,
                       draw(st.one_of(st.just(start + 30.0), st.floats(allow_nan=True))),
                       64, draw(st.integers(-2, 6)), draw(st.integers(-2, 7)),
                       *(draw(_RTT) for _ in range(7)), slow=draw(st.integers(-1, 7)))


@settings(max_examples=200, deadline=None)
@given(st.lists(_garbage_window(), max_size=30))
def test_column_validation_agrees_with_each_windows_own(ws):
    """The live path validates windows in one numpy pass; the reference is
    WindowStats.problem, one window at a time: the same windows rejected,
    for the same reason."""
    want = [(i, w.problem()) for i, w in enumerate(ws) if w.problem() is not None]
    assert WindowBatch.from_windows(ws).problems() == want


@st.composite
def _wire_window(draw: st.DrawFn) -> cpb.WindowStats:
    sent = draw(st.integers(0, 6))
    m = cpb.WindowStats(src=draw(_NAMES), dst=draw(_NAMES), window_start=T0,
                        window_end=T0 + 30.0, size=draw(st.sampled_from([64, 4096])),
                        sent=sent, lost=draw(st.integers(0, 8)), slow=draw(st.integers(0, 8)),
                        proto=draw(st.sampled_from(["", "udp", "rdma"])),
                        route=draw(st.sampled_from(["", "t0>s1>t1"])),
                        clock=draw(st.sampled_from(["", "kernel", "user", "hardware", "bogus"])),
                        **{f: draw(_RTT) for f in STAT_FIELDS})
    for _ in range(draw(st.integers(0, 3))):
        m.routes.add(route=draw(st.sampled_from(["", "t0>s0>t1", "t0>s1>t1"])),
                     sent=draw(st.integers(0, 4)), lost=draw(st.integers(0, 5)),
                     rtt_median=draw(_RTT))
    return m


@settings(max_examples=200, deadline=None)
@given(st.lists(_wire_window(), max_size=20))
def test_windows_sent_as_columns_arrive_as_the_messages_would(ms):
    """An agent sends its windows as columns; the reference decodes each
    window's own message (window_from_pb). Both forms in one report are
    read alike, and the columns of a batch survive the wire unchanged."""
    want = WindowBatch.from_windows([window_from_pb(m) for m in ms])
    raw = window_batch_from_pb(pb.WindowBatch(windows=ms))
    assert len(raw) == len(want)
    for packed in (True, False):  # today's agents, older ones
        columns = window_batch_to_pb(want, packed=packed)
        got = window_batch_from_pb(pb.WindowBatch.FromString(columns.SerializeToString()))
        assert len(got) == len(want)
        for i in range(len(ms)):
            assert _same(got.window(i), want.window(i)) and _same(raw.window(i), want.window(i))


@settings(max_examples=300, deadline=None)
@given(st.lists(_wire_window(), max_size=6), st.data())
def test_columns_that_do_not_fit_together_are_one_clear_error(ms, data):
    """A column cut short or an index past its table (a broken or hostile
    agent) is an InputError naming the column, never a crash or windows
    read from the wrong rows."""
    c = window_batch_to_pb(WindowBatch.from_windows([window_from_pb(m) for m in ms]),
                           packed=False).columns
    field = data.draw(st.sampled_from([f.name for f in c.DESCRIPTOR.fields
                                       if f.name != "packed"]))  # the repeated ones
    values = getattr(c, field)
    if values and data.draw(st.booleans()):
        del values[-1]
    else:
        values.append(data.draw(st.integers(0, 9)) if field not in (
            "names", "protos", "route_names", "clocks") else "x")
    try:
        got = window_batch_from_pb(pb.WindowBatch(columns=c))
    except InputError as e:
        assert "window columns" in str(e)
    else:
        # Only a name appended to a table fits, or a clock column left with
        # no entry at all (an older agent's: every clock unknown); the
        # windows are unchanged.
        assert len(got) == len(ms)
        assert field in ("names", "protos", "route_names", "clocks") or (
            field == "clock" and not c.clock and set(got.clocks) == {""}), field


_PACKED_TYPES = {"window_start": "<f8", "window_end": "<f8", "rtt": "<f8", "route_median": "<f8",
                 "route": "<i4"}  # the rest uint32


@settings(max_examples=300, deadline=None)
@given(st.lists(_wire_window(), max_size=6), st.data())
def test_packed_columns_that_do_not_fit_are_one_clear_error(ms, data):
    """The packed form: a column a value short or long, or cut inside a
    value, or an index past its table, is an InputError naming the column;
    so is a message carrying both forms (a broken writer: which to trust?)."""
    c = window_batch_to_pb(WindowBatch.from_windows([window_from_pb(m) for m in ms])).columns
    field = data.draw(st.sampled_from([f.name for f in c.packed.DESCRIPTOR.fields]))
    kind = np.dtype(_PACKED_TYPES.get(field, "<u4"))
    raw = getattr(c.packed, field)
    how = data.draw(st.sampled_from(["short", "long", "torn", "both"]))
    if how == "short" and raw:
        setattr(c.packed, field, raw[:-kind.itemsize])
    elif how == "torn":
        setattr(c.packed, field, raw + b"\x01")
    elif how == "both":
        getattr(c, field).append(0)
    else:
        setattr(c.packed, field, raw + np.array([data.draw(st.integers(0, 9))], kind).tobytes())
    try:
        got = window_batch_from_pb(pb.WindowBatch.FromString(
            pb.WindowBatch(columns=c).SerializeToString()))
    except InputError as e:
        assert "window columns" in str(e)
        # src sets the window count, so it is the others that disagree
        assert field in str(e) or field == "src" or how == "both" or "index out of" in str(e)
    else:
        # Only a clock column left with no entry at all reads (every clock
        # unknown), or a window's route count cut from 0 to none
        assert how == "short" and field == "clock" and not c.packed.clock and len(got) == len(ms)
        assert set(got.clocks) == {""}


def test_live_windows_in_columns_are_rejected_charted_and_queued_as_objects_were():
    """The analyzer's live path (columns from the wire) rejects the bad
    windows with their reasons, charts and analyses the rest."""
    topo = parse_topology(layout_doc(LAY))
    a, b, c = (LAY.endpoint(h, 0) for h in range(3))
    ok = [WindowStats(a, b, T0, T0 + 30, 64, 30, 0, 10, 11, 12, 13, 12, 1, 20),
          WindowStats(a, c, T0, T0 + 30, 64, 30, 30)]
    bad = [WindowStats(a, a, T0, T0 + 30, 64, 30, 0, 10, 11, 12, 13, 12, 1, 20),
           WindowStats(b, c, T0, T0 + 30, 64, 3, 5)]
    engine = Analyzer(topo, AnalyzerConfig())
    rejected = engine.add_live(WindowBatch.from_windows(ok[:1] + bad + ok[1:]))
    assert rejected == [f"{a}->{a}: src equals dst",
                        f"{b}->{c}: impossible counts sent=3 lost=5"]
    assert [p.median_us for p in engine.history.points((a, b))] == [12]
    assert math.isnan(engine.history.points((a, c))[0].median_us)
    assert engine.add_live(WindowBatch.from_windows(ok)) == []  # not yet analysed: accepted
    engine.tick(T0 + 60)
    assert engine.add_live(WindowBatch.from_windows(ok)) == [
        f"{a}->{b}: window arrived after its time was analysed",
        f"{a}->{c}: window arrived after its time was analysed"]


def test_route_statistics_agree_with_the_raw_probes(recording, tmp_path):
    """Each window's per-route sent, lost and median RTT, as a dictionary
    of the recording's own probes computes them (the columns take the
    routes' RTT order from the windows' sort, without sorting again)."""
    topo, _ = recording
    doc = with_overlay(layout_doc(LAY))
    table, _ = simulate_probes(doc, 120.0, [], ProbeNoise(rate_hz=3.0, healthy_loss=0.05), seed=5, t0=T0)
    pq.write_table(table, tmp_path / "p.parquet")
    batch = window_batch(read_probe_records(tmp_path / "p.parquet", topo), 30.0)
    want: dict[tuple[object, ...], list[float]] = defaultdict(list)
    sent: dict[tuple[object, ...], int] = defaultdict(int)
    for r in table.to_pylist():
        if not r.get("route"):
            continue
        key = (math.floor(r["ts"] / 30.0) * 30.0, r["src"], r["dst"], r["size"], r["route"])
        sent[key] += 1
        if r["rtt_us"] is not None:
            want[key].append(r["rtt_us"])
    got = {(w.window_start, w.src, w.dst, w.size, rs.route): rs
           for w in batch.windows() for rs in w.routes}
    assert got.keys() == sent.keys() and any(len(v) < sent[k] for k, v in want.items())
    for key, rs in got.items():
        assert rs.sent == sent[key] and rs.lost == sent[key] - len(want[key])
        if want[key]:
            assert rs.rtt_median == pytest.approx(float(np.median(want[key])), rel=1e-12)
        else:
            assert math.isnan(rs.rtt_median)


def test_row_order_of_a_probe_file_does_not_change_its_windows(recording, tmp_path):
    """Probe files need not be sorted (other tools write them): the same
    probes in another row order are the same windows, the route a window
    names included (it was the last traced row seen, so a shuffled file
    moved votes between links)."""
    topo, _ = recording
    doc = with_overlay(layout_doc(LAY))
    table, _ = simulate_probes(doc, 120.0, [], ProbeNoise(rate_hz=3.0), seed=7, t0=T0)
    shuffled = table.take(np.random.default_rng(3).permutation(table.num_rows))
    got = []
    for name, t in (("sorted", table), ("shuffled", shuffled)):
        pq.write_table(t, tmp_path / f"{name}.parquet")
        got.append(window_batch(read_probe_records(tmp_path / f"{name}.parquet", topo), 30.0))
    a, b = got
    assert a.route_names == b.route_names and (a.route >= 0).any()
    for field in ("src", "dst", "start", "size", "sent", "lost", "route", "r_ptr", "r_route",
                  "r_sent", "r_lost"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    np.testing.assert_allclose(a.stats, b.stats, rtol=1e-12)
    # More than one route in some window: which one a window names is a choice.
    assert (np.diff(a.r_ptr) > 1).any()
