"""Harder copies of labelled recordings we did not write, for
`bench/accuracy.py`: the held-out set differs from the development set in
ways that can be made from the development data itself without inventing
any traffic — coarser sampling (counters are cumulative, so keeping every
k-th sample is exactly what a slower sampler reads), opaque ids (names
that carry no rank, host or rail), fewer traced routes (a route is only
ever removed, never made up: a pair's all or none, or each probe's at
random as the dev set does) and longer recordings (copies of the clean
recording around a fault one, time-shifted) or shorter ones (the first
seconds of a throughput recording: what the live controller holds that
long after a job starts) or with more samples missing (rows dropped at
random: a sampler that missed them). A method that passes the originals but
not these copies leans on something the held-out set does not give it.

    python bench/variants.py ../shared/data/dev/skeleton OUT [--interval 1.0] [--opaque]
        [--seconds 60 [--skip 30]] [--missing 0.2]
    python bench/variants.py ../shared/data/dev/faults OUT [--routes 0.3 | --traced 0.6] [--opaque]
        [--clean ../shared/data/dev/faults/dev-fa1_clean_busy --before 1 --after 2]
    python bench/accuracy.py OUT

Writes `OUT/<name>/` in the same layout (topology.json, throughput.parquet
or probes.parquet, truth.json) and prints one JSON line naming what it made.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def decimate(table: pa.Table, interval_s: float) -> pa.Table:
    """Per endpoint, the first sample of every `interval_s` slot of its own
    clock: what a sampler running at that interval would have read."""
    ep = table.column("endpoint").to_numpy(zero_copy_only=False)
    ts = table.column("ts").to_numpy()
    order = np.lexsort((ts, ep))
    ep_s, ts_s = ep[order], ts[order]
    first = np.ones(len(order), bool)
    first[1:] = ep_s[1:] != ep_s[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    slot = np.floor((ts_s - ts_s[start]) / interval_s).astype(np.int64)
    keep = first.copy()
    keep[1:] |= slot[1:] != slot[:-1]
    return table.take(pa.array(np.sort(order[keep])))


def truncate(table: pa.Table, seconds: float, skip: float = 0.0) -> pa.Table:
    """The rows from `skip` to `skip + seconds` after the recording's first
    sample."""
    ts = table.column("ts").to_numpy()
    start = float(ts.min()) + skip
    keep = (ts >= start) & (ts < start + seconds)
    return table.filter(pa.array(keep))


def drop_samples(table: pa.Table, share: float, seed: int) -> pa.Table:
    """The same rows less a random `share` of them (counters are cumulative,
    so the rows kept read exactly what a sampler that missed the others
    would have read)."""
    keep = np.random.default_rng(seed).random(table.num_rows) >= share
    return table.filter(pa.array(keep))


def _opaque(name: str, salt: str) -> str:
    return "x" + hashlib.sha256((salt + name).encode()).hexdigest()[:10]


def _ids(topology: dict[str, Any]) -> set[str]:
    """Every endpoint, container, host and NIC id: the names that could
    carry rank, host or rail numbers."""
    out: set[str] = set()
    for h in topology.get("hosts", []):
        out.add(h["id"])
        out.update(n["id"] for n in h.get("nics", []))
    for c in topology.get("containers", []):
        out.add(c["id"])
        out.update(e["id"] for e in c.get("endpoints", []))
    return out


def _rename_id(s: str, names: dict[str, str]) -> str:
    """An id, or a composite one: a link `A~B` (its ends sorted again, as the
    contract orders them), a rule `HOST:VNI:DST`."""
    if s in names:
        return names[s]
    if "~" in s:
        return "~".join(sorted(_rename_id(p, names) for p in s.split("~")))
    head, sep, rest = s.partition(":")
    return names[head] + sep + rest if sep and head in names else s


def _rename(obj: Any, names: dict[str, str]) -> Any:
    if isinstance(obj, str):
        return _rename_id(obj, names)
    if isinstance(obj, list):
        return [_rename(x, names) for x in obj]
    if isinstance(obj, dict):
        return {names.get(k, k): _rename(v, names) for k, v in obj.items()}
    return obj


def _rename_column(table: pa.Table, column: str, names: dict[str, str]) -> pa.Table:
    if column not in table.column_names:
        return table
    col = table.column(column).combine_chunks()
    uniq = pc.unique(col)
    mapped = pa.array([names.get(v, v) if v is not None else None for v in uniq.to_pylist()],
                      pa.string())
    idx = pc.index_in(col, value_set=uniq)
    return table.set_column(table.column_names.index(column), column, pc.take(mapped, idx))


def drop_routes(table: pa.Table, keep: float, seed: int) -> pa.Table:
    """Keep the traced route of a share `keep` of the pairs' flows (all of a
    pair's routes or none: an agent that did not trace a pair knows none)."""
    if "route" not in table.column_names:
        return table
    pair = pc.binary_join_element_wise(table.column("src"), table.column("dst"), "|")
    uniq = pc.unique(pair)
    rng = np.random.default_rng(seed)
    return _routes_where(table, pc.is_in(pair, value_set=uniq.filter(
        pa.array(rng.random(len(uniq)) < keep))))


