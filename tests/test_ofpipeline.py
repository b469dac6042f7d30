"""Real `ovs-ofctl dump-flows` outputs written by other projects (Open
vSwitch's own tests, OVN, Antrea, Neutron; ../shared/data/ovs-real, sources
in its SOURCES.md): every file reads without an exception, no forwarding
line is read as a drop, and a few packets per file end where the tables
send them."""

from __future__ import annotations

from pathlib import Path

import pytest

from netskel.ofdump import DumpError, mac_int, read_dump
from netskel.ofpipeline import Outcome, Packet, Pipeline, Port, Ports
from netskel.ofrules import contract_rules, line_rules

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "ovs-real"
FILES = sorted(REAL.glob("*.txt"))


def trace(name: str, pkt: Packet, ports: Ports | None = None, table: int | None = None) -> Outcome:
    return Pipeline(read_dump((REAL / name).read_text()), ports).trace(pkt, table)


def tables(out: Outcome) -> list[int | None]:
    return [s.line for s in out.steps]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_real_dump_reads_and_no_forwarding_line_is_a_drop(path):
    dump = read_dump(path.read_text())
    assert dump.flows
    for rule in line_rules(dump):
        line = path.read_text().splitlines()[rule["line"] - 1]
        actions = line.split("actions=", 1)[1]
        if any(w in actions for w in ("output", "NORMAL", "LOCAL", "IN_PORT", "resubmit",
                                      "goto_table", "group:", "ct(table", "enqueue",
                                      "controller", "CONTROLLER", "set_tunnel")):
            assert rule["action"] != "drop", line
        if actions.strip() == "drop":
            assert rule["action"] == "drop", line


def test_library_gaps_are_covered():
    """Named tables, no match before actions, flag words, packet_type, quoted
    names: the ovs library alone fails on each of these lines."""
    antrea = read_dump((REAL / "antrea_ovs-pipeline_v1.15.txt").read_text())
    assert len(antrea.flows) == 167 and antrea.not_understood == ()
    assert "L3Forwarding" in antrea.table_names
    of15 = read_dump((REAL / "ovs_ofp-print_of15_reply.txt").read_text())
    assert [f.priority for f in of15.flows] == [32768, 4000] and all(f.understood for f in of15.flows)
    nxst = read_dump((REAL / "ovs_ofp-print_nxst_reply.txt").read_text())
    last = nxst.flows[-1]
    assert last.understood and last.table == 1 and last.match == ()
    br2 = read_dump((REAL / "ovs_pta_br-in2.txt").read_text())
    assert [m.value for m in br2.flows[3].match or () if m.field == "packet_type"] == ["1,0x800"]


def test_tabs_between_fields_read_as_spaces():
    """The ovs library's parser loops for ever, allocating, on a tab after a
    value ("table=1\t, priority=1"); to us a tab is whitespace."""
    text = (REAL / "ovs_ofp-print_nxst_reply.txt").read_text()
    tabbed = text.replace(", ", "\t, ").replace(" actions=", "\tactions=")
    assert tabbed != text

    def read(t: str) -> list[tuple[object, ...]]:
        return [(f.line, f.table, f.priority, f.match, f.actions) for f in read_dump(t).flows]
    assert read(tabbed) == read(text)
    one = read_dump("table=1,\tpriority=7,ip,nw_dst=10.0.0.1\tactions=output:2\n")
    assert [(f.table, f.priority, f.understood) for f in one.flows] == [(1, 7, True)]


def test_an_action_we_cannot_interpret_is_an_explicit_unknown():
    nsh = read_dump((REAL / "ovs_nsh_table1.txt").read_text())
    assert [b.why for b in nsh.not_understood] == ["action not interpreted: encap"]
    neutron = read_dump((REAL / "neutron_ovs-firewall_doc.txt").read_text())
    assert neutron.not_understood == ()  # ct_clear is understood
    text = "table=0, priority=5,ip actions=frobnicate(3),output:2\n" \
           "table=0, priority=9,ip,nw_dst=10.0.0.0/8 this is not a flow actions=output:3\n"
    dump = read_dump(text)
    assert [b.line for b in dump.not_understood] == [1, 2]
    out = Pipeline(dump).trace(Packet("10.1.1.1"))
    assert out.end == "unknown" and "line 2" in out.why
    assert Pipeline(dump).trace(Packet("11.1.1.1")).end == "unknown"  # frobnicate


def test_not_a_dump_is_one_error():
    with pytest.raises(DumpError):
        read_dump("Segmentation fault\n")
    with pytest.raises(DumpError):
        read_dump("")
    assert read_dump("NXST_FLOW reply (xid=0x4):\n").flows == ()


