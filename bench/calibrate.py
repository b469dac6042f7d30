"""How a recording's physics compares with another's: the figures the
skeleton method stands on, measured from NIC counters alone (contract
files), so a real recording and our simulator are measured the same way.

    python bench/calibrate.py tests/data/gloo-pp4dp2 [--simulate NAME,dp=2,tp=1,pp=4]

Per recording: the share of each NIC's bytes sent and received at once in
collective bursts (the all-reduce; the rest is pipeline activations and
noise), the iteration period and its spread (coefficient of variation of
the spacing between sync points), and the spacing of the stages'
reductions (truth's stages) as a share of the period. With --simulate the
same shape is simulated (same duration and sampling interval) and measured
beside it; last comes one JSON line with both.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.infer import job_rates, read_throughput  # noqa: E402
from controller.timing import (  # noqa: E402
    collective_mask,
    collective_offsets,
    find_iterations,
    reduction_bursts,
    symmetric,
)
from netskel.topology import load_topology  # noqa: E402


def measure(rec: Path) -> dict[str, Any]:
    topo = load_topology(rec / "topology.json")
    truth = json.loads((rec / "truth.json").read_text())["jobs"][0]
    r = job_rates(topo, truth["job"], read_throughput(rec / "throughput.parquet", topo))
    eps = r.endpoints
    tx, rx = r.tx.astype(np.float64), r.rx.astype(np.float64)
    sym = symmetric(tx, rx)
    mask = collective_mask(sym)
    total = (tx + rx).sum(axis=1)
    share = np.where(mask, tx + rx, 0.0).sum(axis=1) / np.maximum(total, 1.0)
    burst = reduction_bursts(sym)
    it = find_iterations(burst, r.dt)
    out: dict[str, Any] = {"recording": rec.name, "endpoints": len(eps),
                           "interval_s": round(float(r.dt), 4),
                           "collective_share_median": round(float(np.median(share)), 3)}
    if it is None:
        return out
    spacing = np.diff(it.sync) * r.dt
    off = collective_offsets(burst, it, r.dt)
    idx = {e: i for i, e in enumerate(eps)}
    levels = [float(np.mean(off[[idx[e] for e in st]])) for st in truth.get("pp_stages", [])]
    gaps = -np.diff(levels) if len(levels) > 1 else np.zeros(0)
    out.update({"period_s": round(it.period, 3), "iterations": it.count,
                "period_cv": round(float(np.std(spacing) / np.mean(spacing)), 3),
                "stage_gap_s": round(float(np.mean(gaps)), 3) if len(gaps) else None,
                "stage_gap_share": round(float(np.mean(gaps)) / it.period, 3) if len(gaps)
                else None,
                "stage_order_last_first": bool(np.all(gaps > 0)) if len(gaps) else None})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path)
    ap.add_argument("--simulate", help="job spec for `netskel simulate` (same duration)")
    a = ap.parse_args(argv)
    rows = [measure(a.recording)]
    if a.simulate:
        import subprocess
        with tempfile.TemporaryDirectory() as tmp:
            dur = rows[0]["iterations"] * rows[0]["period_s"] if "period_s" in rows[0] else 120
            subprocess.run([sys.executable, "-m", "netskel.cli", "simulate", "--job",
                            a.simulate, "--seconds", str(round(dur)), "--interval",
                            str(rows[0]["interval_s"]), "-o", tmp], check=True,
                           capture_output=True, cwd=ROOT)
            rows.append({**measure(Path(tmp)), "recording": f"simulate {a.simulate}"})
    keys = ["collective_share_median", "period_s", "period_cv", "stage_gap_s",
            "stage_gap_share", "stage_order_last_first"]
    print(f"{'recording':36}" + "".join(f"{k:>24}" for k in keys))
    for row in rows:
        print(f"{row['recording']:36}" + "".join(f"{row.get(k)!s:>24}" for k in keys))
    print(json.dumps({"calibration": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
