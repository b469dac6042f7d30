"""Contract section 3 probe records, read and checked column by column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from netskel.arrays import factorize
from netskel.errors import InputError
from netskel.topology import Topology, link_id

REQUIRED = {"ts": "time", "src": "string", "dst": "string", "size": "integer",
            "rtt_us": "float", "proto": "string"}


class ProbeRecords:
    """Probe records as columns. String columns may come as object arrays
    or already dictionary-encoded by the reader (name -> (sorted distinct
    values, code of each row, -1 for null)); either form is produced from
    the other only when asked for, so an hour of probes never becomes
    millions of Python strings unless something wants them."""

    def __init__(self, ts: np.ndarray, size: np.ndarray, rtt_us: np.ndarray,
                 src: np.ndarray | None = None, dst: np.ndarray | None = None,
                 proto: np.ndarray | None = None, route: np.ndarray | None = None,
                 coded: dict[str, tuple[list[str], np.ndarray]] | None = None) -> None:
        self.ts = ts  # float64 seconds
        self.size = size  # int64
        self.rtt_us = rtt_us  # float64, NaN when lost
        self.coded = dict(coded or {})
        self._values: dict[str, np.ndarray] = {
            k: v for k, v in (("src", src), ("dst", dst), ("proto", proto), ("route", route))
            if v is not None}
        for col in ("src", "dst", "proto"):
            if col not in self._values and col not in self.coded:
                raise ValueError(f"probe records without column '{col}'")

    def __len__(self) -> int:
        return len(self.ts)

    def subset(self, mask: np.ndarray | slice) -> ProbeRecords:
        """The rows where mask is true, or a slice of them (views, not
        copies); dictionaries shared, not copied."""
        return ProbeRecords(
            ts=self.ts[mask], size=self.size[mask], rtt_us=self.rtt_us[mask],
            coded={c: (names, codes[mask]) for c, (names, codes) in self.coded.items()},
            **{c: v[mask] for c, v in self._values.items() if c not in self.coded})

    def _column(self, col: str) -> np.ndarray | None:
        got = self._values.get(col)
        if got is None and col in self.coded:
            names, codes = self.coded[col]
            got = self._values[col] = np.asarray(list(names) + [None], dtype=object)[codes]
        return got

    @property
    def src(self) -> np.ndarray:
        return self._column("src")  # type: ignore[return-value]

    @property
    def dst(self) -> np.ndarray:
        return self._column("dst")  # type: ignore[return-value]

    @property
    def proto(self) -> np.ndarray:
        return self._column("proto")  # type: ignore[return-value]

    @property
    def route(self) -> np.ndarray | None:
        """Object array (str or None), or None when the file has no routes."""
        return self._column("route")

    @property
    def has_route(self) -> bool:
        return "route" in self.coded or "route" in self._values

    def factorized(self, col: str) -> tuple[list[str], np.ndarray]:
        got = self.coded.get(col)
        if got is not None:
            return got
        values = self._column(col)
        if values is None:
            raise KeyError(col)
        if col == "route":  # untraced probes: null, coded -1
            null = np.array([v is None for v in values], dtype=bool)
            names, codes = factorize(np.where(null, "", values))
            return names, np.where(null, -1, codes)
        return factorize(values)


# What a column of each kind must be, as the error says it.
_EXPECTED = {"time": "float64 seconds since the epoch or a timestamp (float32 holds "
                     "epoch seconds only to 128 s)"}


_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def seconds(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A time column as float64 seconds since the epoch: float64 or integer
    seconds as written, a timestamp type (what pandas writes) by its unit
    (a timestamp counts from the epoch in UTC, whatever zone it names)."""
    if pa.types.is_timestamp(column.type):
        ticks = column.cast(pa.int64()).to_numpy(zero_copy_only=False)
        return np.asarray(ticks, dtype=np.float64) / _PER_SECOND[column.type.unit]
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def _kind_ok(t: pa.DataType, kind: str) -> bool:
    if kind == "time":
        return bool(pa.types.is_float64(t) or pa.types.is_integer(t) or pa.types.is_timestamp(t))
    if kind == "float":
        return bool(pa.types.is_floating(t) or pa.types.is_integer(t))
    if kind == "integer":
        return bool(pa.types.is_integer(t))
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_dictionary(t))


def checked_schema(path: str | Path, required: dict[str, str]) -> pa.Schema:
    """The schema of a Parquet file holding the required columns, or one
    InputError line."""
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
                             f"expected {_EXPECTED.get(kind, kind)}")
    return schema


def dictionary_columns(schema: pa.Schema, wanted: tuple[str, ...]) -> list[str]:
    """Those of `wanted` that are string columns (read dictionary-encoded)."""
    return [c for c in wanted if c in schema.names
            and (pa.types.is_string(schema.field(c).type)
                 or pa.types.is_large_string(schema.field(c).type))]


