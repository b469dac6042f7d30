"""Agent pieces without a controller: wire format, windows, size classes,
and a responder fed garbage."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from analyzer.records import ProbeRecords
from analyzer.windows import compute_windows
from netskel.errors import InputError
from netskel.model import TAIL_SHIFT_US
from probe_agent import udp, wire
from probe_agent.agent import parse_endpoint, size_classes
from probe_agent.rdma import rdma_availability
from probe_agent.udp import Reply, Responder, SourceLimit
from probe_agent.window import FlowProbes, WindowAccumulator, summarize_windows


def test_wire_round_trip_and_garbage():
    p = wire.Probe(kind=wire.KIND_PROBE, size=256, seq=7, token=9, t_send_ns=123)
    data = wire.encode(p)
    assert len(data) == 256 and wire.decode(data) == p
    r = wire.decode(wire.reply_to(data, 55))
    assert r.kind == wire.KIND_REPLY and r.dwell_ns == 55 and r.seq == 7
    for junk in (b"", b"x" * 10, b"NSKP" + bytes(60), data[:-1], b"XXXX" + data[4:]):
        assert wire.decode(junk) is None


def test_window_accumulator_counts_loss_and_late_replies():
    acc = WindowAccumulator(window_s=10, timeout_s=1)
    for i in range(10):
        acc.sent("a", "b", 64, 100.0 + i * 0.5)
    for i in range(8):
        acc.replied("a", "b", 64, 100.0 + i * 0.5, 10.0 + i)
    acc.replied("a", "b", 64, 104.5, 2e6)  # later than the timeout: lost
    assert acc.close(now=110.5) == [], "not closed before end + timeout"
    (w,) = acc.close(now=111.0)
    assert (w.window_start, w.window_end, w.sent, w.lost) == (100.0, 110.0, 10, 2)
    rtts = np.arange(10.0, 18.0)
    assert w.rtt_median == np.median(rtts) and w.rtt_std == pytest.approx(rtts.std())
    assert w.problem() is None


def test_a_window_counts_each_flow_on_its_traced_route():
    """Four flows, two on each spine; the flows through spine 1 lose half
    their probes and are 100 us slower. The window's routes say so; a flow
    with no traced route counts in the window but on no route."""
    routes = {40000: "tor-0>spine-0>tor-1", 40001: "tor-0>spine-1>tor-1",
              40002: "tor-0>spine-0>tor-1", 40003: "tor-0>spine-1>tor-1", 40004: ""}
    acc = WindowAccumulator(window_s=10, timeout_s=1)
    for i in range(50):
        flow = 40000 + i % 5
        t = 100.0 + i * 0.1
        acc.sent("a", "b", 64, t, flow)
        if routes[flow].count("spine-1") and i % 2:
            continue  # lost
        acc.replied("a", "b", 64, t, 110.0 if "spine-1" in routes[flow] else 10.0, "kernel", flow)
    acc.replied("a", "b", 64, 100.0, 10.0, "kernel", 49999)  # a flow never sent: no reply counted
    (w,) = acc.close(now=111.0, route_of=lambda src, dst, flow: routes.get(flow, ""))
    assert (w.sent, w.lost) == (50, 10)
    by = {r.route: r for r in w.routes}
    assert set(by) == {"tor-0>spine-0>tor-1", "tor-0>spine-1>tor-1"}
    s0, s1 = by["tor-0>spine-0>tor-1"], by["tor-0>spine-1>tor-1"]
    assert (s0.sent, s0.lost, s0.rtt_median) == (20, 0, 10.0)
    assert (s1.sent, s1.lost, s1.rtt_median) == (20, 10, 110.0)
    assert w.route == "tor-0>spine-0>tor-1", "equal counts: the first by name"
    (plain,) = _one_window_without_routes()
    assert plain.routes == () and plain.route == ""


def _one_window_without_routes() -> list:
    acc = WindowAccumulator(window_s=10, timeout_s=1)
    acc.sent("a", "b", 64, 100.0, 40000)
    acc.replied("a", "b", 64, 100.0, 10.0, "kernel", 40000)
    return acc.close(now=200, route_of=lambda src, dst, flow: "")


def _reference_window(sent: dict[int, int], rtts: dict[int, list[float]],
                      routes: dict[int, str]) -> dict[str, object]:
    """One window the slow way (numpy per statistic, Python per route), as
    the agent computed it before its windows were one numpy pass."""
    got = np.array([r for flow, n in sent.items() for r in rtts.get(flow, [])[:n]])
    out: dict[str, object] = {"sent": sum(sent.values()), "lost": sum(sent.values()) - len(got)}
    if len(got):
        p25, med, p75 = np.percentile(got, [25, 50, 75])
        out.update(rtt_p25=p25, rtt_median=med, rtt_p75=p75, rtt_min=got.min(),
                   rtt_mean=got.mean(), rtt_std=got.std(), rtt_max=got.max(),
                   slow=int(np.count_nonzero(got >= p25 + TAIL_SHIFT_US)))
    by_route: dict[str, tuple[int, list[float]]] = {}
    for flow, n in sent.items():
        if routes[flow]:
            total, acc = by_route.get(routes[flow], (0, []))
            by_route[routes[flow]] = (total + n, acc + rtts.get(flow, [])[:n])
    table = [(r, n, n - len(g), float(np.median(g)) if g else math.nan)
             for r, (n, g) in sorted(by_route.items())]
    out["routes"] = table
    out["route"] = max(table, key=lambda r: r[1])[0] if table else ""
    return out


@pytest.mark.parametrize("seed", range(5))
def test_windows_in_one_pass_agree_with_the_slow_reference(seed):
    """Many windows of random shape (flows with no reply, more replies than
    sends, no send at all, untraced flows, ties between routes) at once,
    each against what numpy computes for it alone."""
    rng = np.random.default_rng(seed)
    paths = ["t0>s0>t1", "t0>s1>t1", "t0>s2>t1", ""]
    windows, routes, expected = [], {}, {}
    for i in range(int(rng.integers(1, 80))):
        acc = FlowProbes()
        src = f"a{i}"
        routes[src] = {}
        for flow in range(40000, 40000 + int(rng.integers(0, 6))):
            n = int(rng.integers(1, 12))
            k = int(rng.integers(0, n + 3)) if rng.random() < 0.9 else 0
            acc.sent[flow] = n
            acc.rtts[flow] = list(rng.lognormal(3, 0.6, k) + rng.choice([0.0, 100.0], k))
            routes[src][flow] = paths[int(rng.integers(len(paths)))]
        windows.append((100.0 * i, 100.0 * i + 10, src, f"b{i % 3}", 64 << (i % 3), acc))
        if sum(acc.sent.values()):
            expected[src] = _reference_window(acc.sent, acc.rtts, routes[src])
    got = {w.src: w for w in summarize_windows(
        windows, route_of=lambda s, d, f: routes[s].get(f, "")).windows()}
    assert set(got) == set(expected), "every window with a send, no other"
    for src, want in expected.items():
        w = got[src]
        i = int(src[1:])
        assert (w.window_start, w.dst, w.size) == (100.0 * i, f"b{i % 3}", 64 << (i % 3))
        assert (w.sent, w.lost) == (want["sent"], want["lost"])
        for stat in ("rtt_p25", "rtt_median", "rtt_p75", "rtt_min", "rtt_mean", "rtt_std",
                     "rtt_max"):
            if "rtt_median" in want:
                assert getattr(w, stat) == pytest.approx(want[stat], rel=1e-12, abs=1e-9), stat
            else:
                assert math.isnan(getattr(w, stat)), stat
        assert w.slow == want.get("slow", 0)
        table = [(r.route, r.sent, r.lost, r.rtt_median) for r in w.routes]
        assert [t[:3] for t in table] == [t[:3] for t in want["routes"]]
        assert np.allclose([t[3] for t in table], [t[3] for t in want["routes"]],
                           rtol=1e-12, equal_nan=True)
        assert w.route == want["route"]
        assert w.problem() is None


def test_the_agent_loads_no_parquet_reader():
    """The sidecar shares its container's memory with training: computing
    its windows with the offline reader's code must not pull in pyarrow
    (~30 MB resident)."""
    code = "import sys, probe_agent.agent; print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "False"


def test_all_lost_window_has_no_rtt():
    acc = WindowAccumulator(window_s=10, timeout_s=1)
    acc.sent("a", "b", 64, 100.0)
    (w,) = acc.close(now=200)
    assert w.lost == w.sent == 1 and math.isnan(w.rtt_median) and w.problem() is None


def test_size_classes_respect_the_mtu():
    assert size_classes((64, 1024, 4096), 1500) == (64, 1024, 1472)
    assert size_classes((64, 1024, 4096), 4500) == (64, 1024, 4096)
    assert size_classes((10,), None) == (64,)


def test_endpoint_spec():
    e = parse_endpoint("job/e0,h/n0,10.0.0.1,eth1")
    assert (e.id, e.nic, e.ip, e.ifname) == ("job/e0", "h/n0", "10.0.0.1", "eth1")
    with pytest.raises(InputError, match="expected ID,NIC,IP"):
        parse_endpoint("job/e0,h/n0")


def test_responder_survives_garbage_and_still_answers():
    r = Responder(["127.0.0.1"], 0)
    stop = threading.Event()
    t = threading.Thread(target=r.serve, args=(stop,), daemon=True)
    t.start()
    try:
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.settimeout(2)
        for junk in (b"", b"hello", bytes(range(256)) * 10):
            c.sendto(junk, ("127.0.0.1", r.port))
        probe = wire.encode(wire.Probe(wire.KIND_PROBE, 128, 1, 2, 3))
        c.sendto(probe, ("127.0.0.1", r.port))
        data, _ = c.recvfrom(4096)
        reply = wire.decode(data)
        assert reply is not None and reply.kind == wire.KIND_REPLY and reply.seq == 1
        assert r.garbage >= 2
    finally:
        stop.set()
        t.join()
        r.close()


def test_source_limit_bursts_then_holds_each_source_to_its_rate():
    lim = SourceLimit(rate=10.0, burst=5.0, sources=2)
    assert [lim.allow("a", 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert lim.allow("b", 0.0)  # another source has its own bucket
    assert not lim.allow("a", 0.05) and lim.allow("a", 0.1)  # one token per 0.1 s
    lim.allow("c", 0.1)  # a third source evicts the least recently seen ("b")
    assert len(lim._buckets) == 2 and "b" not in lim._buckets


def test_responder_echoes_only_well_formed_probes_byte_for_byte_within_rate():
    r = Responder(["127.0.0.1"], 0, SourceLimit(rate=1e-9, burst=3.0))
    stop = threading.Event()
    t = threading.Thread(target=r.serve, args=(stop,), daemon=True)
    t.start()
    try:
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.settimeout(0.5)
        probe = wire.encode(wire.Probe(wire.KIND_PROBE, 256, 1, 2, 3))
        # Not answered: a reply, a probe whose declared size is not its length,
        # a probe with bytes appended (a larger echo would amplify).
        for bad in (wire.encode(wire.Probe(wire.KIND_REPLY, 256, 1, 2, 3)),
                    probe[:200], probe + b"extra"):
            c.sendto(bad, ("127.0.0.1", r.port))
        answered = []
        for seq in range(5):
            c.sendto(wire.encode(wire.Probe(wire.KIND_PROBE, 256, seq, 2, 3)),
                     ("127.0.0.1", r.port))
        try:
            while True:
                data, _ = c.recvfrom(4096)
                answered.append(data)
        except TimeoutError:
            pass
        # Burst of 3 from this source, then nothing (the rate is ~0); each
        # reply followed by its follow-up, header-sized.
        read = [(wire.answer_fields(d), len(d)) for d in answered]
        replies = [(f[1], n) for f, n in read if f and f[0] == wire.KIND_REPLY]
        follows = [(f[1], n) for f, n in read if f and f[0] == wire.KIND_FOLLOW_UP]
        assert replies == [(0, 256), (1, 256), (2, 256)]
        assert follows == [(0, wire.HEADER_SIZE), (1, wire.HEADER_SIZE), (2, wire.HEADER_SIZE)]
        assert len(answered) == 6
        assert r.garbage == 3
    finally:
        stop.set()
        t.join()
        r.close()


@contextmanager
def _served(r: Responder) -> Iterator[socket.socket]:
    """`r` serving on a thread of its own, and a client socket to probe it
    from; stopped and closed on the way out."""
    stop = threading.Event()
    t = threading.Thread(target=r.serve, args=(stop,), daemon=True)
    t.start()
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.settimeout(5)
    try:
        yield c
    finally:
        stop.set()
        t.join()
        r.close()
        c.close()


def test_responder_follows_each_reply_with_its_dwell_from_kernel_stamps():
    """The reply's dwell ends at user time before its send; the follow-up's
    at the kernel's stamp of the reply leaving, later, so the responder's
    own send path is no longer counted as network."""
    r = Responder(["127.0.0.1"], 0)
    with _served(r) as c:
        c.sendto(wire.encode(wire.Probe(wire.KIND_PROBE, 128, 1, 2, 3)), ("127.0.0.1", r.port))
        reply = wire.answer_fields(c.recv(4096))
        follow = wire.answer_fields(c.recv(4096))
    assert r.stamped
    assert reply is not None and reply[:4] == (wire.KIND_REPLY, 1, 2, 3)
    assert follow is not None and follow[:4] == (wire.KIND_FOLLOW_UP, 1, 2, 3)
    assert follow[4] >= reply[4]
    # What the agent takes out of its NIC counters: the follow-up too.
    assert r.own_bytes["127.0.0.1"] == [128 + 36 + 2 * udp.WIRE_OVERHEAD, 128 + udp.WIRE_OVERHEAD]


def test_a_follow_ups_dwell_takes_both_ends_from_one_clock():
    from probe_agent.udp import follow_up_dwell

    assert follow_up_dwell(1_000, 50_000, 1_700, 50_400) == 400  # the NIC's, where it took both
    assert follow_up_dwell(1_000, 0, 1_700, 50_400) == 700  # else the kernel's
    assert follow_up_dwell(1_000, 50_000, 1_700, 0) == 700
    # Sent stamped in hardware, received unstamped there: no software send
    # stamp exists, and no dwell is better than the reply's own.
    assert follow_up_dwell(1_000, 0, 0, 50_400) is None
    assert follow_up_dwell(1_000, 0, 900, 0) is None  # backwards


def test_a_kernel_refusing_a_sends_own_stamp_still_gets_every_reply(monkeypatch):
    """Linux before 4.13 refuses stamping flags given with one send (EINVAL):
    every reply must still go, without follow-ups. The real kernel refuses
    flags that are not send flags the same way."""
    monkeypatch.setattr(udp, "REPLY_STAMP", udp._RX_SOFTWARE)
    r = Responder(["127.0.0.1"], 0)
    with _served(r) as c:
        for seq in range(3):
            c.sendto(wire.encode(wire.Probe(wire.KIND_PROBE, 64, seq, 2, 3)), ("127.0.0.1", r.port))
        got = [wire.answer_fields(c.recv(4096)) for _ in range(3)]
    assert [(f[0], f[1]) for f in got if f] == [(wire.KIND_REPLY, seq) for seq in range(3)]
    assert not r.stamped
    assert r.own_bytes["127.0.0.1"][0] == 3 * (64 + udp.WIRE_OVERHEAD)  # nothing else was sent


def test_prober_subtracts_the_follow_ups_dwell_when_it_came_with_the_reply():
    """A responder slow to send after its user-time stamp (30 ms here):
    with the follow-up, the prober takes those 30 ms out of the RTT, also
    when the follow-up comes a wake-up after its reply (a busy interpreter
    at the responder); a reply whose follow-up never comes is settled
    FOLLOW_UP_WAIT_S after it was read, with its own dwell (an upper
    bound)."""
    from probe_agent import metrics
    from probe_agent.udp import FOLLOW_UP_WAIT_S, Prober, ProbeTarget

    target = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    target.bind(("127.0.0.1", 0))
    target.settimeout(5)
    p = Prober({"a": "127.0.0.1"}, {"a": (64,)}, 20.0, 5.0, lambda *a: None, lambda *a: None)
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    here.setblocking(False)  # as the prober's own sockets: read until drained
    try:
        p.set_targets([ProbeTarget("a", "b", "127.0.0.1", target.getsockname()[1])])
        for ahead in (1.0, 2.0):  # due now and again at the horizon: two probes a call
            p._send_due(time.monotonic() + ahead)
        probes = [target.recv(4096) for _ in range(len(p._inflight))][:3]
        time.sleep(0.03)  # the responder's slow send path
        slow = 30_000_000
        dwells = {s: metrics.PROBE_DWELLS.labels(source=s)._value.get() for s in ("follow_up", "reply")}

        def wake_up(later_s: float = 0.0) -> dict[float, float]:
            p._receive(here, "a")
            settled = p._settle(time.time_ns() + int(later_s * 1e9))
            return {rec[3]: rec[4] for rec in settled}  # RTT by send time

        there.send(wire.reply_to(probes[0], 0))
        there.send(wire.follow_up(wire.probe_key(probes[0]), slow))
        there.send(wire.reply_to(probes[1], 0))  # its follow-up comes late
        there.send(wire.reply_to(probes[2], 0))  # its follow-up never comes
        first = wake_up()
        there.send(wire.follow_up(wire.probe_key(probes[1]), slow))
        second = wake_up()
        second |= wake_up(later_s=FOLLOW_UP_WAIT_S)
        sent = [wire.probe_key(x)[2] / 1e9 for x in probes]
        assert set(first) == {sent[0]} and set(second) == {sent[1], sent[2]}
        assert not p._unsettled and not p._follow_ups
        assert {s: metrics.PROBE_DWELLS.labels(source=s)._value.get() - dwells[s]
                for s in dwells} == {"follow_up": 2, "reply": 1}
        unfollowed = second[sent[2]]
        assert unfollowed >= slow / 1e3
        assert abs(first[sent[0]] - (unfollowed - slow / 1e3)) < 1000
        assert abs(second[sent[1]] - (unfollowed - slow / 1e3)) < 1000
    finally:
        p.close()
        here.close()
        there.close()
        target.close()


def test_rdma_reports_why_it_cannot_run():
    a = rdma_availability()
    if a.available:
        pytest.skip(f"RDMA devices present: {a.devices}")
    assert a.reason and ("pyverbs" in a.reason or "RDMA device" in a.reason)


def test_probe_header_read_from_a_packet_cut_or_carrying_more():
    packet = wire.encode(wire.Probe(kind=wire.KIND_PROBE, size=128, seq=7, token=9,
                                    t_send_ns=123))
    at = (b"\x00" * 28 + packet).find(wire.MAGIC)
    head = wire.header((b"\x00" * 28 + packet)[at:])
    assert head is not None and (head.seq, head.token, head.t_send_ns) == (7, 9, 123)
    assert wire.header(packet[:wire.HEADER_SIZE]) is not None  # cut after the header
    assert wire.header(packet[:wire.HEADER_SIZE - 1]) is None
    assert wire.header(b"XXXX" + packet[4:]) is None
    # The prober's reader of the error queue finds the header itself.
    assert wire.sent_fields(b"\x00" * 28 + packet) == (7, 9, 123)
    assert wire.sent_fields(packet[:wire.HEADER_SIZE]) == (7, 9, 123)
    assert wire.sent_fields(b"\x00" * 28 + packet[:wire.HEADER_SIZE - 1]) is None
    assert wire.sent_fields(b"XXXX" + packet[4:]) is None
    assert wire.sent_fields(wire.reply_to(packet, 5)) is None  # a reply is not what we sent


def test_prober_rtt_from_kernel_stamps_at_both_ends():
    """On Linux the prober's RTT is kernel send stamp to kernel receive
    stamp (minus the responder's dwell from its own kernel stamps, sent in
    its follow-ups), never a user-space clock."""
    from probe_agent import metrics
    from probe_agent.udp import USER, Prober, ProbeTarget

    stop = threading.Event()
    r = Responder(["127.0.0.1"], 0)
    threading.Thread(target=r.serve, args=(stop,), daemon=True).start()
    got: list[float] = []
    done = threading.Event()

    def on_reply(replies: list[Reply]) -> None:
        got.extend(r[4] for r in replies)
        if len(got) >= 50:
            done.set()

    before = metrics.PROBE_STAMPS.labels(clock="kernel")._value.get()
    dwells = {s: metrics.PROBE_DWELLS.labels(source=s)._value.get() for s in ("follow_up", "reply")}
    p = Prober({"a": "127.0.0.1"}, {"a": (64, 1400)}, 500.0, 1.0, lambda *a: None, on_reply)
    p.set_targets([ProbeTarget("a", "b", "127.0.0.1", r.port)])
    threading.Thread(target=p.run, args=(stop,), daemon=True).start()
    try:
        assert done.wait(20), f"{len(got)} replies"
        assert p.kernel_stamps and p.timestamping == "kernel" != USER
        assert metrics.PROBE_STAMPS.labels(clock="kernel")._value.get() - before >= 50
        assert all(0 < x < 100_000 for x in got)
        followed, alone = (metrics.PROBE_DWELLS.labels(source=s)._value.get() - dwells[s]
                           for s in ("follow_up", "reply"))
        assert followed >= 50 and followed >= 9 * alone
    finally:
        stop.set()


def test_prober_reads_replies_late_yet_measures_them_from_kernel_stamps():
    """The prober does not wake for a reply: replies wait in the socket
    until the next batch of sends (at 2 probes/s, up to IDLE_WAIT_S later).
    The RTT must still be the kernel's, not the time the reply was read."""
    from probe_agent.udp import IDLE_WAIT_S, KERNEL, Prober, ProbeTarget

    stop = threading.Event()
    r = Responder(["127.0.0.1"], 0)
    serving = threading.Thread(target=r.serve, args=(stop,), daemon=True)
    serving.start()
    got: list[tuple[float, float, float]] = []  # (t_send_s, read at, rtt_us)
    done = threading.Event()

    def on_reply(replies: list[Reply]) -> None:
        got.extend((r[3], time.time(), r[4]) for r in replies)
        if len(got) >= 6:
            done.set()

    p = Prober({"a": "127.0.0.1"}, {"a": (64,)}, 2.0, 1.0, lambda *a: None, on_reply)
    p.set_targets([ProbeTarget("a", "b", "127.0.0.1", r.port)])
    threads = [threading.Thread(target=p.run, args=(stop,), daemon=True), serving]
    threads[0].start()
    try:
        assert done.wait(20), f"{len(got)} replies"
        if not p.kernel_stamps:
            pytest.skip("no SO_TIMESTAMPING on this kernel")
        assert p.timestamping == KERNEL
        late = [read - t for t, read, _ in got]
        assert np.median(late) > IDLE_WAIT_S / 2  # read on the next wake-up, not at once
        assert max(rtt for _, _, rtt in got) < 20_000  # a loopback RTT, not the wait
    finally:
        stop.set()
        for t in threads:  # closed under a thread still selecting, its socket raises
            t.join()
        r.close()
        p.close()


