"""NetDiag answer latency from current state on a 4,096-endpoint cluster.

    python bench/netdiag.py [--hosts 512] [--rails 8] [--targets 16] [--calls 1000]

An analyzer engine holds 10 windows of history for every endpoint probing
16 same-rail targets (32 K pairs) and one open link incident; a real gRPC
NetDiag server on port 0 answers Diagnose calls from a client in this
process: one suspect endpoint per call (the typical ask of a diagnosis
engine: "rank 1234 stalled"), and one call naming 64 pairs. Prints p50/p99
(goal: p99 <= 100 ms). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analyzer.engine import Analyzer  # noqa: E402
from analyzer.service import IncidentHub, NetDiagService  # noqa: E402
from netskel.api.v1 import common_pb2 as cpb  # noqa: E402
from netskel.api.v1 import netdiag_pb2 as dpb  # noqa: E402
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc  # noqa: E402
from netskel.config import AnalyzerConfig  # noqa: E402
from netskel.grpcserver import make_server  # noqa: E402
from netskel.model import WindowStats  # noqa: E402
from netskel.topology import parse_topology  # noqa: E402
from testbed.layout import Layout, layout_doc  # noqa: E402

W = 30.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=512)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--targets", type=int, default=16)
    ap.add_argument("--calls", type=int, default=1000)
    a = ap.parse_args()
    lay = Layout(hosts=a.hosts, rails=a.rails, hosts_per_tor=16, spines=4)
    topo = parse_topology(layout_doc(lay))
    engine = Analyzer(topo, AnalyzerConfig())
    rng = np.random.default_rng(0)
    pairs = sorted({(lay.endpoint(h, r), lay.endpoint(int(t), r))
                    for h in range(a.hosts) for r in range(a.rails)
                    for t in rng.choice([x for x in range(a.hosts) if x != h], a.targets // 2,
                                        replace=False)})
    t0 = (time.time() // W - 12) * W
    where = {lay.endpoint(h, r): (h, r) for h in range(a.hosts) for r in range(a.rails)}
    # One fault: rail 0 pairs leaving ToR 0 lose everything from window 8 on.
    bad = {p for p in pairs if where[p[0]][1] == 0 and lay.tor_index(where[p[0]][0]) == 0
           and lay.tor_index(where[p[1]][0]) != 0}
    for k in range(11):
        s = t0 + k * W
        windows = []
        for x, y in pairs:
            if (x, y) in bad and k >= 8:
                windows.append(WindowStats(x, y, s, s + W, 64, 300, 300))
            else:
                windows.append(WindowStats(x, y, s, s + W, 64, 300, 0, 90.0, 95.0, 100.0, 105.0,
                                           100.0, 3.0, 120.0))
        engine.add_windows(windows)
        engine.tick(s + W + 5)
    lock = threading.Lock()
    service = NetDiagService(engine, lock, IncidentHub())
    server, ports, _ = make_server(["netskel.api.v1.NetDiag"],
                                   lambda srv: dpb_grpc.add_NetDiagServicer_to_server(service, srv),
                                   ("127.0.0.1:0",))
    stub = dpb_grpc.NetDiagStub(grpc.insecure_channel(f"127.0.0.1:{ports[0]}"))
    eps = [lay.endpoint(h, r) for h in range(a.hosts) for r in range(a.rails)]

    def timed(req: dpb.DiagnoseRequest) -> float:
        t = time.perf_counter()
        stub.Diagnose(req, timeout=10)
        return (time.perf_counter() - t) * 1e3
    for _ in range(20):  # warm the channel
        timed(dpb.DiagnoseRequest(endpoints=[eps[0]]))
    one = [timed(dpb.DiagnoseRequest(endpoints=[eps[int(i)]]))
           for i in rng.integers(0, len(eps), a.calls)]
    many = [timed(dpb.DiagnoseRequest(pairs=[cpb.EndpointPair(a=x, b=y) for x, y in
                                             (pairs[int(j)] for j in rng.integers(0, len(pairs), 64))]))
            for _ in range(a.calls // 4)]
    server.stop(0)
    print(json.dumps({"bench": "netdiag", "endpoints": len(eps), "pairs": len(pairs),
                      "open_incidents": sum(1 for i in engine.incidents.values() if i.end is None),
                      "one_endpoint": summary(one), "64_pairs": summary(many)}))


def summary(ms: list[float]) -> dict[str, float]:
    return {"calls": len(ms), "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2)}


if __name__ == "__main__":
    main()
