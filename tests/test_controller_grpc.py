"""The controller over real gRPC on port 0."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.server import start_controller
from netskel.api.v1 import controller_pb2 as pb
from netskel.api.v1 import controller_pb2_grpc as pb_grpc
from netskel.config import ControllerConfig
from tests.helpers import stopped_while_busy, wait_for


def _cfg(topo_file: Path, db: Path) -> ControllerConfig:
    return ControllerConfig(topology=str(topo_file), listen=("127.0.0.1:0",), db=str(db),
                            heartbeat_timeout_s=2.0)


@pytest.fixture
def controller(topo_file, tmp_path):
    c = start_controller(_cfg(topo_file, tmp_path / "c.sqlite"))
    yield c
    c.stop(0)


# Every stream has a deadline: a quiet stream fails the test, never hangs it.
STREAM_S = 30.0


def _stub(port: int) -> tuple[grpc.Channel, pb_grpc.ControllerStub]:
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    return ch, pb_grpc.ControllerStub(ch)


def _register(stub, topo_doc, h: int, port: int = 7100):
    c = topo_doc["containers"][h]
    stub.Register(pb.RegisterRequest(
        container=c["id"], job=c["job"], host=c["host"], probe_port=port,
        endpoints=[pb.EndpointInfo(id=e["id"], nic=e["nic"], ip=e["ip"]) for e in c["endpoints"]]))


def test_health_and_reflection_are_served(controller):
    ch = grpc.insecure_channel(f"127.0.0.1:{controller.ports[0]}")
    health = health_pb2_grpc.HealthStub(ch)
    resp = health.Check(health_pb2.HealthCheckRequest(service="netskel.api.v1.Controller"))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    refl = reflection_pb2_grpc.ServerReflectionStub(ch)
    out = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
        list_services="")])))
    names = {s.name for s in out[0].list_services_response.service}
    assert "netskel.api.v1.Controller" in names
    ch.close()


def test_list_arrives_at_once_and_targets_activate_on_ready(controller, topo_doc):
    ch, stub = _stub(controller.ports[0])
    _register(stub, topo_doc, 0)
    stream = stub.WatchPingList(pb.WatchPingListRequest(container="job7-w000"),
                               timeout=STREAM_S)
    first = next(stream)
    assert first.full and first.upsert, "the whole list comes at once"
    assert not any(t.active for t in first.upsert), "nobody else is ready yet"
    dsts = {t.dst for t in first.upsert}
    # One target's agent becomes ready: its entries, and only those, flip.
    target_container = next(c["id"] for c in topo_doc["containers"]
                            if any(e["id"] in dsts for e in c["endpoints"]))
    h = int(target_container[-3:])
    _register(stub, topo_doc, h, port=7123)
    registered = next(stream)  # the target's real port is known, still inactive
    assert registered.upsert and all(t.dst_port == 7123 and not t.active
                                     for t in registered.upsert)
    assert stub.Heartbeat(pb.HeartbeatRequest(container=target_container, ready=True)).known
    update = next(stream)
    assert not update.full and update.upsert and update.version > registered.version
    assert all(t.active and t.dst.startswith(target_container + "/") for t in update.upsert)
    stream.cancel()
    ch.close()


def test_unknown_ids_and_bad_registration_are_clear_errors(controller, topo_doc):
    ch, stub = _stub(controller.ports[0])
    with pytest.raises(grpc.RpcError) as e:
        next(stub.WatchPingList(pb.WatchPingListRequest(container="nope"),
                                 timeout=STREAM_S))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Register(pb.RegisterRequest(container="x", host="h0000", probe_port=1,
                                         endpoints=[pb.EndpointInfo(id="x/e", nic="h0001/rnic0",
                                                                    ip="1.2.3.4")]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is on host 'h0001'" in e.value.details()
    assert not stub.Heartbeat(pb.HeartbeatRequest(container="ghost", ready=True)).known
    ch.close()


def test_garbage_bytes_on_the_port_do_not_hurt(controller, topo_doc):
    for payload in (b"\x00" * 64, b"GET / HTTP/1.1\r\n\r\n", bytes(range(256)) * 8):
        with socket.create_connection(("127.0.0.1", controller.ports[0]), timeout=5) as s:
            s.sendall(payload)
            s.settimeout(5)
            try:
                s.recv(1024)
            except (TimeoutError, ConnectionResetError):
                pass
    ch, stub = _stub(controller.ports[0])
    _register(stub, topo_doc, 1)
    assert stub.Heartbeat(pb.HeartbeatRequest(container="job7-w001", ready=True)).known
    ch.close()


def test_restart_loses_no_registration_and_no_list(topo_file, topo_doc, tmp_path):
    db = tmp_path / "c.sqlite"
    c = start_controller(_cfg(topo_file, db))
    ch, stub = _stub(c.ports[0])
    for h in range(4):
        _register(stub, topo_doc, h)
        stub.Heartbeat(pb.HeartbeatRequest(container=f"job7-w{h:03d}", ready=True))
    before = {cid: (c.state.versions[cid], dict(pl)) for cid, pl in c.state.lists.items()}
    regs_before = {k: (r.host, r.endpoints, r.ready) for k, r in c.state.regs.items()}
    ch.close()
    c.stop(0)

    c2 = start_controller(_cfg(topo_file, db))
    try:
        assert {k: (r.host, r.endpoints, r.ready) for k, r in c2.state.regs.items()} == regs_before
        after = {cid: (c2.state.versions[cid], dict(pl)) for cid, pl in c2.state.lists.items()}
        assert after == before
        assert all(t.active for _, pl in after.values() for t in pl.values())
        ch, stub = _stub(c2.ports[0])
        assert stub.Heartbeat(pb.HeartbeatRequest(container="job7-w002", ready=True)).known
        first = next(stub.WatchPingList(pb.WatchPingListRequest(container="job7-w002"),
                                         timeout=STREAM_S))
        assert {(t.src, t.dst) for t in first.upsert} == set(before["job7-w002"][1])
        ch.close()
    finally:
        c2.stop(0)


def test_restart_keeps_departures_gauges_and_growing_versions(topo_file, topo_doc, tmp_path):
    """A container that left stays out of every list after a restart, the
    registered-agents gauge reads what is registered, and a returning
    agent's list version continues from where it was (versions only grow)."""
    from controller.metrics import REGISTRY

    db = tmp_path / "c.sqlite"
    c = start_controller(_cfg(topo_file, db))
    ch, stub = _stub(c.ports[0])
    for h in range(4):
        _register(stub, topo_doc, h)
        stub.Heartbeat(pb.HeartbeatRequest(container=f"job7-w{h:03d}", ready=True))
    gone = "job7-w003"
    gone_eps = {e["id"] for e in topo_doc["containers"][3]["endpoints"]}
    version_before = c.state.versions[gone]
    stub.Deregister(pb.DeregisterRequest(container=gone))
    ch.close()
    c.stop(0)

    def in_lists(state) -> bool:
        return any(t.dst in gone_eps or t.src in gone_eps
                   for pl in state.lists.values() for t in pl.values())

    c2 = start_controller(_cfg(topo_file, db))
    try:
        assert gone not in c2.state.regs and not in_lists(c2.state)
        assert REGISTRY.get_sample_value("netskel_agents_registered") == 3
        ch, stub = _stub(c2.ports[0])
        _register(stub, topo_doc, 3)
        first = next(stub.WatchPingList(pb.WatchPingListRequest(container=gone), timeout=5))
        assert first.version > version_before
        assert in_lists(c2.state)
        ch.close()
    finally:
        c2.stop(0)
    c3 = start_controller(_cfg(topo_file, db))  # and it is back after another restart
    try:
        assert gone in c3.state.regs and in_lists(c3.state)
    finally:
        c3.stop(0)


