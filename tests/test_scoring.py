"""The dev set's incident rules as bench/accuracy.py applies them."""

from __future__ import annotations

import pytest

from netskel.scoring import score_incidents, summarize_faults

LINK = {"type": "link", "id": "spine-0~tor-r0-0"}


def fault(start, end):
    return {"id": "F1", "kind": "link_loss", "start": start, "end": end, "layer": "underlay",
            "component": LINK, "accept": [], "pairs": [["a", "b"]]}


def incident(start, end, component=LINK, confidence=0.9):
    return {"id": "inc-1", "start": start, "end": end, "symptom": "loss", "layer": "underlay",
            "component": component, "pairs": [["a", "b"]], "confidence": confidence}


def test_delay_and_end_error_of_the_best_match():
    truth = {"t_end": 2000.0, "faults": [fault(100.0, 400.0)]}
    s = score_incidents(truth, {"incidents": [incident(97.5, 412.0)]})
    (row,) = s["faults"]
    assert row["detected"] and row["component_ok"]
    assert row["delay_s"] == pytest.approx(2.5) and row["end_error_s"] == pytest.approx(12.0)
    summary = summarize_faults([s])
    assert summary["median_delay_s"] == pytest.approx(2.5)
    assert summary["median_end_error_s"] == pytest.approx(12.0)


@pytest.mark.parametrize("fault_end,incident_end", [(None, 412.0), (400.0, None)])
def test_no_end_error_where_either_is_still_open(fault_end, incident_end):
    truth = {"t_end": 2000.0, "faults": [fault(100.0, fault_end)]}
    s = score_incidents(truth, {"incidents": [incident(101.0, incident_end)]})
    assert s["faults"][0]["end_error_s"] is None
    assert summarize_faults([s])["median_end_error_s"] is None


def test_an_incident_too_early_is_no_match():
    truth = {"t_end": 2000.0, "faults": [fault(1000.0, 1400.0)]}
    s = score_incidents(truth, {"incidents": [incident(600.0, None)]})
    assert not s["faults"][0]["detected"] and s["false_incidents"] == 1