def test_l3_overlay_over_gre_tunnels():
    ports = Ports((Port(1020, "gre1020", "tunnel", "10.0.0.2"), Port(1030, "gre1030", "tunnel",
                                                                      "10.0.0.3"),
                   Port(10, "p10")), complete=True)
    out = trace("ovs_pta_br-in1.txt", Packet("192.168.10.20"), ports)
    assert (out.end, out.port, out.remote_ip) == ("tunnel", "gre1020", "10.0.0.2")
    assert trace("ovs_pta_br-in1.txt", Packet("192.168.10.10"), ports).port == "p10"
    assert trace("ovs_pta_br-in1.txt", Packet("10.9.9.9"), ports).end == "drop"
    # Ethernet packets take the `ip` flow, not the packet_type=(1,0x800) one.
    assert trace("ovs_pta_br-in2.txt", Packet("192.168.10.30")).port == 2010
    out = trace("ovs_pta_br-in3.txt", Packet("192.168.10.30"))
    assert (out.end, out.port) == ("deliver", 30)


def test_nsh_table_never_matches_an_ethernet_probe():
    out = trace("ovs_nsh_table1.txt", Packet("192.168.10.30"), table=1)
    assert out.end == "drop" and "table 1" in out.why


def test_goto_table_write_actions_and_group():
    out = trace("ovs_ofproto-dpif_goto_group.txt", Packet("1.1.1.1", in_port=1))
    assert out.end == "unknown" and "group 1234" in out.why and tables(out) == [1, 2, 3]
    # dl_dst unknown: the dl_dst flow may match, so no answer...
    assert trace("ovs_ofproto-dpif_goto_group.txt", Packet("1.1.1.1", in_port=2)).end == "unknown"
    # ...and with it known, a miss.
    out = trace("ovs_ofproto-dpif_goto_group.txt",
                Packet("1.1.1.1", in_port=2, fields={"dl_dst": mac_int("50:54:00:00:00:0b") or 0}))
    assert out.end == "drop"


def test_resubmit_chain_through_eight_tables():
    pkt = Packet("1.2.3.4", in_port=1, fields={"dl_src": mac_int("20:22:22:22:22:22") or 0})
    out = trace("ovs_ofproto-dpif_resubmit_chain.txt", pkt)
    assert (out.end, out.port) == ("leaves", "CONTROLLER")
    assert [s.table for s in out.steps] == list(range(8))


def test_learn_does_not_forward_and_output_to_in_port_is_dropped():
    mac5 = {"dl_src": mac_int("50:54:00:00:00:05") or 0}
    assert trace("ovs_learn.txt", Packet("1.1.1.1", in_port=1, fields=mac5)).port == 3
    other = {"dl_src": mac_int("50:54:00:00:00:06") or 0}
    assert trace("ovs_learn.txt", Packet("1.1.1.1", in_port=1, fields=other)).port == 2
    assert trace("ovs_learn.txt", Packet("1.1.1.1", in_port=2, fields=other)).end == "drop"
    of12 = Packet("1.1.1.1", in_port=2, fields={"dl_dst": mac_int("52:54:00:c3:00:89") or 0,
                                                "nw_tos": 0})
    assert trace("ovs_ofp-print_of12_reply.txt", of12).end == "drop"


def test_normal_and_local_leave_the_model():
    out = trace("ovs_ofp-print_of15_reply.txt", Packet("1.1.1.1", in_port=3))
    assert (out.end, out.port) == ("leaves", "NORMAL")
    assert trace("ovs_ofp-print_of15_reply.txt", Packet("1.1.1.1", in_port=5)).end == "drop"
    out = trace("ovs_pta_br-p123.txt", Packet("20.0.0.1", in_port=2))
    assert (out.end, out.port) == ("leaves", "LOCAL")
    assert trace("ovs_pta_br-p123.txt", Packet("20.0.0.1", in_port="LOCAL")).port == 2
    assert trace("ovs_tunnel-push-pop_br0.txt", Packet("1.1.2.92", in_port=1)).end == "drop"


def test_conntrack_recirculation_and_zones():
    out = trace("ovs_systraffic_ct_zone.txt", Packet("10.1.1.1", in_port=2))
    assert (out.end, out.port) == ("deliver", 1) and [s.table for s in out.steps] == [0, 1, 2]
    assert trace("ovs_systraffic_ct_zone.txt", Packet("10.1.1.2", in_port=1)).port == 2
    # ct(table=0) then +trk: the in_port=1 flow sends it on; port 2 has no UDP flow.
    assert trace("ovs_systraffic_nat_arp.txt", Packet("10.1.1.2", in_port=1)).port == 2
    assert trace("ovs_systraffic_nat_arp.txt", Packet("10.1.1.1", in_port=2)).end == "drop"
    # Committed in zone 42: later packets are +est, and only replies have a flow.
    assert trace("ovs_systraffic_resets.txt", Packet("10.1.1.2", in_port=1)).end == "drop"
    back = trace("ovs_systraffic_resets.txt", Packet("10.1.1.1", in_port=2, reply=True))
    assert (back.end, back.port) == ("deliver", 1)


def test_protocol_and_unknown_fields():
    assert trace("ovs_ofp-print_nxst_reply.txt", Packet("192.168.0.2", in_port=3)).end == "drop"
    tcp = trace("ovs_ofp-print_nxst_reply.txt", Packet("192.168.0.2", in_port=3, proto="tcp"))
    assert tcp.end == "unknown" and "dl_src" in tcp.why
    icmp = Packet("192.168.0.2", in_port=1, proto="icmp", src="192.168.0.1",
                  fields={"dl_src": mac_int("50:54:00:00:00:05") or 0,
                          "dl_dst": mac_int("50:54:00:00:00:06") or 0, "nw_tos": 0,
                          "icmp_type": 8, "icmp_code": 0})
    assert trace("ovs_ofp-print_of10_reply.txt", icmp).end != "unknown"


