"""`netskel infer`, first cut: reads contract section 2 throughput exactly and
answers every job with its rail-aligned list at zero confidence, the
contract's answer for a job whose skeleton is not (yet) inferred. The
skeleton inference proper replaces `infer_job` (issue 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from analyzer.records import read_table
from controller.pinglist import MemberEndpoint, probe_owner, rail_aligned_pairs
from netskel.errors import InputError
from netskel.topology import Topology, load_topology

THROUGHPUT_COLUMNS = {"ts": "float", "endpoint": "string", "tx_bytes": "integer",
                      "rx_bytes": "integer"}


def read_throughput(path: str | Path, topo: Topology) -> dict[str, np.ndarray]:
    table = read_table(path, THROUGHPUT_COLUMNS)
    endpoints = np.asarray(table.column("endpoint").to_pylist(), dtype=object)
    unknown = sorted({e for e in set(endpoints.tolist()) if e not in topo.endpoints}, key=str)
    if unknown:
        raise InputError(f"{path}: column 'endpoint' names unknown endpoint '{unknown[0]}'")
    ts = table.column("ts").to_numpy(zero_copy_only=False).astype(np.float64)
    if not np.all(np.isfinite(ts)):
        raise InputError(f"{path}: column 'ts' has null or non-finite values")
    cols = {"ts": ts, "endpoint": endpoints}
    for c in ("tx_bytes", "rx_bytes"):
        col = table.column(c)
        if col.null_count:
            raise InputError(f"{path}: column '{c}' has nulls")
        cols[c] = col.to_numpy(zero_copy_only=False).astype(np.int64)
    return cols


def rail_aligned_list(topo: Topology, job: str) -> dict[str, list[str]]:
    eps = [MemberEndpoint(id=e.id, nic=e.nic, host=topo.nics[e.nic].host,
                          rail=topo.nics[e.nic].rail, ip=e.ip or "")
           for e in topo.job_endpoints(job)]
    plist: dict[str, list[str]] = {e.id: [] for e in eps}
    for a, b in rail_aligned_pairs(eps):
        src = probe_owner(a, b)
        plist[src].append(b if src == a else a)
    return {k: sorted(v) for k, v in sorted(plist.items())}


def infer_job(topo: Topology, job: str, throughput: dict[str, np.ndarray]) -> dict[str, Any]:
    eps = topo.job_endpoints(job)
    if len(eps) < 2:
        raise InputError(f"job '{job}' has {len(eps)} endpoint(s); a skeleton needs two or more")
    return {"job": job, "confidence": 0.0,
            "parallelism": {"dp": 1, "tp": 1, "pp": 1, "ep": None},
            "dp_groups": [], "pp_stages": [],
            "ping_list": rail_aligned_list(topo, job)}


def infer_files(topology: str | Path, throughput: str | Path, job: str | None = None
                ) -> dict[str, Any]:
    topo = load_topology(topology)
    data = read_throughput(throughput, topo)
    jobs = topo.jobs()
    if job is not None:
        if job not in jobs:
            raise InputError(f"{topology}: unknown job '{job}'")
        jobs = [job]
    return {"jobs": [infer_job(topo, j, data) for j in jobs]}
