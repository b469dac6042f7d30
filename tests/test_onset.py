"""When a fault began, read from window sums (analyzer/onset.py)."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.onset import drift_onset, ending, onset

W = 30.0
T0 = 1_700_000_010.0 // W * W


def sums(lost, received=None, rtt=None):
    """Window k starts at T0 + k W; one column per pair."""
    lost = np.asarray(lost, dtype=np.float64).reshape(len(lost), -1)
    received = np.full(lost.shape, 100.0) if received is None else np.asarray(received, float)
    rtt = received * 20.0 if rtt is None else np.asarray(rtt, dtype=np.float64)
    return T0 + W * np.arange(len(lost)), lost, received, rtt


def test_a_loss_that_began_late_in_its_first_window_starts_there():
    """60 probes lost in a whole faulty window, 20 in the first: the fault
    filled its last third."""
    starts, lost, rec, rtt = sums([[0, 0], [0, 0], [0, 0], [10, 10], [30, 30], [30, 30], [30, 30]])
    assert onset(starts, lost, rec, rtt, T0 + 3 * W, W, "loss") == pytest.approx(T0 + 3 * W + 20)


def test_a_healthy_rate_of_losses_is_not_the_fault():
    starts, lost, rec, rtt = sums([[2], [2], [2], [12], [22], [22], [22]])
    assert onset(starts, lost, rec, rtt, T0 + 3 * W, W, "loss") == pytest.approx(T0 + 3 * W + 15)


def test_a_fault_filling_its_first_window_began_in_the_one_before():
    """The window before was not flagged, yet the fault held its last 6 s."""
    starts, lost, rec, rtt = sums([[0], [0], [10], [50], [50], [50], [50]])
    assert onset(starts, lost, rec, rtt, T0 + 3 * W, W, "loss") == pytest.approx(T0 + 3 * W - 6)


def test_a_dead_agent_is_counted_by_its_lost_probes_not_their_share():
    """Probes to the endpoint are lost from its death on, its own probes stop:
    the share lost moves with the sending rate, the count with the fault.
    It died 10 s into the window: 2 x 100 a window sent before, 100 after."""
    received = [[200], [200], [200], [200 * 10 / 30], [0], [0], [0]]
    lost = [[0], [0], [0], [100 * 20 / 30], [100], [100], [100]]
    starts, lost_a, rec, rtt = sums(lost, received)
    assert onset(starts, lost_a, rec, rtt, T0 + 3 * W, W, "unreachable") == \
        pytest.approx(T0 + 3 * W + 10)
    share = lost_a[:, 0] / (lost_a[:, 0] + rec[:, 0])
    assert share[3] / share[4] != pytest.approx(2 / 3)  # the share would say otherwise


def test_a_latency_step_is_read_against_each_pairs_own_level():
    """Pairs of 10 and 40 us, +30 us from 12 s into the first window; the
    slower pair went unprobed in one healthy window, which must not read
    as the other's level."""
    received = np.full((7, 2), 100.0)
    received[1, 1] = 0
    level = np.array([10.0, 40.0])
    rtt = received * level
    rtt[3] += received[3] * 30 * (18 / 30)
    rtt[4:] += received[4:] * 30
    starts = T0 + W * np.arange(7)
    lost = np.zeros((7, 2))
    assert onset(starts, lost, received, rtt, T0 + 3 * W, W, "latency") == \
        pytest.approx(T0 + 3 * W + 12)


def test_windows_in_any_order_and_gaps():
    starts, lost, rec, rtt = sums([[0], [0], [0], [10], [30], [30], [30]])
    order = np.array([5, 0, 3, 6, 1, 4])  # window 2 (the one before) is missing
    assert onset(starts[order], lost[order], rec[order], rtt[order], T0 + 3 * W, W, "loss") == \
        pytest.approx(T0 + 3 * W + 20)


@pytest.mark.parametrize("keep,why", [
    ([2, 3, 4, 5, 6], "no healthy window before the one before"),
    ([0, 1, 2, 3], "no whole faulty window after the first"),
    ([0, 1, 2, 4, 5, 6], "the first window itself is missing"),
])
def test_windows_that_cannot_tell_leave_the_start_alone(keep, why):
    starts, lost, rec, rtt = sums([[0], [0], [0], [10], [30], [30], [30]])
    k = np.array(keep)
    assert onset(starts[k], lost[k], rec[k], rtt[k], T0 + 3 * W, W, "loss") is None, why


def _creeping(seed, rise_from, windows=12, top=40.0):
    """Two pairs of 10 and 40 us with 1 us of noise a window; from window
    `rise_from` on both creep up by `top` us over eight windows."""
    rng = np.random.default_rng(seed)
    received = np.full((windows, 2), 100.0)
    extra = np.clip((np.arange(windows) - rise_from) / 8, 0, 1)[:, None] * top
    rtt = received * (np.array([10.0, 40.0]) + extra + rng.normal(0, 1.0, (windows, 2)))
    return T0 + W * np.arange(windows), np.zeros((windows, 2)), received, rtt


