"""Incidents survive a restart: the same incident stays open under the
same id (also after SIGKILL of a serving analyzer), ids are never reused,
closed incidents are retired by count and age."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import grpc

from analyzer.engine import Analyzer
from analyzer.store import IncidentStore
from netskel.api.v1 import netdiag_pb2 as dpb
from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc
from netskel.config import AnalyzerConfig
from netskel.model import FlowRule, VSwitchDump, WindowStats
from netskel.probesim import with_overlay
from netskel.topology import parse_topology
from testbed.layout import Layout, layout_doc
from tests.helpers import wait_for

LAY = Layout(hosts=4, rails=1, hosts_per_tor=2, spines=1)
T0 = 1_700_000_010.0 // 30 * 30


def _blackhole(eng: Analyzer, windows: int, start: int = 0) -> None:
    """Host 0 lost its rule for host 1: the pair's probes are all lost."""
    a, b = LAY.endpoint(0, 0), LAY.endpoint(1, 0)
    rules = [FlowRule(LAY.vni, LAY.overlay_ip(h, 0), "deliver" if h == 0 else "tunnel")
             for h in range(LAY.hosts) if h != 1]
    eng.set_vswitch(VSwitchDump(host=LAY.host(0), ts=0.0, rules=tuple(rules)))
    for k in range(start, start + windows):
        s = T0 + 30 * k
        eng.add_windows([WindowStats(a, b, s, s + 30, 64, 300, 300)]
                        + [WindowStats(a, LAY.endpoint(h, 0), s, s + 30, 64, 300, 0, 90, 95, 100,
                                       105, 100, 3, 120) for h in (2, 3)])
        eng.tick(s + 35)


def _engine(db) -> Analyzer:
    eng = Analyzer(parse_topology(with_overlay(layout_doc(LAY))), AnalyzerConfig())
    eng.attach_store(IncidentStore(db))
    return eng


def test_open_incident_keeps_its_id_across_a_restart(tmp_path):
    first = _engine(tmp_path / "a.sqlite")
    _blackhole(first, 2)
    (inc,) = first.list_incidents(open_only=True)
    # No close(): what is committed after each tick is what a SIGKILL leaves.
    second = _engine(tmp_path / "a.sqlite")
    (again,) = second.list_incidents(open_only=True)
    assert (again.id, again.component, again.pairs) == (inc.id, inc.component, inc.pairs)
    _blackhole(second, 2, start=2)  # the fault goes on: still that one incident
    assert [i.id for i in second.list_incidents()] == [inc.id]
    assert second._seq == first._seq  # the next new incident gets a new id


def test_closed_incidents_are_retired_by_count_and_age(tmp_path):
    eng = _engine(tmp_path / "r.sqlite")
    eng.cfg = AnalyzerConfig(incidents_kept=1, incidents_max_age_s=3600)
    _blackhole(eng, 2)
    (inc,) = eng.list_incidents()
    inc.end = T0 + 60
    eng.tick(T0 + 60 + 7200)
    assert eng.list_incidents() == []
    assert _engine(tmp_path / "r.sqlite").list_incidents() == []


def test_sigkill_of_a_serving_analyzer_loses_no_incident(tmp_path):
    db = tmp_path / "k.sqlite"
    eng = _engine(db)
    _blackhole(eng, 2)
    (inc,) = eng.list_incidents(open_only=True)
    topo = tmp_path / "t.json"
    topo.write_text(json.dumps(with_overlay(layout_doc(LAY))))
    target = f"unix:{tmp_path}/a.sock"

    def serve() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "netskel.cli", "analyzer", "--topology",
                                 str(topo), "--controller", f"unix:{tmp_path}/none.sock",
                                 "--listen", target, "--db", str(db), "--insecure"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listed() -> list[str]:
        with grpc.insecure_channel(target) as ch:
            try:
                r = dpb_grpc.NetDiagStub(ch).ListIncidents(dpb.ListIncidentsRequest(open_only=True),
                                                            timeout=2)
            except grpc.RpcError:
                return []
            return [i.id for i in r.incidents]

    for _ in range(2):
        proc = serve()
        try:
            assert wait_for(listed, 30, "the analyzer to list the incident") == [inc.id]
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
