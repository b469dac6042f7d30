"""The windows Diagnose answers from when no incident holds a pair."""

import numpy as np
import pytest

from analyzer.seen import SeenWindow, SeenWindows
from analyzer.verdicts import INCONCLUSIVE, NO_WINDOW, OK


def window(k: int, pairs: list[int], anomalous: dict[int, str] | None = None) -> SeenWindow:
    return SeenWindow(start=30.0 * k, end=30.0 * (k + 1), pairs=np.array(sorted(pairs)),
                      anomalous=anomalous or {})


def test_a_pair_is_judged_by_the_windows_that_overlap_the_range_and_hold_it():
    seen = SeenWindows()
    seen.add(window(0, [1, 2, 3], {2: "loss"}))
    seen.add(window(1, [1, 3], {3: "latency"}))
    seen.add(window(2, [1, 2, 3], {3: "latency"}))
    assert seen.judge(1, 0, 90, settle=2) == (OK, "3 healthy window(s)")
    # The window ending at the range's start is not in it; one starting at its end is.
    assert seen.judge(1, 30, 60, settle=2) == (OK, "2 healthy window(s)")
    assert seen.judge(2, 30, 59, settle=2) == (INCONCLUSIVE, NO_WINDOW)  # the one window there lacks it
    verdict, reason = seen.judge(3, 0, 90, settle=2)
    assert verdict == INCONCLUSIVE
    assert reason == ("anomalous window(s) not yet persistent: latency in 2 of 3 window(s), "
                      "the last ending at 90")
    verdict, reason = seen.judge(2, 0, 90, settle=2)  # one healthy window after it: it may go on
    assert verdict == INCONCLUSIVE
    assert "loss in 1 of 2 window(s)" in reason and "ending at 30" in reason
    assert seen.judge(4, 0, 90, settle=2) == (INCONCLUSIVE, NO_WINDOW)
    assert seen.judge(-1, 0, 90, settle=2) == (INCONCLUSIVE, NO_WINDOW)  # a pair never numbered


def test_pruned_windows_answer_no_more_and_the_latest_names_its_healthy_pairs():
    seen = SeenWindows()
    assert seen.latest_healthy() == set()
    seen.add(window(0, [1, 2], {}))
    seen.add(window(1, [1, 2, 5], {2: "unreachable"}))
    assert seen.latest_healthy() == {1, 5}
    seen.prune(30.0)  # the first window ended at 30: kept (it ended at, not before, the horizon)
    assert seen.judge(1, 0, 60, settle=2)[1] == "2 healthy window(s)"
    seen.prune(45.0)
    assert seen.judge(1, 0, 60, settle=2)[1] == "1 healthy window(s)"
    seen.prune(61.0)
    assert seen.judge(1, 0, 60, settle=2) == (INCONCLUSIVE, NO_WINDOW)
    assert seen.latest_healthy() == set()


@pytest.mark.parametrize("seed", range(5))
def test_a_window_holds_exactly_its_pairs(seed):
    rng = np.random.default_rng(seed)
    ids = np.unique(rng.integers(0, 500, size=int(rng.integers(0, 200))))
    w = SeenWindow(0.0, 1.0, ids, {})
    members = set(ids.tolist())
    assert [w.holds(x) for x in range(-2, 502)] == [x in members for x in range(-2, 502)]


def test_an_anomaly_followed_by_enough_healthy_windows_passed():
    """Benign congestion: a pair slow in one window, then healthy. Until
    `settle` healthy windows follow, it may be a fault beginning; after
    them it passed, and a range holding it is healthy, saying so."""
    seen = SeenWindows()
    seen.add(window(0, [1, 2]))
    seen.add(window(1, [1, 2], {1: "latency"}))
    seen.add(window(2, [1, 2]))
    assert seen.judge(1, 0, 90, settle=2)[0] == INCONCLUSIVE
    seen.add(window(3, [2]))  # a window that did not hold the pair says nothing of it
    assert seen.judge(1, 0, 120, settle=2)[0] == INCONCLUSIVE
    seen.add(window(4, [1, 2]))
    assert seen.judge(1, 0, 150, settle=2) == (
        OK, "3 healthy window(s); latency in 1 passed without an incident (2 healthy after it)")
    # Asked about the slow window alone, the windows after it still tell how it ended.
    assert seen.judge(1, 30, 59, settle=2)[0] == OK
    # Anomalous again before `settle` healthy ones: not passed.
    seen.add(window(5, [1, 2], {2: "loss"}))
    seen.add(window(6, [1, 2], {2: "loss"}))
    seen.add(window(7, [1, 2]))
    seen.add(window(8, [1, 2]))
    assert seen.judge(2, 0, 179, settle=2)[0] == INCONCLUSIVE  # only its window-5 loss is in range ...
    assert seen.judge(2, 0, 270, settle=2)[0] == OK            # ... and window 6's is passed too
    assert "loss in 2" in seen.judge(2, 0, 270, settle=2)[1]
