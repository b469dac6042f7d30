"""Agent cost: CPU seconds per 1,000 probes and resident memory, for one
agent process probing 64 targets at 10 probes/s each; then the same while
its own responder answers as many probes from those 64 peers (what a
sidecar pays in a job, where every agent is also probed); against an idle
agent (no targets) measured in the same run.

    python bench/agent_overhead.py [--targets 64] [--rate 10] [--seconds 30]

Prints one JSON line. Everything runs on loopback addresses: the controller
in this process, the 64 targets as registered responders in this process
(and, for the second figure, as probers of the agent), the measured agent
as its own process (`netskel agent`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from controller.pinglist import probe_owner  # noqa: E402
from controller.server import start_controller  # noqa: E402
from netskel.api.v1 import controller_pb2 as pb  # noqa: E402
from netskel.api.v1 import controller_pb2_grpc as pb_grpc  # noqa: E402
from netskel.config import AgentConfig, ControllerConfig  # noqa: E402
from probe_agent.udp import Prober, ProbeTarget, Responder  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
BEFORE = 0.168  # CPU-s per 1,000 probes before the hot-path work (issue 16, 2026-11-23)


def ip(i: int) -> str:
    return f"127.{20 + i // 60000}.{(i // 250) % 240}.{1 + i % 250}"


def topology(n_targets: int) -> tuple[dict[str, Any], list[int]]:
    """Hosts whose pair with host 0 is probed by host 0, until n_targets."""
    me = "w0/e0"
    chosen: list[int] = []
    i = 1
    while len(chosen) < n_targets:
        if probe_owner(me, f"w{i}/e0") == me:
            chosen.append(i)
        i += 1
    hosts = [0, *chosen]
    doc = {"version": 1,
           "switches": [{"id": "tor", "tier": "tor", "rail": 0}],
           "hosts": [{"id": f"h{h}", "nics": [{"id": f"h{h}/n0", "rail": 0}]} for h in hosts],
           "links": [{"a": f"h{h}/n0", "b": "tor"} for h in hosts],
           "containers": [{"id": f"w{h}", "job": "bench", "host": f"h{h}",
                           "endpoints": [{"id": f"w{h}/e0", "nic": f"h{h}/n0", "ip": ip(h)}]}
                          for h in hosts]}
    return doc, chosen


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric_total(port: int, metric: str) -> float:
    """The sum of the agent's samples whose line starts with `metric`."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(metric))