def thin_routes(table: pa.Table, keep: float, seed: int) -> pa.Table:
    """Keep the traced route of each probe with chance `keep`, as the dev
    set gives them (a route on 30-50 % of probes, lost ones included): every
    pair's flows stay traced now and then, each probe less often."""
    if "route" not in table.column_names:
        return table
    rng = np.random.default_rng(seed)
    return _routes_where(table, pa.array(rng.random(table.num_rows) < keep))


def _routes_where(table: pa.Table, kept: pa.Array | pa.ChunkedArray) -> pa.Table:
    """The table with its routes kept where `kept`, null elsewhere."""
    route = pc.if_else(kept, table.column("route"), pa.scalar(None, pa.string()))
    return table.set_column(table.column_names.index("route"), "route", route)


def moved(span: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A truth span (a fault, a congestion) `seconds` later; an open end stays open."""
    return {**span, **{k: span[k] + seconds for k in ("start", "end") if span.get(k) is not None}}


def surround(table: pa.Table, truth: dict[str, Any], clean: Path, before: int, after: int
             ) -> tuple[pa.Table, dict[str, Any]]:
    """A fault recording with copies of a clean one (same topology) placed
    before and after it in time: the held-out set's hour-long recordings,
    where long-term tests run and a fault sits among clean periods. Each
    copy's congestions join `benign`, moved with it (they were missing:
    a false incident on a copy's congestion read as having none near)."""
    c = pq.read_table(clean / "probes.parquet")
    ctr = json.loads((clean / "truth.json").read_text())
    dur = float(ctr["t_end"]) - float(ctr["t0"])
    shift = float(truth["t0"]) - float(ctr["t0"])
    offsets = [shift - (k + 1) * dur for k in range(before)] + \
              [shift + float(truth["t_end"]) - float(truth["t0"]) + k * dur for k in range(after)]
    cols = c.column_names
    parts = [c.set_column(0, "ts", pc.add(c.column("ts"), off)) for off in offsets]
    copied = [moved(b, off) for off in offsets for b in ctr.get("benign", [])]
    truth = dict(truth, t0=float(truth["t0"]) - before * dur,
                 t_end=float(truth["t_end"]) + after * dur,
                 benign=sorted(truth.get("benign", []) + copied, key=lambda b: b["start"]))
    return pa.concat_tables([*parts, table.select(cols)]), truth


def shift(table: pa.Table, truth: dict[str, Any], seconds: float
          ) -> tuple[pa.Table, dict[str, Any]]:
    """Every time of a probe recording and its truth moved by `seconds`:
    windows align to the epoch, so the faults begin elsewhere in them (the
    held-out set's faults begin anywhere)."""
    table = table.set_column(0, "ts", pc.add(table.column("ts"), seconds))
    truth = dict(truth, faults=[moved(f, seconds) for f in truth.get("faults", [])],
                 benign=[moved(b, seconds) for b in truth.get("benign", [])],
                 **{k: truth[k] + seconds for k in ("t0", "t_end") if k in truth})
    return table, truth


def join(topology: dict[str, Any], truth: dict[str, Any], table: pa.Table, other: Path,
         lag_s: float = 7.3) -> tuple[dict[str, Any], dict[str, Any], pa.Table]:
    """Another throughput recording's jobs added to this one, on hosts of
    their own (its host, NIC, container, endpoint and job names prefixed
    "j2-"; switches of the same name are the same switch, so both jobs
    share the fabric), its samples moved to start `lag_s` after this one's:
    two jobs of different shapes and rhythms in one file, as the held-out
    set has them, made only of traffic we did not write."""
    o_topo = json.loads((other / "topology.json").read_text())
    o_truth = json.loads((other / "truth.json").read_text())
    o_table = pq.read_table(other / "throughput.parquet")
    names = {n: "j2-" + n for n in _ids(o_topo)}
    names.update({j["job"]: "j2-" + j["job"] for j in o_truth["jobs"]})
    o_topo, o_truth = _rename(o_topo, names), _rename(o_truth, names)
    o_table = _rename_column(o_table, "endpoint", names)
    shift = (float(pc.min(table.column("ts")).as_py()) + lag_s
             - float(pc.min(o_table.column("ts")).as_py()))
    o_table = o_table.set_column(0, "ts", pc.add(o_table.column("ts"), shift))
    known = {s["id"] for s in topology["switches"]}
    topology = dict(topology,
                    switches=topology["switches"] + [s for s in o_topo["switches"]
                                                     if s["id"] not in known],
                    hosts=topology["hosts"] + o_topo["hosts"],
                    links=topology["links"] + [ln for ln in o_topo["links"]
                                               if ln["a"] not in known or ln["b"] not in known],
                    containers=topology["containers"] + o_topo["containers"],
                    vswitch={**topology.get("vswitch", {}), **o_topo.get("vswitch", {})})
    truth = dict(truth, jobs=truth["jobs"] + o_truth["jobs"])
    return topology, truth, pa.concat_tables([table, o_table.select(table.column_names)])


def make(rec: Path, out: Path, interval_s: float | None, opaque: bool, seed: int,
         routes: float = 1.0, clean: Path | None = None, before: int = 0, after: int = 0,
         seconds: float | None = None, skip: float = 0.0, missing: float = 0.0,
         other: Path | None = None, shift_s: float = 0.0, traced: float = 1.0) -> str:
    topology = json.loads((rec / "topology.json").read_text())
    truth = json.loads((rec / "truth.json").read_text())
    data = "throughput.parquet" if (rec / "throughput.parquet").exists() else "probes.parquet"
    table = pq.read_table(rec / data)
    if other is not None and data == "throughput.parquet" and other.resolve() != rec.resolve():
        topology, truth, table = join(topology, truth, table, other)
    if seconds and data == "throughput.parquet":
        table = truncate(table, seconds, skip)
    if interval_s and data == "throughput.parquet":
        table = decimate(table, interval_s)
    if missing and data == "throughput.parquet":
        table = drop_samples(table, missing, seed)
    if clean is not None and data == "probes.parquet" and (before or after):
        table, truth = surround(table, truth, clean, before, after)
    if shift_s and data == "probes.parquet":
        table, truth = shift(table, truth, shift_s)
    if routes < 1.0 and data == "probes.parquet":
        table = drop_routes(table, routes, seed)
    if traced < 1.0 and data == "probes.parquet":
        table = thin_routes(table, traced, seed)
    if opaque:
        names = {n: _opaque(n, f"{seed}:{rec.name}") for n in _ids(topology)}
        topology, truth = _rename(topology, names), _rename(truth, names)
        for column in ("endpoint", "src", "dst"):
            table = _rename_column(table, column, names)
        rng = np.random.default_rng(seed)
        table = table.take(pa.array(rng.permutation(table.num_rows)))
    dest = out / rec.name
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "topology.json").write_text(json.dumps(topology))
    (dest / "truth.json").write_text(json.dumps(truth))
    pq.write_table(table, dest / data)
    return str(dest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="a directory of recordings, or one recording")
    ap.add_argument("out", type=Path)
    ap.add_argument("--interval", type=float, default=None,
                    help="resample throughput to this interval (s)")
    ap.add_argument("--opaque", action="store_true", help="replace every id by a hash")
    ap.add_argument("--routes", type=float, default=1.0,
                    help="share of probe pairs whose routes are kept (0: none)")
    ap.add_argument("--traced", type=float, default=1.0,
                    help="share of probes whose route is kept, each at random")
    ap.add_argument("--clean", type=Path, help="a clean recording of the same topology ...")
    ap.add_argument("--before", type=int, default=0, help="... copies of it placed before")
    ap.add_argument("--after", type=int, default=0, help="... and after each fault recording")
    ap.add_argument("--seconds", type=float, default=None,
                    help="keep this many seconds of each throughput recording")
    ap.add_argument("--skip", type=float, default=0.0,
                    help="... starting this long after its first sample")
    ap.add_argument("--missing", type=float, default=0.0,
                    help="share of throughput rows to drop at random")
    ap.add_argument("--join", type=Path, default=None,
                    help="a throughput recording whose jobs are added to each (own hosts)")
    ap.add_argument("--shift", type=float, default=0.0,
                    help="move every time of a probe recording by this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    recs = ([args.src] if (args.src / "truth.json").exists()
            else sorted(p for p in args.src.iterdir() if (p / "truth.json").exists()))
    made = [make(r, args.out, args.interval, args.opaque, args.seed, args.routes, args.clean,
                 args.before, args.after, args.seconds, args.skip, args.missing, args.join,
                 args.shift, args.traced)
            for r in recs]
    print(json.dumps({"made": made, "interval_s": args.interval, "opaque": args.opaque,
                      "routes": args.routes, "traced": args.traced, "seconds": args.seconds,
                      "skip": args.skip, "missing": args.missing, "shift_s": args.shift,
                      "join": str(args.join) if args.join else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
