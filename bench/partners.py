"""Is there partner evidence at all? For each stage boundary of a labelled
recording (dev-set layout), how far ahead of the best other candidate each
statistic puts a replica's true pipeline partner, in noise levels (the
spread of all non-partner scores, floored at 1/sqrt(samples)). Uses the
truth's stages and containers, so it measures the evidence, not the
inference around it.

    python bench/partners.py DIR [DIR ...]
    (e.g. the 1 s copies: python bench/variants.py ../shared/data/dev/skeleton /tmp/v1 --interval 1.0)

Statistics: `transfers` (every host's rates moved onto one clock,
high-passed traffic outside collectives, group residuals, one side's tx
against the other's rx at the same sample; collectives are what the whole
data-parallel group bursts in), `aligned` (the same, at the lag of +-1
sample where the rows stand out most: what controller/partners.py uses at
0.5 s sampling or finer), `unaligned` (as before session 20:
each host's own clock, each endpoint's own collective level), `raw`
(group residuals of tx and rx as recorded), `net` (residuals of tx - rx)
and `net_masked` (the same outside collectives); per iteration rather than
per sample: `pace` (each replica's centre of traffic outside collectives,
`replica_pace`, what infer() chains replicas by first) and `reduction`
(each replica's reduction time, less its stage's mean in that iteration:
whether the data-parallel all-reduce itself carries a replica's pace).
Prints a line per boundary and statistic, then one JSON line: per
statistic the share of replicas whose true partner is not first, and the
smallest margin seen.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.infer import job_rates, read_throughput  # noqa: E402
from controller.partners import aligned_transfer_scores, transfer_scores  # noqa: E402
from controller.skeleton import (  # noqa: E402
    CLOCK_SPREAD_S,
    _group_residual,
    replica_pace,
    transfer_series,
)
from controller.timing import (  # noqa: E402
    collective_mask,
    collective_offsets,
    find_iterations,
    on_one_clock,
    one_way_outliers,
    reduction_bursts,
    symmetric,
    window_centres,
)
from netskel.topology import load_topology  # noqa: E402


def margins(scores: np.ndarray, true: np.ndarray, samples: int) -> list[float]:
    """Per row with a true partner and another candidate: (best true score -
    best other score) / noise: the spread of all non-partner scores, at
    least what unrelated series of this length scatter by (1/sqrt(samples);
    two replicas give too few scores to measure a spread)."""
    sd = max(float(np.std(scores[~true])), 1.0 / np.sqrt(samples))
    return [float((scores[i][true[i]].max() - scores[i][~true[i]].max()) / sd)
            for i in range(len(scores)) if true[i].any() and (~true[i]).any()]


def _transfer_series(tx: np.ndarray, rx: np.ndarray, mask: np.ndarray, dt: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """What infer() scores transfers on (`transfer_series`, its one-way
    samples left out)."""
    htx, hrx, _ = transfer_series(tx, rx, mask, one_way_outliers(tx, rx, mask), dt)
    return htx, hrx


def _per_iteration_scores(a_units: list[np.ndarray], b_units: list[np.ndarray],
                          per_iteration: np.ndarray) -> np.ndarray:
    """Correlation over iterations of each unit's mean series (less the
    mean of its stage's units in that iteration), for every (a, b) unit
    pair; iterations either side left blank do not count."""
    def rows(units: list[np.ndarray]) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a unit blank in an iteration
            m = np.array([np.nanmean(per_iteration[u], axis=0) for u in units])
            return np.asarray(m - np.nanmean(m, axis=0, keepdims=True))
    a, b = rows(a_units), rows(b_units)
    out = np.zeros((len(a), len(b)))
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            seen = np.isfinite(x) & np.isfinite(y)
            if seen.sum() > 3 and x[seen].std() > 0 and y[seen].std() > 0:
                out[i, j] = np.corrcoef(x[seen], y[seen])[0, 1]
    return out


def _units(topo: Any, eps: list[str], stage: np.ndarray) -> list[np.ndarray]:
    """A stage's endpoints by container (the replica units of the truth)."""
    by: dict[str, list[int]] = defaultdict(list)
    for i in stage:
        by[topo.endpoints[eps[int(i)]].container].append(int(i))
    return [np.array(v) for v in by.values()]