def test_prober_sends_a_batch_per_wake_up_within_the_jitter():
    """One wake-up sends every probe due within its batch (half an
    interval, capped), no probe more than a batch early, and says when the
    next one is due."""
    from probe_agent.udp import BATCH_SHARE, MAX_BATCH_S, Prober, ProbeTarget

    sent: list[tuple[str, float]] = []
    for rate, batch in ((40.0, BATCH_SHARE / 40.0), (1.0, MAX_BATCH_S)):
        p = Prober({"a": "127.0.0.1"}, {"a": (64,)}, rate, 1.0,
                   lambda events: sent.extend((e[1], e[3]) for e in events), lambda *a: None)
        try:
            assert p.batch_s == pytest.approx(batch)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
                sink.bind(("127.0.0.1", 0))
                port = sink.getsockname()[1]
                p.set_targets([ProbeTarget("a", f"t{i}", "127.0.0.1", port) for i in range(200)])
                due = sorted(at for at, _, _ in p._heap)
                now = due[0]
                sent.clear()
                next_due = p._send_due(now)
            assert len(sent) == sum(1 for at in due if at <= now + batch) > 1
            assert next_due == min(at for at, _, _ in p._heap) > now + batch
            assert len({dst for dst, _ in sent}) == len(sent)
        finally:
            p.close()


