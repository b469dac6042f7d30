"""NIC (VF) byte counters from sysfs. Reading fails soft: a vanished
interface yields no sample, not an exception."""

from __future__ import annotations

import time
from pathlib import Path

from netskel.model import CounterSample

SYSFS = Path("/sys/class/net")


def read_counters(ifname: str, root: Path = SYSFS) -> tuple[int, int] | None:
    stats = root / ifname / "statistics"
    try:
        tx = int((stats / "tx_bytes").read_text())
        rx = int((stats / "rx_bytes").read_text())
    except (OSError, ValueError):
        return None
    return tx, rx


def interface_mtu(ifname: str, root: Path = SYSFS) -> int | None:
    try:
        return int((root / ifname / "mtu").read_text())
    except (OSError, ValueError):
        return None


def sample(interfaces: dict[str, str], root: Path = SYSFS) -> list[CounterSample]:
    """One sample per endpoint (endpoint id -> interface name)."""
    now = time.time()
    out = []
    for ep, ifname in interfaces.items():
        got = read_counters(ifname, root)
        if got is not None:
            out.append(CounterSample(endpoint=ep, ts=now, tx_bytes=got[0], rx_bytes=got[1]))
    return out