def boundaries(d: Path) -> list[dict[str, Any]]:
    topo = load_topology(d / "topology.json")
    truth = json.loads((d / "truth.json").read_text())
    out = []
    for job in (j for j in truth["jobs"] if j["kind"] == "training"):
        pairs = {frozenset(p) for p in job["pairs"]}
        r = job_rates(topo, job["job"], read_throughput(d / "throughput.parquet", topo))
        eps = r.endpoints
        index = {e: i for i, e in enumerate(eps)}
        tx, rx = r.tx.astype(np.float64), r.rx.astype(np.float64)
        rail = np.array([topo.nics[topo.endpoints[e].nic].rail for e in eps])
        stages = [np.array([index[e] for e in st]) for st in job["pp_stages"]]
        groups = [st[rail[st] == k] for st in stages for k in np.unique(rail[st])]
        unaligned = _transfer_series(tx, rx, collective_mask(symmetric(tx, rx)), r.dt)
        hosts = [topo.nics[topo.endpoints[e].nic].host for e in eps]
        host = np.unique(hosts, return_inverse=True)[1]
        burst = reduction_bursts(symmetric(tx, rx))
        it = find_iterations(burst, r.dt)
        if it is not None:  # as infer() does: every host's rates on one clock
            tx, rx = on_one_clock(tx, rx, collective_offsets(burst, it, r.dt), groups, host,
                                  r.dt, CLOCK_SPREAD_S)
        mask = collective_mask(symmetric(tx, rx), groups)
        per_iteration: dict[str, np.ndarray] = {}
        if it is not None:
            per_iteration["pace"] = replica_pace(tx, rx, mask, it, r.dt, stages)[0]
            per_iteration["reduction"] = window_centres(burst, it.bounds, r.dt)
        stats = {
            "transfers": _transfer_series(tx, rx, mask, r.dt),
            "unaligned": unaligned,
            "raw": (tx, rx),
            "net": (tx - rx, rx - tx),
            "net_masked": (np.where(mask, 0.0, tx - rx), np.where(mask, 0.0, rx - tx)),
        }
        stats = {k: (_group_residual(a, groups), _group_residual(b, groups))
                 for k, (a, b) in stats.items()}

        for s in range(1, len(stages)):
            a, b = (_units(topo, eps, stages[k]) for k in (s - 1, s))
            true = np.array([[any(frozenset((eps[x], eps[y])) in pairs for x in u for y in v)
                              for v in b] for u in a])
            for name, (ntx, nrx) in [*stats.items(), ("aligned", stats["transfers"])]:
                score = (aligned_transfer_scores(a, b, ntx, nrx, rail) if name == "aligned"
                         else transfer_scores(a, b, ntx, nrx, rail))
                out.extend(_row(d, job["job"], r.dt, s, name,
                                margins(score, true, tx.shape[1])))
            for name, series in per_iteration.items():
                score = _per_iteration_scores(a, b, series)
                out.extend(_row(d, job["job"], r.dt, s, name,
                                margins(score, true, series.shape[1])))
    return out


def _row(d: Path, job: str, dt: float, s: int, name: str, m: list[float]
         ) -> list[dict[str, Any]]:
    if not m:
        return []
    return [{"recording": d.name, "job": job, "dt": round(dt, 3), "boundary": f"{s - 1}/{s}",
             "statistic": name, "min_margin": round(min(m), 2),
             "median_margin": round(float(np.median(m)), 2),
             "not_first": sum(v < 0 for v in m), "replicas": len(m)}]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("recordings", nargs="+", type=Path,
                    help="labelled recordings in the dev-set layout")
    rows = [row for d in ap.parse_args().recordings for row in boundaries(d)]
    for row in rows:
        print(f"{row['recording']:28s} {row['boundary']:5s} {row['statistic']:10s} "
              f"min {row['min_margin']:7.2f} median {row['median_margin']:7.2f} "
              f"not first {row['not_first']}/{row['replicas']}")
    summary: dict[str, Any] = {}
    for name in sorted({r["statistic"] for r in rows}):
        mine = [r for r in rows if r["statistic"] == name]
        summary[name] = {"not_first_share": round(sum(r["not_first"] for r in mine)
                                                  / max(1, sum(r["replicas"] for r in mine)), 3),
                         "min_margin": min(r["min_margin"] for r in mine)}
    print(json.dumps({"bench": "partners", "boundaries": len(rows) // max(1, len(summary)),
                      "statistics": summary}))


if __name__ == "__main__":
    main()
