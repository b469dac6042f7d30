"""Waiting on observable conditions instead of sleeping; rendering pages;
loading bench scripts; the roles as real processes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
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


def catches_signal(pid: int, sig: int) -> bool:
    """The process installed its handler of `sig` (/proc's SigCgt mask):
    the moment a test may send it, not a sleep's guess."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (sig - 1)))


@contextmanager
def stopped_while_busy(stop: Callable[[], None], busy: threading.Event,
                       release: threading.Event) -> Iterator[None]:
    """Once a worker deaf to the stop is `busy`, run `stop` and require it
    to return while the worker is still held; the body then checks what the
    stop left behind. The worker is released on the way out, whatever
    happened."""
    stopping = threading.Thread(target=stop)
    try:
        assert busy.wait(10), "the worker never got busy"
        stopping.start()
        stopping.join(20)
        assert not stopping.is_alive(), "the stop waited for the busy worker"
        yield
    finally:
        release.set()
        if stopping.ident is not None:
            stopping.join(10)


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


class TracedProber:
    """Our prober over `flows` flows from `src_ip` (namespace `src_ns`), its
    flow tracer listening in `trace_ns`, a responder at `dst_ip` (`dst_ns`):
    both serving on their threads until `close`. Hooks as Prober's."""

    def __init__(self, src_ns: str, src_ip: str, dst_ns: str, dst_ip: str, trace_ns: str,
                 flows: int, rate_hz: float = 10.0, on_sent: Any = None,
                 on_reply: Any = None) -> None:
        import threading

        from probe_agent.flowtrace import FlowTracer
        from probe_agent.trace import in_netns
        from probe_agent.udp import Prober, Responder

        self.src_ip, self.dst_ip = src_ip, dst_ip
        with in_netns(dst_ns):
            self.responder = Responder([dst_ip], 0)
        with in_netns(src_ns):
            self.prober = Prober({"a": src_ip}, {"a": (64,)}, rate_hz, 1.0,
                                 on_sent or (lambda *a: None), on_reply or (lambda *a: None),
                                 flows=flows)
        self.tracer = FlowTracer(trace_ns, self.prober.trace_token)
        self.prober.on_trace_reply = self.tracer.replied
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.responder.serve, args=(self.stop,)),
                        threading.Thread(target=self.prober.run, args=(self.stop,))]
        for t in self.threads:
            t.start()

    def send(self, flow: int, ttl: int, seq: int) -> None:
        self.prober.send_trace("a", flow, self.dst_ip, self.responder.port, ttl, seq)

    def trace(self, flow: int) -> Any:
        return self.tracer.trace(lambda ttl, seq: self.send(flow, ttl, seq),
                                 self.src_ip, self.dst_ip)

    def trace_all(self, timeout_s: float = 0.5) -> dict[int, Any]:
        """Every flow at once, as the agent traces a target's flows."""
        return self.tracer.trace_many(
            self.prober.flow_senders("a", self.dst_ip, self.responder.port),
            self.src_ip, self.dst_ip, timeout_s=timeout_s)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        self.prober.close()
        self.responder.close()
        self.tracer.close()


def as_seconds_and_timestamps(table: Any, tz: str | None = None) -> list[tuple[str, Any]]:
    """The table's `ts` cut to whole microseconds, twice: as float64 seconds
    ("float") and as a Parquet timestamp of those microseconds ("stamp",
    what pandas writes), the same instants either way."""
    import pyarrow as pa
    import pyarrow.compute as pc

    at = table.schema.get_field_index("ts")
    micros = pc.round(pc.multiply(table["ts"], 1e6)).cast(pa.int64())
    return [("float", table.set_column(at, "ts", pc.divide(micros.cast(pa.float64()), 1e6))),
            ("stamp", table.set_column(at, "ts", micros.cast(pa.timestamp("us", tz=tz))))]


def bench_script(name: str) -> Any:
    """bench/<name>.py (a script, not a package) loaded as a module."""
    path = Path(__file__).parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextmanager
def role_processes(run_dir: Path, topo_file: Path, topo_doc: dict[str, Any], agents: int,
                   analyzer_args: Sequence[str] = ()
                   ) -> Iterator[tuple[dict[str, int], dict[str, subprocess.Popen[bytes]]]]:
    """A controller, an analyzer and `agents` agents (of containers 0, 1,
    ..., probing over loopback) as real processes, each serving /metrics on
    a port of its own: (ports, processes), both keyed controller, analyzer,
    agent0, agent1, ... Stopped on exit."""
    from testbed.sh import free_port

    sock = f"unix:{run_dir}/c.sock"
    cli = [sys.executable, "-m", "netskel.cli"]
    ports = {"controller": free_port(), "analyzer": free_port()}
    procs = {
        "controller": subprocess.Popen(cli + [
            "controller", "--topology", str(topo_file), "--listen", sock, "--db",
            str(run_dir / "c.sqlite"), "--window", "2", "--heartbeat-ms", "200",
            "--metrics-port", str(ports["controller"]), "--insecure"]),
        "analyzer": subprocess.Popen(cli + [
            "analyzer", *analyzer_args, "--topology", str(topo_file), "--controller", sock,
            "--listen", "127.0.0.1:0", "--metrics-port", str(ports["analyzer"]), "--insecure"])}
    for h in range(agents):
        c, name = topo_doc["containers"][h], f"agent{h}"
        ports[name] = free_port()
        procs[name] = subprocess.Popen(cli + [
            "agent", "--controller", sock, "--container", c["id"], "--job", c["job"], "--host",
            c["host"], "--rate", "20", "--metrics-port", str(ports[name]), "--insecure"]
            + [x for e in c["endpoints"] for x in ("--endpoint", f"{e['id']},{e['nic']},{e['ip']},lo")])
    try:
        yield ports, procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            p.wait(timeout=10)
