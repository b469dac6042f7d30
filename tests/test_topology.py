import copy
import json

import pytest

from netskel.errors import InputError
from netskel.topology import link_id, load_topology, parse_topology, topology_to_doc


def test_loads_layout_and_relations_come_from_fields(topo_doc):
    topo = parse_topology(topo_doc)
    assert len(topo.hosts) == 4 and len(topo.nics) == 8
    assert topo.nic_of("job7-w002/rnic1").rail == 1
    assert topo.host_of_endpoint("job7-w002/rnic1") == "h0002"
    assert link_id("tor-r0-0", "h0000/rnic0") in topo.links
    assert topo.jobs() == ["job7"]


def test_round_trip(topo_doc):
    topo = parse_topology(topo_doc)
    again = parse_topology(topology_to_doc(topo))
    assert again.links == topo.links and again.endpoints == topo.endpoints


def test_ids_are_opaque(topo_doc):
    """A NIC whose id does not start with its host id still belongs to it."""
    doc = copy.deepcopy(topo_doc)
    doc["hosts"][0]["nics"][0]["id"] = "weird~nic"
    for link in doc["links"]:
        if link["a"] == "h0000/rnic0":
            link["a"] = "weird~nic"
    doc["containers"][0]["endpoints"][0]["nic"] = "weird~nic"
    topo = parse_topology(doc)
    assert topo.nics["weird~nic"].host == "h0000"
    assert topo.links[link_id("weird~nic", "tor-r0-0")] == ("weird~nic", "tor-r0-0")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(version=2), "version"),
    (lambda d: d["links"].append({"a": "h0000/rnic0", "b": "nowhere"}), "unknown link end 'nowhere'"),
    (lambda d: d["switches"].append({"id": "tor-x", "tier": "tor"}), "has no 'rail'"),
    (lambda d: d["switches"].append({"id": "sw", "tier": "agg"}), "'agg' is not one of"),
    (lambda d: d["containers"][0]["endpoints"][0].update(nic="h0001/rnic0"), "is on host 'h0001'"),
    (lambda d: d["hosts"].append({"id": "h0000", "nics": []}), "duplicate id 'h0000'"),
    (lambda d: d["links"].append({"a": "h0000/rnic0", "b": "spine-0"}), "NICs attach to ToRs"),
    (lambda d: d["hosts"][1]["nics"][0].update(rail=-1), "non-negative integer"),
    (lambda d: d.pop("links"), "missing required field 'links'"),
])
def test_bad_topology_names_the_problem(topo_doc, mutate, message):
    doc = copy.deepcopy(topo_doc)
    mutate(doc)
    with pytest.raises(InputError, match=message):
        parse_topology(doc, "t.json")


def test_bad_files(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("{\"version\": 1, ")
    with pytest.raises(InputError, match=r"t.json: malformed JSON at line 1"):
        load_topology(p)
    p.write_text("")
    with pytest.raises(InputError, match="empty file"):
        load_topology(p)
    with pytest.raises(InputError, match="cannot read"):
        load_topology(tmp_path / "missing.json")
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8"):
        load_topology(p)
    p.write_text(json.dumps([1, 2]))
    with pytest.raises(InputError, match="expected an object"):
        load_topology(p)


@pytest.mark.parametrize("field, bad, message", [
    ("vni", True, "vni: expected a non-negative integer"),
    ("vni", 1.0, "vni: expected a non-negative integer"),
    ("priority", True, "priority: expected an integer"),
    ("priority", 1.0, "priority: expected an integer"),
])
def test_a_repeated_rule_is_still_checked_by_type(field, bad, message):
    """Rules repeat in every NIC's offloaded copy and are validated once
    per distinct rule (a copy of the host's whole table once per table); a
    copy whose VNI or priority equals a valid one's but is not an integer
    (True == 1.0 == 1) is still refused, where it stands."""
    from netskel.probesim import with_overlay
    from testbed.layout import Layout, layout_doc

    doc = with_overlay(layout_doc(Layout(hosts=2, rails=2, hosts_per_tor=1, spines=1)))
    for v in doc["vswitch"].values():
        for r in [*v["rules"], *(x for rs in v["offloaded"].values() for x in rs)]:
            r["vni"] = r["priority"] = 1
    topo = parse_topology(doc)
    host = next(iter(doc["vswitch"]))
    nic = sorted(doc["vswitch"][host]["offloaded"])[-1]
    assert topo.vswitch[host].offloaded[nic] == topo.vswitch[host].rules
    rule = doc["vswitch"][host]["offloaded"][nic][-1]
    assert rule[field] == bad  # equal to the valid value, of another type
    rule[field] = bad
    with pytest.raises(InputError, match=message) as e:
        parse_topology(doc, "t.json")
    assert f"offloaded.{nic}[" in str(e.value)


def test_large_layouts_have_valid_distinct_overlay_addresses():
    """Benches lay out thousands of hosts (bench/localize.py: 4,096): every
    overlay address must be one, and distinct, or the topology is refused
    (192.168.10.256 once stopped that bench)."""
    import ipaddress

    from testbed.layout import Layout

    lay = Layout(hosts=4096, rails=8, hosts_per_tor=32, spines=8)
    ips = [lay.overlay_ip(h, r) for h in range(lay.hosts) for r in range(8)]
    assert len(set(ips)) == len(ips)
    assert all(ipaddress.ip_address(x) for x in ips)
    assert lay.overlay_ip(3, 1) == "192.168.11.4"  # the testbed's addresses unchanged
