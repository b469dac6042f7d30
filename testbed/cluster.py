"""A real cluster out of network namespaces.

Underlay: every host NIC is a veth to its rail's ToR; ToRs and spines are
routed namespaces, ToRs spread traffic over all spines with ECMP. Overlay:
each host runs its own Open vSwitch (userspace datapath) whose OpenFlow
rules forward by overlay destination: deliver to a local container's VF, or
send into the host's VXLAN device, whose forwarding table names the remote
NIC. Containers are namespaces with one interface per rail. The tunnel
copies each packet's TTL outward (`ttl inherit`), so a probe flow's route
can be traced through it (probe_agent/flowtrace.py), and its TOS (`tos
inherit`), so the underlay queues a probe by its traffic class (`--dscp`),
as a production overlay must for RDMA traffic.

Everything created is recorded (see `Created`) and removed by `destroy()`,
also from another process after a crash (`python -m testbed.cluster clean`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from netskel.topology import Topology, parse_topology, topology_to_doc
from testbed.layout import Layout, layout_doc
from testbed.sh import CommandError, Created, ns, run

log = logging.getLogger(__name__)
UNDERLAY_MTU = 9000
OVERLAY_MTU = 4500
VXLAN_PORT = 4789
OVS_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
HOST_SYSCTLS = ("net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2",
                "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
# icmp_ratelimit=0: route traces from every agent cross the same few switches;
# a real switch's control-plane policing allows far more than Linux's 1/s.
SWITCH_SYSCTLS = ("net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0",
                  "net.ipv4.conf.all.rp_filter=0",
                  "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.all.send_redirects=0",
                  "net.ipv4.conf.default.send_redirects=0")


TUNNEL_OFPORT = 100
L3_TABLE = 30


def overlay_pipeline(lay: Layout, h: int, local_ports: dict[int, int],
                     route_first: bool = False) -> list[str]:
    """Host h's OpenFlow pipeline, in the style of OVN and Antrea: a
    classifier by input port (marking tunnel vs local traffic in reg0),
    conntrack (invalid dropped), L3 forwarding by destination (the output
    port into reg2; a covering prefix drops the rest of the overlay), and
    an output table that commits the connection and outputs to reg2.

    `route_first`: routing before conntrack, as OVN orders its stages. The
    datapath then caches the destination's lookup in the flow before the
    recirculation and the output in one after it, which matches no
    destination (the recirculation id carries reg2)."""
    if route_first:
        return _route_first_pipeline(lay, h, local_ports)
    flows = [f"table=0,priority=100,in_port={TUNNEL_OFPORT},actions="
             "load:0x1->NXM_NX_REG0[],goto_table:10"]
    flows += [f"table=0,priority=100,in_port={p},actions=load:0x2->NXM_NX_REG0[],goto_table:10"
              for p in local_ports.values()]
    flows += ["table=0,priority=0,actions=drop",
              "table=10,priority=100,ip,actions=ct(table=20,zone=7)",
              "table=10,priority=0,actions=drop",
              "table=20,priority=200,ct_state=+inv+trk,actions=drop",
              f"table=20,priority=100,ct_state=+trk,ip,actions=goto_table:{L3_TABLE}",
              "table=20,priority=0,actions=drop"]
    flows += _l3_flows(lay, h, local_ports, "goto_table:40")
    flows += ["table=40,priority=100,ip,actions=ct(commit,zone=7),output:NXM_NX_REG2[]",
              "table=40,priority=0,actions=drop"]
    return flows


def _l3_flows(lay: Layout, h: int, local_ports: dict[int, int], then: str) -> list[str]:
    """L3 forwarding: each destination's output port into reg2, then `then`;
    a covering prefix drops the rest of the overlay."""
    flows = []
    for h2 in range(lay.hosts):
        for r in range(lay.rails):
            port = local_ports[r] if h2 == h else TUNNEL_OFPORT
            flows.append(f"table={L3_TABLE},priority=100,ip,nw_dst={lay.overlay_ip(h2, r)},"
                         f"actions=load:{port:#x}->NXM_NX_REG2[],{then}")
    return [*flows, f"table={L3_TABLE},priority=10,ip,nw_dst=192.168.0.0/16,actions=drop",
            f"table={L3_TABLE},priority=0,actions=drop"]


def _route_first_pipeline(lay: Layout, h: int, local_ports: dict[int, int]) -> list[str]:
    flows = [f"table=0,priority=100,in_port={p},actions=goto_table:{L3_TABLE}"
             for p in (TUNNEL_OFPORT, *local_ports.values())]
    flows.append("table=0,priority=0,actions=drop")
    flows += _l3_flows(lay, h, local_ports, "ct(table=40,zone=7)")
    flows += ["table=40,priority=200,ct_state=+inv+trk,actions=drop",
              "table=40,priority=100,ct_state=+trk,ip,actions=ct(commit,zone=7),"
              "output:NXM_NX_REG2[]",
              "table=40,priority=0,actions=drop"]
    return flows


def endpoint_mac(h: int, r: int) -> str:
    return f"02:4e:53:{r:02x}:{h >> 8:02x}:{h & 0xFF:02x}"


@dataclass
class Ovs:
    """One host's Open vSwitch: private database, daemon and sockets."""

    dir: Path
    netns: str

    @property
    def env(self) -> dict[str, str]:
        d = str(self.dir)
        return {**os.environ, "OVS_RUNDIR": d, "OVS_DBDIR": d, "OVS_LOGDIR": d}

    @property
    def db(self) -> str:
        return f"unix:{self.dir}/db.sock"

    def start(self, created: Created) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        run("ovsdb-tool", "create", f"{self.dir}/conf.db", OVS_SCHEMA)
        common = ["--detach", "--no-chdir"]
        created.add_pidfile(f"{self.dir}/ovsdb-server.pid")
        run("ip", "netns", "exec", self.netns, "ovsdb-server", f"{self.dir}/conf.db",
            f"--remote=punix:{self.dir}/db.sock", f"--pidfile={self.dir}/ovsdb-server.pid",
            f"--unixctl={self.dir}/ovsdb-server.ctl", f"--log-file={self.dir}/ovsdb-server.log",
            *common, env=self.env)
        run("ovs-vsctl", f"--db={self.db}", "--no-wait", "init", env=self.env)
        created.add_pidfile(f"{self.dir}/ovs-vswitchd.pid")
        run("ip", "netns", "exec", self.netns, "ovs-vswitchd", self.db,
            f"--pidfile={self.dir}/ovs-vswitchd.pid", f"--unixctl={self.dir}/ovs-vswitchd.ctl",
            f"--log-file={self.dir}/ovs-vswitchd.log", *common, env=self.env)

    def vsctl(self, *args: str) -> str:
        return run("ovs-vsctl", f"--db={self.db}", "--timeout=10", *args, env=self.env)

    def ofctl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        cmd, bridge, *rest = args
        return run("ovs-ofctl", cmd, f"unix:{self.dir}/{bridge}.mgmt", *rest, env=self.env,
                   check=check, input=stdin)

    def appctl(self, *args: str) -> str:
        return run("ovs-appctl", "-t", f"{self.dir}/ovs-vswitchd.ctl", *args, env=self.env)


