"""A role told to stop (SIGTERM) stops, whichever thread the kernel hands
the signal to (a CI controller never did: its signal went to a gRPC
thread), and exits within its deadline even when its stop hangs (grpc's
aio server can hang in stop() with RPCs in flight; stood in for by a stop
that never returns)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import catches_signal, wait_for

ROOT = Path(__file__).resolve().parent.parent


def _catches_sigterm(pid: int) -> bool:
    return catches_signal(pid, signal.SIGTERM)


def _stopped(then: str) -> subprocess.CompletedProcess[str]:
    """A process waiting in the roles' `wait_for_signal` (deadline 0.5 s),
    sent SIGTERM, then running `then` as its stop."""
    script = ("import threading, sys\n"
              "from netskel.stopping import wait_for_signal\n"
              "wait_for_signal(deadline_s=0.5)\n" + then)
    p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: _catches_sigterm(p.pid), 30, "the SIGTERM handler")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_a_stop_that_hangs_ends_at_the_deadline_with_every_threads_stack():
    got = _stopped("threading.Thread(target=threading.Event().wait, name='stuck').start()\n"
                   "threading.Event().wait()\n")
    assert got.returncode == 1, got
    assert "Timeout (0:00:00.500000)!" in got.stderr, got.stderr
    assert got.stderr.count("Thread 0x") >= 2, got.stderr  # the main thread and the stuck one


def test_a_stop_in_time_exits_cleanly():
    got = _stopped("print('stopped', flush=True)\n")
    assert (got.returncode, got.stdout, got.stderr) == (0, "stopped\n", "")


def test_a_signal_taken_by_another_thread_still_stops_the_role():
    """The kernel gives a process's signal to any of its threads; gRPC runs
    many. A controller whose SIGTERM landed on one of them waited on
    forever (found alive hours after its CI run). Here a thread directs
    SIGTERM at itself once the roles' handler is installed."""
    script = (
        "import os, signal, threading\n"
        "from netskel.stopping import wait_for_signal\n"
        "from tests.test_shutdown import _catches_sigterm\n"
        "def other():\n"
        "    while not _catches_sigterm(os.getpid()):\n"
        "        threading.Event().wait(0.01)\n"
        "    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)\n"
        "    threading.Event().wait()\n"
        "threading.Thread(target=other, daemon=True).start()\n"
        "wait_for_signal()\n"
        "print('stopped', flush=True)\n")
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, text=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert (p.returncode, p.stdout) == (0, "stopped\n"), p
