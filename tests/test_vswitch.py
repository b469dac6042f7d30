"""Virtual-switch tables: real `ovs-ofctl dump-flows` text parsed into the
contract's rules, and a live dump changing what the analyzer blames."""

from __future__ import annotations

import pytest

from analyzer.engine import Analyzer
from analyzer.overlay import OverlayTables
from netskel.config import AnalyzerConfig
from netskel.model import FlowRule, VSwitchDump, WindowStats
from netskel.ofdump import DumpError
from netskel.probesim import with_overlay
from netskel.topology import parse_topology
from probe_agent.vswitch import parse_dump_flows
from testbed.layout import Layout, layout_doc

DUMP = """\
NXST_FLOW reply (xid=0x4):
 cookie=0x0, duration=41.2s, table=0, n_packets=12, n_bytes=1176, idle_age=3, priority=100,ip,nw_dst=192.168.10.1 actions=output:1
 cookie=0x0, duration=41.1s, table=0, n_packets=9, n_bytes=882, priority=100,ip,nw_dst=192.168.10.2 actions=output:100
 cookie=0x0, duration=41.1s, table=0, n_packets=0, n_bytes=0, priority=50,ip,nw_dst=192.168.10.2 actions=drop
 cookie=0x0, duration=41.0s, table=0, n_packets=0, n_bytes=0, priority=100,tun_id=0x9,ip,nw_dst=10.9.0.3 actions=set_field:10.0.0.7->tun_dst,output:100
 cookie=0x0, duration=41.0s, table=0, n_packets=0, n_bytes=0, priority=100,ip,nw_dst=192.168.10.4 actions=drop
 cookie=0x0, duration=41.0s, table=1, n_packets=0, n_bytes=0, priority=100,ip,nw_dst=192.168.10.5 actions=output:2
 cookie=0x0, duration=41.0s, table=0, n_packets=0, n_bytes=0, priority=0 actions=NORMAL
"""


def test_parse_dump_flows():
    got = parse_dump_flows(DUMP, tunnel_ports=(100,), default_vni=7)
    rules = {(r.vni, r.dst): (r.action, r.to) for r in got.rules}
    assert rules[(7, "192.168.10.1")] == ("deliver", "1")
    assert rules[(7, "192.168.10.2")] == ("tunnel", "")  # priority 100 beats the drop at 50
    assert rules[(7, "192.168.10.4")] == ("drop", "")
    # A probe from a local port carries tun_id 0: the tun_id=9 flow is not its
    # rule, and table 1 is never reached; NORMAL takes both, and the rest.
    assert rules[(7, "10.9.0.3")] == rules[(7, "192.168.10.5")] == ("forward", "NORMAL")
    assert rules[(7, "0.0.0.0/0")] == ("forward", "NORMAL")
    assert got.not_understood == ()


def test_dump_with_ports_from_show_names_the_local_port():
    show = ("OFPT_FEATURES_REPLY (xid=0x2): dpid:0000aa\n"
            " 1(c0e0): addr:aa:bb:cc:dd:ee:01\n     config:     0\n"
            " 100(vx7): addr:aa:bb:cc:dd:ee:02\n LOCAL(br0): addr:aa:bb:cc:dd:ee:03\n")
    got = parse_dump_flows(DUMP, (100,), 7, show)
    assert [p.name for p in got.ports.ports] == ["c0e0", "vx7"] and got.ports.complete
    assert ("deliver", "c0e0") in {(r.action, r.to) for r in got.rules if r.dst == "192.168.10.1"}


def test_garbage_is_one_error():
    with pytest.raises(DumpError):
        parse_dump_flows("garbage\nmore garbage\n", (100,), 7)


LAY = Layout(hosts=4, rails=1, hosts_per_tor=2, spines=1)


def test_live_dump_turns_a_vanished_rule_into_an_overlay_blackhole():
    topo = parse_topology(with_overlay(layout_doc(LAY)))
    eng = Analyzer(topo, AnalyzerConfig())
    a, b = LAY.endpoint(0, 0), LAY.endpoint(1, 0)
    rules = [FlowRule(LAY.vni, LAY.overlay_ip(h, 0), "deliver" if h == 0 else "tunnel")
             for h in range(LAY.hosts) if h != 1]  # host 0 lost its rule for host 1
    dump = VSwitchDump(host=LAY.host(0), ts=0.0, rules=tuple(rules))
    converted = OverlayTables(topo).rules_from_dump(dump)
    assert converted[0].to == a and converted[1].to == LAY.nic(2, 0)
    eng.set_vswitch(dump)
    t0 = 1_700_000_010.0 // 30 * 30
    for k in range(2):
        s = t0 + 30 * k
        eng.add_windows([WindowStats(a, b, s, s + 30, 64, 300, 300)]
                        + [WindowStats(a, LAY.endpoint(h, 0), s, s + 30, 64, 300, 0, 90, 95, 100,
                                       105, 100, 3, 120) for h in (2, 3)])
        eng.tick(s + 35)
    incs = eng.list_incidents()
    assert [(i.component.type, i.component.id, i.layer) for i in incs] == [
        ("vswitch_rule", f"{LAY.host(0)}:{LAY.vni}:{LAY.overlay_ip(1, 0)}", "overlay")]
    eng.set_vswitch(VSwitchDump(host="no-such-host", ts=0.0, rules=()))  # ignored, not a crash
