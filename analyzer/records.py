"""Contract section 3 probe records, read and checked column by column."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from netskel.arrays import factorize
from netskel.errors import InputError
from netskel.topology import Topology

REQUIRED = {"ts": "float", "src": "string", "dst": "string", "size": "integer",
            "rtt_us": "float", "proto": "string"}


@dataclass
class ProbeRecords:
    ts: np.ndarray        # float64 seconds
    src: np.ndarray       # object (str)
    dst: np.ndarray       # object (str)
    size: np.ndarray      # int64
    rtt_us: np.ndarray    # float64, NaN when lost
    proto: np.ndarray     # object (str)
    route: np.ndarray | None  # object (str or None)
    # Columns already dictionary-encoded by the reader: name -> (sorted
    # distinct values, code of each row). Spares a Python pass per column.
    coded: dict[str, tuple[list[str], np.ndarray]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ts)

    def factorized(self, col: str) -> tuple[list[str], np.ndarray]:
        got = self.coded.get(col)
        if got is not None:
            return got
        values = getattr(self, col)
        if col == "route":  # untraced probes: null, coded -1
            null = np.array([v is None for v in values], dtype=bool)
            names, codes = factorize(np.where(null, "", values))
            return names, np.where(null, -1, codes)
        return factorize(values)


def _kind_ok(t: pa.DataType, kind: str) -> bool:
    if kind == "float":
        return bool(pa.types.is_floating(t) or pa.types.is_integer(t))
    if kind == "integer":
        return bool(pa.types.is_integer(t))
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_dictionary(t))


def read_table(path: str | Path, required: dict[str, str],
               dictionary: tuple[str, ...] = ()) -> pa.Table:
    """A Parquet file with the required columns, or one InputError line.
    String columns named in `dictionary` are read dictionary-encoded: ids
    repeat millions of times, and decoding them to strings first costs more
    than the whole read."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.stat().st_size == 0:
        raise InputError(f"{p}: empty file")
    try:
        schema = pq.read_schema(p)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise InputError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    for col, kind in required.items():
        if col not in schema.names:
            raise InputError(f"{p}: missing column '{col}'")
        if not _kind_ok(schema.field(col).type, kind):
            raise InputError(f"{p}: column '{col}' has type {schema.field(col).type}, "
                             f"expected {kind}")
    as_dict = [c for c in dictionary if pa.types.is_string(schema.field(c).type)
               or pa.types.is_large_string(schema.field(c).type)]
    try:
        table = pq.read_table(p, read_dictionary=as_dict or None)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise InputError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    if table.num_rows == 0:
        raise InputError(f"{p}: no rows")
    return table


def _strings(table: pa.Table, col: str) -> np.ndarray:
    return _coded(table, col)[2]


def _coded(table: pa.Table, col: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(sorted distinct strings, each row's code (-1 for null), each row's
    string as an object array (None for null)) by Arrow's dictionary
    encoding: distinct values go through Python once, not every row."""
    arr = table.column(col).combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    names = [str(x) for x in arr.dictionary.to_pylist()]
    idx = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    order = sorted(range(len(names)), key=names.__getitem__)
    remap = np.empty(len(names) + 1, dtype=np.int64)
    remap[order] = np.arange(len(names))
    remap[-1] = -1  # a null stays -1
    codes = remap[idx]
    sorted_names = [names[i] for i in order]
    values = np.asarray(sorted_names + [None], dtype=object)[codes]
    return sorted_names, codes, values


def read_probe_records(path: str | Path, topo: Topology) -> ProbeRecords:
    table = read_table(path, REQUIRED)
    p = Path(path)
    ts = table.column("ts").to_numpy(zero_copy_only=False).astype(np.float64)
    rtt = np.asarray(table.column("rtt_us").cast(pa.float64()).to_numpy(zero_copy_only=False),
                     dtype=np.float64)
    size_col = table.column("size")
    if size_col.null_count:
        raise InputError(f"{p}: column 'size' has nulls")
    size = size_col.to_numpy(zero_copy_only=False).astype(np.int64)
    coded = {c: _coded(table, c) for c in ("src", "dst", "proto")}
    src, dst, proto = (coded[c][2] for c in ("src", "dst", "proto"))
    if not np.all(np.isfinite(ts)):
        raise InputError(f"{p}: column 'ts' has null or non-finite values")
    for name, col in (("src", src), ("dst", dst)):
        unknown = sorted({x for x in set(col.tolist()) if x not in topo.endpoints}, key=str)
        if unknown:
            more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
            raise InputError(f"{p}: column '{name}' names unknown endpoint '{unknown[0]}'{more}")
    same = src == dst
    if np.any(same):
        raise InputError(f"{p}: {int(np.sum(same))} row(s) probe an endpoint from itself "
                         f"(first: '{src[int(np.argmax(same))]}')")
    bad = np.isfinite(rtt) & (rtt < 0)
    if bad.any():
        raise InputError(f"{p}: column 'rtt_us' has {int(bad.sum())} negative values")
    if np.any(size <= 0):
        raise InputError(f"{p}: column 'size' has non-positive values")
    route = None
    if "route" in table.column_names:
        coded["route"] = _coded(table, "route")
        route = coded["route"][2]
    return ProbeRecords(ts=ts, src=src, dst=dst, size=size, rtt_us=rtt, proto=proto, route=route,
                        coded={c: (coded[c][0], coded[c][1]) for c in coded})