@pytest.mark.parametrize("seed", range(4))
def test_a_latency_that_creeps_up_starts_where_it_began_to_rise(seed):
    """Flagged in window 8, once it crossed what a window may call slow,
    five windows after it began to rise: the windows before the first
    flagged one are no healthy level, the rise they make is the start."""
    starts, lost, rec, rtt = _creeping(seed, rise_from=3)
    began = onset(starts, lost, rec, rtt, T0 + 8 * W, W, "latency")
    assert began == pytest.approx(T0 + 3 * W, abs=W)


def _creep_beside(seed, other_step=True):
    """Two pairs creeping up 0.6 us a window from window 20, flagged in
    window 44; congestion bursts of +25 us in windows 11 and 13 and, with
    `other_step`, another fault's +6 us on both from window 10 to 40."""
    rng = np.random.default_rng(seed)
    k = np.arange(48)
    extra = np.clip(k - 20, 0, None) * 0.6 + np.isin(k, [11, 13]) * 25.0
    if other_step:
        extra += np.where((k >= 10) & (k < 40), 6.0, 0.0)
    received = np.full((48, 2), 100.0)
    rtt = received * (np.array([10.0, 40.0]) + extra[:, None] + rng.normal(0, 1.0, (48, 2)))
    return T0 + W * k, np.zeros((48, 2)), received, rtt


@pytest.mark.parametrize("seed", range(4))
def test_a_creep_starts_where_it_began_beside_bursts_and_another_faults_step(seed):
    """Two bursts pulled the least-squares rise four windows late; another
    fault's step on the same pairs, read as part of the rise, put its
    start fifteen windows early (bench/inject.py drift with spinelat, draw
    4066 of session 62: 381 s). Bursts are read as their neighbours, and
    the other fault's incident is a level of its own beside the rise."""
    starts, lost, rec, rtt = _creep_beside(seed, other_step=False)
    began = onset(starts, lost, rec, rtt, T0 + 44 * W, W, "latency")
    assert began == pytest.approx(T0 + 20 * W, abs=W)
    starts, lost, rec, rtt = _creep_beside(seed)
    began = onset(starts, lost, rec, rtt, T0 + 44 * W, W, "latency",
                  others=[(T0 + 10 * W, T0 + 40 * W)])
    assert began == pytest.approx(T0 + 20 * W, abs=W)


@pytest.mark.parametrize("seed", range(4))
def test_a_latency_step_is_no_ramp(seed):
    """A step 12 s into the first flagged window, with the same noise: read
    by its share of that window, not as a rise that began before it."""
    starts, lost, rec, rtt = _creeping(seed, rise_from=99)
    rtt[3] += rec[3] * 30 * (18 / 30)
    rtt[4:] += rec[4:] * 30
    assert onset(starts, lost, rec, rtt, T0 + 3 * W, W, "latency") == \
        pytest.approx(T0 + 3 * W + 12, abs=2)
    # Some of its pairs a little slow already in the window before (a flow
    # through the fault there): partly filled windows each side, still a step.
    starts, lost, rec, rtt = _creeping(seed, rise_from=99)
    rtt[2] += rec[2] * 30 * 0.15
    rtt[3] += rec[3] * 30 * 0.6
    rtt[4:] += rec[4:] * 30
    assert onset(starts, lost, rec, rtt, T0 + 3 * W, W, "latency") > T0 + 2 * W


def test_no_clear_step_leaves_the_start_alone():
    """Two probes more a window than before is no step to measure against."""
    starts, lost, rec, rtt = sums([[1], [1], [1], [2], [3], [3], [3]])
    assert onset(starts, lost, rec, rtt, T0 + 3 * W, W, "loss") is None
    starts, lost, rec, rtt = sums([[0], [0], [0], [0], [0], [0], [0]])
    assert onset(starts, lost, rec, rtt, T0 + 3 * W, W, "latency") is None


def test_a_fault_ends_where_its_last_window_stops_losing():
    """Read backwards: 30 lost in a whole faulty window, 12 in the last one,
    none after: the fault held its first 12 s."""
    starts, lost, rec, rtt = sums([[30], [30], [30], [12], [0], [0], [0]])
    assert ending(starts, lost, rec, rtt, T0 + 3 * W, W, "loss") == pytest.approx(T0 + 3 * W + 12)
    starts, lost, rec, rtt = sums([[30], [30], [30], [30], [6], [0], [0]])
    assert ending(starts, lost, rec, rtt, T0 + 3 * W, W, "loss") == \
        pytest.approx(T0 + 4 * W + 6), "a last window filled whole: it ended in the next one"
    assert ending(starts[:4], lost[:4], rec[:4], rtt[:4], T0 + 3 * W, W, "loss") is None


