"""Agents and controller over real sockets on loopback addresses."""

from __future__ import annotations

import contextlib
import math
import os
import queue
import threading

import grpc
import pytest

from controller.server import start_controller
from netskel import serde
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.config import AgentConfig, ControllerConfig
from netskel.model import FlowRule
from probe_agent.agent import Agent
from tests.helpers import wait_for


def agent_cfg(topo_doc, h: int, target: str, **kw) -> AgentConfig:
    c = topo_doc["containers"][h]
    return AgentConfig(controller=target, container=c["id"], job=c["job"], host=c["host"],
                       endpoints=tuple(f"{e['id']},{e['nic']},{e['ip']},lo" for e in c["endpoints"]),
                       probe_port=7100, probe_rate_hz=20, probe_timeout_s=0.3,
                       sizes=(64, 1024), **kw)


def switch_reader_cfg(topo_doc, h: int, target: str, interval_s: float, **kw) -> AgentConfig:
    """An agent reading the fake virtual switch (`_fake_programs`) every
    `interval_s`."""
    return agent_cfg(topo_doc, h, target, vswitch="unix:/fake/br0.mgmt",
                     vswitch_tunnel_ports=(100,), vswitch_vni=7, vswitch_interval_s=interval_s,
                     **kw)


class Feed:
    """The analyzer's view: every event of WatchReports, collected."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stream = pb_grpc.ControllerStub(self.channel).WatchReports(pb.WatchReportsRequest())
        self.windows: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for ev in self.stream:
                if ev.HasField("windows"):
                    for w in serde.window_batch_from_pb(ev.windows).windows():
                        self.windows.put(w)
        except grpc.RpcError:
            pass

    def drain(self) -> list:
        out = []
        while True:
            try:
                out.append(self.windows.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


def controller_and_analyzer(topo_file, sock):
    """Both services in-process, fast windows and a 2 s heartbeat timeout."""
    from analyzer.server import start_analyzer
    from netskel.config import AnalyzerConfig

    ctl = start_controller(ControllerConfig(topology=str(topo_file), listen=(sock,),
                                            db=":memory:", window_seconds=1,
                                            heartbeat_interval_ms=200, heartbeat_timeout_s=2))
    ana = start_analyzer(AnalyzerConfig(topology=str(topo_file), controller=sock,
                                        listen=("127.0.0.1:0",)), tick_s=0.2)
    return ctl, ana


@pytest.fixture
def sock(tmp_path):
    return f"unix:{tmp_path}/controller.sock"


def test_probe_windows_flow_and_late_container_is_not_probed_early(topo_file, topo_doc,
                                                                   tmp_path, sock):
    ctl = start_controller(ControllerConfig(topology=str(topo_file), listen=(sock,),
                                            db=str(tmp_path / "c.sqlite"), window_seconds=1,
                                            heartbeat_interval_ms=200))
    feed = Feed(sock)
    agents = [Agent(agent_cfg(topo_doc, h, sock)) for h in range(3)]
    late = None
    try:
        for a in agents:
            a.start()
        late_eps = {e["id"] for e in topo_doc["containers"][3]["endpoints"]}
        seen = []

        def healthy_windows():
            seen.extend(feed.drain())
            return [w for w in seen if w.lost == 0 and w.sent > 0]
        wait_for(lambda: len(healthy_windows()) >= 6, 20, "windows from the first three agents")
        assert not any(w.dst in late_eps for w in seen), "probed before activation"
        for w in healthy_windows():
            assert 0 < w.rtt_min <= w.rtt_median <= w.rtt_max < 50_000
            assert math.isfinite(w.rtt_std) and w.size in (64, 1024)
            assert w.clock in ("kernel", "user"), w.clock  # what the RTTs can be trusted to
        assert any(w.clock == "kernel" for w in healthy_windows()), "no kernel-stamped window"

        late = Agent(agent_cfg(topo_doc, 3, sock))
        late.start()
        wait_for(lambda: any(w.dst in late_eps and w.sent > 0 for w in healthy_windows()), 20,
                 "probes to the late container once it is ready")
        assert not any(w.dst in late_eps and w.lost == w.sent for w in seen)
        # NIC byte counters arrive too, sampled at 10 Hz or faster.
        samples = list(ctl.state.counters[topo_doc["containers"][0]["endpoints"][0]["id"]])
        assert len(samples) >= 10
        gaps = [b.ts - a.ts for a, b in zip(samples, samples[1:], strict=False)]
        assert sorted(gaps)[len(gaps) // 2] <= 0.11
        assert samples[-1].tx_bytes >= samples[0].tx_bytes
    finally:
        feed.close()
        for a in [*agents, *([late] if late else [])]:
            a.stop()
        ctl.stop(0)


def test_agent_survives_controller_restart(topo_file, topo_doc, tmp_path, sock):
    cfg = ControllerConfig(topology=str(topo_file), listen=(sock,), db=str(tmp_path / "c.sqlite"),
                           window_seconds=1, heartbeat_interval_ms=200)
    ctl = start_controller(cfg)
    agents = [Agent(agent_cfg(topo_doc, h, sock)) for h in range(2)]
    try:
        for a in agents:
            a.start()
        wait_for(lambda: all(a.list_version and any(t.active for t in a.targets.values())
                             for a in agents if a.targets) and agents[0].list_version,
                 20, "lists with active targets")
        lists_before = {a.cfg.container: dict(a.targets) for a in agents}
        ctl.stop(0)
        ctl = start_controller(cfg)
        # Agents reconnect on their own; the feed shows their windows again.
        feed = Feed(sock)
        wait_for(lambda: any(w.sent > 0 for w in feed.drain()), 30, "reports after the restart")
        feed.close()
        assert {a.cfg.container: dict(a.targets) for a in agents} == lists_before
        assert set(ctl.state.regs) == {"job7-w000", "job7-w001"}
    finally:
        for a in agents:
            a.stop()
        ctl.stop(0)


def test_active_check_through_netdiag(topo_file, topo_doc, tmp_path, sock):
    """Diagnose with active_check: the analyzer asks the controller, the
    probing agents probe the pairs at every size at once and report, and the
    verdict comes back well within 15 s. A pair whose prober is gone is named
    as not checked, not judged."""
    import time

    from netskel.api.v1 import common_pb2 as cpb
    from netskel.api.v1 import netdiag_pb2 as dpb
    from netskel.api.v1 import netdiag_pb2_grpc as dpb_grpc

    ctl, ana = controller_and_analyzer(topo_file, sock)
    agents = [Agent(agent_cfg(topo_doc, h, sock)) for h in range(4)]
    ch = grpc.insecure_channel(f"127.0.0.1:{ana.ports[0]}")
    netdiag = dpb_grpc.NetDiagStub(ch)
    try:
        for a in agents:
            a.start()
        wait_for(lambda: all(a.targets and all(t.active for t in a.targets.values())
                             for a in agents[:3]), 20, "every target active")
        e0 = topo_doc["containers"][0]["endpoints"][0]["id"]
        def e0_seen() -> bool:  # all three of its pairs: a pair first seen later is not checked
            pairs = netdiag.Diagnose(dpb.DiagnoseRequest(endpoints=[e0])).pairs
            return len(pairs) == 3 and all(v.verdict == dpb.NETWORK_OK for v in pairs)
        wait_for(e0_seen, 20, "the analyzer to see e0's three pairs")
        t0 = time.monotonic()
        resp = netdiag.Diagnose(dpb.DiagnoseRequest(endpoints=[e0], active_check=True,
                                                    check_seconds=1), timeout=20)
        took = time.monotonic() - t0
        assert took < 15, f"active check answered in {took:.1f} s"
        assert len(resp.pairs) == 3 and resp.verdict == dpb.NETWORK_OK
        for v in resp.pairs:
            assert v.verdict == dpb.NETWORK_OK and v.reason == "active check: every size healthy"
        assert list(resp.check_findings) == []
        # The prober of one pair goes away: that pair is reported unchecked, not judged.
        prober = next(a for a in agents[1:] if any(t.dst == e0 for t in a.targets.values()))
        other = next(t.src for t in prober.targets.values() if t.dst == e0)
        prober.stop()
        resp = netdiag.Diagnose(dpb.DiagnoseRequest(pairs=[cpb.EndpointPair(a=e0, b=other)],
                                                    active_check=True, check_seconds=1),
                                timeout=20)
        assert "not checked" in resp.pairs[0].reason
    finally:
        ch.close()
        for a in agents:
            a.stop()
        ana.stop(0)
        ctl.stop(0)


def test_an_active_checks_probes_count_as_the_agents_own_traffic(topo_doc, sock):
    """A check probes from its own sockets; its bytes must leave the
    counters like the regular probes', while it runs and after."""
    from controller.pinglist import Target
    from probe_agent import check, wire
    from probe_agent.udp import WIRE_OVERHEAD, Responder

    agent = Agent(agent_cfg(topo_doc, 0, sock))  # not started: nothing else of it sends
    peer = Responder(["127.9.9.9"], 0)
    stop = threading.Event()
    serving = threading.Thread(target=peer.serve, args=(stop,), daemon=True)
    serving.start()
    try:
        e = agent.endpoints[0]
        before = agent._own_bytes()[e.id]
        during = []

        def track(prober, running):
            agent._check_prober(prober, running)
            during.append(running)

        windows = check.run_check((Target(e.id, "peer", "127.9.9.9", peer.port, True),), 0.3,
                                  50.0, {e.id: e.ip}, {e.id: (64, 1024)}, 0.3, "", {},
                                  threading.Event(), on_prober=track)
        after = agent._own_bytes()[e.id]
    finally:
        stop.set()
        serving.join(timeout=5)
        peer.close()
        agent.stop()
    assert during == [True, False]
    sent = {w.size: w.sent for w in windows}
    got = {w.size: w.sent - w.lost for w in windows}
    assert sent[64] > 0 and sent[1024] > 0
    assert after[0] - before[0] == sum(n * (size + WIRE_OVERHEAD) for size, n in sent.items())
    # In: the replies and the follow-ups that came before the check ended.
    follow_ups, odd = divmod(after[1] - before[1]
                             - sum(n * (size + WIRE_OVERHEAD) for size, n in got.items()),
                             wire.HEADER_SIZE + WIRE_OVERHEAD)
    assert odd == 0 and 0 < follow_ups <= sum(got.values())


