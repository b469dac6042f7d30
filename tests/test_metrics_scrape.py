"""Each process's /metrics — controller, analyzer, agents as separate real
processes on loopback — parses with the Prometheus text parser, carries the
families an operator needs, and no label names a probe pair."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from netskel.model import LAYERS
from tests.helpers import role_processes, wait_for


def scrape(port: int) -> dict[str, list]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture
def procs(tmp_path, topo_file, topo_doc):
    with role_processes(tmp_path, topo_file, topo_doc, agents=2) as (ports, _procs):
        yield ports


def test_every_process_metrics_parse_and_stay_bounded(procs, topo_doc):
    def sent(port: int) -> float:
        fams = scrape(port)
        return sum(s.value for s in fams.get("netskel_probes_sent", []) if s.name.endswith("_total"))
    wait_for(lambda: sent(procs["agent0"]) > 0 and sent(procs["agent1"]) > 0, 30,
             "both agents to probe", poll=0.5)
    wait_for(lambda: any(s.value > 0 for s in scrape(procs["analyzer"]).get(
        "netskel_windows_analyzed", [])), 30, "the analyzer to analyse a window", poll=0.5)

    def value(who: str, family: str, sample: str, **labels: str) -> float:
        return sum(s.value for s in scrape(procs[who]).get(family, [])
                   if s.name == sample and labels.items() <= s.labels.items())

    # Each role's own figures move with what it did.
    wait_for(lambda: value("controller", "netskel_agents_registered",
                           "netskel_agents_registered") == 2, 30, "two agents registered", poll=0.5)
    assert value("controller", "netskel_pinglist_targets", "netskel_pinglist_targets") > 0
    wait_for(lambda: value("controller", "netskel_reports_accepted",
                           "netskel_reports_accepted_total", kind="window") > 0, 30,
             "the controller to accept windows", poll=0.5)
    assert value("analyzer", "netskel_analysis_seconds", "netskel_analysis_seconds_count") > 0
    # Each role exports its own families (and its process's), none of another role's.
    own = {"controller": "netskel_agents_registered", "analyzer": "netskel_windows_analyzed",
           "agent0": "netskel_probes_sent"}
    for who, family in own.items():
        fams = scrape(procs[who])
        assert family in fams and "process_cpu_seconds" in fams, (who, sorted(fams))
        assert not {f for w, f in own.items() if w != who} & set(fams), (who, sorted(fams))
    endpoints = {e["id"] for c in topo_doc["containers"] for e in c["endpoints"]}
    for who in ("controller", "analyzer", "agent0"):
        fams = scrape(procs[who])
        for samples in fams.values():
            for s in samples:
                assert not {"dst", "pair", "target"} & set(s.labels), (who, s)
                # an agent labels by its own endpoints only (bounded): never two endpoints
                assert len(endpoints & set(s.labels.values())) <= 1, (who, s)
    # Open incidents by layer: every layer's series there, so an alert on one never reads absence.
    layers = {s.labels["layer"] for s in scrape(procs["analyzer"])["netskel_incidents_open"]}
    assert layers == set(LAYERS)
    # Likewise every report kind's rejections and every stream's overflows,
    # at 0 before the first: rate() then counts the first burst too.
    controller = scrape(procs["controller"])
    for family, label, values in (("netskel_reports_rejected", "kind", {"window", "counter", "vswitch"}),
                                  ("netskel_stream_overflows", "stream", {"pinglist", "reports"})):
        assert {s.labels[label] for s in controller[family] if s.name.endswith("_total")} == values
    assert [s.labels for s in scrape(procs["analyzer"])["netskel_stream_overflows"]
            if s.name.endswith("_total")] == [{"stream": "incidents"}]
    rtt = scrape(procs["agent0"])["netskel_probe_rtt_microseconds"]
    assert any(s.name.endswith("_count") and s.value > 0 for s in rtt)
