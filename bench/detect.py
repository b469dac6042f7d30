"""Detection speed and delay.

    python bench/detect.py [--pairs 524288] [--delay-runs 5]

Prints one JSON line:
- one 30 s window of ~512 K pairs through the analyzer engine (WindowStats
  in, incidents out), from the wire (agents' reports of 256 windows, through
  the controller's decoding and report feed, to the live analyzer; also the
  analyzer fed one event per report, and the controller's own time) and
  through the array core alone (analyzer/detect.py), after 6 warm-up
  windows; goal <= 3 s per window;
- the vectorized LOF against scikit-learn's LocalOutlierFactor, one pair at
  a time, on the same 2,000 pairs (ratio measured in this run);
- median detection delay (fault start -> incident visible to `tick`) for a
  1 % loss and a +50 us latency step starting at random moments, windows of
  30 s, grace 3 s; goals <= 35 s and <= 65 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analyzer.batch import WindowBatch  # noqa: E402
from analyzer.detect import STATS  # noqa: E402
from analyzer.engine import Analyzer  # noqa: E402
from analyzer.lof import lof_novelty  # noqa: E402
from analyzer.records import ProbeRecords  # noqa: E402
from analyzer.windows import compute_windows  # noqa: E402
from controller.service import _coalesce  # noqa: E402
from controller.state import ReportEvent  # noqa: E402
from netskel import serde  # noqa: E402
from netskel.api.v1 import controller_pb2 as pb  # noqa: E402
from netskel.config import AnalyzerConfig  # noqa: E402
from netskel.grpcserver import Mailbox  # noqa: E402
from netskel.model import WindowStats  # noqa: E402
from netskel.probesim import ProbeFault, simulate_probes  # noqa: E402
from netskel.topology import parse_topology  # noqa: E402
from testbed.layout import Layout, layout_doc  # noqa: E402

W = 30.0
REPORT = 256  # windows per agent report: 64 targets x 4 size classes
T0 = 1_733_988_600.0


def window_throughput(n_pairs: int) -> dict[str, object]:
    hosts = int(np.ceil((1 + np.sqrt(1 + 8 * n_pairs)) / 2))
    lay = Layout(hosts=hosts, rails=1, hosts_per_tor=32, spines=4)
    topo = parse_topology(layout_doc(lay))
    eps = [lay.endpoint(h, 0) for h in range(hosts)]
    ia, ib = np.triu_indices(hosts, k=1)
    ia, ib = ia[:n_pairs], ib[:n_pairs]
    rng = np.random.default_rng(0)
    base = rng.uniform(70, 130, n_pairs)

    def windows(k: int) -> list[WindowStats]:
        med = base * rng.lognormal(0, 0.01, n_pairs)
        lost = rng.binomial(300, 0.00005, n_pairs)  # healthy: all but lossless
        s = T0 + k * W
        return [WindowStats(eps[a], eps[b], s, s + W, 64, 300, int(lo), m - 6, m - 2, m, m + 2, m,
                            2.0, m + 30) for a, b, m, lo in zip(ia, ib, med.tolist(), lost, strict=True)]
    eng = Analyzer(topo, AnalyzerConfig())
    times = []
    for k in range(8):
        batch = windows(k)
        t = time.perf_counter()
        rejected = eng.add_windows(batch)
        eng.tick(T0 + (k + 1) * W + 5)
        times.append(time.perf_counter() - t)
        assert not rejected
    incidents = len(eng.incidents)
    # The same windows as agents' reports carry them (REPORT windows each),
    # through the controller (each report decoded, queued on the feed and
    # sent on as its feed coalesces them when every agent reports at once:
    # `controller_window_s`) to the analyzer's live path: each event parsed
    # from its bytes, decoded into columns (serde), validated, charted and
    # queued; then the window analysed (`wire_window_s`). No WindowStats is
    # built. `report_events_window_s`: the analyzer given one event per
    # agent report, as before the feed coalesced them.
    wire = Analyzer(topo, AnalyzerConfig())
    single = Analyzer(topo, AnalyzerConfig())
    wire_times: list[float] = []
    single_times: list[float] = []
    ctl_times: list[float] = []
    for k in range(8):
        ws = windows(k)
        raw = [pb.AgentReport(windows=serde.window_batch_to_pb(WindowBatch.from_windows(
            ws[i:i + REPORT]))).SerializeToString() for i in range(0, len(ws), REPORT)]
        del ws
        t = time.perf_counter()
        events = feed_events(raw)
        ctl_times.append(time.perf_counter() - t)
        one_each = [pb.ReportEvent(windows=pb.AgentReport.FromString(r).windows)
                    .SerializeToString() for r in raw]
        for analyzer, evs, took in ((wire, events, wire_times), (single, one_each, single_times)):
            t = time.perf_counter()
            for r in evs:
                rejected = analyzer.add_live(serde.window_batch_from_pb(
                    pb.ReportEvent.FromString(r).windows))
                assert not rejected
            analyzer.tick(T0 + (k + 1) * W + 5)
            took.append(time.perf_counter() - t)
    incidents += len(wire.incidents) + len(single.incidents)
    del wire, single
    # The array core alone, on the same rows.
    det = eng.detector
    batch = windows(8)
    rows = det.rows_for([(w.src, w.dst, w.size, w.proto) for w in batch])
    stats = np.array([[getattr(w, f) for f in STATS] for w in batch])
    sent = np.full(len(batch), 300)
    lost = np.array([w.lost for w in batch])
    groups = eng.groups.of_rows(rows)
    t = time.perf_counter()
    det.observe(rows, stats, sent, lost, T0 + 8 * W, T0 + 9 * W, groups)
    core = time.perf_counter() - t
    return {"pairs": int(n_pairs), "engine_window_s": round(float(np.median(times[6:])), 2),
            "wire_window_s": round(float(np.median(wire_times[6:])), 2),
            "report_events_window_s": round(float(np.median(single_times[6:])), 2),
            "controller_window_s": round(float(np.median(ctl_times[6:])), 2),
            "first_window_s": round(times[0], 2), "core_window_s": round(core, 2),
            "engine_pair_windows_per_s": int(n_pairs / np.median(times[6:])),
            "core_pair_windows_per_s": int(n_pairs / core), "false_incidents": incidents}


def feed_events(reports: list[bytes]) -> list[bytes]:
    """Agents' serialized reports as the controller's report feed sends them
    on when they all arrived before the analyzer read: each decoded, queued,
    and coalesced by the feed itself (`_coalesce`)."""
    loop = asyncio.new_event_loop()
    try:
        box: Mailbox[ReportEvent] = Mailbox(loop, len(reports) + 1)
        for r in reports:
            box.offer(serde.window_batch_from_pb(pb.AgentReport.FromString(r).windows))
        out = []
        while (first := loop.run_until_complete(box.get(0.0))) is not None:
            assert isinstance(first, WindowBatch)
            out.append(pb.ReportEvent(windows=serde.window_batch_to_pb(
                _coalesce(first, box))).SerializeToString())
        return out
    finally:
        loop.close()


def lof_speed(pairs: int = 2000) -> dict[str, object]:
    from sklearn.neighbors import LocalOutlierFactor

    rng = np.random.default_rng(1)
    hist = rng.normal(0, 1, (pairs, 10, 7))
    valid = np.ones((pairs, 10), dtype=bool)
    q = rng.normal(0, 1, (pairs, 7))
    t = time.perf_counter()
    fast = lof_novelty(hist, valid, q, 5).score
    t_fast = time.perf_counter() - t
    t = time.perf_counter()
    ref = np.array([-LocalOutlierFactor(n_neighbors=5, novelty=True).fit(hist[i])
                    .score_samples(q[i:i + 1])[0] for i in range(pairs)])
    t_ref = time.perf_counter() - t
    return {"pairs": pairs, "vectorized_s": round(t_fast, 4), "sklearn_s": round(t_ref, 2),
            "speedup": round(t_ref / t_fast, 1), "max_abs_diff": float(np.abs(fast - ref).max())}


def delays(runs: int) -> dict[str, object]:
    lay = Layout(hosts=8, rails=1, hosts_per_tor=4, spines=1)
    doc = layout_doc(lay)
    topo = parse_topology(doc)
    out: dict[str, object] = {}
    rng = np.random.default_rng(7)
    for name, kind, mag in (("loss_1pct", "loss", 0.01), ("latency_step_50us", "step", 50.0)):
        got = []
        for run in range(runs):
            start = 600 + float(rng.uniform(0, W))
            table, _ = simulate_probes(doc, start + 180, [ProbeFault(kind, start, magnitude=mag,
                                                                     hosts=(lay.host(0),))],
                                       seed=run, t0=T0)
            rec = ProbeRecords(ts=table.column("ts").to_numpy(),
                               src=np.asarray(table.column("src").to_pylist(), dtype=object),
                               dst=np.asarray(table.column("dst").to_pylist(), dtype=object),
                               size=table.column("size").to_numpy().astype(np.int64),
                               rtt_us=table.column("rtt_us").to_numpy(zero_copy_only=False),
                               proto=np.asarray(["udp"] * table.num_rows, dtype=object), route=None)
            eng = Analyzer(topo, AnalyzerConfig(), grace_s=3.0)
            eng.add_windows(compute_windows(rec, W))
            seen = None
            for k in range(int((start + 180) // W) + 1):
                now = T0 + (k + 1) * W + 3.0
                eng.tick(now)
                if eng.incidents:
                    seen = now - (T0 + start)
                    break
            got.append(None if seen is None else round(seen, 1))  # None: never found
        found = [g for g in got if g is not None]
        out[name] = {"median_delay_s": round(float(np.median(found)), 1) if found else None,
                     "delays_s": got}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=524_288)
    ap.add_argument("--delay-runs", type=int, default=5)
    a = ap.parse_args()
    print(json.dumps({"bench": "detect", "window": window_throughput(a.pairs), "lof": lof_speed(),
                      "detection_delay": delays(a.delay_runs)}))


if __name__ == "__main__":
    main()
