"""Import probe records in the format published with the SkeletonHunter paper
(one row per RDMA ping: src_pod, dst_pod, src_ip, dst_ip, latency in us,
loss_rate, ping_time in ns since the epoch, src_asw/dst_asw the ToRs,
src_dsw/dst_dsw the distribution switches, route, ...) into contract section
3, plus a topology stub (contract section 1) built from the same rows so the
recording replays through `netskel analyze` as is.

Endpoints are named POD@NODE/IP, containers POD@NODE; hosts are the node ids;
each endpoint's NIC hangs off its ToR, ToRs off their distribution switches.
The published ids are hashes: they are used verbatim, never parsed."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from netskel.errors import InputError

REQUIRED = ("src_pod", "dst_pod", "src_ip", "dst_ip", "latency", "loss_rate", "ping_time",
            "src_asw", "dst_asw", "src_node_id", "dst_node_id")


def _float(row: dict[str, str], col: str, where: str) -> float:
    if row.get(col) is None:  # DictReader's filler for a short row
        raise InputError(f"{where}: the row ends before column '{col}'")
    try:
        v = float(row[col])
    except ValueError:
        raise InputError(f"{where}: column '{col}' is not a number: {row[col]!r}") from None
    if not math.isfinite(v):
        raise InputError(f"{where}: column '{col}' is not finite")
    return v


def read_rows(path: str | Path) -> list[dict[str, str]]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if not p.is_file():
        raise InputError(f"{p}: not a file")
    # utf-8-sig: a byte-order mark before the first column name is not part of it.
    with p.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        try:
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise InputError(f"{p}: missing column '{missing[0]}'")
            rows = list(reader)
        except UnicodeDecodeError as e:
            raise InputError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} near line "
                             f"{reader.line_num + 1})") from None
        except csv.Error as e:
            raise InputError(f"{p}:{reader.line_num}: {e}") from None
    if not rows:
        raise InputError(f"{p}: no rows")
    return rows


def to_records(rows: Iterable[dict[str, str]], source: str = "csv") -> pa.Table:
    cols: dict[str, list[Any]] = {k: [] for k in ("ts", "src", "dst", "size", "rtt_us", "proto",
                                                   "route")}
    for i, r in enumerate(rows, start=2):
        where = f"{source}:{i}"
        ts = _float(r, "ping_time", where) / 1e9
        loss = _float(r, "loss_rate", where)
        lat = _float(r, "latency", where)
        if not 0.0 <= loss <= 1.0 or lat < 0:
            raise InputError(f"{where}: loss_rate {loss} or latency {lat} out of range")
        lost = loss >= 1.0 or r.get("dial", "success") not in ("", "success")
        route = r.get("route") or ">".join(_path(r))
        cols["ts"].append(ts)
        cols["src"].append(endpoint_id(r, "src"))
        cols["dst"].append(endpoint_id(r, "dst"))
        cols["size"].append(int(r.get("size") or 64))
        cols["rtt_us"].append(None if lost else lat)
        cols["proto"].append("rdma" if "RDMA" in r.get("task_type", "RDMA") else "udp")
        cols["route"].append(route)
    return pa.table({"ts": pa.array(cols["ts"], pa.float64()), "src": pa.array(cols["src"]),
                     "dst": pa.array(cols["dst"]), "size": pa.array(cols["size"], pa.int32()),
                     "rtt_us": pa.array(cols["rtt_us"], pa.float64()),
                     "proto": pa.array(cols["proto"]), "route": pa.array(cols["route"])})


def endpoint_id(r: dict[str, str], side: str) -> str:
    """POD@NODE/IP: the published overlay IPs repeat across nodes (tenants'
    address spaces overlap), so the node is part of an endpoint's identity."""
    return f"{r[f'{side}_pod']}@{r[f'{side}_node_id']}/{r[f'{side}_ip']}"


def _path(r: dict[str, str]) -> list[str]:
    hops = [r["src_asw"], r.get("src_dsw", ""), r.get("dst_dsw", ""), r["dst_asw"]]
    if r["src_asw"] == r["dst_asw"]:
        hops = [r["src_asw"]]
    out: list[str] = []
    for h in hops:
        if h and (not out or out[-1] != h):
            out.append(h)
    return out


def to_topology(rows: Iterable[dict[str, str]]) -> dict[str, Any]:
    switches: dict[str, str] = {}
    hosts: dict[str, dict[str, Any]] = {}
    links: set[tuple[str, str]] = set()
    containers: dict[str, dict[str, Any]] = {}
    for r in rows:
        for side in ("src", "dst"):
            pod, ip, node = r[f"{side}_pod"], r[f"{side}_ip"], r[f"{side}_node_id"]
            asw, dsw = r[f"{side}_asw"], r.get(f"{side}_dsw", "")
            switches.setdefault(asw, "tor")
            if dsw:
                switches[dsw] = "spine"
                links.add(tuple(sorted((asw, dsw))))  # type: ignore[arg-type]
            host = hosts.setdefault(node, {"id": node, "nics": []})
            nic = f"{node}/nic-{ip}"
            if all(n["id"] != nic for n in host["nics"]):
                host["nics"].append({"id": nic, "rail": 0})
                links.add(tuple(sorted((nic, asw))))  # type: ignore[arg-type]
            # The published "pod" spans nodes (a network pod, it seems): one
            # container per pod and node keeps every container on one host.
            cid = f"{pod}@{node}"
            c = containers.setdefault(cid, {"id": cid, "host": node, "endpoints": []})
            ep = endpoint_id(r, side)
            if all(e["id"] != ep for e in c["endpoints"]):
                c["endpoints"].append({"id": ep, "nic": nic, "ip": ip})
    return {"version": 1,
            "switches": [{"id": s, "tier": t, **({"rail": 0} if t == "tor" else {})}
                         for s, t in sorted(switches.items())],
            "hosts": sorted(hosts.values(), key=lambda h: str(h["id"])),
            "links": [{"a": a, "b": b} for a, b in sorted(links)],
            "containers": sorted(containers.values(), key=lambda c: str(c["id"]))}
