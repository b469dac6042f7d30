"""Accuracy on labelled recordings we did not write: runs `netskel infer` on
every `skeleton/<name>/` and `netskel analyze` on every `faults/<name>/` of a
directory in the development-set layout (or on one recording), scores the
outputs against `truth.json` by the set's rules (netskel/scoring.py), prints
a table per recording and, last, one JSON line with the totals.

    python bench/accuracy.py ../shared/data/dev [--only skeleton|faults] [--keep DIR]

The CLI runs as a user runs it (a subprocess per recording), so its exit
status, one-line errors and wall time are part of the measure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from netskel.scoring import (  # noqa: E402
    score_incidents,
    score_skeleton,
    summarize_faults,
    summarize_skeleton,
)


def _recordings(root: Path, kind: str) -> list[Path]:
    data = "throughput.parquet" if kind == "skeleton" else "probes.parquet"
    if (root / data).exists():
        return [root]
    base = root / kind if (root / kind).is_dir() else root
    return sorted(p for p in base.iterdir() if (p / data).exists() and (p / "truth.json").exists())


def _run(args: list[str]) -> tuple[float, str | None]:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "netskel.cli", *args], capture_output=True,
                          text=True, cwd=ROOT)
    took = time.perf_counter() - t
    if done.returncode != 0:
        return took, (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return took, None


def _scored_run(rec: Path, args: list[str], dest: Path, empty: dict[str, Any]
                ) -> tuple[float, str | None, dict[str, Any], dict[str, Any]]:
    """(seconds, error, truth, output) of one CLI run on a recording; a
    failed run scores as an empty output."""
    took, err = _run([*args, "-o", str(dest)])
    truth = json.loads((rec / "truth.json").read_text())
    return took, err, truth, json.loads(dest.read_text()) if err is None else empty


def skeleton(recs: list[Path], out: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    print(f"{'recording':34} {'job':8} {'prec':>6} {'recall':>6} {'conf':>5} "
          f"{'par':>4} {'dpg':>4} {'stg':>4} {'s':>6}")
    for rec in recs:
        took, err, truth, got = _scored_run(
            rec, ["infer", "--topology", str(rec / "topology.json"),
                  "--throughput", str(rec / "throughput.parquet")],
            out / f"{rec.name}.skeleton.json", {"jobs": []})
        for r in score_skeleton(truth, got):
            r.update(recording=rec.name, seconds=round(took, 2), error=err)
            rows.append(r)

            def yn(k: str, r: dict[str, Any] = r) -> str:
                return "-" if r["kind"] == "debug" else ("yes" if r.get(k) else "NO")
            conf = r.get("confidence")
            print(f"{rec.name:34} {r['job']:8} {r['precision']:6.3f} {r['recall']:6.3f} "
                  f"{conf if conf is not None else float('nan'):5.2f} {yn('parallelism_ok'):>4} "
                  f"{yn('dp_groups_ok'):>4} {yn('stages_ok'):>4} {took:6.2f}"
                  + (f"  ERROR {err}" if err else ""))
    return {"summary": summarize_skeleton(rows), "rows": rows}


def faults(recs: list[Path], out: Path) -> dict[str, Any]:
    scored: list[dict[str, Any]] = []
    for rec in recs:
        took, err, truth, got = _scored_run(
            rec, ["analyze", "--topology", str(rec / "topology.json"),
                  "--probes", str(rec / "probes.parquet")],
            out / f"{rec.name}.incidents.json", {"incidents": []})
        s = score_incidents(truth, got)
        s.update(recording=rec.name, seconds=round(took, 2), error=err)
        scored.append(s)
        print(f"{rec.name}: {s['incidents']} incident(s), {s['false_incidents']} false, "
              f"{took:.1f} s" + (f"  ERROR {err}" if err else ""))
        for f in s["faults"]:
            delay = f"{f['delay_s']:.0f} s" if f["delay_s"] is not None else "-"
            end = f"{f['end_error_s']:.0f} s" if f["end_error_s"] is not None else "-"
            print(f"   {f['fault']:4} {f['kind'] or '':14} {f['component']:34} "
                  f"{'found' if f['detected'] else 'MISSED':6} got {f['got'] or '-':34} "
                  f"comp {'ok' if f['component_ok'] else 'NO':2} layer "
                  f"{'ok' if f['layer_ok'] else 'NO':2} delay {delay} end {end}")
    return {"summary": summarize_faults(scored), "recordings": scored}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="a labelled directory (dev-set layout) or one recording")
    p.add_argument("--only", choices=("skeleton", "faults"))
    p.add_argument("--keep", type=Path, help="keep netskel's outputs in this directory")
    a = p.parse_args()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = a.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for kind, fn in (("skeleton", skeleton), ("faults", faults)):
            if a.only not in (None, kind):
                continue
            recs = _recordings(a.root, kind)
            if recs:
                result[kind] = fn(recs, out)["summary"]
                print()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