def test_a_new_probe_rate_applies_from_each_targets_next_probe():
    """`Prober.set_rate` (an agent's reloaded `probe_rate_hz`): the probe
    already due keeps its time, the one after it follows the new interval,
    and the batch shrinks with it; no clock, the schedule read directly."""
    from probe_agent.udp import BATCH_SHARE, JITTER, Prober, ProbeTarget

    p = Prober({"a": "127.0.0.1"}, {"a": (64,)}, 1.0, 1.0, lambda *a: None, lambda *a: None)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
            sink.bind(("127.0.0.1", 0))
            p.set_targets([ProbeTarget("a", "t", "127.0.0.1", sink.getsockname()[1])])
            at0 = p._heap[0][0]
            p._send_due(at0)
            at1 = p._heap[0][0]
            assert 1.0 - JITTER <= at1 - at0 <= 1.0 + JITTER
            p.set_rate(100.0)
            assert p._heap[0][0] == at1 and p.batch_s == pytest.approx(BATCH_SHARE / 100.0)
            p._send_due(at1)
            assert 0.01 * (1 - JITTER) <= p._heap[0][0] - at1 <= 0.01 * (1 + JITTER)
        with pytest.raises(ValueError):
            p.set_rate(0.0)
    finally:
        p.close()


def test_probe_buffer_rewritten_in_place_reads_back_as_the_same_probe():
    buf = wire.probe_buffer(256)
    wire.fill_probe(buf, seq=41, token=7, t_send_ns=99)
    p = wire.decode(bytes(buf))
    assert p is not None and (p.kind, p.size, p.seq, p.token, p.t_send_ns) == (
        wire.KIND_PROBE, 256, 41, 7, 99)
    reply = wire.reply_to(bytes(buf), dwell_ns=1234)
    assert wire.answer_fields(reply) == (wire.KIND_REPLY, 41, 7, 99, 1234)
    assert wire.answer_fields(bytes(buf)) is None  # a probe is not an answer
    assert wire.answer_fields(reply[:-1]) is None  # cut
    assert wire.answer_fields(b"x" * 64) is None
    assert wire.probe_key(bytes(buf)) == (41, 7, 99)
    follow = wire.follow_up(wire.probe_key(bytes(buf)), 5678)
    assert len(follow) == wire.HEADER_SIZE
    assert wire.answer_fields(follow) == (wire.KIND_FOLLOW_UP, 41, 7, 99, 5678)
    assert wire.sent_fields(b"\x00" * 28 + bytes(reply), wire.KIND_REPLY) == (41, 7, 99)
    assert wire.sent_fields(b"\x00" * 28 + bytes(reply)) is None  # not a probe


