"""Skeleton inference over a matrix of harder copies of labelled recordings
we did not write: every sampling interval x share of missing samples x
length (whole, or a cut), each copy made by `bench/variants.py` with its own
seed, inferred and scored by the dev set's rules. One copy at a time says
little (session 60: 3 of 110 cut jobs lost true partners, none of 110 whole
ones); the matrix says where the method stops keeping its promise of
recall 1.0, and at what precision.

    python bench/skeleton_matrix.py ../shared/data/dev/skeleton
        [--intervals 0.15,0.2,0.25,0.3,0.35,0.4,0.5,0.6,0.7,0.85,1.0]
        [--missing 0,0.03] [--cuts whole,120:100] [--seed 60]

A line per training job (a debug job's list is the rail-aligned one at any
sampling), then one JSON line: `bench/accuracy.py`'s skeleton figures over
every copy (`summarize_skeleton`: `all_ok` is the dev set's rule, recall 1,
precision >= 0.99, structure exact), then `recall_lost` and which copies
lost it, wrong structures and how many of those carried confidence above
0.5. Inference runs in this process (`controller.infer.infer_files`,
what `netskel infer` calls), so about 4 min for the default 44 copies.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.infer import infer_files  # noqa: E402
from netskel.scoring import score_skeleton, summarize_skeleton  # noqa: E402


def copies(intervals: list[float], missing: list[float], cuts: list[str], seed: int) -> list[list[str]]:
    """`bench/variants.py` arguments of every copy; seeds drawn from `seed`,
    so a run names each copy it can be made again from."""
    rng = random.Random(seed)
    out = []
    for iv in intervals:
        for ms in missing:
            for cut in cuts:
                args = ["--interval", str(iv), "--missing", str(ms), "--seed", str(rng.randint(100, 999))]
                if cut != "whole":
                    seconds, skip = cut.split(":")
                    args += ["--seconds", seconds, "--skip", skip]
                out.append(args)
    return out


def score_copy(src: Path, args: list[str], work: Path) -> list[dict[str, Any]]:
    subprocess.run([sys.executable, str(ROOT / "bench/variants.py"), str(src), str(work)] + args,
                   check=True, stdout=subprocess.DEVNULL)
    rows = []
    for rec in sorted(p for p in work.iterdir() if (p / "truth.json").exists()):
        truth = json.loads((rec / "truth.json").read_text())
        got = infer_files(rec / "topology.json", rec / "throughput.parquet")
        for r in score_skeleton(truth, got):
            if r["kind"] == "training":
                rows.append({**r, "recording": rec.name, "copy": " ".join(args)})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="a directory of throughput recordings (dev-set layout)")
    p.add_argument("--intervals", default="0.15,0.2,0.25,0.3,0.35,0.4,0.5,0.6,0.7,0.85,1.0")
    p.add_argument("--missing", default="0,0.03", help="shares of samples dropped")
    p.add_argument("--cuts", default="whole,120:100", help="whole, or SECONDS:SKIP")
    p.add_argument("--seed", type=int, default=60)
    a = p.parse_args()
    plan = copies([float(x) for x in a.intervals.split(",")], [float(x) for x in a.missing.split(",")],
                  a.cuts.split(","), a.seed)
    rows: list[dict[str, Any]] = []
    for n, args in enumerate(plan):
        with tempfile.TemporaryDirectory() as tmp:
            for r in score_copy(a.src, args, Path(tmp) / "copy"):
                structure = r["parallelism_ok"] and r["dp_groups_ok"] and r["stages_ok"]
                r["structure_ok"] = structure
                rows.append(r)
                print(f"[{n + 1}/{len(plan)}] {r['copy']:58} {r['recording']:28} "
                      f"precision {r['precision']:.3f} recall {r['recall']:.3f} "
                      f"confidence {r['confidence']:.2f}{'' if structure else ' structure WRONG'}",
                      flush=True)
    lost = [r for r in rows if r["recall"] < 1.0]
    wrong = [r for r in rows if not r["structure_ok"]]
    print(json.dumps({
        "copies": len(plan), **summarize_skeleton(rows), "recall_lost": len(lost),
        "wrong_structures": len(wrong),
        "wrong_confident": sum((r["confidence"] or 0.0) > 0.5 for r in wrong),
        "lost_in": [f"{r['copy']} {r['recording']}" for r in lost]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
