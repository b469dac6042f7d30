"""How a role stops: the process's deadline after SIGTERM (netskel/cli.py
enforces it) and the share of it a role's threads get."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

# SIGTERM to exit, at most (Kubernetes sends SIGKILL 30 s after SIGTERM).
STOP_DEADLINE_S = 8.0


def join_all(threads: Iterable[threading.Thread], within_s: float) -> None:
    """Joins `threads` within one budget, not a timeout each: a thread deaf
    to the stop (an inference under way, a stuck switch dump) is left to the
    process's exit; the roles' threads are daemons."""
    deadline = time.monotonic() + within_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
