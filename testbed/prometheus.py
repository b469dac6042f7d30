"""A real Prometheus beside the testbed: it scrapes the roles with the
shipped scrape jobs and evaluates the shipped alerts (deploy/prometheus),
every second instead of every 15, so a fault on a testbed link shows as an
alert the way a network team would see it.

The process is recorded in the cluster's created.json (its PID), so
`python -m testbed.cluster clean` stops it after a crash too."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netskel.errors import NetskelError
from testbed.sh import Created, free_port

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "deploy" / "prometheus"
START_TIMEOUT_S = 30.0
EVERY_SECOND = re.compile(r"\b(scrape_interval|evaluation_interval): \S+")


def prometheus_available() -> bool:
    return shutil.which("prometheus") is not None and (SHIPPED / "rules.yml").exists()


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str) -> Any:
        """The API's `data`, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=2) as r:
                return json.loads(r.read())["data"]
        except (OSError, ValueError, KeyError):
            return None

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts pending or firing now, each with its labels and state."""
        got = self.api("alerts")
        return list(got["alerts"]) if got else []

    def firing(self, name: str) -> list[dict[str, str]]:
        return [a["labels"] for a in self.alerts()
                if a["labels"].get("alertname") == name and a["state"] == "firing"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_prometheus(run_dir: Path, targets: dict[str, list[str]], created: Created) -> Prometheus:
    """Prometheus in run_dir/prometheus, scraping `targets` (job name ->
    host:port) under the shipped jobs; returns once every target is up."""
    where = run_dir / "prometheus"
    (where / "targets").mkdir(parents=True)
    shutil.copy(SHIPPED / "rules.yml", where)
    (where / "prometheus.yml").write_text(EVERY_SECOND.sub(
        r"\1: 1s", (SHIPPED / "prometheus.yml").read_text()))
    files = {"netskel-controller": "controller", "netskel-analyzer": "analyzer",
             "netskel-agent": "agents"}
    for job, name in files.items():
        (where / "targets" / f"{name}.json").write_text(
            json.dumps([{"targets": targets.get(job, [])}]))
    port = free_port()
    with open(where / "prometheus.log", "ab") as out:
        proc = subprocess.Popen(["prometheus", f"--config.file={where / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={where / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT)
    created.add_pid(proc.pid)
    prom = Prometheus(proc, port)
    want = sum(len(v) for v in targets.values())
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        t = prom.api("targets")
        if t is not None and sum(1 for x in t["activeTargets"] if x["health"] == "up") == want:
            return prom
        time.sleep(0.2)
    prom.stop()
    raise NetskelError(f"prometheus did not scrape its {want} targets within "
                       f"{START_TIMEOUT_S:.0f} s (log: {where / 'prometheus.log'})")
