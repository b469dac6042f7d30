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

from analyzer.batch import WindowBatch
from analyzer.engine import Analyzer
from analyzer.records import read_probe_records
from analyzer.windows import window_batch
from netskel.config import AnalyzerConfig
from netskel.model import RouteStats, WindowStats, pair_key
from netskel.probesim import ProbeFault, ProbeNoise, simulate_probes, with_overlay
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
        level = w.rtt_median
        need = max(cfg.latency_min_shift_us, cfg.latency_rel_shift * level)
        for r in w.routes:
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
        engine._note_routes(part)
        want = _reference_by_route(engine, part.windows())
        got = {p: engine._rt.of(p) for p in engine._rt.pairs}
        assert got.keys() == want.keys()
        for pair, per in want.items():
            assert got[pair].keys() == per.keys()
            for k, v in per.items():
                assert got[pair][k] == pytest.approx(v), (pair, k)
        checked += sum(len(p) for p in want.values())
    assert checked > 100
    # Some routes were found slow: the fault is in the recording.
    assert engine._rt.slow().any()


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
