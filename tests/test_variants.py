"""bench/variants.py's copies of the dev set carry a truth that says what
they hold."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from tests.helpers import bench_script

CLEAN = Path(__file__).resolve().parent.parent.parent / "shared/data/dev/faults/dev-fa1_clean_busy"


def test_copies_of_the_clean_recording_bring_their_congestions_into_the_truth():
    variants = bench_script("variants")
    truth = json.loads((CLEAN / "truth.json").read_text())
    table = pq.read_table(CLEAN / "probes.parquet")
    _, out = variants.surround(table, truth, CLEAN, 1, 2)
    dur = float(truth["t_end"]) - float(truth["t0"])
    own = [(b["switch"], b["start"]) for b in truth["benign"]]
    got = [(b["switch"], b["start"]) for b in out["benign"]]
    assert len(got) == 4 * len(own)
    for k in (-1, 0, 1, 2):
        assert all(any(s == sw and abs(t - (t0 + k * dur)) < 1e-6 for s, t in got)
                   for sw, t0 in own)
    assert got == sorted(got, key=lambda g: g[1])
    assert all(out["t0"] <= b["start"] and b["end"] <= out["t_end"] for b in out["benign"])


def test_thinned_routes_keep_every_pair_traced_now_and_then_and_never_invent_one():
    variants = bench_script("variants")
    table = pq.read_table(CLEAN / "probes.parquet").slice(0, 200_000)
    out = variants.thin_routes(table, 0.4, seed=3)
    before, after = table.column("route").to_pylist(), out.column("route").to_pylist()
    assert all(a is None or a == b for a, b in zip(after, before, strict=True))
    had = sum(1 for b in before if b)
    kept = sum(1 for a in after if a)
    assert 0.35 * had < kept < 0.45 * had
    pairs = list(zip(table.column("src").to_pylist(), table.column("dst").to_pylist(),
                     strict=True))
    traced = {p for p, b in zip(pairs, before, strict=True) if b}
    assert {p for p, a in zip(pairs, after, strict=True) if a} == traced  # no pair left untraced
