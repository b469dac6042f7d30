"""NetDiag's rules as plain functions, without an engine or a network:
which pairs an ask covers, which verdict each gets, what an active
check's flags say."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.diagnose import DEFAULT_RANGE_S, asked_pairs, check_symptoms, diagnosis, time_range
from analyzer.verdicts import FAULT, INCONCLUSIVE, OK
from netskel.errors import InputError, NotFoundError
from netskel.model import Component, Incident, WindowStats

BY_ENDPOINT = {"a": {("a", "b"), ("a", "c")}, "b": {("a", "b")}, "c": {("a", "c")}}
KNOWN = {"a", "b", "c", "d"}


def test_an_ask_covers_each_pair_once_in_the_order_asked():
    asked, lonely = asked_pairs(["b", "a", "d"], [("c", "a")], BY_ENDPOINT, KNOWN)
    assert asked == [("a", "c"), ("a", "b")]  # the named pair first, then b's, then a's new one
    assert lonely == ["d"]


@pytest.mark.parametrize("endpoints, pairs, error", [
    ([], [], InputError), (["zz"], [], NotFoundError), ([], [("a", "zz")], NotFoundError)])
def test_an_empty_ask_or_an_unknown_endpoint_is_the_callers_error(endpoints, pairs, error):
    with pytest.raises(error):
        asked_pairs(endpoints, pairs, BY_ENDPOINT, KNOWN)


def test_a_range_defaults_to_the_look_back_before_now_and_must_not_run_backwards():
    assert time_range(0, 0, now=1_000.0) == (1_000.0 - DEFAULT_RANGE_S, 1_000.0)
    assert time_range(10.0, 0, now=1_000.0) == (10.0, 1_000.0)
    with pytest.raises(InputError):
        time_range(500.0, 400.0, now=1_000.0)


def _incident(iid: str, start: float, end: float | None, pairs: list[tuple[str, str]]) -> Incident:
    return Incident(id=iid, start=start, end=end, symptom="loss", layer="underlay",
                    component=Component("link", "l1"), pairs=pairs, confidence=1.0)


def test_a_pair_is_a_fault_only_by_an_incident_overlapping_the_range():
    incidents = [_incident("inc-2", 100, None, [("a", "b")]),
                 _incident("inc-1", 10, 50, [("a", "b"), ("a", "c")])]  # ended before the range
    judged = []

    def judge(pair: tuple[str, str]) -> tuple[str, str]:
        judged.append(pair)
        return OK, "3 healthy window(s)"

    d = diagnosis([("a", "b"), ("a", "c")], ["d"], incidents, judge,
                  {("a", "c"): ("a", "t0>s1>t1")}, 60.0, 200.0)
    assert [(v.pair, v.verdict, v.reason) for v in d.pairs] == [
        (("d", "d"), INCONCLUSIVE, "no monitored pair has endpoint 'd'"),
        (("a", "b"), FAULT, "inc-2"),
        (("a", "c"), OK, "3 healthy window(s)")]
    assert judged == [("a", "c")]
    assert [i.id for i in d.incidents] == ["inc-2"]
    assert (d.pairs[2].route_from, d.pairs[2].route) == ("a", "t0>s1>t1")
    assert d.verdict == FAULT


def _window(dst: str, size: int, sent: int, lost: int, median: float = 20.0) -> WindowStats:
    return WindowStats("a", dst, 0.0, 5.0, size, sent, lost, rtt_median=median)


def test_a_check_calls_a_pair_unreachable_only_when_no_size_got_through():
    windows = [_window("b", 64, 10, 10), _window("b", 4096, 10, 2),
               _window("c", 64, 10, 10), _window("c", 4096, 10, 10, median=float("nan"))]
    loss = np.array([True, True, True, True])
    unreachable = np.array([True, False, True, True])
    slow = np.zeros(4, dtype=bool)
    checked, reasons, anomalous = check_symptoms(windows, loss, slow, unreachable,
                                                 np.full(4, 20.0))
    assert checked == {("a", "b"), ("a", "c")}
    assert anomalous == {("a", "b"): "loss", ("a", "c"): "unreachable"}
    assert reasons[("a", "b")] == "64 B: all 10 probes lost; 4096 B: 2/10 lost"


def test_a_slow_check_says_how_slow_against_what_is_typical():
    windows = [_window("b", 64, 10, 0, median=180.0), _window("c", 64, 10, 0)]
    no = np.zeros(2, dtype=bool)
    checked, reasons, anomalous = check_symptoms(windows, no, np.array([True, False]), no,
                                                 np.array([21.0, 20.0]))
    assert anomalous == {("a", "b"): "latency"}
    assert reasons == {("a", "b"): "64 B: median RTT 180 us, typically 21 us"}
    assert checked == {("a", "b"), ("a", "c")}
