"""The agent's byte counters: the interface's own, plus its RDMA device's
port counters, where training traffic on an RDMA NIC is counted (it never
passes the kernel's stack). Fake sysfs trees in the kernel's layout; the
loopback interface for the real one."""

from __future__ import annotations

from pathlib import Path

from probe_agent.counters import WORD, WithoutOwnTraffic, rdma_port_bytes, read_counters, sample


def _netdev(net: Path, ifname: str, tx: int, rx: int) -> Path:
    stats = net / ifname / "statistics"
    stats.mkdir(parents=True)
    (stats / "tx_bytes").write_text(f"{tx}\n")
    (stats / "rx_bytes").write_text(f"{rx}\n")
    return net / ifname


def _port(ib: Path, device: str, port: int, xmit: str | None, rcv: str | None) -> None:
    counters = ib / device / "ports" / str(port) / "counters"
    counters.mkdir(parents=True)
    if xmit is not None:
        (counters / "port_xmit_data").write_text(xmit + "\n")
    if rcv is not None:
        (counters / "port_rcv_data").write_text(rcv + "\n")


def test_a_vf_counts_its_rdma_traffic_beside_the_kernels(tmp_path):
    net, ib = tmp_path / "net", tmp_path / "ib"
    vf = _netdev(net, "eth1", 5_000, 7_000)
    (vf / "device" / "infiniband" / "mlx5_3").mkdir(parents=True)
    _port(ib, "mlx5_3", 1, "1000000", "2500000")
    assert read_counters("eth1", net, ib) == (5_000 + 1_000_000 * WORD, 7_000 + 2_500_000 * WORD)
    assert rdma_port_bytes("mlx5_3", ib) == (4_000_000, 10_000_000)
    # A second port adds its words too.
    _port(ib, "mlx5_3", 2, "10", "20")
    assert read_counters("eth1", net, ib) == (5_000 + 1_000_010 * WORD, 7_000 + 2_500_020 * WORD)


def test_soft_roce_and_plain_interfaces_count_the_kernels_only(tmp_path):
    net, ib = tmp_path / "net", tmp_path / "ib"
    _netdev(net, "eth2", 11, 13)
    (ib / "rxe0" / "ports" / "1").mkdir(parents=True)  # no PMA counters
    (ib / "rxe0" / "parent").write_text("eth2\n")
    _netdev(net, "eth3", 17, 19)
    assert read_counters("eth2", net, ib) == (11, 13)
    assert read_counters("eth3", net, ib) == (17, 19)
    assert rdma_port_bytes("rxe0", ib) is None
    assert rdma_port_bytes("absent", ib) is None


def test_unreadable_rdma_counters_leave_the_interfaces_and_a_vanished_one_no_sample(tmp_path):
    net, ib = tmp_path / "net", tmp_path / "ib"
    vf = _netdev(net, "eth4", 100, 200)
    (vf / "device" / "infiniband" / "mlx5_4").mkdir(parents=True)
    _port(ib, "mlx5_4", 1, "garbage", "5")
    _port(ib, "mlx5_4", 2, "7", None)
    assert read_counters("eth4", net, ib) == (100, 200)
    got = sample({"ep-a": "eth4", "ep-b": "gone"}, net, ib)
    assert [(s.endpoint, s.tx_bytes, s.rx_bytes) for s in got] == [("ep-a", 100, 200)]


def test_the_real_loopback_reads_as_the_kernel_counts_it():
    stats = Path("/sys/class/net/lo/statistics")
    before = int((stats / "tx_bytes").read_text())
    got = read_counters("lo")
    after = int((stats / "tx_bytes").read_text())
    assert got is not None and before <= got[0] <= after


def test_the_agents_own_traffic_is_taken_out_and_what_is_left_only_grows():
    c = WithoutOwnTraffic()
    # Training moves 1,000 B a sample; the agent's probes 300 B, counted by
    # the agent just after the kernel (own is read first: it may lag).
    assert c.correct("e", (10_000, 8_000), (0, 0)) == (10_000, 8_000)
    assert c.correct("e", (11_300, 9_300), (300, 300)) == (11_000, 9_000)
    # A probe the kernel counted before this read but the agent after it:
    # 300 B more than it should; the next sample would dip by 300.
    assert c.correct("e", (12_600, 10_300), (300, 300)) == (12_300, 10_000)
    assert c.correct("e", (12_900, 10_600), (900, 900)) == (12_300, 10_000)  # held, no dip
    assert c.correct("e", (14_200, 11_900), (1_200, 1_200)) == (13_000, 10_700)


def test_a_counter_reset_passes_through_and_own_bytes_count_from_there():
    c = WithoutOwnTraffic()
    c.correct("e", (50_000, 50_000), (4_000, 4_000))
    tx, rx = c.correct("e", (700, 500), (4_200, 4_100))  # the VF was reset
    assert (tx, rx) == (700, 500)  # lower: the rates code reads a reset
    assert c.correct("e", (1_900, 1_600), (4_400, 4_200)) == (1_700, 1_500)
    assert c.correct("f", (100, 100), (0, 0)) == (100, 100)  # endpoints apart


def test_results_never_fall_between_resets_whatever_the_race():
    import random

    rng = random.Random(7)
    c = WithoutOwnTraffic()
    raw = own = last = 0
    for _ in range(2000):
        sent = rng.choice([0, 0, 42, 4138])       # the agent's probe
        trained = rng.choice([0, 0, 0, 65_536])   # the job's traffic
        lag = rng.random() < 0.3                  # the agent counts it after this read
        raw += sent + trained
        seen_own = own if lag else own + sent
        own += sent
        tx, _ = c.correct("e", (raw, raw), (seen_own, seen_own))
        assert last <= tx <= raw
        last = tx
    assert last >= raw - own - 4138  # at most one probe left in
