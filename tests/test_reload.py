"""A role started with --config reads it again on SIGHUP, as operators of
long-running services expect: a good file is taken (what needs a restart
is named), a bad one is logged and the running settings stay, and the
process goes on until SIGTERM. Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from netskel.cli import main
from tests.helpers import catches_signal, wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_sighup_reloads_the_analyzers_file_and_keeps_the_last_good(tmp_path, topo_file):
    conf, err = tmp_path / "a.toml", tmp_path / "err.log"
    head = (f'[analyzer]\ntopology = "{topo_file}"\nlisten = ["127.0.0.1:0"]\n'
            'controller = "127.0.0.1:1"\n')
    conf.write_text(head + "persist_windows = 1\n")
    with err.open("w") as sink:
        p = subprocess.Popen([sys.executable, "-m", "netskel.cli", "analyzer", "--config",
                              str(conf), "--insecure"], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=sink, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: catches_signal(p.pid, signal.SIGHUP), 60, "the SIGHUP handler")

        def logged(text: str) -> bool:
            return text in err.read_text()

        conf.write_text(head + "persist_windows = 2\nlof_history_windows = 12\n")
        p.send_signal(signal.SIGHUP)
        wait_for(lambda: logged("a.toml reloaded; a restart applies lof_history_windows"), 30,
                 "the reload")
        conf.write_text("[analyzer]\npersist_windows = 'two'\n")
        p.send_signal(signal.SIGHUP)
        wait_for(lambda: logged("not reloaded, the running settings stay: "), 30,
                 "the refused reload")
        assert "expected int, got str" in err.read_text()
        assert p.poll() is None  # still serving
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "Traceback" not in err.read_text()


def test_a_server_without_a_topology_anywhere_is_one_line(tmp_path, capsys):
    conf = tmp_path / "c.toml"
    conf.write_text("[controller]\nwindow_seconds = 10\n")
    assert main(["controller", "--config", str(conf), "--insecure"]) == 2
    assert main(["analyzer", "--insecure"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["netskel: error: controller: no topology: give --topology or `topology` in "
                   "[controller] of --config",
                   "netskel: error: analyzer: no topology: give --topology or `topology` in "
                   "[analyzer] of --config"]
