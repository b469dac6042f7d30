"""The testbed's multi-table OpenFlow pipeline (classifier, conntrack, L3
forwarding, output by register) read the way the agent reads it, checked
against Open vSwitch's own `ofproto/trace` on every (input port,
destination) of every host, then through the analyzer's overlay trace."""

from __future__ import annotations

import re

import pytest

from analyzer.overlay import OverlayTables
from netskel.model import VSwitchDump
from netskel.ofdump import read_dump
from netskel.ofpipeline import Packet, Pipeline
from netskel.topology import parse_topology
from probe_agent.vswitch import parse_dump_flows, parse_ports
from testbed import faults
from testbed.cluster import TUNNEL_OFPORT, create_cluster
from testbed.layout import Layout, layout_doc
from testbed.sh import CommandError, run
from tests.conftest import requires_testbed

pytestmark = requires_testbed
LAY = Layout(hosts=3, rails=2, hosts_per_tor=2, spines=1)


@pytest.fixture(scope="module")
def cluster():
    c = create_cluster(LAY)
    yield c
    assert c.destroy() == []


@pytest.fixture(params=[False, True], ids=["conntrack-first", "route-first"])
def pipeline(cluster, request):
    """Every host's pipeline in one stage order, then back to the usual."""
    for h in range(LAY.hosts):
        cluster.install_pipeline(h, route_first=request.param)
    yield request.param
    for h in range(LAY.hosts):
        cluster.install_pipeline(h)


def _dp_ports(dpif_show: str) -> dict[int, int]:
    """Datapath port number -> OpenFlow port number (`dpif/show`)."""
    return {int(dp): int(of) for of, dp in re.findall(r"^\s+\S+ (\d+)/(\d+):", dpif_show, re.M)}


def _ovs_says(cluster, h: int, in_port: int, src: str, dst: str, dp_to_of: dict[int, int]) -> str:
    out = cluster.ovs[h].appctl("ofproto/trace", "--ct-next", "trk,est", "br0",
                                f"in_port={in_port},udp,nw_src={src},nw_dst={dst},"
                                "udp_src=40001,udp_dst=7100")
    final = out.strip().splitlines()
    actions = next(line for line in reversed(final) if line.startswith("Datapath actions:"))
    acts = re.split(r",(?![^()]*\))", actions.split(":", 1)[1].strip())
    outs = sorted(dp_to_of[int(a)] for a in acts if a.strip().isdigit())
    return "drop" if not outs else ",".join(map(str, outs))


def _ours(out, ports) -> str:
    """Our end in ofproto/trace's terms: the OpenFlow port out, or drop."""
    if out.end in ("deliver", "tunnel"):
        return str(ports.by_name(out.port).number)
    return out.end


def test_interpreter_agrees_with_ofproto_trace_everywhere(cluster, pipeline):
    dsts = [LAY.overlay_ip(h, r) for h in range(LAY.hosts) for r in range(LAY.rails)]
    dsts += ["192.168.10.99", "192.168.77.1", "10.200.0.1"]  # unassigned, the prefix, outside
    compared = 0
    for h in range(LAY.hosts):
        ovs = cluster.ovs[h]
        ports = parse_ports(ovs.ofctl("show", "br0"), (TUNNEL_OFPORT,))
        pipe = Pipeline(read_dump(ovs.ofctl("dump-flows", "br0")), ports)
        dp_to_of = _dp_ports(ovs.appctl("dpif/show"))
        for port in ports.ports:
            src = LAY.overlay_ip(h, 0) if port.kind == "local" else LAY.overlay_ip((h + 1) % 3, 0)
            for dst in dsts:
                ours = pipe.trace(Packet(dst, in_port=port.number, src=src,
                                         vni=0 if port.kind == "tunnel" else None,
                                         fields={"tp_src": 40001, "tp_dst": 7100}))
                theirs = _ovs_says(cluster, h, port.number, src, dst, dp_to_of)
                assert _ours(ours, ports) == theirs, (h, port, dst, ours.summary())
                compared += 1
    assert compared == LAY.hosts * (LAY.rails + 1) * len(dsts)


def test_agent_rules_route_every_pair_and_a_deleted_flow_is_a_blackhole(cluster):
    topo = parse_topology(layout_doc(LAY))
    tables = OverlayTables(topo)

    def load(h: int) -> None:
        ovs = cluster.ovs[h]
        got = parse_dump_flows(ovs.ofctl("dump-flows", "br0"), (TUNNEL_OFPORT,), LAY.vni,
                               ovs.ofctl("show", "br0"))
        assert got.not_understood == ()
        tables.set_host(VSwitchDump(LAY.host(h), 0.0, got.rules))

    for h in range(LAY.hosts):
        load(h)
    pairs = [(LAY.endpoint(a, r), LAY.endpoint(b, r)) for r in range(LAY.rails)
             for a in range(LAY.hosts) for b in range(LAY.hosts) if a != b]
    assert {tables.round_trip(a, b).kind for a, b in pairs} == {"ok"}
    undo = faults.delete_overlay_rule(cluster, 0, LAY.overlay_ip(2, 1))
    try:
        load(0)
        broken = tables.round_trip(LAY.endpoint(0, 1), LAY.endpoint(2, 1))
        # The covering prefix now drops it: named by the missing destination,
        # the prefix that dropped it in the evidence.
        assert (broken.kind, broken.rule) == ("blackhole",
                                              f"{LAY.host(0)}:{LAY.vni}:{LAY.overlay_ip(2, 1)}")
        assert broken.detail["matched_rule"]["dst"] == "192.168.0.0/16"
        assert tables.round_trip(LAY.endpoint(1, 1), LAY.endpoint(2, 1)).kind == "ok"
    finally:
        undo()
    load(0)
    assert tables.round_trip(LAY.endpoint(0, 1), LAY.endpoint(2, 1)).kind == "ok"


