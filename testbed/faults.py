"""Faults injected into a running testbed. Each returns its undo; all of
them live inside the cluster's namespaces, so destroying the cluster also
removes any fault left behind."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from netskel.dpflows import flow_line, key_fields
from testbed.cluster import L3_TABLE, Cluster
from testbed.sh import run

Undo = Callable[[], None]


def _port(cluster: Cluster, link: str) -> tuple[str, str]:
    if link not in cluster.links:
        raise KeyError(f"unknown link '{link}'")
    return cluster.links[link]


def link_down(cluster: Cluster, link: str) -> Undo:
    """Administratively down the switch-side port: the other end loses carrier."""
    netns, dev = _port(cluster, link)
    run("ip", "-n", netns, "link", "set", dev, "down")

    def undo() -> None:
        run("ip", "-n", netns, "link", "set", dev, "up")
        cluster.restore_routes(link)
    return undo


def _nft(cluster: Cluster, link: str, table: str, rule: str) -> Undo:
    netns, dev = _port(cluster, link)
    script = (f"table inet {table} {{\n chain nsk {{\n  type filter hook forward priority 0;\n"
              f"  iifname \"{dev}\" {rule}\n  oifname \"{dev}\" {rule}\n }}\n}}\n")
    run("ip", "netns", "exec", netns, "nft", "-f", "-", input=script)

    def undo() -> None:
        run("ip", "netns", "exec", netns, "nft", "delete", "table", "inet", table)
    return undo


def _drop_share(percent: int) -> str:
    """The nft statement dropping `percent` % (1..100) of what reaches it."""
    if not 0 < percent <= 100:
        raise ValueError("percent must be in 1..100")
    # nft refuses "< 100" (the value is out of numgen's 0-99 range): all is all.
    return "drop" if percent == 100 else f"numgen random mod 100 < {percent} drop"


def class_loss(cluster: Cluster, link: str, dscp: int, percent: int) -> Undo:
    """Drop `percent` % of the packets of one traffic class (DSCP) crossing
    the link, both ways: a lossless queue gone wrong, which traffic of
    every other class never sees."""
    if not 0 <= dscp <= 63:
        raise ValueError("dscp must be in 0..63")
    return _nft(cluster, link, "nsk_class", f"ip dscp {dscp} {_drop_share(percent)}")


def random_loss(cluster: Cluster, link: str, percent: int) -> Undo:
    """Drop `percent` % of packets crossing the link, both ways."""
    return _nft(cluster, link, "nsk_loss", _drop_share(percent))


def drop_above(cluster: Cluster, link: str, size: int) -> Undo:
    """Silently drop IP packets longer than `size` bytes crossing the link."""
    return _nft(cluster, link, "nsk_size", f"meta length > {size} drop")


def rate_limit(cluster: Cluster, link: str, rate: str = "20mbit", load_mbit: int = 40,
               seconds: float = 120.0, load_from: tuple[int, int, int] | None = None) -> Undo:
    """A token bucket on the switch port plus bounded background load through
    it: the queue builds and probes crossing the link wait in it."""
    _port(cluster, link)
    ends = cluster.link_ends[link]
    for netns, dev in ends:  # both directions: ECMP may send the load either way
        run("ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
            "rate", rate, "burst", "3000", "latency", "200ms")
    procs: list[subprocess.Popen[bytes]] = []
    if load_from is not None:
        h_from, h_to, r = load_from
        target = cluster.layout.underlay_ip(h_to, r)
        code = ("import socket,time,sys\n"
                "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                f"end=time.monotonic()+{seconds}\nbuf=b'x'*1200\n"
                f"gap=1200*8/({load_mbit}*1e6)\nnxt=time.monotonic()\n"
                "while time.monotonic()<end:\n"
                f" s.sendto(buf,('{target}',9))\n nxt+=gap\n"
                " d=nxt-time.monotonic()\n if d>0: time.sleep(d)\n")
        p = subprocess.Popen(["ip", "netns", "exec", cluster.host_ns(h_from), sys.executable,
                              "-c", code])
        cluster.created.add_pid(p.pid)
        procs.append(p)

    def undo() -> None:
        for p in procs:
            p.terminate()
            p.wait(timeout=5)
        for netns, dev in ends:
            run("ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", dev, "root")
    return undo


def delete_overlay_rule(cluster: Cluster, h: int, dst_ip: str) -> Undo:
    """Remove host h's L3 forwarding flow for one overlay destination: the
    covering prefix then drops it, a blackhole. The datapath cache is
    purged each way, so the change holds from the next packet on (a flow
    cached from earlier traffic forwarded one more ping until the
    revalidator caught up)."""
    ovs = cluster.ovs[h]
    match = f"table={L3_TABLE},priority=100,ip,nw_dst={dst_ip}"
    flows = ovs.ofctl("dump-flows", "br0", f"table={L3_TABLE},ip,nw_dst={dst_ip}")
    actions = [line.split("actions=")[1].strip() for line in flows.splitlines()
               if "actions=" in line and "priority=100" in line]
    if not actions:
        raise KeyError(f"host {h} has no rule for {dst_ip}")
    ovs.ofctl("del-flows", "br0", "--strict", match)
    ovs.appctl("revalidator/purge")

    def undo() -> None:
        ovs.ofctl("add-flow", "br0", f"{match},actions={actions[0]}")
        ovs.appctl("revalidator/purge")
    return undo


def stale_datapath_flow(cluster: Cluster, h: int, r: int, dst_ip: str) -> Undo:
    """Host h's cached datapath flows from endpoint port c0e{r} to one overlay
    destination rewritten to drop, the OpenFlow tables left right: what a
    NIC holding a stale offloaded flow does (nothing here offloads, so the
    software datapath's cache stands in for the NIC's copy). Flows exist
    only while traffic runs; the revalidator leaves a flow alone until the
    tables change. Undo purges the cache: the next packets reinstall it.
    Where conntrack follows routing, the flow matching the destination is
    the one before the recirculation: it is the one rewritten."""
    ovs = cluster.ovs[h]
    keys = []
    for line in ovs.appctl("dpctl/dump-flows", "-m", "--names").splitlines():
        flow = flow_line(line)
        if flow is None:
            continue
        _, in_port, dst, _, _ = key_fields(flow[0])
        if (in_port, dst) == (f"c0e{r}", dst_ip):
            keys.append(flow[0])
    if not keys:
        raise KeyError(f"host {h} caches no flow from c0e{r} to {dst_ip} (no traffic yet?)")
    for key in keys:
        ovs.appctl("dpctl/mod-flow", key, "drop")

    def undo() -> None:
        ovs.appctl("revalidator/purge")
    return undo
