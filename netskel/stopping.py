"""How a role stops: its main thread's wait for SIGTERM (or SIGHUP, a
reload), the process's deadline after it, and the share of it a role's
threads get."""

from __future__ import annotations

import faulthandler
import signal
import threading
import time
from collections.abc import Callable, Iterable

# SIGTERM to exit, at most (Kubernetes sends SIGKILL 30 s after SIGTERM).
STOP_DEADLINE_S = 8.0


def join_all(threads: Iterable[threading.Thread], within_s: float) -> None:
    """Joins `threads` within one budget, not a timeout each: a thread deaf
    to the stop (an inference under way, a stuck switch dump) is left to the
    process's exit; the roles' threads are daemons."""
    deadline = time.monotonic() + within_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))


SIGNAL_POLL_S = 0.5  # how late a signal taken by another thread may be seen


def wait_for_signal(on_reload: Callable[[], None] | None = None,
                     deadline_s: float = STOP_DEADLINE_S) -> None:
    """Returns on SIGINT or SIGTERM. The wait wakes every SIGNAL_POLL_S: the
    kernel may hand the signal to any thread (gRPC runs a dozen), and then
    only the C-level handler runs there; Python's handler waits for the main
    thread to run bytecode, which an untimed Event.wait never does. A
    controller in CI sat in that wait for hours after its SIGTERM.
    The stop that follows is bounded: a grpc.aio server can hang in stop()
    while RPCs are in flight (grpc/grpc#40834), and threads blocked in a
    domain call are joined at exit. Past the deadline every thread's stack
    goes to stderr and the process exits 1.
    SIGHUP calls `on_reload` here, in the main thread (none: SIGHUP stops
    the process, as it always would)."""
    done, hup = threading.Event(), threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    if on_reload is not None:
        signal.signal(signal.SIGHUP, lambda *_: hup.set())
    while not done.wait(SIGNAL_POLL_S):
        if hup.is_set():
            hup.clear()
            assert on_reload is not None
            on_reload()
    faulthandler.dump_traceback_later(deadline_s, exit=True)