@dataclass
class Cluster:
    layout: Layout
    run_dir: Path
    prefix: str
    created: Created
    topo: Topology = field(init=False)
    ovs: dict[int, Ovs] = field(default_factory=dict)
    ports: dict[tuple[int, int], int] = field(default_factory=dict)  # (host, rail) -> OF port
    links: dict[str, tuple[str, str]] = field(default_factory=dict)  # link id -> (ns, ifname)
    # Every switch-side end of a link (both ends between two switches).
    link_ends: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # Router interface address -> switch id: the inventory that names trace hops.
    switch_addresses: dict[str, str] = field(default_factory=dict)
    # Static routes a link's switch port carries: the kernel flushes them when
    # the port goes down, and with no routing daemon they must be put back.
    routes: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.topo = parse_topology(layout_doc(self.layout), "testbed")

    # -- names ------------------------------------------------------------------
    def host_ns(self, h: int) -> str:
        return f"{self.prefix}-h{h}"

    def tor_ns(self, r: int, t: int) -> str:
        return f"{self.prefix}-t{r}-{t}"

    def spine_ns(self, s: int) -> str:
        return f"{self.prefix}-s{s}"

    def container_ns(self, h: int) -> str:
        return f"{self.prefix}-c{h}"

    @property
    def topology_path(self) -> Path:
        return self.run_dir / "topology.json"

    @property
    def switch_addresses_path(self) -> Path:
        return self.run_dir / "switch-addresses.json"

    @property
    def controller_socket(self) -> str:
        return f"unix:{self.run_dir}/controller.sock"

    # -- build ------------------------------------------------------------------
    def build(self) -> None:
        lay = self.layout
        t0 = time.monotonic()
        names = ([self.host_ns(h) for h in range(lay.hosts)]
                 + [self.tor_ns(r, t) for r in range(lay.rails) for t in range(lay.tors_per_rail)]
                 + [self.spine_ns(s) for s in range(lay.spines)]
                 + [self.container_ns(h) for h in range(lay.hosts)])
        for n in names:
            self.created.add_namespace(n)
            run("ip", "-n", n, "link", "set", "lo", "up")
        for h in range(lay.hosts):
            ns(self.host_ns(h), "sysctl", "-qw", *HOST_SYSCTLS)
        for n in names[lay.hosts:len(names) - lay.hosts]:
            ns(n, "sysctl", "-qw", *SWITCH_SYSCTLS,
               f"net.ipv4.fib_multipath_hash_policy={int(lay.ecmp_ports)}")
        self._underlay()
        self._overlay()
        self.topology_path.write_text(json.dumps(topology_to_doc(self.topo), indent=1))
        self.switch_addresses_path.write_text(json.dumps(self.switch_addresses, indent=1))
        log.info("cluster %s built in %.1fs", self.prefix, time.monotonic() - t0)

    def _veth(self, ns_a: str, if_a: str, ns_b: str, if_b: str, mtu: int) -> None:
        run("ip", "link", "add", if_a, "netns", ns_a, "mtu", str(mtu), "type", "veth", "peer",
            "name", if_b, "netns", ns_b, "mtu", str(mtu))
        run("ip", "-n", ns_a, "link", "set", if_a, "up")
        run("ip", "-n", ns_b, "link", "set", if_b, "up")

    def _underlay(self) -> None:
        lay = self.layout
        for h in range(lay.hosts):
            t = lay.tor_index(h)
            for r in range(lay.rails):
                hns, tns = self.host_ns(h), self.tor_ns(r, t)
                nic_if, port = f"r{r}", f"h{h}"
                self._veth(hns, nic_if, tns, port, UNDERLAY_MTU)
                ip, gw = lay.underlay_ip(h, r), f"10.{r}.{t}.1"
                run("ip", "-n", hns, "addr", "add", f"{ip}/32", "dev", nic_if)
                run("ip", "-n", hns, "route", "add", f"10.{r}.0.0/16", "via", gw, "dev", nic_if,
                    "onlink")
                run("ip", "-n", tns, "addr", "add", f"{gw}/32", "dev", port)
                self.switch_addresses[gw] = lay.tor(r, t)
                lid = self._link(lay.nic(h, r), lay.tor(r, t))
                self.links[lid] = (tns, port)
                self.link_ends[lid] = [(tns, port)]
                self._route(lid, tns, [f"{ip}/32", "dev", port])
        k = 0
        for r in range(lay.rails):
            for t in range(lay.tors_per_rail):
                tns = self.tor_ns(r, t)
                hops: list[str] = []
                tor_links: list[str] = []
                for s in range(lay.spines):
                    sns = self.spine_ns(s)
                    tor_if, spine_if = f"s{s}", f"r{r}t{t}"
                    self._veth(tns, tor_if, sns, spine_if, UNDERLAY_MTU)
                    a, b = f"10.255.{k // 128}.{(k % 128) * 2}", f"10.255.{k // 128}.{(k % 128) * 2 + 1}"
                    k += 1
                    run("ip", "-n", tns, "addr", "add", f"{a}/31", "dev", tor_if)
                    run("ip", "-n", sns, "addr", "add", f"{b}/31", "dev", spine_if)
                    self.switch_addresses[a] = lay.tor(r, t)
                    self.switch_addresses[b] = lay.spine(s)
                    lid = self._link(lay.tor(r, t), lay.spine(s))
                    self.links[lid] = (sns, spine_if)
                    self.link_ends[lid] = [(tns, tor_if), (sns, spine_if)]
                    self._route(lid, sns, [f"10.{r}.{t}.0/24", "via", a])
                    hops += ["nexthop", "via", b, "dev", tor_if]
                    tor_links.append(lid)
                for lid in tor_links:
                    self.routes[lid].append((tns, [f"10.{r}.0.0/16", *hops]))
                run("ip", "-n", tns, "route", "add", f"10.{r}.0.0/16", *hops)

    def _route(self, lid: str, netns: str, spec: list[str]) -> None:
        run("ip", "-n", netns, "route", "add", *spec)
        self.routes.setdefault(lid, []).append((netns, spec))

    def restore_routes(self, lid: str) -> None:
        for netns, spec in self.routes.get(lid, []):
            run("ip", "-n", netns, "route", "replace", *spec)

    def _link(self, a: str, b: str) -> str:
        from netskel.topology import link_id

        lid = link_id(a, b)
        assert lid in self.topo.links, lid
        return lid

    def _overlay(self) -> None:
        lay = self.layout
        for h in range(lay.hosts):
            hns, cns = self.host_ns(h), self.container_ns(h)
            ovs = Ovs(self.run_dir / f"ovs-h{h}", hns)
            ovs.start(self.created)
            self.ovs[h] = ovs
            ovs.vsctl("add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev",
                      "fail_mode=secure")
            vx = f"vx{lay.vni}"
            run("ip", "-n", hns, "link", "add", vx, "mtu", str(OVERLAY_MTU), "type", "vxlan", "id",
                str(lay.vni), "dstport", str(VXLAN_PORT), "nolearning", "ttl", "inherit", "tos", "inherit")
            run("ip", "-n", hns, "link", "set", vx, "up")
            ns(hns, "ethtool", "-K", vx, "tx", "off")
            ovs.vsctl("add-port", "br0", vx, "--", "set", "interface", vx,
                      f"ofport_request={TUNNEL_OFPORT}")
            for r in range(lay.rails):
                ep_if, port_if = f"e{r}", f"c0e{r}"
                self._veth(cns, ep_if, hns, port_if, OVERLAY_MTU)
                run("ip", "-n", cns, "link", "set", ep_if, "address", endpoint_mac(h, r))
                run("ip", "-n", cns, "addr", "add", f"{lay.overlay_ip(h, r)}/24", "dev", ep_if)
                ns(cns, "ethtool", "-K", ep_if, "tx", "off")
                ns(hns, "ethtool", "-K", port_if, "tx", "off")
                ofport = 1 + r
                ovs.vsctl("add-port", "br0", port_if, "--", "set", "interface", port_if,
                          f"ofport_request={ofport}")
                self.ports[(h, r)] = ofport
        # Static neighbours and forwarding state: every same-rail endpoint pair.
        for h in range(lay.hosts):
            hns, cns = self.host_ns(h), self.container_ns(h)
            for h2 in range(lay.hosts):
                for r in range(lay.rails):
                    if h2 == h:
                        continue
                    ip2 = lay.overlay_ip(h2, r)
                    run("ip", "-n", cns, "neigh", "replace", ip2, "lladdr", endpoint_mac(h2, r),
                        "dev", f"e{r}", "nud", "permanent")
                    run("bridge", "-n", hns, "fdb", "append", endpoint_mac(h2, r), "dev",
                        f"vx{lay.vni}", "dst", lay.underlay_ip(h2, r), "self", "permanent")
            self.install_pipeline(h)

    def install_pipeline(self, h: int, route_first: bool = False) -> None:
        """Host h's OpenFlow pipeline (see overlay_pipeline), replacing what
        its bridge holds, and its datapath cache emptied."""
        lay = self.layout
        self.ovs[h].ofctl("del-flows", "br0")
        self.ovs[h].ofctl("add-flows", "br0", "-", stdin="\n".join(overlay_pipeline(
            lay, h, {r: self.ports[(h, r)] for r in range(lay.rails)}, route_first)))
        self.ovs[h].appctl("revalidator/purge")

    # -- processes --------------------------------------------------------------
    def agent_command(self, h: int, extra: tuple[str, ...] = ()) -> list[str]:
        """`extra`: flags after the testbed's own (a later flag wins)."""
        lay = self.layout
        eps = [f"{lay.endpoint(h, r)},{lay.nic(h, r)},{lay.overlay_ip(h, r)},e{r}"
               for r in range(lay.rails)]
        cmd = ["ip", "netns", "exec", self.container_ns(h), sys.executable, "-m", "netskel.cli",
               "agent", "--insecure", "--controller", self.controller_socket,
               "--container", lay.container(h),
               "--job", lay.job, "--host", lay.host(h), "--counter-hz", "20",
               # The host's switch, as a sidecar with the OVS socket mounted would see it.
               "--vswitch", f"unix:{self.ovs[h].dir}/br0.mgmt", "--vswitch-tunnel-port", str(TUNNEL_OFPORT),
               "--vswitch-db", self.ovs[h].db,
               "--vswitch-vni", str(lay.vni), "--vswitch-interval", "2",
               # Its datapath's cached flows stand in for a NIC's offloaded ones (nothing
               # here offloads; same grammar, same failure: a flow unlike its tables).
               "--vswitch-datapath", f"{self.ovs[h].dir}/ovs-vswitchd.ctl",
               "--vswitch-datapath-type", "ovs",
               # The host's network namespace, as hostPID + /proc/1/ns/net would give it.
               "--underlay-netns", f"/var/run/netns/{self.host_ns(h)}", "--trace-interval", "30"]
        for e in eps:
            cmd += ["--endpoint", e]
        return cmd + list(extra)

    def start_agent(self, h: int, extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        log_path = self.run_dir / f"agent-{h}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(self.agent_command(h, extra), stdout=out,
                                    stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.created.add_pid(proc.pid)
        return proc

    def destroy(self, keep_files: bool = False) -> list[str]:
        """Remove what we made; the run directory too (logs, OVS databases)
        unless asked to keep it or something could not be removed."""
        problems = self.created.destroy()
        if not problems and not keep_files and not os.environ.get("NETSKEL_KEEP_RUN"):
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return problems

    # -- inspection -------------------------------------------------------------
    def ping(self, h_from: int, h_to: int, r: int, size: int = 56, count: int = 1) -> bool:
        out = ns(self.container_ns(h_from), "ping", "-c", str(count), "-W", "1", "-s", str(size),
                 "-M", "do", self.layout.overlay_ip(h_to, r), check=False)
        return f"{count} received" in out

    def trace_underlay(self, h_from: int, h_to: int, r: int) -> list[str]:
        """The switches the kernel's ECMP choice sends host h_from's rail-r
        tunnel traffic through to h_to (from `ip route get` hop by hop).
        Only where switches hash addresses alone: with Layout.ecmp_ports a
        forwarded packet's path follows the hash the sending host's kernel
        left on it (veth keeps skb->hash), which `ip route get` cannot see."""
        lay = self.layout
        if lay.ecmp_ports:
            raise ValueError("trace_underlay: paths depend on each flow's hash (ecmp_ports)")
        src, dst = lay.underlay_ip(h_from, r), lay.underlay_ip(h_to, r)
        t = lay.tor_index(h_from)
        node_ns, node_id, iif = self.tor_ns(r, t), lay.tor(r, t), f"h{h_from}"
        hops = [node_id]
        for _ in range(8):
            out = run("ip", "-n", node_ns, "route", "get", dst, "from", src, "iif", iif)
            dev = out.split(" dev ")[1].split()[0]
            if dev.startswith("h"):
                return hops
            if dev.startswith("s"):
                s = int(dev[1:])
                node_ns, node_id, iif = self.spine_ns(s), lay.spine(s), f"r{r}t{t}"
            else:  # spine port r{r}t{t}
                t = int(dev.split("t")[1])
                node_ns, node_id, iif = self.tor_ns(r, t), lay.tor(r, t), f"s{s}"
            hops.append(node_id)
        raise CommandError(f"no route from {src} to {dst}")


def create_cluster(layout: Layout, base: Path | None = None) -> Cluster:
    run_id = secrets.token_hex(2)
    run_dir = (base or Path("/tmp")) / f"netskel-{run_id}"
    run_dir.mkdir(parents=True)
    created = Created(path=str(run_dir / "created.json"))
    created.save()
    cluster = Cluster(layout=layout, run_dir=run_dir, prefix=f"nsk{run_id}", created=created)
    try:
        cluster.build()
    except BaseException:
        cluster.destroy()
        raise
    return cluster


def main(argv: list[str]) -> int:
    """`python -m testbed.cluster clean RUN_DIR/created.json`: remove what a
    crashed run left behind, by the names and PIDs it recorded."""
    if len(argv) != 2 or argv[0] != "clean":
        print("usage: python -m testbed.cluster clean RUN_DIR/created.json", file=sys.stderr)
        return 2
    problems = Created.load(argv[1]).destroy()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
