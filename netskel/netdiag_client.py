"""A small NetDiag client: what a diagnosis engine does, from the shell."""

from __future__ import annotations

import argparse
import json

import grpc

from netskel import serde
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.errors import InputError, NetskelError


def run_netdiag(a: argparse.Namespace) -> int:
    with grpc.insecure_channel(a.server) as ch:
        stub = dpb_grpc.NetDiagStub(ch)
        try:
            if a.incidents:
                resp = stub.ListIncidents(dpb.ListIncidentsRequest(), timeout=10)
                docs = [serde.incident_from_pb(i).to_doc() for i in resp.incidents]
                if a.json:
                    print(json.dumps({"incidents": docs}, indent=1))
                else:
                    print_incidents(docs)
                return 0
            pairs = []
            for spec in a.pair:
                parts = spec.split(",")
                if len(parts) != 2:
                    raise InputError(f"--pair '{spec}': expected A,B")
                pairs.append(cpb.EndpointPair(a=parts[0], b=parts[1]))
            d = stub.Diagnose(dpb.DiagnoseRequest(endpoints=a.endpoint, pairs=pairs), timeout=10)
        except grpc.RpcError as e:
            raise NetskelError(f"NetDiag at {a.server}: {e.code().name}: {e.details()}") from None
    verdict = serde.VERDICT_NAMES[d.verdict]
    if a.json:
        print(json.dumps({"verdict": verdict,
                          "pairs": [{"pair": [v.pair.a, v.pair.b],
                                     "verdict": serde.VERDICT_NAMES[v.verdict],
                                     "reason": v.reason} for v in d.pairs],
                          "incidents": [serde.incident_from_pb(i).to_doc()
                                        for i in d.incidents]}, indent=1))
        return 0
    print(f"verdict: {verdict}")
    for v in d.pairs:
        print(f"  {v.pair.a:<24} {v.pair.b:<24} {serde.VERDICT_NAMES[v.verdict]:<14} {v.reason}")
    print_incidents([serde.incident_from_pb(i).to_doc() for i in d.incidents])
    return 0


def print_incidents(docs: list[dict[str, object]]) -> None:
    if not docs:
        print("no incidents")
        return
    print(f"{'id':<11} {'symptom':<12} {'layer':<9} {'component':<32} {'conf':>5} pairs")
    for d in docs:
        comp = d["component"]
        assert isinstance(comp, dict)
        pairs = d["pairs"]
        assert isinstance(pairs, list)
        state = "" if d["end"] is None else " (closed)"
        print(f"{d['id']:<11} {d['symptom']:<12} {d['layer']:<9} "
              f"{comp['type'] + ':' + comp['id']:<32} {d['confidence']:>5.2f} "
              f"{len(pairs)}{state}")
