"""Probe RTT fidelity: our UDP prober against the kernel's `ping` on the same
path, in the same run.

Two network namespaces joined by one veth (names generated from this
process's id, removed afterwards, whatever happens). A netskel Responder
serves in one; in the other, rounds alternate: `ping -c N -i 0.01 -s 56`,
then our Prober at 100 probes/s with 64-byte probes for N replies. The
kernel answers ping in its softirq, so ping's RTT is the path's floor plus
one send and one receive through the socket layer; ours, stamped where
each host's driver takes or gives the packet, is the floor itself.

    python bench/fidelity.py [--rounds 3] [--count 200] [--busy-poll 50] [--gil-load]

Prints per-round figures, then one JSON line with agent_median_us,
ping_median_us, agent_p99_us, ping_p99_us (all rounds pooled), and the
packet-capture reference: our probes as an AF_PACKET socket on the
prober's veth sees them leave and their replies arrive (wire_median_us,
wire_p99_us, agent_vs_wire_median_gap_us), and the same probes less the
replies' own dwells instead of their follow-ups' (wire_reply_dwell_*:
the responder's send path, what the follow-ups take out). `--gil-load`
spins a pure-Python thread in the responder's process, as an agent's
other threads do.
Goal (issue 16): agent median within 5 us of ping's, p99 within 20 us.
Two readings, both printed: `goal_met` compares our production RTT (kernel
send stamp to kernel receive stamp, less the responder's dwell from its
own kernel stamps, which its follow-up carries) with ping's, which also
counts ping's own send path through the socket layer and the responder
kernel's echo; ours counts neither host, only what lies between the two
drivers, so it sits tens of us *below* ping and misses by the letter.
`goal_met_same_definition` runs our prober with ping's send stamp (user
time before the send). The spread (p99 less median) of each is printed
too: the prober's own noise, which the issue's goal is about.
`--busy-poll US` adds two arms per round, in alternating order and
without the capture tap: our prober and responder with SO_BUSY_POLL of US
microseconds on their sockets (agent_busy_poll_*), and the same without
it (agent_no_busy_poll_*).
Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probe_agent.udp import Reply

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ADDR_A, ADDR_B = "10.231.7.1", "10.231.7.2"  # inside our own namespaces only
PORT = 7399
PING_RTT = re.compile(r"time=([0-9.]+) ms")


def serve(ip: str, port: int, busy_poll_us: int = 0, gil_load: bool = False) -> None:
    """Child mode, inside namespace B: answer probes until stdin closes.
    `gil_load`: a pure-Python thread spins beside the responder, as an
    agent's other threads (gRPC, counters, windows) take the interpreter."""
    from probe_agent.udp import Responder

    r = Responder([ip], port, busy_poll_us=busy_poll_us)
    stop = threading.Event()
    t = threading.Thread(target=r.serve, args=(stop,), daemon=True)
    t.start()
    if gil_load:
        def spin() -> None:
            while not stop.is_set():
                sum(range(1000))
        threading.Thread(target=spin, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()
    stop.set()
    t.join()
    r.close()


class Capture:
    """The wire reference: every packet of our probe port on the veth, with
    the kernel's capture time (an AF_PACKET socket, as tcpdump uses: the
    time a probe leaves for the driver and a reply arrives from it). A
    probe's wire RTT is its reply's arrival minus its departure minus the
    responder's dwell, which its follow-up carries (the reply's where no
    follow-up came)."""

    def __init__(self, ifname: str, port: int) -> None:
        import socket

        self.port = port
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.sock.bind((ifname, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)
        self.sock.settimeout(0.1)
        self.out: dict[int, int] = {}
        self.back: dict[int, tuple[int, int]] = {}
        self.fixed: dict[int, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import socket
        import struct

        from probe_agent import wire

        while not self.stop.is_set():
            try:
                data, anc, _flags, addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(16))
            except (TimeoutError, OSError):
                continue
            stamp = next((struct.unpack("@qq", p[:16]) for lvl, kind, p in anc
                          if lvl == socket.SOL_SOCKET and len(p) >= 16), None)
            if stamp is None or len(data) < 42 or data[12:14] != b"\x08\x00" or data[23] != 17:
                continue
            ihl = (data[14] & 0x0F) * 4
            sport, dport = struct.unpack("!HH", data[14 + ihl:18 + ihl])
            head = wire.header(data[22 + ihl:])
            if head is None:
                continue
            t = stamp[0] * 1_000_000_000 + stamp[1]
            if head.kind == wire.KIND_PROBE and dport == self.port:
                self.out.setdefault(head.seq, t)
            elif head.kind == wire.KIND_REPLY and sport == self.port:
                self.back.setdefault(head.seq, (t, head.dwell_ns))
            elif head.kind == wire.KIND_FOLLOW_UP and sport == self.port:
                self.fixed.setdefault(head.seq, head.dwell_ns)

    def rtts_us(self) -> tuple[list[float], list[float]]:
        """The wire RTTs less the follow-ups' dwells (the reply's where none
        came), and the same probes' less the replies' own dwells: what the
        responder's send path would add without follow-ups."""
        self.stop.set()
        self.thread.join()
        self.sock.close()
        answered = [(s, t) for s, t in sorted(self.out.items()) if s in self.back]
        return ([(self.back[s][0] - t - self.fixed.get(s, self.back[s][1])) / 1e3
                 for s, t in answered],
                [(self.back[s][0] - t - self.back[s][1]) / 1e3 for s, t in answered])


def probe(src_ip: str, dst_ip: str, port: int, count: int, kernel_tx: bool,
          ifname: str = "", busy_poll_us: int = 0) -> None:
    """Child mode, inside namespace A: `count` replies at 100/s, as JSON
    (with the capture reference on `ifname` when given)."""
    from probe_agent.udp import Prober, ProbeTarget

    cap = Capture(ifname, port) if ifname else None

    rtts: list[float] = []
    stamps: list[str] = []
    done = threading.Event()

    def on_reply(replies: list[Reply]) -> None:
        rtts.extend(r[4] for r in replies)
        if len(rtts) >= count:
            done.set()

    p = Prober({"a": src_ip}, {"a": (64,)}, 100.0, 1.0, lambda *a: None, on_reply,
               kernel_tx=kernel_tx, busy_poll_us=busy_poll_us)
    p.set_targets([ProbeTarget("a", "b", dst_ip, port)])
    stop = threading.Event()
    t = threading.Thread(target=p.run, args=(stop,), daemon=True)
    t.start()
    done.wait(timeout=count / 100.0 * 3 + 10)
    stop.set()
    t.join()
    stamps.append(p.timestamping)
    p.close()
    wire_rtts, reply_dwell = cap.rtts_us() if cap is not None else ([], [])
    from probe_agent import metrics

    followed = {s: metrics.PROBE_DWELLS.labels(source=s)._value.get() for s in ("follow_up", "reply")}
    print(json.dumps({"rtts": rtts[:count], "timestamping": stamps[0], "wire": wire_rtts[:count],
                      "wire_reply_dwell": reply_dwell[:count], "dwells": followed}))


def _pct(xs: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def _figures(name: str, rtts: list[float]) -> dict[str, float]:
    """`name`_median_us and `name`_p99_us."""
    return {f"{name}_median_us": round(_pct(rtts, 50), 1),
            f"{name}_p99_us": round(_pct(rtts, 99), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--busy-poll", type=int, default=0, metavar="US",
                    help="also run prober and responder with SO_BUSY_POLL of US microseconds")
    ap.add_argument("--gil-load", action="store_true",
                    help="a pure-Python thread spinning in the responder's process")
    ap.add_argument("--serve", nargs=4, metavar=("IP", "PORT", "BUSY", "GIL"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--probe", nargs=7, metavar=("SRC", "DST", "PORT", "N", "KTX", "IF", "BUSY"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve[0], int(a.serve[1]), int(a.serve[2]), a.serve[3] == "1")
        return
    if a.probe:
        probe(a.probe[0], a.probe[1], int(a.probe[2]), int(a.probe[3]), a.probe[4] == "1",
              a.probe[5] if a.probe[5] != "-" else "", int(a.probe[6]))
        return

    from testbed.sh import Created, run

    tag = f"nskfid{os.getpid() % 100000}"
    ns_a, ns_b = f"{tag}a", f"{tag}b"
    with tempfile.TemporaryDirectory() as d:
        created = Created(f"{d}/created.json")
        servers: list[subprocess.Popen[str]] = []
        try:
            created.add_namespace(ns_a)
            created.add_namespace(ns_b)
            run("ip", "link", "add", f"{tag}x", "netns", ns_a, "type", "veth", "peer",
                "name", f"{tag}y", "netns", ns_b)
            for ns, dev, ip in ((ns_a, f"{tag}x", ADDR_A), (ns_b, f"{tag}y", ADDR_B)):
                run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
                run("ip", "-n", ns, "link", "set", dev, "up")
                run("ip", "-n", ns, "link", "set", "lo", "up")

            def responder(port: int, busy_us: int) -> subprocess.Popen[str]:
                srv = subprocess.Popen(["ip", "netns", "exec", ns_b, sys.executable, __file__,
                                        "--serve", ADDR_B, str(port), str(busy_us),
                                        "1" if a.gil_load else "0"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                servers.append(srv)
                created.add_pid(srv.pid)
                assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
                return srv

            def prober(port: int, kernel_tx: bool, ifname: str, busy_us: int) -> Any:
                return json.loads(run("ip", "netns", "exec", ns_a, sys.executable, __file__,
                                      "--probe", ADDR_A, ADDR_B, str(port), str(a.count),
                                      "1" if kernel_tx else "0", ifname or "-", str(busy_us)))

            responder(PORT, 0)
            if a.busy_poll:
                responder(PORT + 1, a.busy_poll)
            busy: list[float] = []
            nobusy: list[float] = []
            agent: list[float] = []
            ping: list[float] = []
            pinglike: list[float] = []
            wire_ref: list[float] = []
            wire_reply: list[float] = []
            followed = [0.0, 0.0]  # RTTs whose dwell came from a follow-up, from the reply
            mode = ""
            rounds: list[dict[str, Any]] = []
            for _ in range(a.rounds):
                out = run("ip", "netns", "exec", ns_a, "ping", "-n",
                          "-c", str(a.count), "-i", "0.01", "-s", "56", ADDR_B)
                p = [float(x) * 1000 for x in PING_RTT.findall(out)]
                got = prober(PORT, True, f"{tag}x", 0)
                mode = got["timestamping"]
                followed[0] += got["dwells"]["follow_up"]
                followed[1] += got["dwells"]["reply"]
                ours = got["rtts"]
                like = prober(PORT, False, "", 0)["rtts"]
                # Busy polling against the same prober without it, both
                # without the capture tap, in alternating order (whichever
                # runs second finds the machine warmer).
                arms = [(PORT, 0), (PORT + 1, a.busy_poll)] if a.busy_poll else []
                res_arms = {busy_us: prober(port, True, "", busy_us)["rtts"]
                            for port, busy_us in (arms if len(rounds) % 2 == 0 else arms[::-1])}
                polled, unpolled = res_arms.get(a.busy_poll, []), res_arms.get(0, [])
                busy += polled
                nobusy += unpolled
                ping += p
                agent += ours
                pinglike += like
                wire_ref += got["wire"]
                wire_reply += got["wire_reply_dwell"]
                rounds.append({"ping_median_us": round(_pct(p, 50), 1),
                               "agent_median_us": round(_pct(ours, 50), 1),
                               "agent_user_send_median_us": round(_pct(like, 50), 1),
                               "ping_p99_us": round(_pct(p, 99), 1),
                               "agent_p99_us": round(_pct(ours, 99), 1),
                               "agent_user_send_p99_us": round(_pct(like, 99), 1),
                               "wire_median_us": round(_pct(got["wire"], 50), 1),
                               "wire_p99_us": round(_pct(got["wire"], 99), 1),
                               "ping_n": len(p), "agent_n": len(ours)}
                              | (_figures("agent_busy_poll", polled)
                                 | _figures("agent_no_busy_poll", unpolled) if a.busy_poll
                                 else {}))
                print(json.dumps(rounds[-1]), file=sys.stderr)
        finally:
            for srv in servers:
                if srv.stdin is not None:
                    srv.stdin.close()
                    try:
                        srv.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
            problems = created.destroy()
            if problems:
                print("; ".join(problems), file=sys.stderr)
    res = {"bench": "fidelity", "rounds": a.rounds, "count": a.count, "timestamping": mode,
           "agent_median_us": round(_pct(agent, 50), 1), "ping_median_us": round(_pct(ping, 50), 1),
           "agent_p99_us": round(_pct(agent, 99), 1), "ping_p99_us": round(_pct(ping, 99), 1),
           "agent_user_send_median_us": round(_pct(pinglike, 50), 1),
           "agent_user_send_p99_us": round(_pct(pinglike, 99), 1),
           "agent_min_us": round(min(agent, default=float("nan")), 1),
           "ping_min_us": round(min(ping, default=float("nan")), 1)}
    if a.busy_poll:
        res["busy_poll_us"] = a.busy_poll
        res |= _figures("agent_busy_poll", busy) | _figures("agent_no_busy_poll", nobusy)
    # The packet-capture reference on the prober's own veth, same probes.
    res["wire_median_us"] = round(_pct(wire_ref, 50), 1)
    res["wire_p99_us"] = round(_pct(wire_ref, 99), 1)
    # The same probes less the replies' own dwells: the responder's send
    # path (Python, the system call, its socket layer) that follow-ups take out.
    res["wire_reply_dwell_median_us"] = round(_pct(wire_reply, 50), 1)
    res["wire_reply_dwell_p99_us"] = round(_pct(wire_reply, 99), 1)
    res["dwell_from_follow_up_share"] = round(followed[0] / max(sum(followed), 1), 4)
    res["agent_vs_wire_median_gap_us"] = round(res["agent_median_us"] - res["wire_median_us"], 1)
    res["median_gap_us"] = round(res["agent_median_us"] - res["ping_median_us"], 1)
    res["p99_gap_us"] = round(res["agent_p99_us"] - res["ping_p99_us"], 1)
    res["agent_spread_us"] = round(res["agent_p99_us"] - res["agent_median_us"], 1)
    res["ping_spread_us"] = round(res["ping_p99_us"] - res["ping_median_us"], 1)
    res["goal_met"] = abs(res["median_gap_us"]) <= 5 and abs(res["p99_gap_us"]) <= 20
    res["same_definition_median_gap_us"] = round(res["agent_user_send_median_us"]
                                                 - res["ping_median_us"], 1)
    res["same_definition_p99_gap_us"] = round(res["agent_user_send_p99_us"] - res["ping_p99_us"], 1)
    res["goal_met_same_definition"] = (abs(res["same_definition_median_gap_us"]) <= 5
                                       and abs(res["same_definition_p99_gap_us"]) <= 20)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