# A fake ovs-ofctl's start: `show` lists the ports; a dump counts itself in $STATE as n.
_OFCTL_HEAD = """#!/bin/sh
n=$(cat "$STATE" 2>/dev/null || echo 0)
if [ "$1" = "show" ]; then
  printf ' 1(c0e0): addr:aa:bb:cc:dd:ee:01\\n 100(vx7): addr:aa:bb:cc:dd:ee:02\\n'
  exit 0
fi
n=$((n + 1)); echo $n > "$STATE"
"""
FAKE_OFCTL = _OFCTL_HEAD + """
# An ovs-ofctl that misbehaves before it answers: garbage, a failure, a hang-up
# mid-table, then a good table.
case $n in
  1) echo 'Segmentation fault (core dumped) <<<garbage>>>' ;;
  2) echo 'ovs-ofctl: br0.mgmt: failed to connect to socket (Connection refused)' >&2; exit 1 ;;
  3) printf 'NXST_FLOW reply (xid=0x4):\\n cookie=0x0, table=0, priority=100,'
     printf 'ip,nw_dst=192.168.10.9 actions=outp' ;;
  *) printf 'NXST_FLOW reply (xid=0x4):\\n cookie=0x0, duration=1.0s, table=0, n_packets=0, '
     printf 'n_bytes=0, priority=100,ip,nw_dst=192.168.10.9 actions=output:1\\n' ;;
esac
"""


