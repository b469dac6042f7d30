"""`netskel infer`: contract section 2 throughput in, contract section 4
skeleton out, one job at a time (controller/skeleton.py does the work)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from analyzer.records import read_table
from controller.skeleton import Rates, infer, ping_list, to_rates
from netskel.errors import InputError
from netskel.topology import Topology, load_topology

THROUGHPUT_COLUMNS = {"ts": "float", "endpoint": "string", "tx_bytes": "integer",
                      "rx_bytes": "integer"}


def read_throughput(path: str | Path, topo: Topology) -> dict[str, Any]:
    table = read_table(path, THROUGHPUT_COLUMNS, dictionary=("endpoint",))
    col = table.column("endpoint")
    if col.null_count:
        raise InputError(f"{path}: column 'endpoint' has nulls")
    if pa.types.is_dictionary(col.type):
        col = col.unify_dictionaries()  # chunks share one dictionary, indices concatenate
    encoded = col.combine_chunks()
    if not pa.types.is_dictionary(encoded.type):
        encoded = encoded.dictionary_encode()
    names = encoded.dictionary.to_pylist()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    unknown = sorted(n for n in names if n not in topo.endpoints)
    if unknown:
        raise InputError(f"{path}: column 'endpoint' names unknown endpoint '{unknown[0]}'")
    ts = table.column("ts").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if not np.all(np.isfinite(ts)):
        raise InputError(f"{path}: column 'ts' has null or non-finite values")
    cols: dict[str, Any] = {"ts": ts, "code": codes, "names": names}
    for c in ("tx_bytes", "rx_bytes"):
        col = table.column(c)
        if col.null_count:
            raise InputError(f"{path}: column '{c}' has nulls")
        cols[c] = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return cols


def job_rates(topo: Topology, job: str, throughput: dict[str, Any]) -> Rates:
    """One job's endpoints' rates from a throughput file read by
    read_throughput (other jobs' rows left out)."""
    eps = [e.id for e in topo.job_endpoints(job)]
    if len(eps) < 2:
        raise InputError(f"job '{job}' has {len(eps)} endpoint(s); a skeleton needs two or more")
    names: list[str] = throughput["names"]
    wanted = set(eps)
    mine = np.array([n in wanted for n in names], dtype=bool)
    code = throughput["code"]
    mask = mine[code]
    cols = [throughput[c] for c in ("ts", "code", "tx_bytes", "rx_bytes")]
    if not mask.all():  # other jobs share the file: keep only this job's rows
        cols = [c[mask] for c in cols]
    return to_rates(cols[0], cols[1], cols[2], cols[3], eps, names=names)


def infer_job(topo: Topology, job: str, throughput: dict[str, Any]) -> dict[str, Any]:
    sk = infer(topo, job, job_rates(topo, job, throughput))
    return {"job": job, "confidence": sk.confidence,
            "parallelism": {"dp": sk.dp, "tp": sk.tp, "pp": sk.pp, "ep": sk.ep},
            "dp_groups": sk.dp_groups, "pp_stages": sk.pp_stages, "ep_groups": sk.ep_groups,
            "ping_list": ping_list(sk), "notes": sk.notes}


def infer_files(topology: str | Path, throughput: str | Path, job: str | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    say = progress or (lambda stage, done, total: None)
    say("reading topology", 0, 0)
    topo = load_topology(topology)
    say("reading throughput samples", 0, 0)
    data = read_throughput(throughput, topo)
    jobs = topo.jobs()
    if job is not None:
        if job not in jobs:
            raise InputError(f"{topology}: unknown job '{job}'")
        jobs = [job]
    out = []
    for n, j in enumerate(jobs):
        say(f"inferring job {j}", n, len(jobs))
        out.append(infer_job(topo, j, data))
    say("inferring jobs", len(jobs), len(jobs))
    return {"jobs": out}