def test_native_tunnel_port_far_end_is_learned_from_the_switch(cluster):
    """A native VXLAN port's remote_ip and key come from ovs-vsctl: a flow
    that outputs to it becomes a tunnel rule toward that address."""
    from probe_agent.vswitch import Reader, VSwitchSource

    ovs = cluster.ovs[0]
    ovs.vsctl("add-port", "br0", "tun9", "--", "set", "interface", "tun9", "type=vxlan",
              "options:remote_ip=10.9.9.9", "options:key=9", "ofport_request=200")
    flow = "table=30,priority=100,ip,nw_dst=192.168.99.1"
    ovs.ofctl("add-flow", "br0", f"{flow},actions=load:0xc8->NXM_NX_REG2[],goto_table:40")
    try:
        reader = Reader(VSwitchSource(f"unix:{ovs.dir}/br0.mgmt", (TUNNEL_OFPORT,), LAY.vni,
                                      ovs.db))
        got = reader.read()
        tun9 = next(p for p in got.ports.ports if p.number == 200)
        assert (tun9.kind, tun9.remote_ip, tun9.key) == ("tunnel", "10.9.9.9", 9)
        rule = next(r for r in got.rules if r.dst == "192.168.99.1")
        assert (rule.vni, rule.action, rule.to) == (9, "tunnel", "10.9.9.9")
        # The kernel VXLAN device is a system port: a tunnel only because we said so.
        vx = next(p for p in got.ports.ports if p.number == TUNNEL_OFPORT)
        assert (vx.kind, vx.remote_ip) == ("tunnel", None)
    finally:
        ovs.ofctl("del-flows", "br0", "--strict", flow)
        ovs.vsctl("del-port", "br0", "tun9")


def test_a_stale_datapath_flow_is_read_and_blamed_on_its_nic(cluster, pipeline):
    """The datapath's flows, read as the agent reads them, agree with the
    switch's tables while traffic runs; one rewritten to drop (a stale
    offloaded flow) makes the pair's trace name the NIC it leaves by. In
    both stage orders: routing before conntrack caches the output in a
    flow after the recirculation that matches no destination."""
    from probe_agent.vswitch import Reader, VSwitchSource

    topo = parse_topology(layout_doc(LAY))
    tables = OverlayTables(topo)
    readers = {h: Reader(VSwitchSource(f"unix:{cluster.ovs[h].dir}/br0.mgmt", (TUNNEL_OFPORT,),
                                       LAY.vni, cluster.ovs[h].db,
                                       f"{cluster.ovs[h].dir}/ovs-vswitchd.ctl", "ovs"))
               for h in range(LAY.hosts)}

    def ping(src_h: int, dst_h: int, r: int) -> None:
        run("ip", "netns", "exec", cluster.container_ns(src_h), "ping", "-c", "2", "-i", "0.05",
            "-W", "1", LAY.overlay_ip(dst_h, r))

    def load() -> None:
        for h, reader in readers.items():
            got = reader.read()
            tables.set_host(VSwitchDump(LAY.host(h), 0.0, got.rules,
                                        datapath=reader.read_datapath(got.ports).rules))

    ping(0, 1, 0)
    ping(0, 1, 1)
    load()
    held = readers[0].read_datapath(readers[0].read().ports).rules
    assert {(f.port, f.rule.dst, f.rule.action) for f in held} >= {
        ("c0e0", LAY.overlay_ip(1, 0), "tunnel"), (f"vx{LAY.vni}", LAY.overlay_ip(0, 0), "deliver")}
    pairs = [(LAY.endpoint(0, r), LAY.endpoint(1, r)) for r in range(LAY.rails)]
    assert [tables.round_trip(a, b).kind for a, b in pairs] == ["ok", "ok"]
    undo = faults.stale_datapath_flow(cluster, 0, 0, LAY.overlay_ip(1, 0))
    try:
        with pytest.raises(CommandError):  # the flow really drops
            ping(0, 1, 0)
        load()
        got = tables.round_trip(*pairs[0])
        assert (got.kind, got.nic) == ("nic", LAY.nic(0, 0))
        assert got.detail["offloaded_rule"]["action"] == "drop"
        assert tables.round_trip(*pairs[1]).kind == "ok"
    finally:
        undo()
    ping(0, 1, 0)
    load()
    assert [tables.round_trip(a, b).kind for a, b in pairs] == ["ok", "ok"]