FAKE_APPCTL = """#!/bin/sh
# An ovs-appctl whose first datapath read fails, the second is cut mid-line
# (its port name half written), then answers one offloaded flow.
n=$(cat "$STATE.dp" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$STATE.dp"
[ $n = 1 ] && { echo 'ovs-appctl: cannot connect to "ovs-vswitchd"' >&2; exit 1; }
[ $n = 2 ] && { printf 'recirc_id(0),in_port(c0e0),eth_type(0x0800),ipv4(dst=192.168.10.9), '
               printf 'actions:c0'; exit 0; }
echo "$@" > "$STATE.args"
printf 'ufid:1, recirc_id(0),in_port(c0e0),eth_type(0x0800),ipv4(dst=192.168.10.9,frag=no), '
printf 'packets:5, bytes:490, used:0.1s, offloaded:yes, dp:tc, actions:drop\\n'
"""


def _fake_programs(tmp_path, monkeypatch, fakes: dict[str, str]) -> None:
    """`fakes` (program name -> shell script) first on PATH; $STATE is
    theirs to count calls in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(tmp_path / "calls"))


@contextlib.contextmanager
def _vswitch_dumps(topo_doc, tmp_path, sock, topo_file, monkeypatch, fakes: dict[str, str],
                   **agent_kw):
    """An agent reading a fake switch (`fakes`: program name -> shell script,
    first on PATH; $STATE is theirs to count calls in) under a real
    controller; yields the vswitch dumps of the controller's report feed."""
    _fake_programs(tmp_path, monkeypatch, fakes)
    ctl = start_controller(ControllerConfig(topology=str(topo_file), listen=(sock,),
                                            db=str(tmp_path / "c.sqlite"), window_seconds=1,
                                            heartbeat_interval_ms=200))
    channel = grpc.insecure_channel(sock)
    stream = pb_grpc.ControllerStub(channel).WatchReports(pb.WatchReportsRequest(),
                                                             timeout=60)  # fails, never hangs
    agent = Agent(switch_reader_cfg(topo_doc, 0, sock, 0.05, **agent_kw))
    try:
        agent.start()
        yield (serde.vswitch_from_pb(ev.vswitch) for ev in stream if ev.HasField("vswitch"))
    finally:
        stream.cancel()
        channel.close()
        agent.stop()
        ctl.stop()


