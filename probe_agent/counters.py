"""NIC (VF) byte counters from sysfs. Reading fails soft: a vanished
interface yields no sample, not an exception.

Training traffic on an RDMA NIC never passes the kernel's network stack,
so the interface's own counters (/sys/class/net/IF/statistics, on mlx5 "an
aggregation of software ring counters", the kernel's documentation says)
miss it; the RDMA device's port counters (PortXmitData / PortRcvData, in
4-byte words) hold it. An endpoint's bytes are both summed. A software
RDMA device (Soft-RoCE) keeps no port counters: its packets pass the
kernel and are in the interface's counters already, so nothing is counted
twice. A port counter without the extended width stops at 2^32 - 1 words
and then adds nothing, as if the RDMA traffic had stopped."""

from __future__ import annotations

import os
import time
from pathlib import Path

from netskel.model import CounterSample
from probe_agent.rdma import SYS_INFINIBAND, device_of_interface

SYSFS = Path("/sys/class/net")
WORD = 4  # port_xmit_data and port_rcv_data count 32-bit words


def rdma_port_bytes(device: str, sys_ib: Path = SYS_INFINIBAND) -> tuple[int, int] | None:
    """(tx, rx) bytes over all of an RDMA device's ports; None where it
    keeps no port counters."""
    ports = sys_ib / device / "ports"
    try:
        names = sorted(os.listdir(ports))
    except OSError:
        return None
    tx = rx = 0
    found = False
    for name in names:
        counters = ports / name / "counters"
        try:
            t = int((counters / "port_xmit_data").read_text())
            r = int((counters / "port_rcv_data").read_text())
        except (OSError, ValueError):
            continue
        tx, rx, found = tx + t * WORD, rx + r * WORD, True
    return (tx, rx) if found else None


def read_counters(ifname: str, root: Path = SYSFS,
                  sys_ib: Path = SYS_INFINIBAND) -> tuple[int, int] | None:
    """The interface's (tx, rx) bytes, its RDMA device's traffic included."""
    stats = root / ifname / "statistics"
    try:
        tx = int((stats / "tx_bytes").read_text())
        rx = int((stats / "rx_bytes").read_text())
    except (OSError, ValueError):
        return None
    device = device_of_interface(ifname, root, sys_ib)
    rdma = rdma_port_bytes(device, sys_ib) if device is not None else None
    if rdma is not None:
        tx, rx = tx + rdma[0], rx + rdma[1]
    return tx, rx


def interface_mtu(ifname: str, root: Path = SYSFS) -> int | None:
    try:
        return int((root / ifname / "mtu").read_text())
    except (OSError, ValueError):
        return None


def sample(interfaces: dict[str, str], root: Path = SYSFS,
           sys_ib: Path = SYS_INFINIBAND) -> list[CounterSample]:
    """One sample per endpoint (endpoint id -> interface name)."""
    now = time.time()
    out = []
    for ep, ifname in interfaces.items():
        got = read_counters(ifname, root, sys_ib)
        if got is not None:
            out.append(CounterSample(endpoint=ep, ts=now, tx_bytes=got[0], rx_bytes=got[1]))
    return out


class WithoutOwnTraffic:
    """An endpoint's counters less the agent's own probes, replies and
    traces. Skeleton inference reads these counters; on an idle cluster the
    probes were all it saw, and their size cycle (64 B to 4 KB every five
    probes, 0.5 s at 10/s) read as a data-parallel job's iteration at
    confidence 0.6-0.7 on the testbed. In a job they add noise to every
    endpoint's rate.

    `own` bytes must be read *before* the interface's counters: the agent
    counts a packet only after the kernel did, so the difference never
    counts a probe twice. It may still hold a probe sent between the two
    reads; the next sample can then come out up to that much lower, which
    would read as a counter reset, so each result is held at least at the
    last. A real reset (the interface's counter going down) passes through
    as one, and the agent's own bytes count from there."""

    def __init__(self) -> None:
        # endpoint -> (last raw tx, rx; own tx, rx at the last reset; last result tx, rx)
        self._state: dict[str, tuple[int, int, int, int, int, int]] = {}

    def correct(self, endpoint: str, raw: tuple[int, int], own: tuple[int, int]
                ) -> tuple[int, int]:
        st = self._state.get(endpoint)
        if st is None:
            base_tx, base_rx, last_tx, last_rx = 0, 0, 0, 0
        else:
            raw_tx0, raw_rx0, base_tx, base_rx, last_tx, last_rx = st
            if raw[0] < raw_tx0 or raw[1] < raw_rx0:  # reset: start over from here
                base_tx, base_rx, last_tx, last_rx = own[0], own[1], 0, 0
        tx = max(last_tx, raw[0] - (own[0] - base_tx), 0)
        rx = max(last_rx, raw[1] - (own[1] - base_rx), 0)
        self._state[endpoint] = (raw[0], raw[1], base_tx, base_rx, tx, rx)
        return tx, rx