def test_prober_with_user_send_stamps_asks_for_no_kernel_send_stamps():
    """Prober(kernel_tx=False) (ping's definition, bench/fidelity.py) never
    reads its error queue, so its sockets must not ask for send stamps: a
    queue that only fills keeps the socket readable and the prober spinning
    (it burnt a whole core and lost replies before)."""
    import socket

    from probe_agent.udp import _TX_HARDWARE, _TX_SOFTWARE, SO_TIMESTAMPING, Prober

    for kernel_tx in (True, False):
        p = Prober({"a": "127.0.0.1"}, {"a": (64,)}, 10.0, 1.0, lambda *a: None,
                   lambda *a: None, kernel_tx=kernel_tx)
        try:
            if not p.kernel_stamps:
                pytest.skip("no SO_TIMESTAMPING on this kernel")
            flags = p.flow_sockets["a"][0].getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING)
            assert bool(flags & (_TX_SOFTWARE | _TX_HARDWARE)) is kernel_tx
        finally:
            p.close()


def test_window_counts_its_slow_tail_and_offline_windows_agree():
    """The agent's windows and `netskel analyze`'s count the same slow tail:
    probes at least TAIL_SHIFT_US above the window's own p25."""
    rtts = [20.0] * 9 + [20.0 + TAIL_SHIFT_US + 1] * 3 + [20.0 + TAIL_SHIFT_US - 1]
    acc = WindowAccumulator(window_s=30, timeout_s=1)
    for i, r in enumerate(rtts):
        acc.sent("a", "b", 64, 90.0 + i)
        acc.replied("a", "b", 64, 90.0 + i, r)
    acc.sent("a", "b", 64, 119.0)  # lost: not slow
    (live,) = acc.close(now=200)
    assert live.slow == 3 and live.problem() is None
    n = len(rtts) + 1
    rec = ProbeRecords(ts=90.0 + np.arange(n, dtype=np.float64), size=np.full(n, 64),
                       rtt_us=np.array(rtts + [np.nan]), src=np.array(["a"] * n, dtype=object),
                       dst=np.array(["b"] * n, dtype=object),
                       proto=np.array(["udp"] * n, dtype=object))
    (off,) = compute_windows(rec, 30.0)
    assert (off.slow, off.sent, off.lost) == (3, n, 1)


