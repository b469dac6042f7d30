"""The alerts a network team loads (deploy/prometheus): Prometheus's own
tools accept the rules and the scrape config, each alert fires exactly when
its unit tests say, the rules read only series the roles export, and a real
Prometheus scraping live roles evaluates them: quiet while all is well,
pending once an agent stops and a settings file breaks."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from netskel.model import LAYERS
from testbed.prometheus import start_prometheus
from testbed.sh import Created
from tests.helpers import catches_signal, role_processes, wait_for

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "deploy" / "prometheus"


def tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} not installed (scripts/setup.sh installs Debian's prometheus)")
    return exe


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROM / "rules.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_promtool_accepts_the_scrape_config_and_its_rules():
    res = subprocess.run([tool("promtool"), "check", "config", "prometheus.yml"], cwd=PROM,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules())} rules found" in res.stdout


def test_each_alert_fires_when_its_unit_tests_say_and_the_tests_bite(tmp_path):
    promtool = tool("promtool")
    res = subprocess.run([promtool, "test", "rules", "rules_test.yml"], cwd=PROM,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    # The same tests against rules with one threshold moved must fail:
    # they pin when alerts fire, not only that the files parse.
    shutil.copy(PROM / "rules_test.yml", tmp_path)
    text = (PROM / "rules.yml").read_text()
    moved = text.replace("< 0.9 * netskel_pinglist_targets", "< 0.8 * netskel_pinglist_targets")
    assert moved != text
    (tmp_path / "rules.yml").write_text(moved)
    res = subprocess.run([promtool, "test", "rules", "rules_test.yml"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert "NetskelProbingCoverageLow" in res.stdout + res.stderr


def _exported() -> dict[str, set[str]]:
    """Each series name a role's registry exposes, with its label names."""
    from analyzer import metrics as am
    from controller import metrics as cm
    from probe_agent import metrics as pm

    # One series per open incident: none while nothing is open, so its
    # labels are the ones the collector declares.
    out: dict[str, set[str]] = {"netskel_incident_open": set(am.OpenIncidents.LABELS)}
    regs: list[CollectorRegistry] = [am.REGISTRY, cm.REGISTRY, pm.REGISTRY]
    for reg in regs:
        for fam in text_string_to_metric_families(generate_latest(reg).decode()):
            for s in fam.samples:
                out.setdefault(s.name, set()).update(s.labels)
            # A family with no sample yet (a labelled counter before its
            # first event) still names its series.
            if fam.type == "counter":
                out.setdefault(fam.name + "_total", set())
            out.setdefault(fam.name, set())
    return out


def test_the_rules_read_only_series_the_roles_export_and_the_jobs_that_scrape_them():
    exported = _exported()
    jobs = {j["job_name"] for j in yaml.safe_load((PROM / "prometheus.yml").read_text())
            ["scrape_configs"]}
    assert jobs == {"netskel-controller", "netskel-analyzer", "netskel-agent"}
    for rule in rules():
        expr = rule["expr"]
        names = set(re.findall(r"\b(netskel_[a-z_]+)\b", expr))
        assert names or "up{" in expr, rule["alert"]
        for name in names:
            assert name in exported, f"{rule['alert']} reads {name}, which no role exports"
        for label, value in re.findall(r'(\w+)=~?"([^"]*)"', expr):
            if label == "job":
                assert set(value.split("|")) <= jobs, rule["alert"]
            elif label == "layer":
                assert set(value.split("|")) <= set(LAYERS), rule["alert"]
            else:
                assert any(label in exported[n] for n in names), (rule["alert"], label)
        kept = {"job", "instance"} | {n.strip() for by in re.findall(r"by \(([^)]*)\)", expr)
                                       for n in by.split(",")}
        for name in kept - {"job", "instance"}:
            assert any(name in exported[n] for n in names), (rule["alert"], name)
        # The alert's text reads labels its series carry (aggregations keep only theirs).
        if "by (" not in expr:
            kept |= {label for n in names for label in exported[n]}
        for text in rule["annotations"].values():
            for label in re.findall(r"\$labels\.(\w+)", text):
                assert label in kept, (rule["alert"], label)
    # Every open-incident layer that is a network fault pages; the others warn.
    by_name = {r["alert"]: r for r in rules()}
    fault = re.search(r'layer=~"([^"]*)"', by_name["NetskelNetworkFault"]["expr"])
    assert fault is not None
    assert set(fault.group(1).split("|")) | {"agent", "unknown"} == set(LAYERS)


@pytest.fixture
def roles(tmp_path, topo_file, topo_doc):
    """A controller, an analyzer reading a settings file and one agent, as
    real processes with their metrics ports."""
    conf = tmp_path / "analyzer.toml"
    conf.write_text("[analyzer]\npersist_windows = 3\n")
    with role_processes(tmp_path, topo_file, topo_doc, agents=1,
                        analyzer_args=("--config", str(conf))) as (ports, procs):
        yield ports, procs, conf


def test_prometheus_evaluates_the_rules_on_live_roles(tmp_path, roles):
    tool("prometheus")
    ports, procs, conf = roles
    # The shipped config and rules, scraping and evaluating every second
    # (testbed/prometheus.py, as the testbed and the demo run it); it
    # returns once the three roles are scraped.
    prom = start_prometheus(tmp_path, {
        "netskel-controller": [f"127.0.0.1:{ports['controller']}"],
        "netskel-analyzer": [f"127.0.0.1:{ports['analyzer']}"],
        "netskel-agent": [f"127.0.0.1:{ports['agent0']}"]}, Created(str(tmp_path / "pids.json")))
    try:
        def evaluated() -> list[dict[str, Any]]:
            got = prom.api("rules")
            rs = [r for g in (got or {"groups": []})["groups"] for r in g["rules"]]
            return rs if len(rs) == len(rules()) and all(
                r["health"] == "ok" and not r["lastEvaluation"].startswith("0001")
                for r in rs) else []
        wait_for(evaluated, 60, "every rule evaluated without error", poll=0.5)

        def health_alerts() -> list[tuple[str, str, str]]:
            return sorted((a["labels"]["alertname"], a["labels"]["job"], a["state"])
                          for a in prom.alerts()
                          if a["labels"]["alertname"] in ("NetskelTargetDown",
                                                          "NetskelConfigReloadFailed"))
        # Scraped and evaluated with every role up and every file good: quiet.
        assert health_alerts() == []

        # An agent stops and the analyzer's settings no longer read.
        wait_for(lambda: catches_signal(procs["analyzer"].pid, signal.SIGHUP), 60,
                 "the analyzer's SIGHUP handler")
        conf.write_text("[analyzer]\npersist_windows = 'three'\n")
        procs["analyzer"].send_signal(signal.SIGHUP)
        procs["agent0"].terminate()
        procs["agent0"].wait(timeout=10)
        want = [("NetskelConfigReloadFailed", "netskel-analyzer", "pending"),
                ("NetskelTargetDown", "netskel-agent", "pending")]
        wait_for(lambda: health_alerts() == want, 60, "both alerts pending", poll=0.5)
    finally:
        prom.stop()

