"""`netskel infer`: contract section 2 throughput in, contract section 4
skeleton out, one job at a time (controller/skeleton.py does the work)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
    """The file's columns as arrays, ids as codes into `names`. Row groups
    are decoded on both cores (Parquet decoding releases the GIL; one
    reader decoded 77 M rows in 8-9 s, most of `netskel infer`'s reading)
    and copied straight into arrays allocated once: reading the whole table
    first and converting it held every column twice (77 M rows: 2.2 GB
    more), and on this VM memory a process touches for the first time costs
    more in the kernel than the read itself."""
    p = Path(path)
    schema = checked_schema(p, THROUGHPUT_COLUMNS)
    as_dict = dictionary_columns(schema, ("endpoint",)) or None
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
        cols: dict[str, Any] = {"ts": np.empty(n, dtype=np.float64),
                                "tx_bytes": np.empty(n, dtype=np.int64),
                                "rx_bytes": np.empty(n, dtype=np.int64)}
        ids: list[Any] = [None] * len(sizes)
        starts = np.r_[0, np.cumsum(sizes)].tolist()

        def read(share: range, f: pq.ParquetFile | None = None) -> None:
            """Row groups `share`; each thread has a reader of its own."""
            f = pq.ParquetFile(p, read_dictionary=as_dict) if f is None else f
            for g in share:
                t = f.read_row_group(g, columns=["ts", "endpoint", "tx_bytes", "rx_bytes"],
                                     use_threads=False)
                if t.num_rows != sizes[g]:
                    raise InputError(f"{p}: row group {g} holds {t.num_rows} rows where the "
                                     f"file's metadata says {sizes[g]}")
                for c, out in cols.items():
                    arr = t.column(c)
                    if arr.null_count:
                        raise InputError(f"{p}: column '{c}' has "
                                         + ("null or non-finite values" if c == "ts" else "nulls"))
                    at = starts[g]
                    for chunk in arr.chunks:
                        out[at:at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
                        at += len(chunk)
                ids[g] = t.column("endpoint")
                del t

        if len(sizes) == 1:
            read(range(1), first)
        else:
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(read, (range(w, len(sizes), 2) for w in range(2)), (first, None)))
        col = pa.chunked_array([c for part in ids for c in part.chunks], type=ids[0].type)
        ids.clear()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise InputError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    if col.null_count:
        raise InputError(f"{p}: column 'endpoint' has nulls")
    if not pa.types.is_dictionary(col.type):
        col = col.dictionary_encode()
    col = col.unify_dictionaries()  # chunks share one dictionary, indices concatenate
    names = col.chunk(0).dictionary.to_pylist() if col.num_chunks else []
    unknown = sorted(n for n in names if n not in topo.endpoints)
    if unknown:
        raise InputError(f"{p}: column 'endpoint' names unknown endpoint '{unknown[0]}'")
    if not np.all(np.isfinite(cols["ts"])):
        raise InputError(f"{p}: column 'ts' has null or non-finite values")
    code = np.empty(n, dtype=np.int32)
    at = 0
    for chunk in col.chunks:
        code[at:at + len(chunk)] = chunk.indices.to_numpy(zero_copy_only=False)
        at += len(chunk)
    cols["code"] = code
    cols["names"] = names
    return cols


def job_rates(topo: Topology, job: str, throughput: dict[str, Any], keep: bool = True) -> Rates:
    """One job's endpoints' rates from a throughput file read by
    read_throughput (to_rates leaves other jobs' rows out). keep=False hands
    the rows over (the caller's last job): each is freed as soon as
    to_rates is done with it, and what comes next reuses its memory."""
    eps = [e.id for e in topo.job_endpoints(job)]
    if len(eps) < 2:
        raise InputError(f"job '{job}' has {len(eps)} endpoint(s); a skeleton needs two or more")

    def rows(c: str) -> Any:
        return throughput[c] if keep else throughput.pop(c)

    # Passed straight into the call, so no name here keeps a column alive.
    return to_rates(rows("ts"), rows("code"), rows("tx_bytes"), rows("rx_bytes"), eps,
                    names=throughput["names"])


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