SENT, ANSWERED = "netskel_probes_sent_total{", "netskel_probes_answered_total "
FOLLOWED, ALONE = ('netskel_probe_dwells_total{source="follow_up"}',
                   'netskel_probe_dwells_total{source="reply"}')


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(sock: str, container: str, endpoint: str, seconds: float, rate: float,
            expect_targets: int, peers: tuple[str, ...] = (), flows: int = 4
            ) -> dict[str, float]:
    """`peers`: addresses that probe the agent's responder meanwhile, each at
    `rate` (from this process: their cost is not the agent's)."""
    mport = free_port()
    cmd = [sys.executable, "-m", "netskel.cli", "agent", "--controller", sock,
           "--container", container, "--job", "bench", "--host", container.replace("w", "h"),
           "--endpoint", endpoint, "--rate", str(rate), "--metrics-port", str(mport), "--insecure",
           "--flows", str(flows)]
    agent = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # warm-up: until probing reaches its steady rate
            try:
                if metric_total(mport, SENT) >= expect_targets * rate:
                    break
            except OSError:  # metrics endpoint not up yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("agent did not start probing")
            time.sleep(0.2)
        peer_stop = threading.Event()
        peer = None
        if peers:  # the agent's port: the default its command line leaves it
            peer = Prober({p: p for p in peers}, {p: (64, 256, 1024, 4096) for p in peers}, rate,
                          1.0, lambda *a: None, lambda *a: None)
            peer.set_targets(ProbeTarget(p, container, endpoint.split(",")[2],
                                         AgentConfig().probe_port) for p in peers)
            threading.Thread(target=peer.run, args=(peer_stop,), daemon=True).start()
        try:
            cpu0, sent0, t0 = proc_cpu(agent.pid), metric_total(mport, SENT), time.monotonic()
            answered0 = metric_total(mport, ANSWERED)
            dwells0 = [metric_total(mport, m) for m in (FOLLOWED, ALONE)]
            time.sleep(seconds)
            cpu1, sent1, t1 = proc_cpu(agent.pid), metric_total(mport, SENT), time.monotonic()
            answered1 = metric_total(mport, ANSWERED)
            dwells1 = [metric_total(mport, m) for m in (FOLLOWED, ALONE)]
        finally:
            peer_stop.set()
            if peer is not None:
                peer.close()
        return {"cpu_s": sum(cpu1) - sum(cpu0), "user_s": cpu1[0] - cpu0[0],
                "sys_s": cpu1[1] - cpu0[1], "probes": sent1 - sent0, "wall_s": t1 - t0,
                "answered": answered1 - answered0,
                "followed": dwells1[0] - dwells0[0], "alone": dwells1[1] - dwells0[1],
                "rss_mb": proc_rss_mb(agent.pid)}
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=64)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--flows", type=int, default=4, help="the agent's --flows")
    a = ap.parse_args()
    doc, chosen = topology(a.targets)
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "topology.json"
        topo.write_text(json.dumps(doc))
        sock = f"unix:{tmp}/c.sock"
        ctl = start_controller(ControllerConfig(topology=str(topo), listen=(sock,), db=":memory:",
                                                window_seconds=10))
        responder = Responder([ip(h) for h in chosen], 7100)
        stop = threading.Event()
        threading.Thread(target=responder.serve, args=(stop,), daemon=True).start()
        ch = grpc.insecure_channel(sock)
        stub = pb_grpc.ControllerStub(ch)
        for h in chosen:
            stub.Register(pb.RegisterRequest(container=f"w{h}", job="bench", host=f"h{h}",
                                             probe_port=7100, endpoints=[pb.EndpointInfo(
                                                 id=f"w{h}/e0", nic=f"h{h}/n0", ip=ip(h))]))
            stub.Heartbeat(pb.HeartbeatRequest(container=f"w{h}", ready=True))
        hb_stop = threading.Event()

        def keep_alive() -> None:
            while not hb_stop.wait(1.0):
                try:
                    for h in chosen:
                        stub.Heartbeat(pb.HeartbeatRequest(container=f"w{h}", ready=True))
                except grpc.RpcError:
                    return
        keeper = threading.Thread(target=keep_alive, daemon=True)
        keeper.start()
        try:
            busy = measure(sock, "w0", f"w0/e0,h0/n0,{ip(0)}", a.seconds, a.rate, a.targets,
                           flows=a.flows)
            both = measure(sock, "w0", f"w0/e0,h0/n0,{ip(0)}", a.seconds, a.rate, a.targets,
                           peers=tuple(ip(h) for h in chosen), flows=a.flows)
            # Baseline: the same agent with its targets not ready (nothing to probe).
            hb_stop.set()
            keeper.join()
            for h in chosen:
                stub.Heartbeat(pb.HeartbeatRequest(container=f"w{h}", ready=False))
            idle = measure(sock, "w0", f"w0/e0,h0/n0,{ip(0)}", a.seconds, a.rate, 0,
                           flows=a.flows)
        finally:
            hb_stop.set()
            stop.set()
            ch.close()
            ctl.stop(0)
            responder.close()
    per_1000 = busy["cpu_s"] / busy["probes"] * 1000 if busy["probes"] else float("nan")
    extra = (busy["cpu_s"] - idle["cpu_s"]) / busy["probes"] * 1000 if busy["probes"] else 0.0
    print(json.dumps({
        "bench": "agent_overhead", "targets": a.targets, "rate_hz": a.rate, "flows": a.flows,
        "seconds": round(busy["wall_s"], 1), "probes": int(busy["probes"]),
        "probes_per_s": round(busy["probes"] / busy["wall_s"], 1),
        "cpu_s_per_1000_probes": round(per_1000, 4),
        "cpu_s_per_1000_probes_above_idle": round(extra, 4),
        # Where it goes: user space (Python) and the kernel (on loopback the
        # sender's sendto also runs the receiver's UDP input).
        "user_s_per_1000_probes": round(busy["user_s"] / max(busy["probes"], 1) * 1000, 4),
        "sys_s_per_1000_probes": round(busy["sys_s"] / max(busy["probes"], 1) * 1000, 4),
        # The agent probing and answering as many probes: CPU per 1,000 sent.
        "cpu_s_per_1000_probes_probing_and_answering": round(
            both["cpu_s"] / max(both["probes"], 1) * 1000, 4),
        "answered_while_probing": int(both["answered"]),
        # RTTs whose responder's dwell came from its follow-up (kernel
        # stamps), not from the reply alone (the follow-up read too late).
        "dwell_from_follow_up_share": round(
            busy["followed"] / max(busy["followed"] + busy["alone"], 1), 4),
        # Issue 16's measurement before the hot-path work (2026-11-23, same bench).
        "before_cpu_s_per_1000_probes": BEFORE,
        "cpu_fraction_of_one_core": round(busy["cpu_s"] / busy["wall_s"], 4),
        "idle_cpu_fraction_of_one_core": round(idle["cpu_s"] / idle["wall_s"], 4),
        "rss_mb": round(busy["rss_mb"], 1), "idle_rss_mb": round(idle["rss_mb"], 1),
        "idle_probes": int(idle["probes"])}))


if __name__ == "__main__":
    main()
