"""Running commands, and remembering what we created so that exactly that,
and nothing else, is removed."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


class CommandError(RuntimeError):
    pass


def free_port() -> int:
    """A loopback TCP port free a moment ago, for a process that needs its
    port named before it starts (Prometheus, a role's --metrics-port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*args: str, check: bool = True, env: dict[str, str] | None = None,
        input: str | None = None) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, env=env, input=input)
    if check and proc.returncode != 0:
        raise CommandError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def ns(name: str, *args: str, check: bool = True) -> str:
    """A command inside a namespace."""
    return run("ip", "netns", "exec", name, *args, check=check)


@dataclass
class Created:
    """Everything a testbed made, persisted as it is made."""

    path: str
    namespaces: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    pidfiles: list[str] = field(default_factory=list)

    def save(self) -> None:
        Path(self.path).write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> Created:
        return cls(**json.loads(Path(path).read_text()))

    def add_namespace(self, name: str) -> None:
        run("ip", "netns", "add", name)
        self.namespaces.append(name)
        self.save()

    def add_pid(self, pid: int) -> None:
        self.pids.append(pid)
        self.save()

    def add_pidfile(self, path: str) -> None:
        self.pidfiles.append(path)
        self.save()

    def destroy(self) -> list[str]:
        """Stop our processes, delete our namespaces; return what failed."""
        problems = []
        pids = list(self.pids)
        for pf in self.pidfiles:
            try:
                pids.append(int(Path(pf).read_text().strip()))
            except (OSError, ValueError):
                pass
        for pid in pids:
            _terminate(pid)
        for name in reversed(self.namespaces):
            run("ip", "netns", "del", name, check=False)
            if name in run("ip", "netns", "list").split():
                problems.append(f"namespace {name} still exists")
        self.namespaces, self.pids, self.pidfiles = [], [], []
        self.save()
        return problems


def _exited(pid: int) -> bool:
    """Our child is reaped here; another's (a daemon, reparented) counts as
    gone once it is a zombie: reaping it is its parent's job, and the PID 1
    of a container may take seconds (2 s a daemon here, 15 s a teardown)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return bool(done)
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _terminate(pid: int, timeout: float = 3.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exited(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