OVN = Ports((Port(1, "ovn-k8s-mp0"), Port(2, "patch-br-int-to", "patch"),
             Port(3, "ovn-6bb3b3-0", "tunnel")))


def test_ovn_table_zero_follows_to_table_eight_and_forty():
    out = trace("ovs_doc_flow-visualization_ovn.txt", Packet("10.0.0.5", in_port="ovn-k8s-mp0"), OVN)
    assert out.end == "drop" and [s.table for s in out.steps] == [0, 8]  # the excerpt ends at 0
    out = trace("ovs_doc_flow-visualization_ovn.txt", Packet("10.0.0.5", in_port=3, vni=5), OVN)
    assert [s.table for s in out.steps] == [0, 40]
    # The conjunctive flow (conj_id=100) matches from the patch port: both clauses hold.
    out = trace("ovs_doc_flow-visualization_ovn.txt", Packet("10.0.0.5", in_port=2), OVN)
    assert out.steps[0].line == 2


ANTREA = Ports((Port(1, "antrea-tun0", "tunnel"), Port(2, "antrea-gw0", "uplink"),
                Port(0x24, "client-6-3353ef"), Port(0x25, "web-7975-274540"),
                Port(0x26, "db-755c6-5080e3")))
CLIENT = {"dl_src": mac_int("5e:b5:e3:a6:90:b7") or 0}


def test_antrea_pod_to_remote_pod_is_tunnelled_to_its_node():
    pkt = Packet("10.10.1.5", in_port="client-6-3353ef", src="10.10.0.26", fields=CLIENT)
    out = trace("antrea_ovs-pipeline_v1.15.txt", pkt, ANTREA)
    assert (out.end, out.port, out.remote_ip) == ("tunnel", "antrea-tun0", "192.168.77.103")
    assert len(out.steps) > 10


def test_antrea_tunnel_to_local_pod_and_spoofguard_and_policy():
    pkt = Packet("10.10.0.26", in_port="antrea-tun0", src="10.10.1.5", vni=0)
    out = trace("antrea_ovs-pipeline_v1.15.txt", pkt, ANTREA)
    assert (out.end, out.port) == ("deliver", "client-6-3353ef")
    spoofed = Packet("10.10.1.5", in_port="client-6-3353ef", src="10.10.0.99", fields=CLIENT)
    out = trace("antrea_ovs-pipeline_v1.15.txt", spoofed, ANTREA)
    assert out.end == "drop" and out.steps[-1].text.startswith("table=SpoofGuard, priority=0")
    # The example policy drops everything toward web but TCP 80 (conjunction 4).
    to_web = Packet("10.10.0.24", in_port="client-6-3353ef", src="10.10.0.26",
                    fields={**CLIENT, "dl_dst": mac_int("fa:b7:53:74:21:a6") or 0})
    out = trace("antrea_ovs-pipeline_v1.15.txt", to_web, ANTREA)
    assert out.end == "drop" and "reg3=0x4 actions=drop" in out.steps[-1].text


def test_neutron_firewall_from_table_60():
    vm1 = Packet("192.168.0.2", in_port=1, src="192.168.0.1",
                 fields={"dl_src": mac_int("fa:16:3e:a4:22:10") or 0, "tp_src": 40000,
                         "tp_dst": 7000})
    out = trace("neutron_ovs-firewall_doc.txt", vm1, table=60)
    assert [s.table for s in out.steps][:3] == [60, 71, 72] and out.end != "unknown"
    spoofed = Packet("192.168.0.2", in_port=1, src="10.9.9.9",
                     fields={"dl_src": mac_int("fa:16:3e:a4:22:10") or 0, "tp_src": 40000,
                             "tp_dst": 7000})
    out = trace("neutron_ovs-firewall_doc.txt", spoofed, table=60)
    assert out.end == "drop"


def test_contract_rules_of_a_prefix_table():
    text = ("table=0, priority=10,ip,nw_dst=10.1.0.0/16 actions=set_field:192.0.2.9->tun_dst,"
            "output:100\n"
            "table=0, priority=20,ip,nw_dst=10.1.2.3 actions=output:1\n"
            "table=0, priority=30,ip,nw_dst=10.1.2.4 actions=drop\n"
            "table=0, priority=0 actions=NORMAL\n")
    pipe = Pipeline(read_dump(text), Ports((Port(100, "vx", "tunnel"), Port(1, "c1")), True))
    got = {(r.dst, r.action, r.to) for r in contract_rules(pipe, [7])}
    assert got == {("10.1.0.0/16", "tunnel", "192.0.2.9"), ("10.1.2.3", "deliver", "c1"),
                   ("10.1.2.4", "drop", ""), ("0.0.0.0/0", "forward", "NORMAL")}
