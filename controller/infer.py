"""`netskel infer`: contract section 2 throughput in, contract section 4
skeleton out, one job at a time (controller/skeleton.py does the work)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.records import checked_schema, dictionary_columns
from controller.skeleton import Rates, Skeleton, infer, ping_list, to_rates
from netskel.errors import InputError
from netskel.topology import Topology, load_topology

THROUGHPUT_COLUMNS = {"ts": "float", "endpoint": "string", "tx_bytes": "integer",
                      "rx_bytes": "integer"}


def read_throughput(path: str | Path, topo: Topology) -> dict[str, Any]:
    """The file's columns as arrays, ids as codes into `names`. Numbers are
    copied batch by batch into arrays allocated once: reading the whole
    table first and converting it held every column twice (77 M rows:
    2.2 GB more), and on this VM memory a process touches for the first
    time costs more in the kernel than the read itself."""
    p = Path(path)
    schema = checked_schema(p, THROUGHPUT_COLUMNS)
    try:
        f = pq.ParquetFile(p, read_dictionary=dictionary_columns(schema, ("endpoint",)) or None)
        n = f.metadata.num_rows
        if n <= 0:
            raise InputError(f"{p}: no rows")
        cols: dict[str, Any] = {"ts": np.empty(n, dtype=np.float64),
                                "tx_bytes": np.empty(n, dtype=np.int64),
                                "rx_bytes": np.empty(n, dtype=np.int64)}
        at = 0
        for batch in f.iter_batches(batch_size=1 << 20, columns=list(cols)):
            k = batch.num_rows
            if at + k > n:
                raise InputError(f"{p}: more rows than the file's metadata says ({n})")
            for c, out in cols.items():
                arr = batch.column(c)
                if arr.null_count:
                    raise InputError(f"{p}: column '{c}' has "
                                     + ("null or non-finite values" if c == "ts" else "nulls"))
                out[at:at + k] = arr.to_numpy(zero_copy_only=False)
            at += k
        if at != n:
            raise InputError(f"{p}: {at} rows where the file's metadata says {n}")
        col = f.read(columns=["endpoint"]).column("endpoint")
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise InputError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    if col.null_count:
        raise InputError(f"{p}: column 'endpoint' has nulls")
    if pa.types.is_dictionary(col.type):
        col = col.unify_dictionaries()  # chunks share one dictionary, indices concatenate
    encoded = col.combine_chunks()
    del col
    if not pa.types.is_dictionary(encoded.type):
        encoded = encoded.dictionary_encode()
    names = encoded.dictionary.to_pylist()
    unknown = sorted(n for n in names if n not in topo.endpoints)
    if unknown:
        raise InputError(f"{p}: column 'endpoint' names unknown endpoint '{unknown[0]}'")
    if not np.all(np.isfinite(cols["ts"])):
        raise InputError(f"{p}: column 'ts' has null or non-finite values")
    cols["code"] = encoded.indices.to_numpy(zero_copy_only=False)
    cols["names"] = names
    return cols


def job_rates(topo: Topology, job: str, throughput: dict[str, Any], keep: bool = True) -> Rates:
    """One job's endpoints' rates from a throughput file read by
    read_throughput (other jobs' rows left out). keep=False hands the rows
    over (the caller's last job): each is freed as soon as to_rates is done
    with it, and what comes next reuses its memory."""
    eps = [e.id for e in topo.job_endpoints(job)]
    if len(eps) < 2:
        raise InputError(f"job '{job}' has {len(eps)} endpoint(s); a skeleton needs two or more")
    names: list[str] = throughput["names"]
    wanted = set(eps)
    mine = np.array([n in wanted for n in names], dtype=bool)
    mask = mine[throughput["code"]]
    every = bool(mask.all())

    def rows(c: str) -> Any:
        v = throughput[c] if keep else throughput.pop(c)
        return v if every else v[mask]  # other jobs share the file: only this job's rows

    # Passed straight into the call, so no name here keeps a column alive.
    return to_rates(rows("ts"), rows("code"), rows("tx_bytes"), rows("rx_bytes"), eps,
                    names=names)


def skeleton_doc(sk: Skeleton) -> dict[str, Any]:
    """Contract section 4's entry for one job."""
    return {"job": sk.job, "confidence": sk.confidence,
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
        rates = job_rates(topo, j, data, keep=n < len(jobs) - 1)
        out.append(skeleton_doc(infer(topo, j, rates)))
        del rates
    say("inferring jobs", len(jobs), len(jobs))
    return {"jobs": out}
