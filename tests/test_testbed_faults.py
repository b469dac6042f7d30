"""Each injected fault does to real packets what it claims, and the testbed
removes exactly what it created, also after its builder was killed."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import faults
from testbed.cluster import create_cluster
from testbed.layout import Layout
from testbed.sh import _exited, ns, run
from tests.conftest import requires_testbed
from tests.helpers import wait_for

pytestmark = [requires_testbed, pytest.mark.testbed]


@pytest.fixture(scope="module")
def cluster():
    c = create_cluster(Layout(hosts=4, rails=1, hosts_per_tor=2, spines=2))
    yield c
    assert c.destroy() == []
    assert not c.run_dir.exists()


def _spine_link(cluster, a: int, b: int) -> str:
    hops = cluster.trace_underlay(a, b, 0)
    assert len(hops) == 3, hops
    tor, spine = hops[0], hops[1]
    return "~".join(sorted((tor, spine)))


def _received(cluster, a, b, count, size=56, interval="0.01") -> int:
    out = ns(cluster.container_ns(a), "ping", "-q", "-c", str(count), "-i", interval, "-W", "1",
             "-s", str(size), cluster.layout.overlay_ip(b, 0), check=False)
    return int(re.search(r"(\d+) received", out).group(1))


def _rtts(cluster, a, b, count) -> list[float]:
    out = ns(cluster.container_ns(a), "ping", "-c", str(count), "-i", "0.05", "-W", "2",
             cluster.layout.overlay_ip(b, 0), check=False)
    return [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]


def test_link_down_cuts_the_pair_and_undo_restores(cluster):
    link = _spine_link(cluster, 0, 2)
    assert _received(cluster, 0, 2, 5) == 5
    undo = faults.link_down(cluster, link)
    try:
        assert _received(cluster, 0, 2, 5) == 0
        assert _received(cluster, 0, 1, 5) == 5, "a same-ToR pair does not cross the link"
    finally:
        undo()
    deadline = time.monotonic() + 5
    while _received(cluster, 0, 2, 3) < 3:
        assert time.monotonic() < deadline, "link did not come back"


def test_random_loss_drops_a_fraction(cluster):
    link = _spine_link(cluster, 0, 2)
    undo = faults.random_loss(cluster, link, 30)
    try:
        got = _received(cluster, 0, 2, 200)
    finally:
        undo()
    # Each echo crosses the link twice: P(ok) = 0.7^2 = 0.49; 200 trials.
    assert 60 < got < 140, got
    assert _received(cluster, 0, 2, 20) == 20


def test_large_packets_only_are_dropped(cluster):
    link = _spine_link(cluster, 0, 2)
    undo = faults.drop_above(cluster, link, 1000)
    try:
        assert _received(cluster, 0, 2, 5, size=500) == 5
        assert _received(cluster, 0, 2, 5, size=1400) == 0
    finally:
        undo()
    assert _received(cluster, 0, 2, 5, size=1400) == 5


def test_rate_limit_under_load_builds_a_queue(cluster):
    link = _spine_link(cluster, 0, 2)
    idle = sorted(_rtts(cluster, 0, 2, 20))
    undo = faults.rate_limit(cluster, link, rate="20mbit", load_mbit=40, seconds=30,
                             load_from=(0, 2, 0))
    try:
        loaded = sorted(_rtts(cluster, 0, 2, 40)[10:])
    finally:
        undo()
    assert loaded, "no probe survived the queue"
    assert loaded[len(loaded) // 2] > 10 * max(idle[len(idle) // 2], 0.2), (idle, loaded)


def test_deleted_overlay_rule_is_a_blackhole(cluster):
    undo = faults.delete_overlay_rule(cluster, 0, cluster.layout.overlay_ip(1, 0))
    try:
        assert _received(cluster, 0, 1, 3) == 0
        assert _received(cluster, 0, 2, 3) == 3
    finally:
        undo()
    assert _received(cluster, 0, 1, 3) == 3


def test_killed_builder_leaves_nothing_after_clean(tmp_path):
    code = ("import sys,time\nfrom pathlib import Path\n"
            "from testbed.cluster import create_cluster\nfrom testbed.layout import Layout\n"
            f"c=create_cluster(Layout(hosts=2, rails=1, hosts_per_tor=1), base=Path('{tmp_path}'))\n"
            "print(c.created.path, flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    created_path = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    created = json.loads(Path(created_path).read_text())
    assert created["namespaces"] and created["pidfiles"]
    listed = set(run("ip", "netns", "list").split())
    assert set(created["namespaces"]) <= listed
    pids = [int(Path(p).read_text()) for p in created["pidfiles"]]
    out = subprocess.run([sys.executable, "-m", "testbed.cluster", "clean", created_path],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    listed = set(run("ip", "netns", "list").split())
    assert not set(created["namespaces"]) & listed
    for pid in pids:  # gone, or exited and waiting for PID 1 to reap it
        assert _exited(pid), f"OVS process {pid} survived"


def test_a_daemons_zombie_counts_as_stopped():
    """A daemon we stop is not our child: once it exits it is a zombie until
    its parent reaps it (PID 1 of a container: seconds). Waiting for it to
    vanish made each OVS daemon cost 2 s of teardown; a zombie is stopped."""

    parent = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.read(r, 1); os._exit(0)\n"
        "print(pid, flush=True); sys.stdin.readline(); os.write(w, b'x'); time.sleep(60)\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdin is not None
        daemon = int(parent.stdout.readline())
        assert not _exited(daemon), "a running process that is not our child"
        parent.stdin.write("\n")
        parent.stdin.flush()
        wait_for(lambda: Path(f"/proc/{daemon}/stat").read_text().rsplit(")", 1)[1].split()[0]
                 == "Z", 10, "the forked process to exit unreaped", poll=0.01)
        assert _exited(daemon), "an exited process its parent has not reaped yet"
        assert not _exited(parent.pid), "our running child"
    finally:
        parent.kill()
        parent.wait()
