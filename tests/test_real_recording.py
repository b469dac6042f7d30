"""Inference on real traffic we recorded, not simulated: the testbed's
pp=4 x dp=2 PyTorch (gloo) job (tests/test_testbed_torch.py, kept with
NETSKEL_RECORD_DIR). The CLI reads it as a user's files and the answer is
scored by the dev-set rules, so the real job checks the method on every
run, also where the testbed cannot be built."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_infer_on_the_recorded_pure_pipeline_is_exact(tmp_path: Path) -> None:
    """The same job with one replica (NETSKEL_TORCH_SHAPE=4x1): no gradient
    all-reduce at all, so stages, order and partners come from the
    transfers alone (controller/pipeline_only.py); before, it read as one
    stage of four replicas and kept every pair."""
    rec = Path(__file__).parent / "data" / "gloo-pp4dp1"
    out = tmp_path / "skeleton.json"
    assert main(["infer", "--topology", str(rec / "topology.json"),
                 "--throughput", str(rec / "throughput.parquet"), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    [score] = score_skeleton(json.loads((rec / "truth.json").read_text()), doc)
    assert score["parallelism_ok"] and score["dp_groups_ok"] and score["stages_ok"], score
    assert score["recall"] == 1.0 and score["precision"] == 1.0, score
    assert doc["jobs"][0]["confidence"] > 0.5
