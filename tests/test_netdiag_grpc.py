"""Controller and analyzer as real gRPC servers on loopback, fed by a client
that speaks the agent protocol: NetDiag's answers, its incident stream, and
its behaviour under bad requests."""

from __future__ import annotations

import queue
import re
import socket
import threading
import time

import grpc
import pytest

from analyzer.batch import WindowBatch
from analyzer.server import start_analyzer
from controller.server import start_controller
from netskel import serde
from netskel.api.v1 import common_pb2 as cpb
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.config import AnalyzerConfig, ControllerConfig
from netskel.model import WindowStats
from tests.helpers import chromium, render_page, stopped_while_busy, wait_for


@pytest.fixture
def stack(topo_file, tmp_path):
    sock = f"unix:{tmp_path}/c.sock"
    ctl = start_controller(ControllerConfig(topology=str(topo_file), listen=(sock,), db=":memory:"))
    ana = start_analyzer(AnalyzerConfig(topology=str(topo_file), controller=sock,
                                        listen=("127.0.0.1:0",)), tick_s=0.2)
    ch = grpc.insecure_channel(sock)
    dch = grpc.insecure_channel(f"127.0.0.1:{ana.ports[0]}")
    yield pb_grpc.ControllerStub(ch), dpb_grpc.NetDiagStub(dch), ana
    ch.close()
    dch.close()
    ana.stop(0)
    ctl.stop(0)


def _windows(topo_doc, start, lossy=()):
    c0 = topo_doc["containers"][0]
    out = []
    for r, e in enumerate(c0["endpoints"]):
        for other in topo_doc["containers"][1:]:
            dst = other["endpoints"][r]["id"]
            lost = 100 if (e["id"], dst) in lossy else 0
            out.append(WindowStats(e["id"], dst, start, start + 10, 64, 200, lost,
                                   10, 11, 12, 13, 12, 1, 20))
    return out


def _register_first(stub, topo_doc):
    c0 = topo_doc["containers"][0]
    stub.Register(pb.RegisterRequest(container=c0["id"], job="job7", host=c0["host"], probe_port=7100,
                                     endpoints=[pb.EndpointInfo(id=e["id"], nic=e["nic"], ip=e["ip"])
                                                for e in c0["endpoints"]]))


def _report(stub, container, windows):
    stub.Report(iter([pb.AgentReport(container=container, windows=pb.WindowBatch(
        windows=[serde.window_to_pb(w) for w in windows]))]))


