"""A sweep of simulated training jobs in the dev-set layout, for
`bench/accuracy.py`: our simulator is no evidence that the method works
(the dev set is), but a change that loses a pair anywhere on it has found
a case worth reading. Each recording is `OUT/<shape>_<interval>_s<seed>/`
(topology.json, throughput.parquet, truth.json); existing ones are kept, so
a second run only adds what is missing.

    python bench/sweep.py OUT [--set default|moe|big|fine|long|short] [--seconds 180]
    python bench/accuracy.py OUT --only skeleton

Sets: `default`, 14 shapes (pipeline depths 1-8, tp 2-8, dp 1-32, MoE
among them) x 0.05 / 0.2 / 1 s x seeds 1-2; `moe`, 6 MoE shapes with
lockstepped expert groups x 0.05 / 0.1 s x seeds 1-3; `big`, dp64 tp8 pp8
(4,096 endpoints) at 0.05 s, seeds 1-3, for 120 and 300 s; `fine`, 6 shapes
at 0.01 / 0.025 s (the finest sampling the dev set's README names, where
host clocks lie several samples apart) x seeds 1-2; `long`, 20-30 s
iterations (six to nine in three minutes) at 0.1 / 0.5 s x seeds 1-2, and
debug jobs (no iterations) at 0.1 / 0.5 s x seeds 1-3; `short`, 2-3 s
iterations at 0.2 / 0.5 / 1 s x seeds 1-2 (at 1 s two or three samples
an iteration). Prints one JSON line naming what it wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from netskel.cli import main as netskel  # noqa: E402

DEFAULT = ["dp=2,tp=8,pp=8", "dp=4,tp=8,pp=4", "dp=8,tp=4,pp=4", "dp=4,tp=2,pp=6",
           "dp=16,tp=8,pp=2", "dp=2,tp=4,pp=8", "dp=1,tp=8,pp=4", "dp=8,tp=8,pp=1",
           "dp=16,tp=4,pp=1", "dp=2,tp=8,pp=4", "dp=8,tp=8,pp=4,ep=8,a2a_share=2",
           "dp=8,tp=8,pp=4,ep=8,a2a_share=4", "dp=16,tp=4,pp=2,ep=4", "dp=32,tp=8,pp=4"]
MOE = ["dp=8,tp=8,pp=4,ep=8,a2a_share=2", "dp=8,tp=8,pp=4,ep=8,a2a_share=4",
       "dp=8,tp=8,pp=2,ep=4", "dp=8,tp=8,pp=2,ep=4,a2a_share=4",
       "dp=16,tp=8,pp=4,ep=2,a2a_share=2", "dp=8,tp=4,pp=8,ep=4,a2a_share=2"]
FINE = ["dp=4,tp=8,pp=4", "dp=8,tp=4,pp=4", "dp=16,tp=8,pp=2", "dp=2,tp=4,pp=8",
        "dp=32,tp=8,pp=4", "dp=8,tp=8,pp=4,ep=8,a2a_share=2"]
LONG = ["dp=4,tp=8,pp=4,period_s=20", "dp=8,tp=8,pp=2,period_s=25",
        "dp=2,tp=8,pp=8,period_s=30", "dp=8,tp=4,pp=4,period_s=28"]
DEBUG = ["dp=4,tp=8,pp=4,periodic=0", "dp=8,tp=8,pp=1,periodic=0", "dp=2,tp=8,pp=2,periodic=0"]
SHORT = ["dp=4,tp=8,pp=4,period_s=2", "dp=8,tp=8,pp=2,period_s=3", "dp=8,tp=8,pp=1,period_s=2"]
Recording = tuple[str, float, int, float | None]  # shape, interval, seed, seconds


def grid(shapes: list[str], intervals: tuple[float, ...], seeds: tuple[int, ...]
         ) -> list[Recording]:
    return [(s, i, seed, None) for s in shapes for i in intervals for seed in seeds]


SETS: dict[str, list[Recording]] = {
    "default": grid(DEFAULT, (0.05, 0.2, 1.0), (1, 2)),
    "moe": grid(MOE, (0.05, 0.1), (1, 2, 3)),
    "big": [("dp=64,tp=8,pp=8", 0.05, seed, secs) for secs in (120.0, 300.0) for seed in (1, 2, 3)],
    "fine": grid(FINE, (0.01, 0.025), (1, 2)),
    "long": grid(LONG, (0.1, 0.5), (1, 2)) + grid(DEBUG, (0.1, 0.5), (1, 2, 3)),
    "short": grid(SHORT, (0.2, 0.5, 1.0), (1, 2)),
}


def name_of(shape: str, interval: float, seed: int, seconds: float | None) -> str:
    tag = shape.replace(",", "").replace("=", "").replace("a2a_share", "a2a")
    return f"{tag}_{interval:g}_s{seed}" + (f"_{seconds:g}s" if seconds else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--set", choices=sorted(SETS), default="default")
    ap.add_argument("--seconds", type=float, default=180.0, help="recording length (not for big)")
    a = ap.parse_args()
    wrote = []
    for shape, interval, seed, seconds in SETS[a.set]:
        d = a.out / name_of(shape, interval, seed, seconds)
        if not (d / "truth.json").exists():
            rc = netskel(["simulate", "--job", f"j,{shape}", "--seconds",
                          str(seconds or a.seconds), "--interval", str(interval),
                          "--seed", str(seed), "-o", str(d)])
            if rc:
                return rc
            wrote.append(d.name)
    print(json.dumps({"bench": "sweep", "set": a.set, "out": str(a.out),
                      "recordings": len(SETS[a.set]), "written": len(wrote)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
