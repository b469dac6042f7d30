"""A small NetDiag client: what a diagnosis engine does, from the shell."""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import grpc

from netskel import serde
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.errors import InputError, NetskelError
from netskel.model import as_likely
from netskel.security import Security, Tls, channel, read_token


def client_security(a: argparse.Namespace) -> Security:
    """TLS when a CA is given (a client certificate optional), the bearer
    token when a token file is."""
    if bool(a.tls_cert) != bool(a.tls_key):
        raise InputError("netdiag: --tls-cert and --tls-key go together")
    if (a.tls_cert or a.tls_key) and not a.tls_ca:
        raise InputError("netdiag: a client certificate needs --tls-ca")
    token = read_token(a.token_file) if a.token_file else None
    tls = Tls.load(a.tls_cert or "", a.tls_key or "", a.tls_ca) if a.tls_ca else None
    return Security(tls, token)


def run_netdiag(a: argparse.Namespace) -> int:
    with channel(a.server, client_security(a)) as ch:
        stub = dpb_grpc.NetDiagStub(ch)
        try:
            if a.incidents or a.blamed:
                docs = []
                token = ""
                while True:  # every page
                    resp = stub.ListIncidents(dpb.ListIncidentsRequest(
                        open_only=a.open, page_token=token), timeout=10)
                    docs += [serde.incident_from_pb(i).to_doc() for i in resp.incidents]
                    token = resp.next_page_token
                    if not token:
                        break
                if a.component_type:
                    docs = [d for d in docs if d["component"]["type"] == a.component_type]
                if a.blamed:
                    rows = blamed(docs)
                    if a.json:
                        print(json.dumps({"blamed": rows}, indent=1))
                    else:
                        print_blamed(rows)
                elif a.json:
                    print(json.dumps({"incidents": docs}, indent=1))
                else:
                    print_incidents(docs)
                return 0
            if a.history:
                x, y = _pair(a.history, "--history")
                h = stub.PairHistory(dpb.PairHistoryRequest(pair=cpb.EndpointPair(a=x, b=y)),
                                     timeout=10)
                print_history(h.points, a.json)
                return 0
            pairs = [cpb.EndpointPair(a=x, b=y) for x, y in (_pair(s, "--pair") for s in a.pair)]
            d = stub.Diagnose(dpb.DiagnoseRequest(endpoints=a.endpoint, pairs=pairs,
                                                  active_check=a.check,
                                                  check_seconds=a.check_seconds),
                              timeout=10 + (a.check_seconds + 15 if a.check else 0))
        except grpc.RpcError as e:
            raise NetskelError(f"NetDiag at {a.server}: {e.code().name}: {e.details()}") from None
    verdict = serde.VERDICT_NAMES[d.verdict]
    if a.json:
        print(json.dumps({"verdict": verdict,
                          "pairs": [{"pair": [v.pair.a, v.pair.b],
                                     "verdict": serde.VERDICT_NAMES[v.verdict],
                                     "reason": v.reason, "route_from": v.route_from,
                                     "route": v.route} for v in d.pairs],
                          "incidents": [serde.incident_from_pb(i).to_doc()
                                        for i in d.incidents],
                          "check_findings": [serde.incident_from_pb(i).to_doc()
                                             for i in d.check_findings]}, indent=1))
        return 0
    print(f"verdict: {verdict}")
    for v in d.pairs:
        print(f"  {v.pair.a:<24} {v.pair.b:<24} {serde.VERDICT_NAMES[v.verdict]:<14} {v.reason}")
    print_incidents([serde.incident_from_pb(i).to_doc() for i in d.incidents])
    if d.check_findings:
        print("active check blames:")
        print_incidents([serde.incident_from_pb(i).to_doc() for i in d.check_findings])
    return 0


def _pair(spec: str, flag: str) -> tuple[str, str]:
    parts = spec.split(",")
    if len(parts) != 2 or not all(parts):
        raise InputError(f"{flag} '{spec}': expected A,B")
    return parts[0], parts[1]


def print_history(points: Any, as_json: bool) -> None:
    rows = [{"window_start": p.window_start, "size": p.size, "rtt_median_us": p.rtt_median,
             "rtt_p75_us": p.rtt_p75, "sent": p.sent, "lost": p.lost, "prober": p.src}
            for p in points]
    if as_json:
        print(json.dumps({"points": rows}, indent=1))
        return
    if not rows:
        print("no windows kept for this pair")
        return
    print(f"{'window start (UTC)':<20} {'size':>5} {'median us':>10} {'p75 us':>9} "
          f"{'lost/sent':>10}  prober")
    for r in rows:
        t = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["window_start"]))
        med = "-" if math.isnan(r["rtt_median_us"]) else f"{r['rtt_median_us']:.0f}"
        p75 = "-" if math.isnan(r["rtt_p75_us"]) else f"{r['rtt_p75_us']:.0f}"
        print(f"{t:<20} {r['size']:>5} {med:>10} {p75:>9} {r['lost']:>4}/{r['sent']:<5}  "
              f"{r['prober']}")


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
        evidence = d.get("evidence")
        twins = as_likely(evidence) if isinstance(evidence, dict) else []
        also = f"  or: {', '.join(twins)}" if twins else ""
        print(f"{d['id']:<11} {d['symptom']:<12} {d['layer']:<9} "
              f"{comp['type'] + ':' + comp['id']:<32} {d['confidence']:>5.2f} "
              f"{len(pairs)}{state}{also}")


def blamed(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per blamed component (link, switch, rule, NIC...): what the
    network team replaces or restarts, most pairs first; `as_likely`, what
    the probes could not tell it from."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for d in docs:
        key = (d["component"]["type"], d["component"]["id"])
        r = rows.setdefault(key, {"type": key[0], "id": key[1], "layer": d["layer"], "incidents": 0,
                                  "open": 0, "pairs": set(), "symptoms": set(), "since": d["start"],
                                  "as_likely": set()})
        r["as_likely"].update(as_likely(d.get("evidence") or {}))
        r["incidents"] += 1
        r["open"] += d["end"] is None
        r["pairs"].update(map(tuple, d["pairs"]))
        r["symptoms"].add(d["symptom"])
        r["since"] = min(r["since"], d["start"])
    out = [dict(r, pairs=len(r["pairs"]), symptoms=sorted(r["symptoms"]),
                as_likely=sorted(r["as_likely"])) for r in rows.values()]
    return sorted(out, key=lambda r: (-r["open"], -r["pairs"], r["type"], r["id"]))


def print_blamed(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("nothing blamed")
        return
    print(f"{'component':<40} {'layer':<9} {'open':>4} {'incid':>5} {'pairs':>5} symptoms")
    for r in rows:
        also = f"  or: {', '.join(r['as_likely'])}" if r["as_likely"] else ""
        print(f"{r['type'] + ':' + r['id']:<40} {r['layer']:<9} {r['open']:>4} {r['incidents']:>5} "
              f"{r['pairs']:>5} {','.join(r['symptoms'])}{also}")