def test_vswitch_dump_loop_survives_garbage_and_the_good_table_arrives(topo_doc, tmp_path, sock,
                                                                        topo_file, monkeypatch):
    from probe_agent.metrics import REGISTRY

    failures = "netskel_agent_vswitch_dump_failures_total"
    dp_failures = "netskel_agent_vswitch_datapath_failures_total"
    before = REGISTRY.get_sample_value(failures) or 0.0
    dp_before = REGISTRY.get_sample_value(dp_failures) or 0.0
    with _vswitch_dumps(topo_doc, tmp_path, sock, topo_file, monkeypatch,
                        {"ovs-ofctl": FAKE_OFCTL, "ovs-appctl": FAKE_APPCTL},
                        vswitch_datapath="ovs-vswitchd") as feed:
        dumps = []
        for d in feed:
            dumps.append(d)
            if d.datapath is not None or len(dumps) > 200:  # ~10 s of dumps
                break
    dump = dumps[0]
    assert dump.host == topo_doc["containers"][0]["host"]
    assert [(r.dst, r.action, r.to) for r in dump.rules] == [("192.168.10.9", "deliver", "c0e0")]
    # The failed and the cut-short datapath reads sent the tables without
    # it, once (the analyzer keeps the NICs' last); the next carried the flow.
    assert [d.datapath is None for d in dumps] == [True, False]
    assert (REGISTRY.get_sample_value(dp_failures) or 0.0) - dp_before >= 2
    assert [(f.port, f.from_tunnel, f.rule) for f in dumps[-1].datapath or ()] == [
        ("c0e0", False, FlowRule(7, "192.168.10.9", "drop", ""))]
    assert (tmp_path / "calls.args").read_text().split() == [
        "-t", "ovs-vswitchd", "dpctl/dump-flows", "-m", "--names", "type=offloaded"]
    # Three bad dumps (garbage, a failed command, a table cut mid-line) came
    # first: each counted, none sent, and the loop went on.
    assert (REGISTRY.get_sample_value(failures) or 0.0) - before >= 3
    assert int((tmp_path / "calls").read_text()) >= 4


FAKE_OFCTL_CHANGING = _OFCTL_HEAD + """
# The same table on every dump until the eighth, then another.
dst=192.168.10.9; [ $n -ge 8 ] && dst=192.168.10.10
printf 'NXST_FLOW reply (xid=0x4):\\n cookie=0x0, duration=%d.0s, table=0, n_packets=%d, ' $n $n
printf 'n_bytes=0, priority=100,ip,nw_dst=%s actions=output:1\\n' $dst
"""


def test_an_unchanged_table_is_not_sent_again_a_changed_one_is(topo_doc, tmp_path, sock,
                                                               topo_file, monkeypatch):
    """Every agent with --vswitch reads its host's whole table every few
    seconds; only a change (or the refresh) goes to the controller."""
    with _vswitch_dumps(topo_doc, tmp_path, sock, topo_file, monkeypatch,
                        {"ovs-ofctl": FAKE_OFCTL_CHANGING}) as feed:
        dumps = [next(feed), next(feed)]
    assert [[r.dst for r in d.rules] for d in dumps] == [["192.168.10.9"], ["192.168.10.10"]]
    assert int((tmp_path / "calls").read_text()) >= 8  # seven reads, one send