def test_busy_polling_is_set_on_every_socket_and_probes_still_measure():
    """busy_poll_us (bench/fidelity.py --busy-poll) puts SO_BUSY_POLL on the
    prober's and the responder's sockets; probing works as without it (the
    RTT stays kernel stamp to kernel stamp). Off by default."""
    import socket

    from probe_agent.udp import SO_BUSY_POLL, Prober, ProbeTarget

    stop = threading.Event()
    plain = Responder(["127.0.0.1"], 0)
    r = Responder(["127.0.0.1"], 0, busy_poll_us=50)
    threading.Thread(target=r.serve, args=(stop,), daemon=True).start()
    got: list[float] = []
    done = threading.Event()

    def on_reply(replies: list[Reply]) -> None:
        got.extend(r[4] for r in replies)
        if len(got) >= 20:
            done.set()

    p = Prober({"a": "127.0.0.1"}, {"a": (64,)}, 200.0, 1.0, lambda *a: None, on_reply,
               busy_poll_us=50)
    p.set_targets([ProbeTarget("a", "b", "127.0.0.1", r.port)])
    threading.Thread(target=p.run, args=(stop,), daemon=True).start()
    try:
        assert plain.sockets[0].getsockopt(socket.SOL_SOCKET, SO_BUSY_POLL) == 0
        assert r.sockets[0].getsockopt(socket.SOL_SOCKET, SO_BUSY_POLL) == 50
        assert p.flow_sockets["a"][0].getsockopt(socket.SOL_SOCKET, SO_BUSY_POLL) == 50
        assert done.wait(20), f"{len(got)} replies"
        assert p.timestamping == "kernel" and all(0 < x < 100_000 for x in got)
    finally:
        stop.set()
        plain.close()