def test_diagnose_watch_and_list(stack, topo_doc, capsys):
    ctl, nd, ana = stack
    c0 = topo_doc["containers"][0]
    _register_first(ctl, topo_doc)
    ctl.Heartbeat(pb.HeartbeatRequest(container=c0["id"], ready=True))
    events: queue.Queue = queue.Queue()
    watch = nd.WatchIncidents(dpb.WatchIncidentsRequest())

    def follow():
        try:
            for i in watch:
                events.put(i)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.CANCELLED
    threading.Thread(target=follow, daemon=True).start()
    # The feed subscription is asynchronous: wait until the analyzer knows the agent.
    wait_for(lambda: c0["endpoints"][0]["id"] in ana.engine.known_endpoints, 10, "feed")

    # Far enough back that the clean windows closing the incident are past too.
    t = (time.time() // 10) * 10 - 10 * ana.engine.cfg.close_windows
    bad = (c0["endpoints"][0]["id"], topo_doc["containers"][2]["endpoints"][0]["id"])
    _report(ctl, c0["id"], _windows(topo_doc, t - 40) + _windows(topo_doc, t - 30, lossy={bad}))
    opened = events.get(timeout=10)
    assert opened.symptom == cpb.SYMPTOM_LOSS and not opened.HasField("end")
    assert [(p.a, p.b) for p in opened.pairs] == [tuple(sorted(bad))]

    d = nd.Diagnose(dpb.DiagnoseRequest(endpoints=[c0["endpoints"][0]["id"]]))
    assert d.verdict == dpb.NETWORK_FAULT
    by_pair = {(v.pair.a, v.pair.b): v.verdict for v in d.pairs}
    assert by_pair.pop(tuple(sorted(bad))) == dpb.NETWORK_FAULT
    assert by_pair and all(v == dpb.NETWORK_OK for v in by_pair.values())
    other = topo_doc["containers"][1]["endpoints"][1]["id"]
    assert nd.Diagnose(dpb.DiagnoseRequest(endpoints=[c0["endpoints"][1]["id"]])).verdict \
        == dpb.NETWORK_OK
    assert nd.Diagnose(dpb.DiagnoseRequest(pairs=[cpb.EndpointPair(
        a=topo_doc["containers"][1]["endpoints"][0]["id"], b=other)])).verdict \
        == dpb.INCONCLUSIVE, "a pair nobody probes cannot be judged"

    from netskel.cli import main
    server = f"127.0.0.1:{ana.ports[0]}"
    assert main(["netdiag", "--server", server, "--blamed", "--open"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 and opened.component.id in table[1]
    assert table[1].split()[2:5] == ["1", "1", "1"], "open, incidents, pairs"
    assert main(["netdiag", "--server", server, "--incidents", "--component-type", "switch"]) == 0
    assert capsys.readouterr().out.strip() == "no incidents"

    # One pair's history: both windows, the lossy one as lost.
    h = nd.PairHistory(dpb.PairHistoryRequest(pair=cpb.EndpointPair(a=bad[1], b=bad[0])))
    assert [(p.window_start, p.lost, p.sent) for p in h.points] == [(t - 40, 0, 200),
                                                                     (t - 30, 100, 200)]
    assert main(["netdiag", "--server", server, "--history", f"{bad[0]},{bad[1]}"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 3 and rows[2].split()[-2:] == ["100/200", bad[0]]
    with pytest.raises(grpc.RpcError) as e:
        nd.PairHistory(dpb.PairHistoryRequest(pair=cpb.EndpointPair(a=bad[0], b="nope")))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND

    # The web page's data: the open incident, its link blamed, its pair charted.
    import json
    import urllib.request

    from analyzer.web import WebServer
    web = WebServer(("127.0.0.1", 0), ana.engine, ana.lock).start()
    try:
        base = f"http://127.0.0.1:{web.port}"
        state = json.load(urllib.request.urlopen(f"{base}/api/state", timeout=5))
        assert [i["id"] for i in state["incidents"]] == [opened.id]
        comp = opened.component.id
        assert comp in state["blamed"]["links"] + state["blamed"]["switches"]
        assert [c["pair"] for c in state["charts"]] == [list(sorted(bad))]
        page = urllib.request.urlopen(base + "/", timeout=5).read().decode()
        assert "<svg id=\"topology\"" in page
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/api/pair?a={bad[0]}&b=nope", timeout=5)
        assert err.value.code == 404
    finally:
        web.stop()

    # Recovery: close_windows clean windows in a row close it, ending at the first.
    _report(ctl, c0["id"], [w for k in range(ana.engine.cfg.close_windows)
                            for w in _windows(topo_doc, t - 20 + 10 * k)])
    closed = events.get(timeout=10)
    assert closed.id == opened.id and closed.end == t - 20
    listed = nd.ListIncidents(dpb.ListIncidentsRequest())
    assert [i.id for i in listed.incidents] == [opened.id]
    assert nd.ListIncidents(dpb.ListIncidentsRequest(open_only=True)).incidents == []
    watch.cancel()


def test_bad_reports_are_rejected_not_fatal(stack, topo_doc):
    ctl, nd, ana = stack
    c0 = topo_doc["containers"][0]
    _register_first(ctl, topo_doc)
    src = c0["endpoints"][0]["id"]
    dst = topo_doc["containers"][1]["endpoints"][0]["id"]
    t = time.time() // 10 * 10
    nan = float("nan")
    bad = [WindowStats(src, dst, t, t + 10, 64, 5, 9),
           WindowStats(src, dst, t, t + 10, 64, 5, 0, nan, 1, 1, 1, 1, 1, 1),
           WindowStats(src, dst, t, t + 10, 64, 5, 0, -3, 1, 1, 1, 1, 1, 1),
           WindowStats(topo_doc["containers"][1]["endpoints"][1]["id"], dst, t, t + 10, 64, 5, 0,
                       1, 1, 1, 1, 1, 0, 1)]
    cut = serde.window_batch_to_pb(WindowBatch.from_windows(bad))
    # columns that do not fit together: one report rejected
    cut.columns.packed.src = cut.columns.packed.src[:-4]
    ack = ctl.Report(iter([pb.AgentReport(container=c0["id"], windows=pb.WindowBatch(
        windows=[serde.window_to_pb(w) for w in bad])),
        pb.AgentReport(container=c0["id"], windows=cut),
        pb.AgentReport(container=c0["id"], counters=pb.CounterBatch(samples=[
            pb.CounterSample(endpoint=src, ts=t, tx_bytes=-5, rx_bytes=1),
            pb.CounterSample(endpoint=src, ts=t, tx_bytes=5, rx_bytes=1)]))]))
    assert (ack.accepted, ack.rejected) == (1, 6)
    with pytest.raises(grpc.RpcError) as e:
        ctl.Report(iter([pb.AgentReport(container="stranger", windows=pb.WindowBatch())]))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with socket.create_connection(("127.0.0.1", ana.ports[0]), timeout=5) as s:
        s.sendall(b"\x16\x03\x01" + bytes(500))
    assert nd.ListIncidents(dpb.ListIncidentsRequest()).incidents == []


def test_example_client_names_the_component(stack, topo_doc):
    """examples/diagnose.py, as a diagnosis engine would run it."""
    import subprocess
    import sys
    from pathlib import Path

    ctl, nd, ana = stack
    c0 = topo_doc["containers"][0]
    _register_first(ctl, topo_doc)
    ctl.Heartbeat(pb.HeartbeatRequest(container=c0["id"], ready=True))
    wait_for(lambda: c0["endpoints"][0]["id"] in ana.engine.known_endpoints, 10, "feed")
    # Far enough back that the clean windows closing the incident are past too.
    t = (time.time() // 10) * 10 - 10 * ana.engine.cfg.close_windows
    bad = (c0["endpoints"][0]["id"], topo_doc["containers"][2]["endpoints"][0]["id"])
    _report(ctl, c0["id"], _windows(topo_doc, t - 40) + _windows(topo_doc, t - 30, lossy={bad}))
    wait_for(lambda: nd.ListIncidents(dpb.ListIncidentsRequest()).incidents, 10, "an incident")
    example = Path(__file__).resolve().parents[1] / "examples" / "diagnose.py"
    out = subprocess.run([sys.executable, str(example), f"127.0.0.1:{ana.ports[0]}", bad[0]],
                         capture_output=True, text=True, timeout=30)
    inc = nd.ListIncidents(dpb.ListIncidentsRequest()).incidents[0]
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "NETWORK_FAULT" and inc.component.id in lines[1] and "LOSS" in lines[1]


def test_list_incidents_pages_through_more_than_a_message_holds(topo_file, tmp_path, capsys):
    """12,000 incidents with long evidence would exceed the 4 MB message
    limit in one answer; pages of at most 5,000 get every one, once, in
    order, even while new ones open between pages."""
    from argparse import Namespace

    from netskel.model import Component, Incident
    from netskel.netdiag_client import run_netdiag

    # Retention above what the test adds: the analyzer's tick may run at any
    # moment and would trim closed incidents to the default 10,000 (a flake
    # under load: the command line then saw 10,000 of 12,001).
    ana = start_analyzer(AnalyzerConfig(topology=str(topo_file), controller="unix:/none",
                                        listen=("127.0.0.1:0",), incidents_kept=20_000,
                                        incidents_max_age_s=1e12))
    pad = "x" * 400

    def add(k: int) -> None:
        ana.engine.incidents[f"inc-{k:06d}"] = Incident(
            id=f"inc-{k:06d}", start=float(k % 997), end=float(k % 997) + 1.0, symptom="loss",
            layer="underlay", component=Component("link", f"l{k}"), pairs=[], confidence=0.5,
            evidence={"note": pad})

    for k in range(12_000):
        add(k)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ana.ports[0]}") as ch:
            nd = dpb_grpc.NetDiagStub(ch)
            seen, token, pages = [], "", 0
            while True:
                r = nd.ListIncidents(dpb.ListIncidentsRequest(page_size=5000, page_token=token),
                                     timeout=10)
                assert r.ByteSize() < 4 * 1024 * 1024
                seen += [(i.start, i.id) for i in r.incidents]
                pages += 1
                if pages == 1:
                    with ana.lock:  # opened between pages, before the cursor: not repeated
                        add(12_000)
                token = r.next_page_token
                if not token:
                    break
            assert pages == 3 and seen == sorted(seen) and len(set(seen)) == len(seen)
            assert len(seen) >= 12_000
            with pytest.raises(grpc.RpcError) as e:
                nd.ListIncidents(dpb.ListIncidentsRequest(page_token="garbage!"), timeout=5)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as e:
                nd.ListIncidents(dpb.ListIncidentsRequest(page_size=5001), timeout=5)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The command line follows every page.
        assert run_netdiag(Namespace(server=f"127.0.0.1:{ana.ports[0]}", tls_ca=None,
                                     tls_cert=None, tls_key=None, token_file=None,
                                     incidents=True, blamed=False, open=False,
                                     component_type=None, json=True)) == 0
        import json
        assert len(json.loads(capsys.readouterr().out)["incidents"]) == 12_001
    finally:
        ana.stop(0)


def test_a_stop_does_not_wait_out_a_long_analysis(topo_file, tmp_path):
    """One window of 524,288 pairs takes seconds under the engine's lock and
    cannot be interrupted; the analyzer's stop gives its threads one budget
    and closes its incident store, inside the process's 8 s stop deadline,
    instead of joining the analysis to its end."""
    import sqlite3

    ana = start_analyzer(AnalyzerConfig(topology=str(topo_file), controller="unix:/none",
                                        listen=("127.0.0.1:0",), db=str(tmp_path / "a.sqlite")),
                         tick_s=0.05)
    assert ana.store is not None
    analysing, release = threading.Event(), threading.Event()

    def long_tick(now, progress=None):
        analysing.set()
        release.wait(60)  # numpy does not look at the stop event
        return []

    ana.engine.tick = long_tick  # type: ignore[method-assign]
    with (stopped_while_busy(lambda: ana.stop(0), analysing, release),
          pytest.raises(sqlite3.ProgrammingError)):  # closed: what was saved stays
        ana.store.load()


def test_a_link_the_probes_cannot_tell_from_the_named_one_is_shown_beside_it(topo_file, topo_doc,
                                                                             capsys):
    """Every path between a rail's only two ToRs crosses both of a spine's
    links to them, so the analyzer names one and lists the other in its
    evidence. Whoever reads the incidents (command line, web page) sees
    both: replacing the named cable alone may leave the fault in place."""
    import json
    import urllib.request

    from analyzer.web import WebServer
    from netskel.cli import main
    from netskel.model import Component, Incident

    ana = start_analyzer(AnalyzerConfig(topology=str(topo_file), controller="unix:/none",
                                        listen=("127.0.0.1:0",)))
    tiers = {sw["id"]: sw["tier"] for sw in topo_doc["switches"]}
    spine = next(sw for sw, tier in tiers.items() if tier == "spine")
    named, twin = sorted("~".join(sorted((lk["a"], lk["b"]))) for lk in topo_doc["links"]
                         if spine in (lk["a"], lk["b"]))[:2]
    with ana.lock:
        ana.engine.incidents["inc-000001"] = Incident(
            id="inc-000001", start=time.time() - 60, end=None, symptom="loss", layer="underlay",
            component=Component("link", named), pairs=[("a", "b")], confidence=0.45,
            evidence={"indistinguishable_from": [twin]})
    web = WebServer(("127.0.0.1", 0), ana.engine, ana.lock).start()
    try:
        server = f"127.0.0.1:{ana.ports[0]}"
        assert main(["netdiag", "--server", server, "--incidents"]) == 0
        row = capsys.readouterr().out.splitlines()[1]
        assert named in row and row.endswith(f"or: {twin}")
        assert main(["netdiag", "--server", server, "--blamed", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["blamed"]
        assert [(r["id"], r["as_likely"]) for r in rows] == [(named, [twin])]
        state = json.load(urllib.request.urlopen(f"http://127.0.0.1:{web.port}/api/state",
                                                 timeout=5))
        assert state["blamed"]["links"] == [named]
        assert state["blamed"]["suspect_links"] == [twin]
        if chromium() is not None:  # scripts/setup.sh installs it
            dom = render_page(f"http://127.0.0.1:{web.port}/")
            assert f"link {named} (or {twin})" in dom
            assert re.search(rf'class="link suspect" data-link="{re.escape(twin)}"', dom)
            assert re.search(rf'class="link blamed" data-link="{re.escape(named)}"', dom)
            # Its pair has no windows kept (as after a restart): said, not "Infinity B".
            assert "a \u2194 b  (no windows kept)" in dom
    finally:
        web.stop()
        ana.stop(0)
