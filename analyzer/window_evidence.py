"""What a person needs to judge an incident's windows: one detector row's
name and its window's figures, read from a batch's columns."""

from __future__ import annotations

import numpy as np

from analyzer.batch import STAT_FIELDS, WindowBatch
from analyzer.detect import STATS, Observation


def row_label(src: str, dst: str, proto: str, size: int) -> str:
    """One detector row's name in an incident's evidence: a pair's two
    directions and two protocols at one size are separate measurements."""
    return f"{src}>{dst} {proto} size_{size}"


def window_evidence(b: WindowBatch, obs: Observation, i: int) -> dict[str, object]:
    """What a person needs to judge one window (row i of the batch, read
    from its columns: thousands of rows in a fault's window): counts, the
    loss test, the RTT statistics against the pair's usual median and the
    LOF score."""
    sent, lost, slow = int(b.sent[i]), int(b.lost[i]), int(b.slow[i])
    ev: dict[str, object] = {"sent": sent, "lost": lost,
                             "loss_p_value": float(f"{obs.loss_p[i]:.3g}"),
                             "loss_baseline": float(f"{obs.loss_baseline[i]:.3g}")}
    if lost < sent:
        row = dict(zip(STAT_FIELDS, b.stats[i].tolist(), strict=True))
        ev["rtt_us"] = {f.removeprefix("rtt_"): round(row[f], 1) for f in STATS}
        clock = b.clocks[int(b.clock[i])]
        if clock:  # how far the RTTs can be trusted: NIC, kernel or user-space stamps
            ev["rtt_clock"] = clock
    if np.isfinite(obs.ref_median[i]):
        ev["usual_median_us"] = round(float(obs.ref_median[i]), 1)
    if obs.crept is not None and obs.crept[i] and obs.slow_ref is not None:
        ev["slow_reference_median_us"] = round(float(obs.slow_ref[i]), 1)
    if np.isfinite(obs.lof[i]):
        ev["lof"] = round(float(obs.lof[i]), 2)
    if slow:
        ev["slow_tail"] = slow  # probes >= 20 us above the window's own p25
    flags = [n for n, a in (("loss", obs.loss), ("latency", obs.latency),
                            ("unreachable", obs.unreachable)) if a[i]]
    if obs.tail is not None and obs.tail[i]:
        flags.append("slow_tail")
    if flags:
        ev["anomalies"] = flags
    return ev
