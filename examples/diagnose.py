"""Ask netskel whether the network explains a training stall.

    python examples/diagnose.py ANALYZER_ADDR ENDPOINT [ENDPOINT ...]

A diagnosis engine that sees ranks stall passes their endpoints (contract
ids, e.g. "job7-w003/rnic0"). NetDiag answers from its current state:
NETWORK_FAULT with the incidents that explain it (component, layer,
evidence), NETWORK_OK when every monitored pair of those endpoints is
healthy, INCONCLUSIVE when it cannot tell yet (no window, or an anomaly in
the latest windows that may still persist; one that passed reads healthy,
named in the pair's reason)."""

from __future__ import annotations

import sys
import time

import grpc

from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc


def diagnose(addr: str, endpoints: list[str], last_s: float = 300.0) -> dpb.DiagnoseResponse:
    with grpc.insecure_channel(addr) as channel:
        stub = dpb_grpc.NetDiagStub(channel)
        return stub.Diagnose(dpb.DiagnoseRequest(endpoints=endpoints, start=time.time() - last_s),
                             timeout=5)


def main() -> int:
    addr, *endpoints = sys.argv[1:]
    resp = diagnose(addr, endpoints)
    print(dpb.Verdict.Name(resp.verdict))
    for inc in resp.incidents:
        print(f"  {inc.id}: {cpb.ComponentType.Name(inc.component.type)} {inc.component.id} "
              f"({cpb.Layer.Name(inc.layer)}, {cpb.Symptom.Name(inc.symptom)}, "
              f"confidence {inc.confidence:.2f}, {len(inc.pairs)} pairs)")
    return 0 if resp.verdict != dpb.NETWORK_FAULT else 1


if __name__ == "__main__":
    sys.exit(main())
