"""bench/inject.py --place: where random faults go. Its figures judge the
analyzer at placements the fixed ones never tried, so a recording too short
to hold one must be refused, not given a fault that starts before it."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import bench_script


def _recording(d: Path, seconds: float) -> Path:
    d.mkdir()
    topo = {"switches": [{"id": "tor-0", "tier": "tor"}, {"id": "spine-0", "tier": "spine"}],
            "containers": [{"id": f"c{i}", "endpoints": [{"id": f"c{i}/rnic0"}]}
                           for i in range(3)]}
    (d / "topology.json").write_text(json.dumps(topo))
    ts = pa.array([1.7e9, 1.7e9 + seconds / 2, 1.7e9 + seconds])
    pq.write_table(pa.table({"ts": ts}), d / "probes.parquet")
    return d


def test_a_placement_lies_inside_the_recording_with_room_on_both_sides(tmp_path: Path) -> None:
    inj = bench_script("inject")
    rec = _recording(tmp_path / "long", 1200.0)
    for seed in range(20):
        ep, tor, spine, start, length = inj.placement(rec, seed)
        assert (ep.endswith("/rnic0"), tor, spine) == (True, "tor-0", "spine-0")
        assert 300.0 <= length <= 800.0 and start >= 200.0 and start + length <= 1000.0


def test_a_recording_too_short_for_a_placement_is_refused(tmp_path: Path) -> None:
    rec = _recording(tmp_path / "short", 600.0)
    with pytest.raises(ValueError, match="600 s of probes; a placement needs at least 700 s"):
        bench_script("inject").placement(rec, 1)
