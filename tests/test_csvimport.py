"""The SkeletonHunter sample CSV becomes contract probe records that replay
through `netskel analyze` against the topology stub built from it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from netskel.cli import main

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "skeletonhunter-samples.csv"


def test_import_samples_and_replay(tmp_path):
    probes, topo, out = tmp_path / "p.parquet", tmp_path / "t.json", tmp_path / "inc.json"
    assert main(["import-csv", str(SAMPLES), "--probes", str(probes), "--topology", str(topo)]) == 0
    t = pq.read_table(probes)
    assert t.num_rows == 3
    assert t.column("rtt_us").to_pylist() == [16.183, 14.948, 11.954]
    assert t.column("ts").to_pylist()[0] == 1733989087.1621418
    assert set(t.column("proto").to_pylist()) == {"rdma"}
    # Same ToR: the route is that ToR; different ToRs: ToR > distribution switch > ToR.
    assert [r.count(">") for r in t.column("route").to_pylist()] == [0, 2, 0]
    doc = json.loads(topo.read_text())
    assert len(doc["containers"]) >= 2 and doc["links"]
    assert main(["analyze", "--topology", str(topo), "--probes", str(probes), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == {"incidents": []}


def test_import_rejects_bad_rows(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    text = SAMPLES.read_text().splitlines()
    bad.write_text("\n".join([text[0], text[1].replace(",16.183,", ",fast,")]) + "\n")
    probes = tmp_path / "p.parquet"
    assert main(["import-csv", str(bad), "--probes", str(probes)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "column 'latency' is not a number" in err[0] and "bad.csv:2" in err[0]
    assert not probes.exists()
    nohead = tmp_path / "nohead.csv"
    nohead.write_text("a,b\n1,2\n")
    assert main(["import-csv", str(nohead), "--probes", str(probes)]) == 2
    assert "missing column 'src_pod'" in capsys.readouterr().err
