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
