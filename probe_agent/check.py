"""An active check: probe a few targets now, at every size and a higher
rate than the regular list, trace their routes, and summarize one window
per target and size. A diagnosis engine is waiting, so this runs beside the
regular prober (own sockets) instead of queueing behind it."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from controller.pinglist import Target
from netskel.model import WindowStats
from probe_agent import flowtrace
from probe_agent.udp import Prober, ProbeTarget, Reply, Sent
from probe_agent.window import FlowProbes, summarize_windows

log = logging.getLogger(__name__)
Key = tuple[str, str, int]  # (src, dst, size)
COVER_GRACE_S = 2.0  # how much longer a check may wait for a probe of every pair and size


def run_check(targets: tuple[Target, ...], duration_s: float, rate_hz: float,
              sources: dict[str, str], sizes: dict[str, tuple[int, ...]], timeout_s: float,
              underlay_netns: str, switch_names: dict[str, str], stop: threading.Event,
              flows: int = 1, tunnel_port: int = flowtrace.VXLAN_PORT,
              on_prober: Callable[[Prober, bool], None] | None = None) -> list[WindowStats]:
    """`flows` per pair as the regular prober spreads them, each traced
    (probe_agent/flowtrace.py) when the host namespace is given: the
    windows carry their probes by route. `on_prober(prober, running)` is
    told when the check's prober starts and after it closed (the agent
    counts its bytes as its own traffic)."""
    mine = tuple(t for t in targets if t.src in sources)
    probes: dict[Key, FlowProbes] = defaultdict(FlowProbes)
    lock = threading.Lock()
    unsent = {(t.src, t.dst, s) for t in mine for s in sizes.get(t.src, ())}
    covered = threading.Event()  # every target has had a probe of every size
    if not unsent:
        covered.set()

    def on_sent(events: list[Sent]) -> None:
        with lock:
            for src, dst, size, _t, flow in events:
                probes[(src, dst, size)].add_sent(flow)
                unsent.discard((src, dst, size))
            if not unsent:
                covered.set()

    def on_reply(replies: list[Reply]) -> None:
        with lock:
            for src, dst, size, _t, rtt_us, flow, clock in replies:
                if 0 <= rtt_us <= timeout_s * 1e6:
                    probes[(src, dst, size)].add_rtt(flow, rtt_us, clock)

    # Every size each round: the per-target rate covers all sizes.
    n_sizes = max(len(sizes.get(t.src, ())) for t in mine) if mine else 1
    prober = Prober({s: ip for s, ip in sources.items() if any(t.src == s for t in mine)},
                    sizes, rate_hz, timeout_s, on_sent, on_reply, flows=flows)
    routes: dict[tuple[str, str, int], str] = {}

    def trace_routes() -> None:
        try:
            tracer = flowtrace.FlowTracer(underlay_netns, prober.trace_token, tunnel_port)
        except OSError as e:
            log.warning("check: no route traces: %s", e)
            return
        prober.on_trace_reply = tracer.replied
        try:
            for t in mine:
                if stop.is_set() or done.is_set():
                    return
                traces = tracer.trace_many(prober.flow_senders(t.src, t.dst_ip, t.dst_port),
                                           t.src, t.dst)
                for flow, tr in traces.items():
                    routes[(t.src, t.dst, flow)] = tr.route(switch_names)
        finally:
            prober.on_trace_reply = None
            tracer.close()

    if on_prober is not None:
        on_prober(prober, True)
    done = threading.Event()
    threads = [threading.Thread(target=prober.run, args=(done,), name="check-prober", daemon=True)]
    if underlay_netns:
        threads.append(threading.Thread(target=trace_routes, name="check-trace", daemon=True))
    start = time.time()
    try:
        prober.set_targets(ProbeTarget(t.src, t.dst, t.dst_ip, t.dst_port) for t in mine)
        for th in threads:
            th.start()
        stop.wait(max(duration_s, n_sizes / rate_hz))
        # A loaded host may start the prober late or starve it: a pair left
        # without a probe of some size would be judged on its history instead.
        if not stop.is_set():
            covered.wait(COVER_GRACE_S)
        prober.set_targets(())  # stop sending; replies in flight still count
        end = time.time()
        stop.wait(timeout_s)
    finally:
        done.set()
        for th in threads:
            th.join(timeout=5)
        prober.close()
        if on_prober is not None:
            on_prober(prober, False)

    def route_of(src: str, dst: str, flow: int) -> str:
        return routes.get((src, dst, flow), "")

    with lock:
        return summarize_windows([(start, end, src, dst, size, acc)
                                  for (src, dst, size), acc in sorted(probes.items())],
                                 route_of=route_of).windows()
