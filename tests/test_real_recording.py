"""Inference on real traffic we recorded, not simulated: the testbed's
pp=4 x dp=2 PyTorch (gloo) job (tests/test_testbed_torch.py, kept with
NETSKEL_RECORD_DIR). The CLI reads it as a user's files and the answer is
scored by the dev-set rules, so the real job checks the method on every
run, also where the testbed cannot be built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netskel.cli import main
from netskel.scoring import score_skeleton

REC = Path(__file__).parent / "data" / "gloo-pp4dp2"


def test_infer_on_the_recorded_gloo_job_is_exact(tmp_path: Path) -> None:
    out = tmp_path / "skeleton.json"
    assert main(["infer", "--topology", str(REC / "topology.json"),
                 "--throughput", str(REC / "throughput.parquet"), "-o", str(out)]) == 0
    [score] = score_skeleton(json.loads((REC / "truth.json").read_text()),
                             json.loads(out.read_text()))
    assert score["parallelism_ok"] and score["dp_groups_ok"] and score["stages_ok"], score
    assert score["recall"] == 1.0 and score["precision"] == 1.0, score


@pytest.mark.parametrize("name", ["gloo-pp4dp1", "gloo-pp2dp1", "gloo-pp1dp2"])
def test_infer_with_one_replica_or_two_hosts_is_exact(tmp_path: Path, name: str) -> None:
    """The same job in other shapes (NETSKEL_TORCH_SHAPE=4x1, 2x1, 1x2).
    With one replica there is no gradient all-reduce at all, so stages,
    order and partners come from the transfers alone
    (controller/pipeline_only.py): pp4 read as one stage of four replicas
    keeping every pair, pp2 as dp2 at confidence 1.0. On two hosts a
    pipeline and an all-reduce look alike but for 1F1B's shape, and the
    all-reduce must stay dp2."""
    rec = Path(__file__).parent / "data" / name
    out = tmp_path / "skeleton.json"
    assert main(["infer", "--topology", str(rec / "topology.json"),
                 "--throughput", str(rec / "throughput.parquet"), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    [score] = score_skeleton(json.loads((rec / "truth.json").read_text()), doc)
    assert score["parallelism_ok"] and score["dp_groups_ok"] and score["stages_ok"], score
    assert score["recall"] == 1.0 and score["precision"] == 1.0, score
    assert doc["jobs"][0]["confidence"] > 0.5
