"""One controller (its own process, real gRPC over a Unix socket) and N
simulated agents (testbed/simagents.py, 500 per client process): every
agent registers, receives its first ping list, turns ready and reports
windows for its targets.

Figures: seconds until every agent is registered and until every first
list arrived (from the fleet's start), window reports per second accepted
while all agents report at once, whether every list converged, the worst
health-check answer during the run, and the controller's peak memory.

    python bench/agents.py [--agents 32768] [--reports 2]

Goal (issue 15): 32,768 agents served by one controller.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    from testbed import simagents

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--agents", type=int, default=32768)
    ap.add_argument("--reports", type=int, default=2, help="window batches per agent")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        doc = simagents.topology(a.agents)
        (Path(d) / "t.json").write_text(json.dumps(doc))
        target = f"unix:{d}/c.sock"
        with open(Path(d) / "c.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "netskel.cli", "controller",
                                     "--topology", f"{d}/t.json", "--listen", target, "--db",
                                     f"{d}/c.sqlite", "--heartbeat-timeout", "3600", "--insecure"],
                                    stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT)
        try:
            deadline = time.monotonic() + 120
            while not simagents.healthy(target):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the controller did not start")
                time.sleep(0.2)
            idle_mb = _peak_rss_mb(proc.pid)
            t0 = time.perf_counter()
            parts = simagents.run_fleet(target, doc, reports=a.reports, settle_s=300,
                                        timeout=3600, phase_s=900)
            wall = time.perf_counter() - t0
            peak_mb = _peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    errors = [p["error"] for p in parts if "error" in p]
    ok = [p for p in parts if "error" not in p]
    sent = sum(p["sent"] for p in ok)
    reports_s = max((p["reports_s"] for p in ok), default=float("nan"))
    out = {"bench": "agents", "agents": a.agents, "client_processes": len(parts),
           "errors": errors[:3],
           "all_registered_s": round(max((p["registered_s"] for p in ok), default=0), 2),
           "all_first_lists_s": round(max((p["lists_s"] for p in ok), default=0), 2),
           "windows_sent": sent, "windows_accepted": sum(p["accepted"] for p in ok),
           "windows_per_s": round(sent / reports_s, 1) if reports_s > 0 else None,
           "lists_not_converged": sum(max(p["wrong"], 0) for p in ok),
           "not_converged_examples": [d for p in ok for d in p.get("wrong_detail", [])][:4],
           "list_streams_failed": sum(p["stream_errors"] for p in ok),
           "list_stream_error": next((p["stream_error_first"] for p in ok
                                      if p["stream_error_first"]), ""),
           "health_failed": sum(p["health_failed"] for p in ok),
           "health_worst_s": round(max((p["health_worst_s"] for p in ok), default=0), 3),
           "controller_idle_mb": round(idle_mb, 1), "controller_peak_mb": round(peak_mb, 1),
           "wall_s": round(wall, 1)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
