"""RDMA probing: the queue-pair address travels registration -> ping list ->
agent, the agent splits its targets by it, and (where a device exists) two
UD queue pairs ping each other. Here no device exists: that test skips and
says why; nothing stands in for the device."""

from __future__ import annotations

import threading

import pytest

from controller.pinglist import Member, MemberEndpoint, Target, build_lists
from controller.registration import RegEndpoint, Registration, gid_bytes, validate_registration
from netskel import serde
from netskel.errors import InputError
from netskel.topology import parse_topology
from probe_agent.agent import split_targets
from probe_agent.rdma import (
    RdmaAddress,
    RdmaPinger,
    device_of_interface,
    flow_label,
    gid_str,
    rdma_availability,
)
from testbed.layout import Layout, layout_doc

GID = "fe80:0000:0000:0000:0250:56ff:fe9a:1b2c"


def test_gid_round_trips_and_garbage_is_refused():
    raw = gid_bytes(GID)
    assert len(raw) == 16 and gid_str(raw) == GID
    for bad in ("fe80::1", "zz80:0000:0000:0000:0250:56ff:fe9a:1b2c", ""):
        with pytest.raises(ValueError):
            gid_bytes(bad)


def test_flow_labels_are_distinct_non_zero_20_bit_per_flow():
    labels = {flow_label(seq, 4) for seq in range(100)}
    assert len(labels) == 4 and all(0 < x < 1 << 20 for x in labels)


def test_device_found_behind_an_interface_in_sysfs(tmp_path):
    (tmp_path / "eth1" / "device" / "infiniband" / "mlx5_3").mkdir(parents=True)
    (tmp_path / "eth2" / "device").mkdir(parents=True)
    assert device_of_interface("eth1", tmp_path) == "mlx5_3"
    assert device_of_interface("eth2", tmp_path) is None
    assert device_of_interface("nope", tmp_path) is None


def test_registered_queue_pair_reaches_the_peers_ping_list_and_the_wire():
    def member(h: int, rdma: bool) -> Member:
        ep = MemberEndpoint(id=f"c{h}/e0", nic=f"n{h}/0", host=f"h{h}", rail=0, ip=f"10.0.0.{h}",
                            rdma_gid=GID if rdma else "", rdma_qpn=0x1234 if rdma else 0)
        return Member(id=f"c{h}", job="j", host=f"h{h}", endpoints=(ep,), probe_port=7100,
                      active=True)

    lists = build_lists({"c0": member(0, True), "c1": member(1, False)})
    (t,) = [t for pl in lists.values() for t in pl.values()]
    assert (t.dst_rdma_gid, t.dst_rdma_qpn) == ((GID, 0x1234) if t.dst == "c0/e0" else ("", 0))
    assert serde.target_from_pb(serde.target_to_pb(t)) == t
    reg = Registration(container="c0", job="j", host="h0", probe_port=7100, endpoints=(
        RegEndpoint(id="c0/e0", nic="n0/0", ip="10.0.0.1", rdma_gid=GID, rdma_qpn=77),))
    assert serde.registration_from_pb(serde.registration_to_pb(reg)) == reg


def test_a_bad_rdma_address_is_one_clear_registration_error():
    lay = Layout()
    topo = parse_topology(layout_doc(lay))
    eps = tuple(RegEndpoint(id=lay.endpoint(0, r), nic=lay.nic(0, r), ip=f"192.168.0.{r + 1}")
                for r in range(lay.rails))

    def reg(gid: str, qpn: int) -> Registration:
        first = RegEndpoint(id=eps[0].id, nic=eps[0].nic, ip=eps[0].ip, rdma_gid=gid, rdma_qpn=qpn)
        return Registration(container=lay.container(0), job=None, host=lay.host(0),
                            probe_port=7100, endpoints=(first, *eps[1:]))

    validate_registration(reg("", 0), topo, {})
    validate_registration(reg(GID, 77), topo, {})
    for gid, qpn in ((GID, 0), ("fe80::1", 5), (GID, 1 << 24), ("", 9)):
        with pytest.raises(InputError, match="bad RDMA address"):
            validate_registration(reg(gid, qpn), topo, {})


def test_targets_split_by_who_has_a_queue_pair():
    def target(src: str, dst: str, qpn: int, active: bool = True) -> Target:
        return Target(src=src, dst=dst, dst_ip="10.0.0.9", dst_port=7100, active=active,
                      dst_rdma_gid=GID if qpn else "", dst_rdma_qpn=qpn)

    ts = [target("a", "x", 5), target("a", "y", 0), target("b", "x", 5), target("a", "z", 6, False)]
    rdma, udp = split_targets(ts, {"a"})
    assert rdma == {("a", "x"): RdmaAddress(GID, 5)}
    assert [(t.src, t.dst) for t in udp] == [("a", "y"), ("b", "x")]


def test_two_ud_queue_pairs_ping_each_other_on_a_real_device():
    avail = rdma_availability()
    if not avail.available:
        pytest.skip(f"no RDMA here: {avail.reason} (any device counts, Soft-RoCE too)")
    replies: list[float] = []
    sent: list[int] = []
    a = RdmaPinger(avail.devices[0], lambda s, d, size, t: sent.append(size),
                   lambda s, d, size, t, rtt: replies.append(rtt), src="a")
    b = RdmaPinger(avail.devices[0], lambda *_: None, lambda *_: None, src="b")
    addr_b = b.open()
    a.open()
    stop = threading.Event()
    answer = threading.Thread(target=lambda: [b.poll(0.01) for _ in iter(stop.is_set, True)])
    answer.start()
    try:
        for size in (64, 256, 1024, 4096) * 5:
            a.probe("b", addr_b, size)
            a.poll(0.05)
    finally:
        stop.set()
        answer.join()
        a.close()
        b.close()
    assert len(sent) == 20 and len(replies) >= 15
    assert all(0 < r < 10_000 for r in replies)
