"""An active check: probe a few targets now, at every size and a higher
rate than the regular list, trace their routes, and summarize one window
per target and size. A diagnosis engine is waiting, so this runs beside the
regular prober (own sockets) instead of queueing behind it."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict

from controller.pinglist import Target
from netskel.model import WindowStats
from probe_agent import trace
from probe_agent.udp import Prober, ProbeTarget
from probe_agent.window import NO_RTT, clock_name, clock_rank, summarize


def run_check(targets: tuple[Target, ...], duration_s: float, rate_hz: float,
              sources: dict[str, str], sizes: dict[str, tuple[int, ...]], timeout_s: float,
              underlay_netns: str, switch_names: dict[str, str], stop: threading.Event
              ) -> list[WindowStats]:
    mine = tuple(t for t in targets if t.src in sources)
    sent: dict[tuple[str, str, int], int] = defaultdict(int)
    rtts: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    ranks: dict[tuple[str, str, int], int] = defaultdict(lambda: NO_RTT)  # clock_rank
    lock = threading.Lock()

    def on_sent(src: str, dst: str, size: int, _t: float, _flow: int) -> None:
        with lock:
            sent[(src, dst, size)] += 1

    def on_reply(src: str, dst: str, size: int, _t: float, rtt_us: float, _flow: int) -> None:
        if 0 <= rtt_us <= timeout_s * 1e6:
            with lock:
                rtts[(src, dst, size)].append(rtt_us)
                k = (src, dst, size)
                ranks[k] = min(ranks[k], clock_rank(prober.timestamping))  # this RTT's clock

    # Every size each round: the per-target rate covers all sizes.
    n_sizes = max(len(sizes.get(t.src, ())) for t in mine) if mine else 1
    prober = Prober({s: ip for s, ip in sources.items() if any(t.src == s for t in mine)},
                    sizes, rate_hz, timeout_s, on_sent, on_reply)
    routes: dict[tuple[str, str], trace.Trace] = {}

    def trace_routes() -> None:
        pairs = [(t.src_nic_ip, t.dst_nic_ip) for t in mine if t.src_nic_ip and t.dst_nic_ip]
        routes.update(trace.trace_all(pairs, underlay_netns, stop, gap_s=0.0))

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
        prober.set_targets(())  # stop sending; replies in flight still count
        end = time.time()
        stop.wait(timeout_s)
    finally:
        done.set()
        for th in threads:
            th.join(timeout=5)
        prober.close()
    out = []
    by_key = {(t.src, t.dst): t for t in mine}
    with lock:
        for (src, dst, size), n in sorted(sent.items()):
            w = summarize(src, dst, start, end, size, n, rtts.get((src, dst, size), []),
                          clock=clock_name(ranks.get((src, dst, size), NO_RTT)))
            tgt = by_key[(src, dst)]
            tr = routes.get((tgt.src_nic_ip, tgt.dst_nic_ip))
            out.append(dataclasses.replace(w, route=tr.route(switch_names)) if tr else w)
    return out