def test_a_window_names_the_least_exact_clock_of_its_rtts():
    """A window's RTTs are only as exact as the least exact of them: one
    RTT from user-space times makes the window's clock "user"; one of
    unknown clock makes it unknown; a window of lost probes names none."""
    from probe_agent.window import WindowAccumulator

    acc = WindowAccumulator(30.0, 1.0)
    for dst, clocks in (("k", ["kernel", "hardware", "kernel"]), ("u", ["kernel", "user"]),
                        ("h", ["hardware"]), ("x", ["kernel", ""]), ("lost", [])):
        for i in range(3):
            acc.sent("a", dst, 64, 10.0 + i)
        for i, c in enumerate(clocks):
            acc.replied("a", dst, 64, 10.0 + i, 50.0, c)
    got = {w.dst: w.clock for w in acc.close(100.0)}
    assert got == {"k": "kernel", "u": "user", "h": "hardware", "x": "", "lost": ""}


def test_agent_ignores_a_list_update_older_than_its_list():
    """Versions only grow: a diff older than the list in force (one that
    crossed a resync) is ignored, never applied over the newer list."""
    from netskel.api.v1 import controller_pb2 as pb
    from netskel.config import AgentConfig
    from probe_agent.agent import Agent

    a = Agent(AgentConfig(container="c0", host="h0", probe_port=0,
                          endpoints=("c0/e0,h0/nic0,127.0.0.1,",)))
    try:
        def target(active: bool) -> pb.PingTarget:
            return pb.PingTarget(src="c0/e0", dst="c1/e0", dst_ip="127.0.0.2", dst_port=7100,
                                 active=active)
        a.apply_update(pb.PingListUpdate(version=5, full=True, upsert=[target(True)]))
        a.apply_update(pb.PingListUpdate(version=3, upsert=[target(False)]))
        assert a.list_version == 5 and a.targets[("c0/e0", "c1/e0")].active
        a.apply_update(pb.PingListUpdate(version=6, upsert=[target(False)]))
        assert a.list_version == 6 and not a.targets[("c0/e0", "c1/e0")].active
        # A whole list always counts (a restarted controller may number anew).
        a.apply_update(pb.PingListUpdate(version=2, full=True, upsert=[target(True)]))
        assert a.list_version == 2 and a.targets[("c0/e0", "c1/e0")].active
    finally:
        a.stop(deregister=False)


