"""Datapath flows (`ovs-appctl dpctl/dump-flows -m --names`) read as rules,
and a NIC whose flows disagree with its switch named live. The netdev
lines (tests/data/dpctl) are Open vSwitch 3.1's own output on the
testbed; the TC lines and actions are written in the grammar
`dpctl/parse-actions` prints (no NIC here offloads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.engine import Analyzer
from analyzer.overlay import OverlayTables
from netskel.config import AnalyzerConfig
from netskel.dpflows import DatapathError, _int, _ipv4_dst, key_fields, read_datapath, split_top
from netskel.model import DatapathRule, FlowRule, VSwitchDump, WindowStats
from netskel.topology import parse_topology
from testbed.layout import Layout, layout_doc

DATA = Path(__file__).parent / "data" / "dpctl"
NETDEV = (DATA / "netdev-ovs3.1.txt").read_text()  # recorded on the testbed (4 of its flows)
# Recorded on the testbed with its route-first pipeline (routing, then conntrack).
ROUTE_FIRST = (DATA / "netdev-ovs3.1-route-first.txt").read_text()
TC = (DATA / "tc-offloaded.txt").read_text()       # written in TC offload's grammar


def _rules(text: str, tunnels: frozenset[str] = frozenset({"vx7"})) -> list[tuple]:
    got = read_datapath(text, tunnels, 7)
    return [(f.port, f.from_tunnel, f.rule.vni, f.rule.dst, f.rule.action, f.rule.to)
            for f in got.rules]


def test_netdev_dump_terminal_ipv4_flows_become_rules():
    got = read_datapath(NETDEV, frozenset({"vx7"}), 7)
    assert (got.flows, got.skipped) == (4, 2)  # IPv6 neighbour drop; the pre-conntrack recirc
    assert _rules(NETDEV) == [("vx7", True, 7, "192.168.10.1", "deliver", "c0e0"),
                              ("c0e0", False, 7, "192.168.10.2", "tunnel", "")]


def test_without_naming_the_tunnel_port_its_output_is_a_delivery():
    assert ("c0e0", False, 7, "192.168.10.2", "deliver", "vx7") in _rules(NETDEV, frozenset())


def test_offloaded_tc_flows_carry_their_tunnel_key_and_outer_address():
    assert _rules(TC, frozenset()) == [
        ("pf0vf0", False, 7, "192.168.3.9", "tunnel", "10.0.0.2"),
        ("vxlan_sys_4789", True, 7, "192.168.3.1", "deliver", "pf0vf0")]


def test_userspace_tunnel_push_is_a_tunnel_to_its_header_address():
    line = ("recirc_id(0),in_port(c0e0),eth_type(0x0800),ipv4(dst=192.168.3.9,frag=no), "
            "packets:1, bytes:98, used:0.1s, actions:tnl_push(tnl_port(4789),header(size=50,"
            "type=4,eth(dst=02:00:00:00:00:02,src=02:00:00:00:00:01,dl_type=0x0800),ipv4(src="
            "10.0.0.1,dst=10.0.0.2,proto=17,tos=0,ttl=64,frag=0x4000),udp(src=0,dst=4789,csum=0x0),"
            "vxlan(flags=0x8000000,vni=0x9)),out_port(100))\n")
    assert _rules(line) == [("c0e0", False, 9, "192.168.3.9", "tunnel", "10.0.0.2")]


@pytest.mark.parametrize(("dst", "want"), [
    ("192.168.3.0/255.255.255.0", "192.168.3.0/24"),
    ("192.168.3.7/255.255.255.255", "192.168.3.7"),
    ("192.168.3.7/0.0.0.0", None),             # not looked at: no destination's fate
    ("192.168.3.7/255.0.255.0", None),         # not a prefix
])
def test_destination_masks(dst, want):
    line = f"recirc_id(0),in_port(c0e0),eth_type(0x0800),ipv4(dst={dst}), actions:drop\n"
    got = _rules(line)
    assert got == ([("c0e0", False, 7, want, "drop", "")] if want else [])


def test_bare_word_actions_are_not_output_ports():
    line = ("recirc_id(0),in_port(vx7),eth_type(0x0800),ipv4(dst=192.168.3.1), "
            "actions:ct_clear,pop_vlan,c0e0\n")
    assert _rules(line) == [("vx7", True, 7, "192.168.3.1", "deliver", "c0e0")]


@pytest.mark.parametrize("actions", [
    "clone(set(ipv4(dst=1.2.3.4)),c0e1),c0e0",   # branches
    "c0e0,c0e1",                                 # floods
    "userspace(pid=0,slow_path(controller))",    # the slow path decides
])
def test_flows_that_are_not_one_rules_effect_are_skipped(actions):
    line = f"recirc_id(0),in_port(vx7),eth_type(0x0800),ipv4(dst=192.168.3.1), actions:{actions}\n"
    got = read_datapath(line, frozenset({"vx7"}), 7)
    assert (got.flows, got.skipped, got.rules) == (1, 1, ())


def test_empty_and_header_only_dumps_hold_nothing_and_garbage_is_one_error():
    assert read_datapath("", frozenset(), 7).rules == ()
    assert read_datapath("flow-dump from pmd on cpu core: 3\n", frozenset(), 7).flows == 0
    with pytest.raises(DatapathError):
        read_datapath("ovs-vswitchd: no such datapath\n", frozenset(), 7)


def _key_by_full_parse(key: str) -> tuple:
    """The slow reference: every top-level field parsed."""
    eth_type, in_port, dst, tunnel, tun_id = None, "", None, False, None
    for tok in split_top(key):
        name, _, args = tok.partition("(")
        args = args[:-1] if tok.endswith(")") else None
        if args is None or "(" in name:
            continue
        fields = dict(p.partition("=")[::2] for p in split_top(args))
        if name == "eth_type":
            eth_type = _int(args)
        elif name == "in_port":
            in_port = args
        elif name == "ipv4" and "dst" in fields:
            dst = _ipv4_dst(fields["dst"])
        elif name == "tunnel":
            tunnel, tun_id = True, _int(fields.get("tun_id", ""))
    return eth_type, in_port, dst, tunnel, tun_id


def test_routing_before_conntrack_is_read_through_the_recirculation():
    """OVN's stage order: the destination is matched before `recirc`, the
    output after it by a flow that matches no destination."""
    got = read_datapath(ROUTE_FIRST, frozenset({"vx7"}), 7)
    # The two continuations say nothing alone, but each judged flow was read
    # through one: followed, not skipped (an operator reads skipped flows
    # as a cache the reader could not judge).
    assert (got.flows, got.skipped, got.followed) == (4, 0, 2)
    assert sorted(_rules(ROUTE_FIRST)) == [("c0e0", False, 7, "192.168.10.2", "tunnel", ""),
                                          ("vx7", True, 7, "192.168.10.1", "deliver", "c0e0")]


def _chain(*continuations: str, head: str = "ct(zone=3),recirc(0x5)",
           dst: str = "192.168.3.9") -> str:
    lines = [f"recirc_id(0),in_port(pf0vf1),eth_type(0x0800),ipv4(dst={dst},frag=no), "
             f"packets:9, bytes:900, used:0.1s, actions:{head}"]
    lines += continuations
    return "\n".join(lines) + "\n"


_TO_TUNNEL = ("ct_state(+est+trk),recirc_id(0x5),in_port(pf0vf1),eth_type(0x0800),"
              "ipv4(frag=no), actions:set(tunnel(tun_id=0x9,dst=10.0.0.2,ttl=64,tp_dst=4789,"
              "flags(df|key))),vxlan_sys_4789")


@pytest.mark.parametrize(("continuations", "want"), [
    ([_TO_TUNNEL], ("tunnel", "10.0.0.2", 9)),
    # new and established connections go the same way: one fate
    ([_TO_TUNNEL, _TO_TUNNEL.replace("+est+trk", "+new+trk")], ("tunnel", "10.0.0.2", 9)),
    # invalid ones are dropped: says nothing of valid traffic (symbolic and -m forms)
    ([_TO_TUNNEL, "ct_state(-new+inv+trk),recirc_id(0x5),in_port(pf0vf1),eth_type(0x0800),"
                  "ipv4(frag=no), actions:drop"], ("tunnel", "10.0.0.2", 9)),
    ([_TO_TUNNEL, "ct_state(0x30/0x30),recirc_id(0x5),in_port(pf0vf1),eth_type(0x0800),"
                  "ipv4(frag=no), actions:drop"], ("tunnel", "10.0.0.2", 9)),
    # a continuation that drops valid traffic is the fate
    (["ct_state(+est+trk),recirc_id(0x5),in_port(pf0vf1),eth_type(0x0800),ipv4(frag=no), "
      "actions:drop"], ("drop", "", 7)),
    # two recirculations (conntrack, then NAT)
    (["ct_state(+trk),recirc_id(0x5),in_port(pf0vf1),eth_type(0x0800),ipv4(frag=no), "
      "actions:ct(zone=3,nat),recirc(0x6)",
      "ct_state(+trk),recirc_id(0x6),in_port(pf0vf1),eth_type(0x0800),ipv4(frag=no), "
      "actions:ct_clear,pf0vf2"], ("deliver", "pf0vf2", 7)),
    # a continuation that covers the destination applies; one for another does not
    ([_TO_TUNNEL.replace("ipv4(frag=no)", "ipv4(dst=192.168.3.0/255.255.255.0,frag=no)"),
      _TO_TUNNEL.replace("ipv4(frag=no)", "ipv4(dst=192.168.4.1,frag=no)")
                .replace("vxlan_sys_4789", "pf0vf3").replace("set(", "xset(")],
     ("tunnel", "10.0.0.2", 9)),
])
def test_a_recirculating_flow_takes_its_continuations_one_fate(continuations, want):
    got = read_datapath(_chain(*continuations), frozenset({"vxlan_sys_4789"}), 7)
    rules = [(f.port, f.from_tunnel, f.rule.dst, f.rule.action, f.rule.to, f.rule.vni)
             for f in got.rules if f.rule.dst == "192.168.3.9"]  # (some continuations are rules too)
    assert rules == [("pf0vf1", False, "192.168.3.9", *want[:2], want[2])]


def test_only_continuations_a_judged_flow_was_read_through_count_as_followed():
    invalid = ("ct_state(-new+inv+trk),recirc_id(0x5),in_port(pf0vf1),eth_type(0x0800),"
               "ipv4(frag=no), actions:drop")
    other_port = _TO_TUNNEL.replace("in_port(pf0vf1)", "in_port(pf0vf2)")
    got = read_datapath(_chain(_TO_TUNNEL, invalid, other_port), frozenset({"vxlan_sys_4789"}), 7)
    assert len(got.rules) == 1
    assert (got.flows, got.followed, got.skipped) == (4, 1, 2)


@pytest.mark.parametrize("continuations", [
    [],                                                                    # not held
    [_TO_TUNNEL.replace("in_port(pf0vf1)", "in_port(pf0vf2)")],            # another port's
    [_TO_TUNNEL.replace("recirc_id(0x5)", "recirc_id(0x7)")],              # another id's
    [_TO_TUNNEL, _TO_TUNNEL.replace("+est+trk", "+new+trk")               # they disagree
     .replace("vxlan_sys_4789", "pf0vf2").replace("set(", "xset(")],
    [_TO_TUNNEL.replace("actions:", "actions:clone(pf0vf3),")],            # it branches
    ["ct_state(+trk),recirc_id(0x5),in_port(pf0vf1),eth_type(0x0800),ipv4(frag=no), "
     "actions:recirc(0x5)"],                                               # a loop
])
def test_a_recirculation_without_one_valid_fate_is_skipped(continuations):
    got = read_datapath(_chain(*continuations), frozenset({"vxlan_sys_4789"}), 7)
    assert (got.rules, got.flows, got.skipped) == ((), 1 + len(continuations),
                                                  1 + len(continuations))


def test_a_flow_that_outputs_before_it_recirculates_is_skipped():
    got = read_datapath(_chain(_TO_TUNNEL, head="pf0vf3,ct(zone=3),recirc(0x5)"),
                        frozenset({"vxlan_sys_4789"}), 7)
    assert got.rules == ()


def test_key_patterns_agree_with_a_full_parse():
    keys = [line.partition("actions:")[0].split(", packets:")[0].partition(", ")[2]
            for line in (NETDEV + TC).splitlines() if "actions:" in line]
    keys += ["tunnel(tun_id=0x9/0xffffffff,src=10.0.0.2,dst=10.0.0.1,flags(-df+csum+key)),"
             "in_port(vx7),eth_type(0x0800),ipv4(src=1.1.1.1,dst=192.168.3.0/255.255.255.0)",
             "in_port(1),eth_type(0x86dd),ipv6(dst=::1)", "eth_type(0x0800),ipv4(proto=17)"]
    assert len(keys) == 9
    for key in keys:
        assert key_fields(key) == _key_by_full_parse(key), key


def test_split_top_keeps_nested_parentheses():
    assert split_top("a(b,c(d,e)),f,g(h)") == ["a(b,c(d,e))", "f", "g(h)"]


# -- the analyzer's side ----------------------------------------------------------
LAY = Layout(hosts=3, rails=2, hosts_per_tor=2, spines=1)


def _switch(h: int) -> tuple[FlowRule, ...]:
    """Host h's tables as the agent reads the testbed's: deliveries to the
    local ports c0eR, everything else into the tunnel device."""
    return tuple(FlowRule(LAY.vni, LAY.overlay_ip(h2, r), "deliver" if h2 == h else "tunnel",
                          f"c0e{r}" if h2 == h else "")
                 for h2 in range(LAY.hosts) for r in range(LAY.rails))


def _out(dst_h: int, action: str = "tunnel", to: str = "") -> DatapathRule:
    return DatapathRule("c0e0", False, FlowRule(LAY.vni, LAY.overlay_ip(dst_h, 0), action, to))


IN_OK = DatapathRule("vx7", True, FlowRule(LAY.vni, LAY.overlay_ip(0, 0), "deliver", "c0e0"))


def _tables(*datapath: DatapathRule | None) -> OverlayTables:
    t = OverlayTables(parse_topology(layout_doc(LAY)))
    for h in range(LAY.hosts):
        t.set_host(VSwitchDump(LAY.host(h), 0.0, _switch(h)))
    for dp in datapath:
        t.set_host(VSwitchDump(LAY.host(0), 0.0, _switch(0),
                               datapath=None if dp is None else (IN_OK, dp)))
    return t


def _trip(t: OverlayTables, r: int = 0) -> tuple[str, str | None]:
    got = t.round_trip(LAY.endpoint(0, r), LAY.endpoint(1, r))
    return got.kind, got.nic


@pytest.mark.parametrize(("name", "flow"), [
    ("dropped", _out(1, "drop")),
    ("tunnelled to another NIC", _out(1, "tunnel", LAY.underlay_ip(2, 0))),
    ("delivered to a local port", _out(1, "deliver", "c0e1")),
])
def test_a_flow_disagreeing_with_the_switch_names_the_nic_it_leaves_by(name, flow):
    assert _trip(_tables(_out(1))) == ("ok", None)
    assert _trip(_tables(flow)) == ("nic", LAY.nic(0, 0)), name
    assert _trip(_tables(flow), r=1) == ("ok", None)  # the host's other NIC holds nothing wrong


def test_an_arriving_flow_to_the_wrong_port_names_the_receiving_nic():
    t = OverlayTables(parse_topology(layout_doc(LAY)))
    for h in range(LAY.hosts):
        t.set_host(VSwitchDump(LAY.host(h), 0.0, _switch(h)))
    wrong = DatapathRule("vx7", True, FlowRule(LAY.vni, LAY.overlay_ip(0, 0), "deliver", "c0e1"))
    t.set_host(VSwitchDump(LAY.host(0), 0.0, _switch(0), datapath=(wrong,)))
    got = t.round_trip(LAY.endpoint(1, 0), LAY.endpoint(0, 0))
    assert (got.kind, got.nic) == ("nic", LAY.nic(0, 0))


def test_a_cache_says_nothing_of_what_it_does_not_hold_and_the_last_read_stands():
    assert _trip(_tables(_out(2))) == ("ok", None)  # nothing cached toward host 1: fine
    # One of two megaflows for the destination drops: that one is the NIC's fault.
    t = _tables(None)
    t.set_host(VSwitchDump(LAY.host(0), 0.0, _switch(0), datapath=(_out(1), _out(1, "drop"))))
    assert _trip(t) == ("nic", LAY.nic(0, 0))
    t.set_host(VSwitchDump(LAY.host(0), 0.0, _switch(0)))  # datapath not read: stays
    assert _trip(t) == ("nic", LAY.nic(0, 0))
    t.set_host(VSwitchDump(LAY.host(0), 0.0, _switch(0), datapath=()))  # read, nothing held
    assert _trip(t) == ("ok", None)


def _dumps(eng: Analyzer, datapath: tuple[DatapathRule, ...] | None) -> None:
    """Every host's tables as its agent sends them; host 0's datapath read too."""
    for h in range(LAY.hosts):
        eng.set_vswitch(VSwitchDump(LAY.host(h), 0.0, _switch(h),
                                    datapath=datapath if h == 0 else None))


def test_a_nic_with_a_stale_flow_is_the_incident_not_its_link():
    """Every probe of one pair lost: with the datapath read, the NIC whose
    flow drops them; without it, the network's vote could only guess."""
    def incidents(datapath: tuple[DatapathRule, ...] | None) -> list[tuple[str, str, str]]:
        eng = Analyzer(parse_topology(layout_doc(LAY)), AnalyzerConfig())
        _dumps(eng, datapath)
        a, b = LAY.endpoint(0, 0), LAY.endpoint(1, 0)
        t0 = 1_700_000_010.0 // 30 * 30
        for k in range(2):
            s = t0 + 30 * k
            eng.add_windows([WindowStats(a, b, s, s + 30, 64, 300, 300)]
                            + [WindowStats(x, y, s, s + 30, 64, 300, 0, 90, 95, 100, 105, 100, 3,
                                           120)
                               for x, y in [(a, LAY.endpoint(2, 0)),
                                            (LAY.endpoint(1, 0), LAY.endpoint(2, 0))]])
            eng.tick(s + 35)
        return [(i.component.type, i.component.id, i.layer) for i in eng.list_incidents()]

    assert incidents((IN_OK, _out(1, "drop"))) == [("nic", LAY.nic(0, 0), "nic")]
    assert ("nic", LAY.nic(0, 0), "nic") not in incidents(None)


