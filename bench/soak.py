"""Soak: containers come and go for a while; healthy pairs must raise nothing
and the servers must not grow.

One controller and one analyzer (in this process, production settings: 30 s
windows) and one
real agent per container (each its own process, probing over loopback
addresses). Every 30-90 s (scaled by --speed) one container stops cleanly
(SIGTERM: it deregisters) or a stopped one starts again. Every 10 s the
controller/analyzer process's threads and memory are sampled. At the end:
incidents (goal 0), threads and RSS at the first and last quarter.

    python bench/soak.py [--minutes 10] [--hosts 8] [--speed 1.0]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def loopback_ip(h: int, r: int) -> str:
    return f"127.0.{10 + r}.{h + 1}"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--speed", type=float, default=1.0, help="churn this many times faster")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    from analyzer.server import start_analyzer
    from controller.server import start_controller
    from netskel.config import AnalyzerConfig, ControllerConfig
    from testbed.layout import Layout, layout_doc

    rng = random.Random(a.seed)
    lay = Layout(hosts=a.hosts, rails=2, hosts_per_tor=2, spines=2)
    doc = layout_doc(lay, loopback_ip)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "t.json").write_text(json.dumps(doc))
        sock = f"unix:{d}/c.sock"
        ctl = start_controller(ControllerConfig(topology=f"{d}/t.json", listen=(sock,),
                                                db=f"{d}/c.sqlite",
                                                heartbeat_interval_ms=500,
                                                heartbeat_timeout_s=5))
        ana = start_analyzer(AnalyzerConfig(topology=f"{d}/t.json", controller=sock,
                                            listen=("127.0.0.1:0",)), tick_s=0.5)
        procs: dict[int, subprocess.Popen[bytes]] = {}

        def start(h: int) -> None:
            c = doc["containers"][h]
            cmd = [sys.executable, "-m", "netskel.cli", "agent", "--insecure", "--controller",
                   sock, "--container", c["id"], "--job", c["job"], "--host", c["host"],
                   "--rate", "5", "--counter-hz", "2"]
            for e in c["endpoints"]:
                cmd += ["--endpoint", f"{e['id']},{e['nic']},{e['ip']},lo"]
            procs[h] = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)

        def stop(h: int) -> None:
            p = procs.pop(h)
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)

        for h in range(lay.hosts):
            start(h)
        samples: list[tuple[float, int, float]] = []
        events: list[tuple[float, str, int]] = []
        t0 = time.monotonic()
        wall0 = time.time()
        end = t0 + a.minutes * 60
        next_churn = t0 + rng.uniform(30, 90) / a.speed
        next_sample = t0 + 10
        try:
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_churn:
                    down = [h for h in range(lay.hosts) if h not in procs]
                    # Keep at least half running; otherwise flip a coin.
                    if down and (len(procs) <= lay.hosts // 2 or rng.random() < 0.5):
                        h = rng.choice(down)
                        start(h)
                        events.append((now - t0, "join", h))
                    else:
                        h = rng.choice(sorted(procs))
                        stop(h)
                        events.append((now - t0, "leave", h))
                    next_churn = now + rng.uniform(30, 90) / a.speed
                if now >= next_sample:
                    samples.append((now - t0, threading.active_count(), rss_mb()))
                    next_sample += 10
                time.sleep(0.5)
        finally:
            for h in sorted(procs):
                stop(h)
            with ana.lock:
                incidents = [i.to_doc() for i in ana.engine.list_incidents()]
            ana.stop(0)
            ctl.stop(0)
    q = max(1, len(samples) // 4)
    first, last = samples[:q], samples[-q:]

    def avg(rows: list[tuple[float, int, float]], k: int) -> float:
        return round(sum(r[k] for r in rows) / max(1, len(rows)), 1)

    print(json.dumps({
        "bench": "soak", "minutes": a.minutes, "containers": lay.hosts,
        "joins": sum(e[1] == "join" for e in events),
        "leaves": sum(e[1] == "leave" for e in events),
        "incidents": len(incidents),
        "incident_list": [{"component": f'{i["component"]["type"]}:{i["component"]["id"]}',
                           "layer": i["layer"], "symptom": i["symptom"],
                           "start_s": round(i["start"] - wall0, 1),
                           "end_s": None if i["end"] is None else round(i["end"] - wall0, 1),
                           "pairs": len(i["pairs"])} for i in incidents],
        "events": [(round(t, 1), kind, h) for t, kind, h in events],
        "threads_first_quarter": avg(first, 1), "threads_last_quarter": avg(last, 1),
        "rss_mb_first_quarter": avg(first, 2), "rss_mb_last_quarter": avg(last, 2)}))


if __name__ == "__main__":
    main()
