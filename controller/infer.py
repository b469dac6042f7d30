"""`netskel infer`: contract section 2 throughput in, contract section 4
skeleton out, one job at a time (controller/skeleton.py does the work)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.records import checked_schema, dictionary_columns, seconds
from controller.rates import Rates, group_rows, group_spans, grouped_rates, places
from controller.skeleton import Skeleton, infer, ping_list, rail_aligned
from netskel.errors import InputError, InsufficientData
from netskel.topology import Topology, load_topology

THROUGHPUT_COLUMNS = {"ts": "time", "endpoint": "string", "tx_bytes": "integer",
                      "rx_bytes": "integer"}


@dataclass
class Throughput:
    """A throughput file's rows of the topology's jobs, grouped by endpoint:
    job after job, each job's endpoints in topology order (a job's rows are
    one slice), each endpoint's rows in file order (`counts` each). Rows
    of endpoints in no job are left out."""

    endpoints: list[str]
    counts: np.ndarray
    ts: np.ndarray
    tx: np.ndarray
    rx: np.ndarray

    @classmethod
    def from_columns(cls, topo: Topology, ts: np.ndarray, code: np.ndarray, tx: np.ndarray,
                     rx: np.ndarray, names: list[str]) -> Throughput:
        """From columns in file order, ids as codes into `names`."""
        eps, recode = _job_order(topo, names)
        (ts, tx, rx), counts = group_rows(code, len(eps), [ts, tx, rx], recode=recode)
        return cls(eps, counts, ts, tx, rx)


def _job_order(topo: Topology, names: list[str]) -> tuple[list[str], np.ndarray]:
    """(every job's endpoints, job by job; each name's place among them)."""
    eps = [e.id for j in topo.jobs() for e in topo.job_endpoints(j)]
    return eps, places(names, eps)


def read_throughput(path: str | Path, topo: Topology) -> Throughput:
    """The file's rows grouped by endpoint as they are decoded. Row groups
    are decoded on both cores (Parquet decoding releases the GIL; one
    reader decoded 77 M rows in 8-9 s, most of `netskel infer`'s reading),
    the ids first (they say where every row goes), then the other columns
    a row group at a time, each placed straight into arrays allocated once:
    no column is held in file order (77 M rows: 1.8 GB, written and read
    once more), and on this VM memory a process touches for the first time
    costs more in the kernel than the read itself."""
    p = Path(path)
    schema = checked_schema(p, THROUGHPUT_COLUMNS)
    as_dict = dictionary_columns(schema, ("endpoint",)) or None
    local = threading.local()

    def reader() -> pq.ParquetFile:
        """Each thread reads with a reader of its own."""
        if getattr(local, "f", None) is None:
            local.f = pq.ParquetFile(p, read_dictionary=as_dict)
        return cast(pq.ParquetFile, local.f)

    def group(g: int, columns: list[str]) -> pa.Table:
        t = reader().read_row_group(g, columns=columns, use_threads=False)
        if t.num_rows != sizes[g]:
            raise InputError(f"{p}: row group {g} holds {t.num_rows} rows where the "
                             f"file's metadata says {sizes[g]}")
        return t

    def ids(g: int) -> pa.ChunkedArray:
        return group(g, ["endpoint"]).column("endpoint")

    def load(g: int) -> list[np.ndarray]:
        t = group(g, ["ts", "tx_bytes", "rx_bytes"])
        out = []
        for c in ("ts", "tx_bytes", "rx_bytes"):
            arr = t.column(c)
            if arr.null_count:
                raise InputError(f"{p}: column '{c}' has "
                                 + ("null or non-finite values" if c == "ts" else "nulls"))
            parts = [seconds(chunk) if c == "ts" else chunk.to_numpy(zero_copy_only=False)
                     for chunk in arr.chunks]
            out.append(parts[0] if len(parts) == 1 else
                       np.concatenate(parts) if parts else np.empty(0))
        if not np.all(np.isfinite(out[0])):
            raise InputError(f"{p}: column 'ts' has null or non-finite values")
        return out

    try:
        first = pq.ParquetFile(p, read_dictionary=as_dict)
        meta = first.metadata
        n = meta.num_rows
        if n <= 0:
            raise InputError(f"{p}: no rows")
        sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if sum(sizes) != n:
            raise InputError(f"{p}: row groups hold {sum(sizes)} rows where the file's "
                             f"metadata says {n}")
        with ThreadPoolExecutor(2) as pool:
            parts = list(pool.map(ids, range(len(sizes))))
        col = pa.chunked_array([c for part in parts for c in part.chunks], type=parts[0].type)
        parts.clear()
        if col.null_count:
            raise InputError(f"{p}: column 'endpoint' has nulls")
        if not pa.types.is_dictionary(col.type):
            col = col.dictionary_encode()
        col = col.unify_dictionaries()  # chunks share one dictionary, indices concatenate
        names = col.chunk(0).dictionary.to_pylist() if col.num_chunks else []
        unknown = sorted(x for x in names if x not in topo.endpoints)
        if unknown:
            raise InputError(f"{p}: column 'endpoint' names unknown endpoint '{unknown[0]}'")
        code = np.empty(n, dtype=np.int32)
        at = 0
        for chunk in col.chunks:
            code[at:at + len(chunk)] = chunk.indices.to_numpy(zero_copy_only=False)
            at += len(chunk)
        del col
        eps, recode = _job_order(topo, names)
        starts = np.r_[0, np.cumsum(sizes)].tolist()
        (ts, tx, rx), counts = group_spans(
            code, len(eps), list(zip(starts[:-1], starts[1:], strict=True)), load,
            [np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.int64)], recode=recode)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise InputError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    return Throughput(eps, counts, ts, tx, rx)


def job_rates(topo: Topology, job: str, throughput: Throughput, keep: bool = True) -> Rates:
    """One job's endpoints' rates from a throughput file read by
    read_throughput (its rows are one slice there). keep=False hands the
    rows over (the caller's last job): they become running byte counts in
    place, and nothing is copied."""
    eps = [e.id for e in topo.job_endpoints(job)]
    if len(eps) < 2:
        raise InputError(f"job '{job}' has {len(eps)} endpoint(s); a skeleton needs two or more")
    th = throughput
    i = th.endpoints.index(eps[0])
    if th.endpoints[i:i + len(eps)] != eps:
        raise ValueError(f"job '{job}': its endpoints are not one slice of the rows read")
    bounds = np.r_[0, np.cumsum(th.counts)]
    rows = slice(int(bounds[i]), int(bounds[i + len(eps)]))
    counts = th.counts[i:i + len(eps)]
    if keep:  # grouped_rates turns tx and rx into running counts in place
        return grouped_rates(th.ts[rows], th.tx[rows].copy(), th.rx[rows].copy(), counts, eps)

    def handed(column: str) -> np.ndarray:
        """The job's rows of a column taken out of `th`, so that the call
        below holds the only reference (no name here keeps the rows alive:
        grouped_rates frees each as soon as it is done with it)."""
        rows_of = getattr(th, column)[rows]
        setattr(th, column, np.empty(0))
        return cast(np.ndarray, rows_of)

    return grouped_rates(handed("ts"), handed("tx"), handed("rx"), counts, eps)


def skeleton_doc(sk: Skeleton) -> dict[str, Any]:
    """Contract section 4's entry for one job."""
    return {"job": sk.job, "confidence": sk.confidence,
            "parallelism": {"dp": sk.dp, "tp": sk.tp, "pp": sk.pp, "ep": sk.ep},
            "dp_groups": sk.dp_groups, "pp_stages": sk.pp_stages, "ep_groups": sk.ep_groups,
            "ping_list": ping_list(sk), "notes": sk.notes}


def infer_files(topology: str | Path, throughput: str | Path, job: str | None = None,
                progress: Callable[[str, int, int], None] | None = None,
                warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every job's skeleton (contract section 4). A job the recording holds
    too little of (an endpoint without samples: its container joined late;
    a single endpoint) keeps the rail-aligned list with a note, as the live
    controller keeps it, and `warn` hears why; the other jobs are inferred."""
    say = progress or (lambda stage, done, total: None)
    tell = warn or (lambda line: None)
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
        eps = [e.id for e in topo.job_endpoints(j)]
        if len(eps) < 2:
            why = f"{len(eps)} endpoint(s): no pair to probe"
            tell(f"job '{j}': {why}")
            out.append(skeleton_doc(rail_aligned(topo, j, eps, why)))
            continue
        try:
            rates = job_rates(topo, j, data, keep=n < len(jobs) - 1)
        except InsufficientData as e:
            tell(f"job '{j}': the rail-aligned list: {throughput}: {e}")
            out.append(skeleton_doc(rail_aligned(topo, j, eps, f"cannot infer from {throughput}: {e}")))
            continue
        out.append(skeleton_doc(infer(topo, j, rates)))
        del rates
    say("inferring jobs", len(jobs), len(jobs))
    return {"jobs": out}