def test_an_active_check_probes_every_pair_at_every_size_before_it_ends():
    """A check as short as the sizes allow at its rate (4 ms here) over more
    pairs than a prober can serve in that time: every pair still gets a
    window of every size, none judged on its history instead (a loaded
    agent once returned a check with a pair missing)."""
    from controller.pinglist import Target
    from probe_agent.check import run_check

    ips = [f"127.41.0.{i + 2}" for i in range(100)]
    resp = Responder(ips, 0)
    stop = threading.Event()
    serving = threading.Thread(target=resp.serve, args=(stop,))
    serving.start()
    try:
        targets = tuple(Target("me", f"t{i}", ip, resp.port, True) for i, ip in enumerate(ips))
        sizes = (64, 256, 1024, 4096)
        windows = run_check(targets, 0.0, 1000.0, {"me": "127.41.1.1"}, {"me": sizes}, 0.5, "",
                            {}, threading.Event(), flows=2)
    finally:
        stop.set()
        serving.join()
        resp.close()
    assert {(w.dst, w.size) for w in windows} == {(f"t{i}", s) for i in range(100) for s in sizes}
    assert all(w.sent >= 1 and w.problem() is None for w in windows)


def test_the_rtt_histogram_exports_what_prometheus_clients_histogram_does():
    """The prober's RTT histogram (a bisect per reply, no locks) against
    prometheus_client's own Histogram fed the same values: the same
    buckets, count and sum on a scrape."""
    import random

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from probe_agent.metrics import RttHistogram

    bounds = (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 50000)
    ours_reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    ours = RttHistogram("rtt_us", "RTT", bounds, ours_reg)
    ref = Histogram("rtt_us", "RTT", ["src"], buckets=bounds, registry=ref_reg)
    rng = random.Random(7)
    values = [*bounds, 0.0, 1e9, *(rng.lognormvariate(4, 2) for _ in range(2000))]
    # Two probers of one source (the regular one and an active check's),
    # one of them closed halfway: every value still counts once.
    first = {src: ours.child(src) for src in ("e0", "e1", "e2")}
    second = {src: ours.child(src) for src in ("e0", "e1")}
    for i, v in enumerate(values):
        src = f"e{i % 3}"
        if i == len(values) // 2:
            for s, counts in second.items():
                ours.retire(s, counts)
            second = {}
        (second.get(src) if i % 2 and src in second else first[src]).observe(v)
        ref.labels(src=src).observe(v)

    def samples(reg: CollectorRegistry) -> dict[tuple[str, str, str], float]:
        out = {}
        for line in generate_latest(reg).decode().splitlines():
            if line.startswith("rtt_us_") and "_created" not in line:
                name, value = line.rsplit(" ", 1)
                metric, labels = name.split("{")
                le = next((x.split("=")[1] for x in labels.rstrip("}").split(",")
                           if x.startswith("le=")), "")
                src = next(x.split("=")[1] for x in labels.rstrip("}").split(",")
                           if x.startswith("src="))
                out[(metric, src, le)] = float(value)
        return out

    got, want = samples(ours_reg), samples(ref_reg)
    assert set(got) == set(want) and len(want) == 3 * (len(bounds) + 1 + 2)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def _tos_of_next(sock: socket.socket) -> tuple[bytes, int]:
    """The next datagram and its TOS byte as this host's kernel received it."""
    data, anc, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(4))
    (tos,) = [p[0] for level, kind, p in anc if level == socket.IPPROTO_IP and kind == socket.IP_TOS]
    return data, tos


