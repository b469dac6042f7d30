"""Deployment: the kustomize overlays render and validate offline against
the Kubernetes schemas; the image builds where a Docker daemon runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from netskel.config import load_config

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"


def render(name: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed (Debian: kubernetes-client)")
    out = subprocess.run(["kubectl", "kustomize", str(K8S / name)], capture_output=True, text=True,
                         check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("name", ["controller", "analyzer", "agent-sidecar"])
def test_overlay_renders_and_validates(tmp_path, name):
    docs = render(name)
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump_all(docs))
    exe = shutil.which("kubernetes-validate", path=str(Path(__import__("sys").executable).parent))
    assert exe, "kubernetes-validate is a dev dependency"
    res = subprocess.run([exe, "--strict", "--quiet", str(f)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def _containers(docs, kind="Deployment"):
    return [c for d in docs if d["kind"] in (kind, "StatefulSet")
            for c in d["spec"]["template"]["spec"]["containers"]]


def _tls_args(args: list[str]) -> bool:
    return all(f in args for f in ("--tls-cert", "--tls-key", "--tls-ca")) and \
        "--insecure" not in args


def test_services_are_probed_and_speak_tls_and_agent_sidecar_has_what_it_needs(
        tmp_path_factory):
    for name, port in (("controller", 7000), ("analyzer", 7001)):
        (c,) = _containers(render(name))
        assert c["livenessProbe"]["tcpSocket"]["port"] == port
        assert c["readinessProbe"]["tcpSocket"]["port"] == port
        assert c["image"].startswith("registry.example.com/netskel:")
        assert _tls_args(c["args"])
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert "/etc/netskel/tls" in mounts
    # The analyzer's settings file is mounted where its --config says, and reads.
    docs = render("analyzer")
    (c,) = _containers(docs)
    path = Path(c["args"][c["args"].index("--config") + 1])
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (vol,) = [v for d in docs if d["kind"] == "Deployment"
              for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"
             and d["metadata"]["name"] == vol["configMap"]["name"]]
    settings = tmp_path_factory.mktemp("settings") / path.name
    settings.write_text(cm["data"][path.name])
    assert load_config(settings).analyzer.close_windows == 4
    agent = next(c for c in _containers(render("agent-sidecar")) if c["name"] == "netskel-agent")
    caps = agent["securityContext"]["capabilities"]
    assert caps["add"] == ["NET_RAW", "IPC_LOCK"] and caps["drop"] == ["ALL"]
    assert agent["resources"]["limits"]["rdma/hca"] == 1
    assert agent["livenessProbe"]["httpGet"]["path"] == "/metrics"
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NETSKEL_TLS_CERT"].startswith("/etc/netskel/tls/")
    # Open vSwitch's sockets are 0750: only their owner (root here) can read
    # the switch, so --vswitch flags on any other user would always fail.
    if any(a.startswith("--vswitch") for a in agent["args"]):
        assert agent["securityContext"].get("runAsUser") == 0
    (worker,) = [d for d in render("agent-sidecar") if d["kind"] == "StatefulSet"]
    (tls,) = [v for v in worker["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert tls["csi"]["volumeAttributes"]["csi.cert-manager.io/uri-sans"] == \
        "netskel://agent/${POD_NAME}"


@pytest.mark.parametrize("name", ["controller", "analyzer"])
def test_a_role_and_everything_it_mounts_live_in_the_netskel_namespace(name):
    """A Deployment reads ConfigMaps, Secrets and claims of its own
    namespace only, and agents dial `netskel-controller.netskel`: a role
    rendered without a namespace lands in kubectl's current one, away from
    its topology."""
    docs = render(name)
    namespaced = [d for d in docs if d["kind"] != "Namespace"]
    assert {(d["kind"], d["metadata"].get("namespace")) for d in namespaced} == \
        {(d["kind"], "netskel") for d in namespaced}
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "netskel"
               for d in docs)


def test_the_operators_monitors_find_every_role_under_the_job_names_the_alerts_select():
    """A ServiceMonitor's job is its Service's name; the PodMonitor names
    its own. Both must find what the role overlays render."""
    docs = render("monitoring")
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor"]
    jobs = {j["job_name"] for j in yaml.safe_load(
        (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]}
    found = set()
    for name in ("controller", "analyzer"):
        for svc in (d for d in render(name) if d["kind"] == "Service"):
            labels = svc["metadata"].get("labels", {})
            if svc["metadata"]["namespace"] == sm["metadata"]["namespace"] and \
                    sm["spec"]["selector"]["matchLabels"].items() <= labels.items():
                assert {e["port"] for e in sm["spec"]["endpoints"]} <= \
                    {p["name"] for p in svc["spec"]["ports"]}
                found.add(svc["metadata"]["name"])
    (worker,) = [d for d in render("agent-sidecar") if d["kind"] == "StatefulSet"]
    pod = worker["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (agent,) = [c for c in pod["spec"]["containers"] if c["name"] == "netskel-agent"]
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    (port,) = [p for p in agent["ports"] if p["name"] == ep["port"]]
    assert ["--metrics-port", str(port["containerPort"])] == \
        agent["args"][agent["args"].index("--metrics-port"):][:2]
    # No other container of the pod shares the port's name (it would be scraped as an agent).
    assert all(ep["port"] not in {p.get("name") for p in c.get("ports", [])}
               for c in pod["spec"]["containers"] if c is not agent)
    found |= {r["replacement"] for r in ep["relabelings"] if r["targetLabel"] == "job"}
    assert found == jobs


def test_the_operators_rules_are_the_alerts_of_deploy_prometheus():
    docs = render("monitoring")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    source = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())
    assert rule["spec"] == source, "regenerate: python scripts/prometheus_rule.py"


def test_image_builds_where_docker_runs():
    if shutil.which("docker") is None:
        pytest.skip("no docker client on this machine")
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("docker client present but no daemon running: the image cannot be built here")
    res = subprocess.run(["docker", "build", "-q", "-t", "netskel:test", str(ROOT)],
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-2000:]
    # The sidecar's RDMA prober has its library in the image (a device comes with the pod).
    verbs = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python", "netskel:test", "-c",
                            "from probe_agent.rdma import load_verbs; load_verbs()"],
                           capture_output=True, text=True, timeout=300)
    assert verbs.returncode == 0, verbs.stderr[-2000:]
