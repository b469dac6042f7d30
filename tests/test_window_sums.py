"""The per-pair sums an incident is dated from after it was found."""

import numpy as np

from analyzer import window_sums
from analyzer.batch import STAT_FIELDS
from analyzer.window_sums import WindowSums


def rows(rng, npairs, n):
    pid = rng.integers(0, npairs, size=n)
    sent = rng.integers(1, 40, size=n).astype(np.float64)
    lost = np.minimum(sent, rng.integers(0, 5, size=n)).astype(np.float64)
    stats = rng.uniform(10, 200, size=(n, len(STAT_FIELDS)))
    stats[lost == sent, STAT_FIELDS.index("rtt_mean")] = np.nan  # nothing received
    return pid, stats, sent, lost


def test_sums_agree_with_a_loop_over_rows_and_pairs_seen_later_read_zero():
    rng = np.random.default_rng(4)
    sums = WindowSums()
    want = []
    for k, npairs in enumerate([5, 5, 9]):  # four pairs first seen in the third window
        pid, stats, sent, lost = rows(rng, npairs, 30)
        got_sent, got_lost = sums.note(10.0 * k, pid, stats, sent, lost, npairs)
        ref = np.zeros((3, 9))
        for p, st, s, lo in zip(pid, stats, sent, lost, strict=True):
            ref[0, p] += lo
            ref[1, p] += s - lo
            if s > lo:
                ref[2, p] += st[STAT_FIELDS.index("rtt_mean")] * (s - lo)
        assert np.allclose(got_sent[:npairs], ref[0, :npairs] + ref[1, :npairs])
        assert np.allclose(got_lost[:npairs], ref[0, :npairs])
        want.append(ref)
    ids = np.array([8, 0, 3])
    held = sums.of(ids)
    assert held is not None
    starts, values = held
    assert starts.tolist() == [0.0, 10.0, 20.0]
    assert values.shape == (3, 3, 3)
    for k in range(3):
        assert np.allclose(values[:, k, :], want[k][:, ids], rtol=1e-5)
    assert values[:, :2, 0].tolist() == [[0, 0]] * 3  # pair 8 was unseen then


def test_nothing_held_answers_none_and_old_windows_go():
    sums = WindowSums()
    assert sums.of(np.array([0])) is None
    rng = np.random.default_rng(1)
    for k in range(window_sums.MAX_WINDOWS + 5):
        sums.note(float(k), *rows(rng, 3, 4), 3)
    assert sums.of(np.array([], dtype=np.int64)) is None
    held = sums.of(np.array([1]))
    assert held is not None
    kept = window_sums.MAX_WINDOWS  # three pairs' sums are far below BYTES
    assert held[0].tolist() == [float(k) for k in range(window_sums.MAX_WINDOWS + 5 - kept,
                                                         window_sums.MAX_WINDOWS + 5)]