def _period(seed, rise):
    """61 windows of a period: noise of 2 % on the log-median, plus `rise`."""
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 0.02, 61) + rise(np.arange(61))


@pytest.mark.parametrize("seed", range(4))
def test_a_drift_begins_where_its_period_left_its_level(seed):
    step = _period(seed, lambda t: np.where(t >= 20, 0.1, 0.0))
    assert drift_onset(step) == pytest.approx(20, abs=1)
    ramp = _period(seed, lambda t: np.maximum(0, t - 15) * 0.004)
    assert drift_onset(ramp) == pytest.approx(15, abs=2)
    gaps = _period(seed, lambda t: np.where(t >= 30, 0.1, 0.0))
    gaps[::3] = np.nan  # windows missing or not healthy
    assert drift_onset(gaps) == pytest.approx(30, abs=1)


@pytest.mark.parametrize("seed", range(4))
def test_a_drift_over_the_whole_period_or_none_at_all_began_before_it(seed):
    assert drift_onset(_period(seed, lambda t: 0.1 + 0 * t)) == 0.0
    assert drift_onset(_period(seed, lambda t: 0 * t)) == 0.0
    assert drift_onset(_period(seed, lambda t: np.where(t < 30, 0.1, 0.0))) == 0.0, \
        "a drop is no start"


def test_too_few_values_tell_nothing():
    assert drift_onset(np.array([np.nan, 0.1, np.nan, 0.2, 0.1])) is None


def test_short_windows_read_a_drift_to_within_a_grid_step():
    """1 s windows make 1,801 places in a period: the rise's bounds are
    tried on an even grid of them, not on every pair of places."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 0.02, 1801)
    x[700:] += 0.1
    assert drift_onset(x) == pytest.approx(700, abs=1800 / 64)


def test_a_slow_loss_found_late_starts_where_its_losses_began():
    """A probe or two a window, found only once four windows of it added up
    (analyzer/detect.py, Carry): no window holds a step to read a share
    from, so the start is where the lost counts change rate, three windows
    before the one it was found in, not that window's start."""
    starts, lost, rec, rtt = sums([[0], [0], [0], [0], [0], [1], [2], [1], [2], [2], [1], [2]])
    first = T0 + 8 * W
    began = onset(starts, lost, rec, rtt, first, W, "loss")
    assert began is not None and T0 + 5 * W - W / 2 <= began <= T0 + 6 * W


def test_a_slow_loss_ends_where_its_rate_fell_whatever_came_before_it():
    """A loss strong in its first window, then two probes a whole window,
    one in the window it ended halfway through, none after: the end is half
    a window in, read against the usual faulty window (their median), not
    against a mean that the strong window and the healthy windows before
    the fault pull about."""
    starts, lost, rec, rtt = sums([[0], [0], [0], [0], [40], [2], [2], [2], [2], [2], [2], [1],
                                   [0], [0], [0]])
    end = ending(starts, lost, rec, rtt, T0 + 11 * W, W, "loss")
    assert end == pytest.approx(T0 + 11 * W + W / 2, abs=1)


def test_a_rate_that_never_changed_dates_nothing():
    """Losses as frequent before the flagged window as after it: no change
    to date, the window's own start stands (None)."""
    starts, lost, rec, rtt = sums([[1], [2], [1], [2], [1], [2], [1], [2], [1], [2], [1], [2]])
    assert onset(starts, lost, rec, rtt, T0 + 8 * W, W, "loss") is None


def test_a_loss_found_by_summing_windows_began_before_its_first_flagged_one():
    """A probe or two, then four, seven, five, three a window: flagged only
    in the window of four (the sums of the loss test), after a window that
    already lost two where healthy windows lose none. The fault began in
    that window, not in the flagged one (read as a share of the flagged
    window alone, it began 6 s into that one: a 1 % loss at bench/inject.py
    --place 204 was dated 48 s late)."""
    starts, lost, rec, rtt = sums([[0], [0], [0], [0], [0], [0], [0], [2], [4], [7], [5], [3]])
    began = onset(starts, lost, rec, rtt, T0 + 8 * W, W, "loss")
    assert began is not None and T0 + 7 * W <= began < T0 + 8 * W


def test_one_probe_lost_in_a_healthy_window_is_not_where_a_weak_loss_began():
    """A stray loss four windows before a weak loss (seven, five, one, one a
    window): the fault's level is the mean of the windows after the flagged
    one, not their median (1), so the stray probe does not pass for it."""
    starts, lost, rec, rtt = sums([[0], [0], [0], [1], [0], [0], [1], [7], [5], [1], [1]])
    began = onset(starts, lost, rec, rtt, T0 + 7 * W, W, "loss")
    assert began is not None and began >= T0 + 6 * W