def test_the_same_dump_again_leaves_the_tables_and_traces_alone():
    """Every agent of a host sends its table, and each again after a while:
    the analyzer applies a dump only when it differs."""
    t = _tables(_out(1))
    before = t.trace(LAY.endpoint(0, 0), LAY.endpoint(1, 0))  # cached until the tables change
    t.set_host(VSwitchDump(LAY.host(0), 5.0, _switch(0), datapath=(IN_OK, _out(1))))
    t.set_host(VSwitchDump(LAY.host(0), 6.0, _switch(0)))  # datapath not read: the same too
    assert t.trace(LAY.endpoint(0, 0), LAY.endpoint(1, 0)) is before
    t.set_host(VSwitchDump(LAY.host(0), 7.0, _switch(0), datapath=(IN_OK, _out(1, "drop"))))
    assert _trip(t) == ("nic", LAY.nic(0, 0))


def test_a_slow_host_after_its_nics_stale_flow_is_its_own_incident():
    """A NIC's stale flow dropped one pair's probes; the tables are right
    again, and from then on the whole host is slow (CI once: an incident
    that stayed open 150 s after its fault). A stale flow decides where a
    flow's packets go, not how fast they arrive: the slow host is an
    incident of its own, and the NIC's closes once its pair stops losing."""
    eng = Analyzer(parse_topology(layout_doc(LAY)), AnalyzerConfig())
    pairs = [(LAY.endpoint(a, r), LAY.endpoint(b, r)) for r in range(LAY.rails)
             for a in range(LAY.hosts) for b in range(a + 1, LAY.hosts)]
    dropped = (LAY.endpoint(0, 0), LAY.endpoint(1, 0))
    host0 = {p for p in pairs if LAY.endpoint(0, 0) in p or LAY.endpoint(0, 1) in p}
    t0 = 1_700_000_010.0 // 30 * 30
    _dumps(eng, (IN_OK, _out(1, "drop")))
    for k in range(28):  # ten healthy windows, two lossy, then the host slow
        s = t0 + 30 * k
        if k == 12:
            _dumps(eng, (IN_OK, _out(1)))
        us = 200 if k >= 12 else 100
        eng.add_windows([WindowStats(*p, s, s + 30, 64, 300, 300) if k in (10, 11) and p == dropped
                         else WindowStats(*p, s, s + 30, 64, 300, 0, us - 10, us - 5, us, us + 5,
                                          us, 3, us + 20) if p in host0
                         else WindowStats(*p, s, s + 30, 64, 300, 0, 90, 95, 100, 105, 100, 3, 120)
                         for p in pairs])
        eng.tick(s + 35)
    got = {(i.component.type, i.component.id): i for i in eng.list_incidents()}
    assert set(got) == {("nic", LAY.nic(0, 0)), ("host", LAY.host(0))}
    nic, host = got[("nic", LAY.nic(0, 0))], got[("host", LAY.host(0))]
    assert nic.end == t0 + 12 * 30, "the NIC's incident ends where its pair stopped losing"
    assert (host.symptom, host.end, host.start) == ("latency", None, t0 + 12 * 30)
