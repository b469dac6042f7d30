"""Waiting on observable conditions instead of sleeping; rendering pages."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(fn: Callable[[], T], timeout: float, what: str, poll: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    last: T = fn()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(poll)
        last = fn()
    return last


def chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


def render_page(url: str, screenshot: str | None = None, budget_ms: int = 8000) -> str:
    """The DOM of a page after its scripts ran, from headless Chromium;
    optionally a screenshot too. Virtual time lets the page's fetches finish
    without waiting on the wall clock."""
    import subprocess

    exe = chromium()
    assert exe is not None, "chromium is not installed (scripts/setup.sh installs it)"
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", f"--virtual-time-budget={budget_ms}", "--window-size=1280,1100"]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    if screenshot:
        subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True,
                       timeout=120, check=True)
    return dom


def registered_state(topo: Any, ready: bool = False) -> Any:
    """A controller state (no store) with every container of the topology
    registered as its agent would, optionally ready."""
    from controller.registration import RegEndpoint, Registration
    from controller.state import ControllerState

    state = ControllerState(topo, None, now=0.0)
    for c in topo.containers.values():
        state.register(Registration(container=c.id, job=c.job, host=c.host, probe_port=7100,
                                    endpoints=tuple(RegEndpoint(e.id, e.nic, e.ip or "x")
                                                    for e in c.endpoints)), now=0.0)
        if ready:
            state.heartbeat(c.id, True, now=0.0)
    return state
