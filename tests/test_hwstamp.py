"""Hardware timestamps: what a device offers, read from the real kernel
(this machine's interfaces offer software stamps only), and the rule for
when a probe can have hardware stamps at all."""

from __future__ import annotations

import pytest

from probe_agent.hwstamp import (
    HWTSTAMP_FILTER_ALL,
    HWTSTAMP_FILTER_NONE,
    HWTSTAMP_TX_OFF,
    HWTSTAMP_TX_ON,
    RAW_HARDWARE,
    RX_HARDWARE,
    RX_SOFTWARE,
    TX_HARDWARE,
    TX_SOFTWARE,
    offer,
    offers_hardware,
    prepare,
)

HW = TX_HARDWARE | RX_HARDWARE | RAW_HARDWARE | TX_SOFTWARE | RX_SOFTWARE
PTP_V2_EVENT = 12  # HWTSTAMP_FILTER_PTP_V2_EVENT


@pytest.mark.parametrize("so, tx_types, rx_filters, hardware", [
    # A ConnectX-like offer: both ways, raw clock, every packet received.
    (HW, 1 << HWTSTAMP_TX_OFF | 1 << HWTSTAMP_TX_ON,
     1 << HWTSTAMP_FILTER_NONE | 1 << HWTSTAMP_FILTER_ALL, True),
    # PTP event packets only: no probe would be stamped on receipt.
    (HW, 1 << HWTSTAMP_TX_ON, 1 << HWTSTAMP_FILTER_NONE | 1 << PTP_V2_EVENT, False),
    (HW & ~RAW_HARDWARE, 1 << HWTSTAMP_TX_ON, 1 << HWTSTAMP_FILTER_ALL, False),
    (HW, 1 << HWTSTAMP_TX_OFF, 1 << HWTSTAMP_FILTER_ALL, False),
    (TX_SOFTWARE | RX_SOFTWARE, 0, 0, False),
])
def test_hardware_stamps_need_both_ways_and_every_packet(so, tx_types, rx_filters, hardware):
    assert offers_hardware(so, tx_types, rx_filters) is hardware


def test_the_kernels_loopback_offers_software_stamps_only():
    got = offer("lo")
    assert got.software and not got.hardware and got.phc_index == -1
    on, note = prepare("lo", turn_on=True)  # asked, but nothing to turn on
    assert not on and "no hardware stamps offered" in note


def test_an_unknown_or_impossible_interface_is_a_note_not_an_error():
    for name in ("netskel-none0", "x" * 20, ""):
        on, note = prepare(name, turn_on=True)
        assert not on and "unknown" in note
    with pytest.raises(OSError):
        offer("netskel-none0")


def test_the_agent_reports_each_interfaces_stamping_and_starts_whatever_it_is():
    from netskel.config import AgentConfig
    from probe_agent.agent import Agent

    a = Agent(AgentConfig(container="c0", host="h0", probe_port=0, hw_timestamps=True, rdma="off",
                          endpoints=("c0/e0,h0/nic0,127.0.0.1,lo", "c0/e1,h0/nic1,127.0.0.1,")))
    try:
        assert list(a.stamping) == ["lo"]  # an endpoint without an interface has nothing to ask
        on, note = a.stamping["lo"]
        assert not on and note.startswith("lo: no hardware stamps offered")
    finally:
        a.stop(deregister=False)