FAKE_OFCTL_STEADY = _OFCTL_HEAD + """
printf 'NXST_FLOW reply (xid=0x4):\\n cookie=0x0, duration=1.0s, table=0, n_packets=0, '
printf 'n_bytes=0, priority=100,ip,nw_dst=192.168.10.9 actions=output:1\\n'
"""


def test_an_active_check_reads_the_switch_at_once(topo_doc, tmp_path, sock, topo_file,
                                                  monkeypatch):
    """The guide's "dumps the virtual switch's flow tables on request": an
    active check wakes the switch readers of the probing agent's host and of
    its target's (each overlay path ends in the target host's table), so the
    check's overlay trace reads the tables of the moment, not ones up to an
    interval old. Here the interval is an hour: only the check can bring a
    table."""
    from netskel.api.v1 import common_pb2 as cpb
    from probe_agent.metrics import REGISTRY

    _fake_programs(tmp_path, monkeypatch, {"ovs-ofctl": FAKE_OFCTL_STEADY})
    ctl = start_controller(ControllerConfig(topology=str(topo_file), listen=(sock,),
                                            db=":memory:", window_seconds=1,
                                            heartbeat_interval_ms=200))
    channel = grpc.insecure_channel(sock)
    stub = pb_grpc.ControllerStub(channel)
    stream = stub.WatchReports(pb.WatchReportsRequest(), timeout=60)
    dumps: list[str] = []

    def read() -> None:
        with contextlib.suppress(grpc.RpcError):  # the stream cancelled at the end
            dumps.extend(ev.vswitch.host for ev in stream if ev.HasField("vswitch"))

    reader = threading.Thread(target=read, daemon=True)
    agents = [Agent(switch_reader_cfg(topo_doc, h, sock, 3600.0)) for h in (0, 1)]

    def reads(why: str) -> float:
        return REGISTRY.get_sample_value("netskel_agent_vswitch_reads_total", {"why": why}) or 0.0

    before = reads("interval"), reads("check")
    try:
        reader.start()
        for a in agents:
            a.start()
        e0, e1 = (topo_doc["containers"][h]["endpoints"][0]["id"] for h in (0, 1))
        wait_for(lambda: any(t.active and {t.src, t.dst} == {e0, e1}
                             for a in agents for t in a.targets.values()), 20,
                 "the pair's target active")
        assert dumps == [] and not (tmp_path / "calls").exists()
        resp = stub.ActiveCheck(pb.ActiveCheckRequest(pairs=[cpb.EndpointPair(a=e0, b=e1)],
                                                      duration_s=0.5), timeout=20)
        assert list(resp.unchecked) == [] and resp.windows
        hosts = {topo_doc["containers"][h]["host"] for h in (0, 1)}
        wait_for(lambda: set(dumps) == hosts, 20, "both hosts' switch tables from the check")
        assert (reads("interval"), reads("check") - before[1]) == (before[0], 2)
        assert sorted(dumps) == sorted(hosts)  # one read each
    finally:
        stream.cancel()
        channel.close()
        for a in agents:
            a.stop()
        ctl.stop()


def test_a_reloaded_interval_applies_to_the_wait_under_way(topo_doc, tmp_path, sock, topo_file,
                                                           monkeypatch):
    """SIGHUP with --config hands the agent its new switch-read interval
    and probe rate (`Agent.reconfigure`): an agent waiting out an hour reads
    its switch within a second of the reload, not after the hour."""
    import dataclasses

    from probe_agent.metrics import REGISTRY

    _fake_programs(tmp_path, monkeypatch, {"ovs-ofctl": FAKE_OFCTL_STEADY})
    ctl = start_controller(ControllerConfig(topology=str(topo_file), listen=(sock,),
                                            db=":memory:", window_seconds=1,
                                            heartbeat_interval_ms=200))
    agent = Agent(switch_reader_cfg(topo_doc, 0, sock, 3600.0))

    def reads() -> float:
        return REGISTRY.get_sample_value("netskel_agent_vswitch_reads_total",
                                         {"why": "interval"}) or 0.0

    before = reads()
    try:
        agent.start()
        wait_for(lambda: agent.cfg.container in ctl.state.regs, 20, "the agent registered")
        assert reads() == before
        agent.reconfigure(dataclasses.replace(agent.cfg, vswitch_interval_s=0.05,
                                              probe_rate_hz=40.0))
        wait_for(lambda: reads() >= before + 2, 10, "reads at the reloaded interval")
        assert agent.prober.interval == 1 / 40.0 and agent.rdma.rate_hz == 40.0
    finally:
        agent.stop()
        ctl.stop()