def test_probes_and_replies_carry_the_configured_dscp():
    """Probes in the class the job's RDMA traffic runs in wait in its queues."""
    from netskel.config import AgentConfig
    from probe_agent.udp import Prober, ProbeTarget

    target = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    target.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    target.bind(("127.0.0.1", 0))
    target.settimeout(5.0)
    p = Prober({"a": "127.0.0.1"}, {"a": (64,)}, 50.0, 1.0, lambda *a: None, lambda *a: None,
               flows=2, dscp=26)
    r = Responder(["127.0.0.1"], 0, dscp=46)
    stop = threading.Event()
    threads = [threading.Thread(target=f, args=(stop,), daemon=True) for f in (p.run, r.serve)]
    for t in threads:
        t.start()
    try:
        p.set_targets([ProbeTarget("a", "b", "127.0.0.1", target.getsockname()[1])])
        tos = {_tos_of_next(target)[1] for _ in range(4)}  # both flows' sockets
        assert tos == {26 << 2}
        target.sendto(wire.encode(wire.Probe(wire.KIND_PROBE, 64, 1, 2, 3)), ("127.0.0.1", r.port))
        data, reply_tos = _tos_of_next(target)
        while wire.answer_fields(data) is None:  # the prober's probes keep coming meanwhile
            data, reply_tos = _tos_of_next(target)
        assert reply_tos == 46 << 2
    finally:
        stop.set()
        for t in threads:
            t.join()
        p.close()
        r.close()
        target.close()
    with pytest.raises(InputError, match="dscp"):
        AgentConfig(dscp=64)