def test_silent_agent_is_announced_to_the_feed(controller, topo_doc):
    ch, stub = _stub(controller.ports[0])
    feed = stub.WatchReports(pb.WatchReportsRequest(), timeout=STREAM_S)
    _register(stub, topo_doc, 3)
    stub.Heartbeat(pb.HeartbeatRequest(container="job7-w003", ready=True))
    states = []

    def saw_gone():
        ev = next(feed)
        if ev.HasField("agent"):
            states.append((ev.agent.container, ev.agent.ready))
        return ("job7-w003", False) in states[1:] and ("job7-w003", True) in states
    wait_for(saw_gone, 10, "the feed to announce the silent agent")
    feed.cancel()
    ch.close()


def test_join_and_leave_push_only_the_changes(controller, topo_doc):
    ch, stub = _stub(controller.ports[0])
    _register(stub, topo_doc, 0)
    stream = stub.WatchPingList(pb.WatchPingListRequest(container="job7-w000"),
                               timeout=STREAM_S)
    first = next(stream)
    before = {(t.src, t.dst) for t in first.upsert}
    # A container the topology snapshot does not know joins on host 1.
    stub.Register(pb.RegisterRequest(
        container="job7-extra", job="job7", host="h0001", probe_port=7100,
        endpoints=[pb.EndpointInfo(id="job7-extra/rnic0", nic="h0001/rnic0", ip="127.0.10.99")]))
    mine = {(t.src, t.dst) for t in first.upsert}
    got = set()
    # Its pair with job7-w000 lands on one side only; w000 hears of it if it is the prober.
    lists = {c: set(pl) for c, pl in controller.state.lists.items()}
    involved = {k for pl in lists.values() for k in pl if "job7-extra/rnic0" in k}
    assert involved and all(k[0].endswith("rnic0") and k[1].endswith("rnic0") for k in involved)
    if any(k[0].startswith("job7-w000/") for k in involved):
        update = next(stream)
        got = {(t.src, t.dst) for t in update.upsert}
        assert got <= involved and not update.remove
    stub.Deregister(pb.DeregisterRequest(container="job7-extra"))
    if got:
        update = next(stream)
        assert {(t.src, t.dst) for t in update.remove} == got
    assert {k for pl in controller.state.lists.values() for k in pl} & involved == set()
    assert mine == before
    with pytest.raises(grpc.RpcError) as e:
        stub.Deregister(pb.DeregisterRequest(container="job7-extra"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    stream.cancel()
    ch.close()


def test_active_check_names_every_ordered_pair_left_without_a_window(controller, topo_doc):
    """An agent that answers a check for only some of its ordered pairs, or
    with a window that cannot be trusted: those come back as not checked,
    with why. Left unnamed, the analyzer
    judged them from older passive windows and called them checked-healthy
    in all but the reason."""
    import threading

    from netskel import serde
    from netskel.api.v1 import common_pb2 as cpb
    from netskel.model import WindowStats

    ch, stub = _stub(controller.ports[0])
    _register(stub, topo_doc, 0)
    stream = stub.WatchPingList(pb.WatchPingListRequest(container="job7-w000"),
                                timeout=STREAM_S)
    first = next(stream)
    answered, skipped, broken = sorted(first.upsert, key=lambda t: t.dst)[:3]
    peers = sorted({t.dst.split("/")[0] for t in (answered, skipped, broken)})
    for port, peer in enumerate(peers, start=7123):
        _register(stub, topo_doc, int(peer[-3:]), port=port)
        assert stub.Heartbeat(pb.HeartbeatRequest(container=peer, ready=True)).known
    active: set[str] = set()
    while not {answered.dst, skipped.dst, broken.dst} <= active:  # the peers' targets activate
        active |= {t.dst for t in next(stream).upsert if t.active}
    result: dict[str, pb.ActiveCheckResponse] = {}
    asking = threading.Thread(target=lambda: result.update(resp=stub.ActiveCheck(
        pb.ActiveCheckRequest(pairs=[cpb.EndpointPair(a=t.src, b=t.dst)
                                     for t in (answered, skipped, broken)], duration_s=1.0),
        timeout=STREAM_S)))
    asking.start()
    order = next(u for u in stream if u.HasField("check")).check
    assert {(t.src, t.dst) for t in order.targets} == {
        (t.src, t.dst) for t in (answered, skipped, broken)}
    w = WindowStats(src=answered.src, dst=answered.dst, window_start=1.0, window_end=2.0,
                    size=64, sent=10, lost=0, rtt_min=10.0, rtt_p25=11.0, rtt_median=12.0,
                    rtt_p75=13.0, rtt_mean=12.0, rtt_std=1.0, rtt_max=15.0)
    bad = WindowStats(src=broken.src, dst=broken.dst, window_start=1.0, window_end=2.0,
                      size=64, sent=3, lost=5)  # more lost than sent
    ack = stub.Report(iter([pb.AgentReport(container="job7-w000", check=pb.CheckResult(
        id=order.id, windows=[serde.window_to_pb(w), serde.window_to_pb(bad)]))]))
    assert ack.accepted == 1
    asking.join(STREAM_S)
    resp = result["resp"]
    assert [(x.src, x.dst) for x in resp.windows] == [(answered.src, answered.dst)]
    why = {(x.pair.a, x.pair.b): x.reason for x in resp.unchecked}
    assert set(why) == {(skipped.src, skipped.dst), (broken.src, broken.dst)}, why
    assert "reported no window" in why[(skipped.src, skipped.dst)]
    assert "cannot be trusted: impossible counts" in why[(broken.src, broken.dst)]
    stream.cancel()
    ch.close()


def test_a_stop_does_not_wait_out_a_long_inference(topo_file, tmp_path, monkeypatch):
    """Inferring a 32,768-endpoint job takes ~25 s and cannot be interrupted;
    the controller's stop gives its threads one budget and closes the store,
    inside the process's 8 s stop deadline, instead of joining the inference
    to its end."""
    import threading

    import controller.server as server

    inferring, release = threading.Event(), threading.Event()

    def long_inference(state, stop, every_s):
        inferring.set()
        release.wait(60)  # numpy does not look at the stop event

    monkeypatch.setattr(server, "run_live_inference", long_inference)
    c = start_controller(_cfg(topo_file, tmp_path / "c.sqlite"))
    with (stopped_while_busy(lambda: c.stop(0), inferring, release),
          pytest.raises(sqlite3.ProgrammingError)):  # closed: what was committed stays
        c.store.load_registrations()