def read_table(path: str | Path, required: dict[str, str],
               dictionary: tuple[str, ...] = ()) -> pa.Table:
    """A Parquet file with the required columns, or one InputError line.
    String columns named in `dictionary` are read dictionary-encoded: ids
    repeat millions of times, and decoding them to strings first costs more
    than the whole read."""
    p = Path(path)
    as_dict = dictionary_columns(checked_schema(p, required), dictionary)
    try:
        table = pq.read_table(p, read_dictionary=as_dict or None)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise InputError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    if table.num_rows == 0:
        raise InputError(f"{p}: no rows")
    return table


def _coded(table: pa.Table, col: str) -> tuple[list[str], np.ndarray]:
    """(sorted distinct strings, each row's code, -1 for null) by Arrow's
    dictionary encoding: distinct values go through Python once, not every
    row."""
    arr = table.column(col).combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    names = [str(x) for x in arr.dictionary.to_pylist()]
    idx = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    order = sorted(range(len(names)), key=names.__getitem__)
    remap = np.empty(len(names) + 1, dtype=np.int64)
    remap[order] = np.arange(len(names))
    remap[-1] = -1  # a null stays -1
    return [names[i] for i in order], remap[idx]


def read_probe_records(path: str | Path, topo: Topology) -> ProbeRecords:
    table = read_table(path, REQUIRED, dictionary=("src", "dst", "proto", "route"))
    p = Path(path)
    ts = seconds(table.column("ts"))
    rtt = np.asarray(table.column("rtt_us").cast(pa.float64()).to_numpy(zero_copy_only=False),
                     dtype=np.float64)
    size_col = table.column("size")
    if size_col.null_count:
        raise InputError(f"{p}: column 'size' has nulls")
    size = size_col.to_numpy(zero_copy_only=False).astype(np.int64)
    coded = {c: _coded(table, c) for c in ("src", "dst", "proto")}
    if not np.all(np.isfinite(ts)):
        raise InputError(f"{p}: column 'ts' has null or non-finite values")
    for name in ("src", "dst", "proto"):
        names, codes = coded[name]
        if len(codes) and int(codes.min()) < 0:
            raise InputError(f"{p}: column '{name}' has nulls")
        if name == "proto":
            continue
        unknown = [x for x in names if x not in topo.endpoints]
        if unknown:
            more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
            raise InputError(f"{p}: column '{name}' names unknown endpoint '{unknown[0]}'{more}")
    # src == dst, compared by code: the two columns' dictionaries differ.
    (src_names, src_codes), (dst_names, dst_codes) = coded["src"], coded["dst"]
    at = {n: i for i, n in enumerate(src_names)}
    dst_as_src = np.array([at.get(n, -1) for n in dst_names] + [-1], dtype=np.int64)[dst_codes]
    same = src_codes == dst_as_src
    if np.any(same):
        raise InputError(f"{p}: {int(np.sum(same))} row(s) probe an endpoint from itself "
                         f"(first: '{src_names[int(src_codes[int(np.argmax(same))])]}')")
    bad = np.isfinite(rtt) & (rtt < 0)
    if bad.any():
        raise InputError(f"{p}: column 'rtt_us' has {int(bad.sum())} negative values")
    endless = np.isinf(rtt)
    if endless.any():  # a lost probe's RTT is null (or NaN), never infinite
        raise InputError(f"{p}: column 'rtt_us' has {int(endless.sum())} infinite value(s)")
    if np.any(size <= 0):
        raise InputError(f"{p}: column 'size' has non-positive values")
    if "route" in table.column_names:
        coded["route"] = _coded(table, "route")
    return ProbeRecords(ts=ts, size=size, rtt_us=rtt, coded=coded)


CONTRACT_PROTOCOLS = ("rdma", "udp")


def unknown_protocols(records: ProbeRecords) -> dict[str, int]:
    """Rows per `proto` value outside the contract's (rdma, udp). Such a
    value is still analysed, as an instrument of its own (a pair's RDMA and
    UDP probes are never judged against each other's history), so nothing
    is lost; but a writer spelling it `UDP` splits one instrument from the
    rest of its kind without knowing."""
    names, codes = records.factorized("proto")
    counts = np.bincount(codes, minlength=len(names))
    return {n: int(c) for n, c in zip(names, counts, strict=True)
            if n not in CONTRACT_PROTOCOLS and c}


def unplaceable_routes(records: ProbeRecords, topo: Topology) -> tuple[list[str], int]:
    """(the distinct `route` values naming a switch or a hop-to-hop link the
    topology lacks, how many distinct routes there are). The analysis uses
    only the links a route names that the topology has; a file whose routes
    it cannot place (another separator, other switch names) would quietly
    read as untraced."""
    if not records.has_route:
        return [], 0
    names = [r for r in records.factorized("route")[0] if r]
    bad = []
    for r in names:
        hops = r.split(">")
        if (any(h not in topo.switches for h in hops)
                or any(link_id(a, b) not in topo.links for a, b in zip(hops, hops[1:], strict=False))):
            bad.append(r)
    return bad, len(names)