FAKE_APPCTL_HUGE = """#!/bin/sh
# A datapath holding 120,000 distinct destinations: ~3.7 MB of rules.
awk 'BEGIN { for (i = 0; i < 120000; i++)
  printf "recirc_id(0),in_port(c0e0),eth_type(0x0800),ipv4(dst=10.%d.%d.%d), actions:drop\\n",
         int(i / 65536), int(i / 256) % 256, i % 256 }'
"""


def test_datapath_too_large_for_one_message_is_left_out_not_the_tables(
        topo_doc, tmp_path, sock, topo_file, monkeypatch):
    """Over the servers' message limit the report would fail the whole
    stream (windows too): the tables go without the datapath."""
    with _vswitch_dumps(topo_doc, tmp_path, sock, topo_file, monkeypatch,
                        {"ovs-ofctl": FAKE_OFCTL, "ovs-appctl": FAKE_APPCTL_HUGE},
                        vswitch_datapath="ovs-vswitchd", vswitch_refresh_s=0.05) as feed:
        dumps = [next(feed), next(feed)]
    assert [len(d.rules) for d in dumps] == [1, 1]
    assert [d.datapath for d in dumps] == [None, None]


def test_clean_stop_deregisters_and_raises_nothing(topo_file, topo_doc, tmp_path, sock):
    """SIGTERM's path (stop with deregister): the controller forgets the
    container, its peers drop it from their lists, and the analyzer opens no
    incident for the probes that stop answering."""
    import time

    ctl, ana = controller_and_analyzer(topo_file, sock)
    agents = [Agent(agent_cfg(topo_doc, h, sock)) for h in range(4)]
    try:
        for a in agents:
            a.start()
        wait_for(lambda: all(a.targets and all(t.active for t in a.targets.values())
                             for a in agents), 20, "every target active")
        leaving = agents[1]
        gone = {e["id"] for e in topo_doc["containers"][1]["endpoints"]}
        t_leave = time.time()
        leaving.stop(deregister=True)
        assert leaving.cfg.container not in ctl.state.regs
        wait_for(lambda: all(not (gone & {t.dst, t.src}) for a in (agents[0], agents[2], agents[3])
                             for t in a.targets.values()), 10, "peers to drop the container")
        # The analyzer goes on: windows of the remaining pair, three seconds
        # after the departure, reach it, and still nothing is open.
        e0, e2 = (topo_doc["containers"][h]["endpoints"][0]["id"] for h in (0, 2))
        wait_for(lambda: ana.engine.history.points((e0, e2), t_leave + 3)
                 or ana.engine.history.points((e2, e0), t_leave + 3), 20,
                 "windows from after the departure")
        assert ana.engine.list_incidents(False, 0) == []
    finally:
        for a in agents:
            a.stop()
        ana.stop(0)
        ctl.stop(0)


# An ovs-ofctl whose dump never ends: the agent's switch thread is stuck in it.
HANGING_OFCTL = _OFCTL_HEAD + """
echo $$ > "$STATE.pid"
exec sleep 60
"""


def test_a_stop_tells_the_controller_before_it_waits_for_a_stuck_thread(
        topo_doc, tmp_path, sock, topo_file, monkeypatch):
    """A thread stuck in a switch dump must not keep the controller from
    hearing the container leave: the roles get 8 s from SIGTERM to exit, and
    the agent's threads were joined 5 s each before it deregistered."""
    import signal

    _fake_programs(tmp_path, monkeypatch, {"ovs-ofctl": HANGING_OFCTL})
    ctl = start_controller(ControllerConfig(topology=str(topo_file), listen=(sock,),
                                            db=":memory:", window_seconds=1,
                                            heartbeat_interval_ms=200))
    agent = Agent(switch_reader_cfg(topo_doc, 0, sock, 0.05))
    pid_file = tmp_path / "calls.pid"
    stopping = threading.Thread(target=agent.stop, kwargs={"deregister": True})
    try:
        agent.start()
        wait_for(lambda: agent.cfg.container in ctl.state.regs and pid_file.exists(), 20,
                 "the agent registered and its switch dump under way")
        stopping.start()
        wait_for(lambda: agent.cfg.container not in ctl.state.regs, 3,
                 "the controller to hear the container leave")
        assert stopping.is_alive(), "the stuck thread is still being waited for"
    finally:
        stopping.join(10) if stopping.ident else agent.stop()
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        ctl.stop()
