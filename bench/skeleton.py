"""Skeleton inference at scale: for 512, 4,096 and 32,768 endpoints
(tp8 pp8, dp = N/64), `netskel infer` end to end on simulated contract files:
wall time and peak memory of the inference process, and the ping list's size
against the full mesh, the rail-aligned list and the true skeleton.

    python bench/skeleton.py [--sizes 512,4096,32768] [--seconds 120] [--repeat 3] [--shuffled]

Rows come in recording order (each endpoint's samples in time order, as
agents append them) unless --shuffled: then every row is out of place and
the full sort runs (the contract allows unsorted rows).

Each size simulates in one process and infers in fresh ones (what
`netskel infer` runs: read, infer, write the JSON), so the inference's wall
time and peak memory are its own, not the simulator's; the median of
--repeat runs is reported, with every run's time. Prints one JSON
line. Goals on this 2-core machine: 4,096 endpoints <= 5 s, 32,768 <= 30 s.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one(n: int, seconds: float, shuffled: bool, repeat: int) -> dict[str, object]:
    import pyarrow.parquet as pq

    from netskel.simulate import JobShape, Noise, simulate

    shape = JobShape("job", dp=n // 64, tp=8, pp=8)
    topo_doc, table, truth = simulate([shape], Noise(duration_s=seconds, shuffle=shuffled), seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "t.json"
        topo.write_text(json.dumps(topo_doc))
        tp = Path(tmp) / "tp.parquet"
        pq.write_table(table, tp)
        rows = table.num_rows
        del table, topo_doc
        out = Path(tmp) / "skeleton.json"
        runs = []
        for _ in range(repeat):
            run = subprocess.run([sys.executable, __file__, "--infer", str(topo), str(tp),
                                  str(out)], capture_output=True, text=True, cwd=ROOT, check=True)
            runs.append(json.loads(run.stdout.strip().splitlines()[-1]))
        # The median run: the first after the simulation is slower (32,768:
        # 33-36 s against 25-28 s; the file is wholly in the page cache,
        # written back, and the guest neither reclaims nor compacts —
        # /proc/vmstat — so likely the VM backing memory the simulation
        # gave back). Runs are listed in the order they ran.
        in_order = [x["total_s"] for x in runs]
        runs.sort(key=lambda x: x["total_s"])
        timing = {**runs[len(runs) // 2], "total_s_runs": in_order}
        doc = json.loads(out.read_text())
    job = doc["jobs"][0]
    pairs = {tuple(sorted((s, d))) for s, ds in job["ping_list"].items() for d in ds}
    tr = truth["job"].pairs
    full = n * (n - 1) // 2
    rail = 8 * ((n // 8) * (n // 8 - 1) // 2)
    return {"endpoints": n, "rows": rows, "row_order": "shuffled" if shuffled else "recorded",
            **timing,
            "parallelism": job["parallelism"], "confidence": job["confidence"],
            "ping_pairs": len(pairs), "true_pairs": len(tr),
            "recall": round(len(pairs & tr) / len(tr), 4),
            "precision": round(len(pairs & tr) / max(1, len(pairs)), 4),
            "vs_full_mesh": round(len(pairs) / full, 5), "vs_rail_aligned": round(len(pairs) / rail, 4),
            "vs_true": round(len(pairs) / len(tr), 3), "true_vs_full_mesh": round(len(tr) / full, 5)}


def infer_once(topo: str, tp: str, out: str) -> dict[str, float]:
    """One `netskel infer` run as the command does it (heap settings
    included), its phases timed: inference (read + infer) and writing the
    JSON; the goal counts both (total_s)."""
    from controller.infer import infer_files
    from netskel.cli import write_json_atomic
    from netskel.heap import retain_freed_memory

    retain_freed_memory()
    t0 = time.perf_counter()
    doc = infer_files(topo, tp)
    t1 = time.perf_counter()
    write_json_atomic(out, doc)
    t2 = time.perf_counter()
    return {"total_s": round(t2 - t0, 2), "infer_s": round(t1 - t0, 2),
            "write_json_s": round(t2 - t1, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,4096,32768")
    ap.add_argument("--seconds", type=float, default=120.0,
                    help="recorded seconds (20 iterations of the simulator's 6 s period)")
    ap.add_argument("--repeat", type=int, default=3, help="inference runs per size (median)")
    ap.add_argument("--shuffled", action="store_true")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--infer", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.infer:
        print(json.dumps(infer_once(*a.infer)))
        return
    if a.one:
        print(json.dumps(one(a.one, a.seconds, a.shuffled, a.repeat)))
        return
    results = []
    for n in (int(x) for x in a.sizes.split(",")):
        cmd = [sys.executable, __file__, "--one", str(n), "--seconds", str(a.seconds),
               "--repeat", str(a.repeat)]
        out = subprocess.run(cmd + (["--shuffled"] if a.shuffled else []), capture_output=True,
                             text=True, cwd=ROOT)
        if out.returncode != 0:
            results.append({"endpoints": n, "error": out.stderr.strip().splitlines()[-1:]})
        else:
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(json.dumps({"bench": "skeleton", "seconds_recorded": a.seconds, "results": results}))


if __name__ == "__main__":
    main()
