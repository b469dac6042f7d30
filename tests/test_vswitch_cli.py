"""`netskel vswitch parse|trace` on real dumps, as the network team runs
it; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from netskel.cli import main

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "ovs-real"
SHOW = """OFPT_FEATURES_REPLY (xid=0x2): dpid:00001a2b3c4d5e6f
n_tables:254, n_buffers:0
 1(antrea-tun0): addr:aa:bb:cc:00:00:01
     config:     0
 2(antrea-gw0): addr:aa:bb:cc:00:00:02
 36(client-6-3353ef): addr:aa:bb:cc:00:00:24
 37(web-7975-274540): addr:aa:bb:cc:00:00:25
 LOCAL(br-int): addr:aa:bb:cc:00:00:00
"""


def run(capsys, *argv: str) -> tuple[int, dict | str]:
    rc = main(["vswitch", *argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else err)


def test_parse_keeps_every_line_with_its_fields(capsys):
    rc, doc = run(capsys, "parse", "--dump", str(REAL / "antrea_ovs-pipeline_v1.15.txt"))
    assert rc == 0 and doc["not_understood"] == []
    assert len(doc["rules"]) == 167
    by_line = {r["line"]: r for r in doc["rules"]}
    assert by_line[83]["dst"] == "10.10.1.0/24" and by_line[83]["table"] == "L3Forwarding"
    assert by_line[83]["next"] == ["L3DecTTL"] and by_line[83]["action"] == "unknown"
    assert by_line[3]["action"] == "drop" and by_line[3]["priority"] == 0
    assert by_line[163]["action"] == "forward" and by_line[163]["to"] == "IN_PORT"
    assert by_line[12]["match"]["in_port"] == "antrea-gw0"


def test_parse_lists_what_it_did_not_understand(capsys):
    rc, doc = run(capsys, "parse", "--dump", str(REAL / "ovs_nsh_table1.txt"))
    assert rc == 0 and [(b["line"], b["why"]) for b in doc["not_understood"]] == [
        (1, "action not interpreted: encap")]


def test_trace_through_antrea_with_ports_from_show(capsys, tmp_path):
    (tmp_path / "show.txt").write_text(SHOW)
    rc, doc = run(capsys, "trace", "--dump", str(REAL / "antrea_ovs-pipeline_v1.15.txt"),
                  "--ports", str(tmp_path / "show.txt"), "--tunnel-port", "1",
                  "--dst", "10.10.1.5", "--src", "10.10.0.26", "--in-port", "client-6-3353ef",
                  "--field", "dl_src=5e:b5:e3:a6:90:b7")
    assert rc == 0 and (doc["end"], doc["port"], doc["remote_ip"]) == (
        "tunnel", "antrea-tun0", "192.168.77.103")
    assert doc["path"][0]["table"] == "PipelineRootClassifier"
    assert doc["path"][-1]["flow"].endswith("actions=output:NXM_NX_REG1[]")


def test_trace_from_a_named_or_numbered_table(capsys):
    rc, doc = run(capsys, "trace", "--dump", str(REAL / "ovs_nsh_table1.txt"), "--dst",
                  "192.168.10.30", "--table", "1")
    assert rc == 0 and doc["end"] == "drop"


@pytest.mark.parametrize("argv, says", [
    (["parse", "--dump", "/no/such/file"], "cannot read"),
    (["trace", "--dump", "{garbage}", "--dst", "10.0.0.1"], "not ovs-ofctl dump-flows output"),
    (["trace", "--dump", "{good}", "--dst", "10.0.0"], "not an IPv4 address"),
    (["trace", "--dump", "{good}", "--dst", "10.0.0.1", "--table", "Nope"], "no such table"),
    (["trace", "--dump", "{good}", "--dst", "10.0.0.1", "--field", "dl_src=zz"], "--field"),
    (["trace", "--dump", "{good}", "--dst", "10.0.0.1", "--tunnel-port", "x=1"], "--tunnel-port"),
    (["parse", "--dump", "{good}", "--ports", "{garbage}"], "no port lines"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, says):
    (tmp_path / "garbage").write_bytes(b"\xff\xfe garbage \x00\n")
    files = {"garbage": str(tmp_path / "garbage"), "good": str(REAL / "ovs_pta_br-in1.txt")}
    rc, err = run(capsys, *[a.format(**files) for a in argv])
    assert rc == 2 and says in err and len(str(err).strip().splitlines()) == 1


DPCTL = Path(__file__).resolve().parent / "data" / "dpctl"


def test_datapath_flows_as_rules_of_their_input_ports(capsys):
    rc, doc = run(capsys, "datapath", "--dump", str(DPCTL / "netdev-ovs3.1.txt"),
                  "--tunnel-port", "vx7", "--vni", "7")
    assert rc == 0 and (doc["flows"], doc["skipped"]) == (4, 2)
    assert [(r["port"], r["from_tunnel"], r["dst"], r["action"], r["to"]) for r in doc["rules"]] == [
        ("vx7", True, "192.168.10.1", "deliver", "c0e0"),
        ("c0e0", False, "192.168.10.2", "tunnel", "")]


def test_a_route_first_cache_reports_its_continuations_as_followed(capsys):
    rc, doc = run(capsys, "datapath", "--dump", str(DPCTL / "netdev-ovs3.1-route-first.txt"),
                  "--tunnel-port", "vx7", "--vni", "7")
    assert rc == 0 and (doc["flows"], doc["skipped"], doc["followed"], len(doc["rules"])) == (
        4, 0, 2, 2)


@pytest.mark.parametrize(("content", "says"), [
    (b"\xff\xfe garbage \x00\n", "not ovs-appctl dpctl/dump-flows output"),
    (None, "cannot read"),
])
def test_datapath_bad_input_is_one_line_and_exit_2(capsys, tmp_path, content, says):
    path = tmp_path / "dp.txt"
    if content is not None:
        path.write_bytes(content)
    rc, err = run(capsys, "datapath", "--dump", str(path))
    assert rc == 2 and says in err and len(str(err).strip().splitlines()) == 1
