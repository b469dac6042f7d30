"""Hardware timestamps on an endpoint's NIC: what the device offers (what
`ethtool -T` shows, ETHTOOL_GET_TS_INFO) and, only when asked, turning
them on (SIOCSHWTSTAMP: every packet stamped, sent and received).

Why this is needed: a socket that asks for hardware stamps
(SOF_TIMESTAMPING_RAW_HARDWARE, probe_agent/udp.py) gets none until the
device itself stamps, and a VF starts with stamping off (a PTP daemon, if
any, turns it on for the PF it serves). Why only when asked: it is one
setting of the whole device, it needs CAP_NET_ADMIN, and a PTP daemon may
own it; the agent reports what it found and changes nothing unasked. The
receive filter is set to every packet, which any PTP filter is a subset
of: a PTP daemon keeps its stamps."""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct
from dataclasses import dataclass

SIOCETHTOOL, ETHTOOL_GET_TS_INFO = 0x8946, 0x41
SIOCGHWTSTAMP, SIOCSHWTSTAMP = 0x89B1, 0x89B0
TX_HARDWARE, RX_HARDWARE, RAW_HARDWARE = 1 << 0, 1 << 2, 1 << 6
TX_SOFTWARE, RX_SOFTWARE = 1 << 1, 1 << 3
HWTSTAMP_TX_OFF, HWTSTAMP_TX_ON = 0, 1
HWTSTAMP_FILTER_NONE, HWTSTAMP_FILTER_ALL = 0, 1
_TS_INFO = struct.Struct("=IIiI3II3I")  # struct ethtool_ts_info
_CONFIG = struct.Struct("=iii")  # struct hwtstamp_config: flags, tx_type, rx_filter
IFNAMSIZ = 16


@dataclass(frozen=True)
class Offer:
    """What a device can stamp (ethtool -T)."""

    software: bool  # sent and received packets, system clock
    hardware: bool  # every sent and received packet, on the NIC's clock
    phc_index: int  # its PTP hardware clock, -1 for none


def offers_hardware(so_timestamping: int, tx_types: int, rx_filters: int) -> bool:
    """Both directions in hardware, raw clock, every received packet: what
    a probe needs (a PTP-only receive filter stamps no probe)."""
    need = TX_HARDWARE | RX_HARDWARE | RAW_HARDWARE
    return (so_timestamping & need == need and bool(tx_types & (1 << HWTSTAMP_TX_ON))
            and bool(rx_filters & (1 << HWTSTAMP_FILTER_ALL)))


def _ioctl(ifname: str, request: int, data: ctypes.Array[ctypes.c_char]) -> None:
    """An interface ioctl whose ifreq points at `data` (the kernel reads
    and writes it there)."""
    name = ifname.encode()
    if not 0 < len(name) < IFNAMSIZ:
        raise OSError(f"'{ifname}' is no interface name")
    ifreq = bytearray(struct.pack(f"{IFNAMSIZ}sP", name, ctypes.addressof(data)).ljust(40, b"\0"))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), request, ifreq)


def offer(ifname: str) -> Offer:
    """The device's stamping capabilities; OSError where it cannot say."""
    buf = ctypes.create_string_buffer(_TS_INFO.pack(ETHTOOL_GET_TS_INFO, *[0] * 10), _TS_INFO.size)
    _ioctl(ifname, SIOCETHTOOL, buf)
    _cmd, so, phc, tx_types, *_r1, rx_filters, _r2, _r3, _r4 = _TS_INFO.unpack(buf.raw)
    return Offer(software=so & (TX_SOFTWARE | RX_SOFTWARE) == TX_SOFTWARE | RX_SOFTWARE,
                 hardware=offers_hardware(so, tx_types, rx_filters), phc_index=phc)


def _config(ifname: str, request: int, tx_type: int = 0, rx_filter: int = 0) -> tuple[int, int]:
    buf = ctypes.create_string_buffer(_CONFIG.pack(0, tx_type, rx_filter), _CONFIG.size)
    _ioctl(ifname, request, buf)
    _flags, tx, rx = _CONFIG.unpack(buf.raw)
    return tx, rx


def prepare(ifname: str, turn_on: bool) -> tuple[bool, str]:
    """(hardware stamps on, a line saying why) for one interface; turns them
    on where offered, off and `turn_on`. Never raises: a refusal is a note."""
    try:
        got = offer(ifname)
    except OSError as e:
        return False, f"{ifname}: stamping capabilities unknown ({e})"
    if not got.hardware:
        return False, f"{ifname}: no hardware stamps offered (software stamps: " \
                      f"{'yes' if got.software else 'no'})"
    try:
        tx, rx = _config(ifname, SIOCGHWTSTAMP)
    except OSError as e:
        tx, rx = HWTSTAMP_TX_OFF, HWTSTAMP_FILTER_NONE
        if not turn_on:
            return False, f"{ifname}: hardware stamps offered, state unknown ({e})"
    if tx == HWTSTAMP_TX_ON and rx == HWTSTAMP_FILTER_ALL:
        return True, f"{ifname}: hardware stamps on (PHC {got.phc_index})"
    if not turn_on:
        return False, f"{ifname}: hardware stamps offered but off (tx {tx}, rx filter {rx}); " \
                      "--hw-timestamps turns them on (needs NET_ADMIN)"
    try:
        tx, rx = _config(ifname, SIOCSHWTSTAMP, HWTSTAMP_TX_ON, HWTSTAMP_FILTER_ALL)
    except OSError as e:
        return False, f"{ifname}: hardware stamps offered, turning them on failed ({e})"
    on = tx == HWTSTAMP_TX_ON and rx == HWTSTAMP_FILTER_ALL
    return on, f"{ifname}: hardware stamps turned {'on' if on else 'partly on'} " \
               f"(tx {tx}, rx filter {rx}, PHC {got.phc_index})"
