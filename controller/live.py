"""Live skeleton inference: the controller's counters in, skeletons in force.

Runs on a schedule and soon after membership changes. Inference works on a
copy of the counters, outside the state lock; a job keeps its rail-aligned
list until its skeleton is confident."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from controller import metrics
from controller.pinglist import JobSkeleton
from controller.rates import to_rates
from controller.skeleton import infer
from controller.state import ControllerState
from netskel.errors import InputError

log = logging.getLogger(__name__)
MIN_CONFIDENCE = 0.5


def reinfer_job(state: ControllerState, job: str, min_samples: int = 50) -> dict[str, object]:
    eps, samples = state.counter_snapshot(job)
    if len(eps) < 2 or len(samples) < min_samples * len(eps):
        return {"job": job, "status": "waiting for counters", "samples": len(samples)}
    ts = np.array([s.ts for s in samples])
    code_of = {e: i for i, e in enumerate(eps)}
    codes = np.array([code_of[s.endpoint] for s in samples])
    tx = np.array([s.tx_bytes for s in samples], dtype=np.int64)
    rx = np.array([s.rx_bytes for s in samples], dtype=np.int64)
    t0 = time.perf_counter()
    try:
        rates = to_rates(ts, codes, tx, rx, eps, names=eps)
        sk = infer(state.topo, job, rates)
    except InputError as e:
        return {"job": job, "status": f"cannot infer: {e}"}
    finally:
        metrics.INFERENCE_SECONDS.observe(time.perf_counter() - t0)
    summary: dict[str, object] = {
        "job": job, "confidence": sk.confidence, "dp": sk.dp, "tp": sk.tp, "pp": sk.pp,
        "pairs": len(sk.pair_index), "dp_groups": sk.dp_groups, "pp_stages": sk.pp_stages,
        "notes": sk.notes}
    if sk.confidence >= MIN_CONFIDENCE:
        summary["status"] = "in force"
        state.apply_skeleton(job, JobSkeleton(covered=frozenset(eps), pairs=frozenset(sk.pairs)),
                             summary)
    else:
        summary["status"] = "not confident: rail-aligned"
        state.apply_skeleton(job, None, summary)
    return summary


def run_live_inference(state: ControllerState, stop: threading.Event, every_s: float = 60.0,
                       settle_s: float = 5.0) -> None:
    """Re-infer every job every `every_s`, and `settle_s` after membership
    changes (so a burst of joins triggers one inference)."""
    next_run = time.monotonic() + every_s
    while not stop.is_set():
        woke = state.membership_changed.wait(timeout=max(0.0, next_run - time.monotonic()))
        if stop.is_set():
            return
        if woke:
            if stop.wait(settle_s):
                return
            state.membership_changed.clear()
        for job in state.jobs():
            if stop.is_set():  # the controller's stop joins this thread
                return
            try:
                log.info("inference %s", reinfer_job(state, job))
            except Exception:  # one job's failure must not stop the others
                log.exception("inference of %s failed", job)
        next_run = time.monotonic() + every_s
