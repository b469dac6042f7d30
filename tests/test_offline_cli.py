"""`netskel analyze` and `netskel infer` on contract files, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analyzer.records import ProbeRecords
from analyzer.windows import compute_windows
from netskel.cli import main
from netskel.topology import parse_topology
from tests.helpers import as_seconds_and_timestamps

CONTRACTS = Path(__file__).resolve().parents[2] / "shared" / "contracts"


def probe_table(topo_doc, lossy_pair=None, loss=0.3, seconds=120, rate=20, seed=1):
    rng = np.random.default_rng(seed)
    topo = parse_topology(topo_doc)
    eps = [e for c in topo_doc["containers"] for e in c["endpoints"]]
    rows = {"ts": [], "src": [], "dst": [], "size": [], "rtt_us": [], "proto": []}
    nic = {e["id"]: topo.nics[e["nic"]] for e in eps}
    pairs = [(a["id"], b["id"]) for a in eps for b in eps
             if a["id"] < b["id"] and nic[a["id"]].rail == nic[b["id"]].rail
             and nic[a["id"]].host != nic[b["id"]].host]
    t0 = 1_700_000_010.0
    n = seconds * rate
    for a, b in pairs:
        ts = t0 + np.sort(rng.uniform(0, seconds, n))
        rtt = rng.lognormal(np.log(15), 0.1, n)
        if (a, b) == lossy_pair:
            rtt[(ts > t0 + 60) & (rng.random(n) < loss)] = np.nan
        rows["ts"].append(ts)
        rows["src"] += [a] * n
        rows["dst"] += [b] * n
        rows["size"].append(rng.choice([64, 1024], n))
        rows["rtt_us"].append(rtt)
        rows["proto"] += ["udp"] * n
    return pa.table({"ts": np.concatenate(rows["ts"]), "src": rows["src"], "dst": rows["dst"],
                     "size": np.concatenate(rows["size"]).astype(np.int32),
                     "rtt_us": np.concatenate(rows["rtt_us"]), "proto": rows["proto"]}), pairs


def test_windows_match_numpy_reference():
    rng = np.random.default_rng(3)
    n = 5000
    rec = ProbeRecords(ts=rng.uniform(0, 90, n), src=np.array(["a", "b"] * (n // 2), dtype=object),
                       dst=np.array(["c"] * n, dtype=object), size=rng.choice([64, 512], n),
                       rtt_us=np.where(rng.random(n) < 0.1, np.nan, rng.lognormal(3, 0.5, n)),
                       proto=np.array(["udp"] * n, dtype=object), route=None)
    for w in compute_windows(rec, 30.0):
        m = ((rec.src == w.src) & (rec.size == w.size) & (rec.ts >= w.window_start)
             & (rec.ts < w.window_end))
        r = rec.rtt_us[m]
        ok = r[np.isfinite(r)]
        assert w.sent == m.sum() and w.lost == (~np.isfinite(r)).sum()
        assert np.allclose([w.rtt_p25, w.rtt_median, w.rtt_p75], np.percentile(ok, [25, 50, 75]))
        assert np.isclose(w.rtt_std, ok.std()) and np.isclose(w.rtt_mean, ok.mean())
        assert w.rtt_min == ok.min() and w.rtt_max == ok.max()


def test_analyze_finds_the_lossy_pair_only(tmp_path, topo_file, topo_doc):
    table, pairs = probe_table(topo_doc, lossy_pair=None)
    lossy = pairs[0]
    table, _ = probe_table(topo_doc, lossy_pair=lossy)
    pq.write_table(table, tmp_path / "p.parquet")
    out = tmp_path / "inc.json"
    assert main(["analyze", "--topology", str(topo_file), "--probes",
                 str(tmp_path / "p.parquet"), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(CONTRACTS.joinpath("incidents.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert doc["incidents"], "the lossy pair must raise an incident"
    flagged = {tuple(p) for i in doc["incidents"] for p in i["pairs"]}
    assert flagged == {tuple(sorted(lossy))}
    assert all(i["symptom"] == "loss" and i["start"] >= 1_700_000_010 + 30 for i in doc["incidents"])


def test_analyze_replays_the_live_analyzers_thresholds(tmp_path, topo_file, topo_doc, capsys):
    """`--config` hands offline analysis the [analyzer] table a live
    analyzer runs with: the loss above lasts two windows, so a file asking
    three lossy windows in a row opens nothing; a bad file is one line."""
    _, pairs = probe_table(topo_doc, lossy_pair=None)
    table, _ = probe_table(topo_doc, lossy_pair=pairs[0])
    pq.write_table(table, tmp_path / "p.parquet")
    conf, out = tmp_path / "a.toml", tmp_path / "inc.json"
    args = ["analyze", "--topology", str(topo_file), "--probes", str(tmp_path / "p.parquet"),
            "-o", str(out), "--config", str(conf)]
    conf.write_text('[analyzer]\nlisten = ["10.9.9.9:1"]\npersist_windows = 1\n')
    assert main(args) == 0 and json.loads(out.read_text())["incidents"]
    conf.write_text("[analyzer]\npersist_windows = 3\n")
    assert main(args) == 0 and json.loads(out.read_text())["incidents"] == []
    conf.write_text("[analyzer]\npersist_window = 3\n")
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"netskel: error: {conf}.analyzer: unknown key(s) persist_window")


def _two_probes(path, **columns):
    """Two probes of one pair, with `columns` in place of the good ones."""
    table = {"ts": [1.0, 2.0], "src": ["job7-w000/rnic0"] * 2, "dst": ["job7-w001/rnic0"] * 2,
             "size": pa.array([64, 64], pa.int32()), "rtt_us": [15.0, 16.0], "proto": ["udp"] * 2}
    pq.write_table(pa.table({**table, **columns}), path)


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_bytes(b"PAR1garbage"), "not a readable Parquet file"),
    (lambda p: pq.write_table(pa.table({"ts": [1.0]}), p), "missing column 'src'"),
    # Epoch seconds in float32 are 128 s apart: every window would merge.
    (lambda p: _two_probes(p, ts=pa.array([1.7e9, 1.7e9 + 1], pa.float32())),
     "column 'ts' has type float, expected float64 seconds"),
    # An infinite RTT is no measurement (lost is null): it made a window's
    # mean and spread infinite and moved a localization's confidence.
    (lambda p: _two_probes(p, rtt_us=[15.0, float("inf")]),
     "column 'rtt_us' has 1 infinite value(s)"),
    (lambda p: _two_probes(p, rtt_us=[15.0, -3.0]), "column 'rtt_us' has 1 negative value"),
    (lambda p: _two_probes(p, ts=[1.0, float("nan")]), "column 'ts' has null or non-finite values"),
    (lambda p: _two_probes(p, src=["job7-w000/rnic0", None]), "column 'src' has nulls"),
    (lambda p: _two_probes(p, size=pa.array([64, 0], pa.int32())),
     "column 'size' has non-positive values"),
    (lambda p: _two_probes(p, size=[64.0, 64.0]), "column 'size' has type double, expected integer"),
])
def test_analyze_bad_probe_files(tmp_path, topo_file, capsys, make, message):
    bad = tmp_path / "bad.parquet"
    make(bad)
    out = tmp_path / "inc.json"
    assert main(["analyze", "--topology", str(topo_file), "--probes", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and str(bad) in err[0]
    assert not out.exists()


def test_analyze_warns_of_routes_the_topology_cannot_place(tmp_path, topo_file, topo_doc, capsys):
    """A route naming switches the topology lacks (another separator, another
    naming) places no probe on a link: the analysis goes on, and says so
    once instead of quietly treating the file as untraced."""
    table, _ = probe_table(topo_doc, seconds=60, rate=2)
    good = "tor-r0-0>spine-0>tor-r0-1"
    routes = [good if k % 3 else None for k in range(table.num_rows)]
    out = tmp_path / "inc.json"
    for name, vals in (("good", routes),
                       ("commas", [r.replace(">", ",") if r else r for r in routes])):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table.append_column("route", pa.array(vals, pa.string())), path)
        assert main(["analyze", "--topology", str(topo_file), "--probes", str(path),
                     "-o", str(out)]) == 0
        warned = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
        if name == "good":
            assert warned == []
        else:
            assert len(warned) == 1 and "column 'route'" in warned[0], warned
            assert "'tor-r0-0,spine-0,tor-r0-1'" in warned[0] and str(path) in warned[0]


def test_analyze_warns_of_protocols_outside_the_contract_and_still_analyses_them(
        tmp_path, topo_file, topo_doc, capsys):
    """`proto` is rdma or udp (contract section 3). A file spelling it
    otherwise is still analysed (each value an instrument of its own: the
    lossy pair is found either way), and the warning says which values and
    how many rows, once."""
    _, pairs = probe_table(topo_doc, seconds=1, rate=1)
    table, _ = probe_table(topo_doc, lossy_pair=pairs[0], seconds=120, rate=5)
    n = table.num_rows
    found = {}
    for name, protos in (("contract", ["udp"] * n),
                         ("odd", ["UDP" if k % 4 else "tcp" for k in range(n)])):
        path = tmp_path / f"{name}.parquet"
        out = tmp_path / f"{name}.json"
        t = table.set_column(table.column_names.index("proto"), "proto",
                             pa.array(protos, pa.string()))
        pq.write_table(t, path)
        assert main(["analyze", "--topology", str(topo_file), "--probes", str(path),
                     "-o", str(out)]) == 0
        warned = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
        found[name] = {tuple(sorted(i["pairs"][0])) for i in json.loads(out.read_text())["incidents"]}
        if name == "contract":
            assert warned == []
        else:
            assert len(warned) == 1 and "column 'proto'" in warned[0] and str(path) in warned[0]
            assert f"'UDP' ({n - (n + 3) // 4} rows)" in warned[0]
            assert f"'tcp' ({(n + 3) // 4} rows)" in warned[0]
    assert found["contract"] and found["odd"] == found["contract"]


def test_analyze_reads_a_timestamp_column_as_the_seconds_it_holds(tmp_path, topo_file, topo_doc):
    """Probe times as a timestamp type (pandas writes them so) are the same
    instants: the same incidents as from float64 seconds."""
    _, pairs = probe_table(topo_doc, seconds=1, rate=1)  # the probed pairs
    table, _ = probe_table(topo_doc, lossy_pair=pairs[0], seconds=120, rate=5)
    docs = []
    for name, t in as_seconds_and_timestamps(table):
        pq.write_table(t, tmp_path / f"{name}.parquet")
        out = tmp_path / f"{name}.json"
        assert main(["analyze", "--topology", str(topo_file), "--probes",
                     str(tmp_path / f"{name}.parquet"), "-o", str(out)]) == 0
        docs.append(json.loads(out.read_text()))
    assert docs[0] == docs[1] and docs[0]["incidents"]


def test_analyze_truncated_parquet_and_unknown_endpoint(tmp_path, topo_file, topo_doc, capsys):
    table, _ = probe_table(topo_doc, seconds=10)
    good = tmp_path / "good.parquet"
    pq.write_table(table, good)
    data = good.read_bytes()
    trunc = tmp_path / "trunc.parquet"
    trunc.write_bytes(data[: len(data) // 2])
    out = tmp_path / "o.json"
    assert main(["analyze", "--topology", str(topo_file), "--probes", str(trunc), "-o",
                 str(out)]) == 2
    assert "not a readable Parquet file" in capsys.readouterr().err
    t2 = table.set_column(1, "src", pa.array(["ghost/rnic0"] * table.num_rows))
    pq.write_table(t2, good)
    assert main(["analyze", "--topology", str(topo_file), "--probes", str(good), "-o",
                 str(out)]) == 2
    assert "unknown endpoint 'ghost/rnic0'" in capsys.readouterr().err
    assert not out.exists()
    t3 = table.set_column(1, "src", table.column("dst"))
    pq.write_table(t3, good)
    assert main(["analyze", "--topology", str(topo_file), "--probes", str(good), "-o",
                 str(out)]) == 2
    assert "probe an endpoint from itself" in capsys.readouterr().err
    assert not out.exists()


def test_long_runs_show_progress_when_asked(tmp_path, topo_file, topo_doc, capsys):
    table, _ = probe_table(topo_doc, lossy_pair=None)
    pq.write_table(table, tmp_path / "p.parquet")
    assert main(["analyze", "--topology", str(topo_file), "--probes", str(tmp_path / "p.parquet"),
                 "-o", str(tmp_path / "i.json"), "--progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any("reading probe records" in x for x in err)
    done = [x for x in err if "analysing windows" in x]
    assert done and done[-1].split("windows")[1].split()[0] == "100%", done


def test_infer_falls_back_to_rail_aligned_list(tmp_path, topo_file, topo_doc):
    eps = [e["id"] for c in topo_doc["containers"] for e in c["endpoints"]]
    n = 50
    t = pa.table({"ts": np.repeat(np.arange(n, dtype=float), len(eps)),
                  "endpoint": eps * n,
                  "tx_bytes": np.arange(n * len(eps), dtype=np.int64),
                  "rx_bytes": np.arange(n * len(eps), dtype=np.int64)})
    pq.write_table(t, tmp_path / "tp.parquet")
    out = tmp_path / "sk.json"
    assert main(["infer", "--topology", str(topo_file), "--throughput",
                 str(tmp_path / "tp.parquet"), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    job = doc["jobs"][0]
    assert job["confidence"] < 0.5 and "no periodic training traffic" in job["notes"][0]
    pairs = {tuple(sorted((s, d))) for s, ds in job["ping_list"].items() for d in ds}
    assert len(pairs) == 2 * (4 * 3 // 2)  # per rail: every cross-host pair, once


@pytest.mark.parametrize("cmd", ["controller", "analyzer"])
def test_servers_refuse_a_malformed_topology_in_one_line(tmp_path, cmd):
    import subprocess
    import sys

    bad = tmp_path / "t.json"
    bad.write_text('{"version": 1, "switches": [], "hosts": [], "links": [{"a": "x"}]}')
    out = subprocess.run([sys.executable, "-m", "netskel.cli", cmd, "--topology", str(bad),
                          "--listen", "127.0.0.1:0", "--insecure"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "links[0]: missing required field 'b'" in lines[0]


@pytest.mark.parametrize("cmd", ["controller", "analyzer"])
@pytest.mark.parametrize("db", ["missing directory", "not a database"])
def test_servers_refuse_a_state_file_they_cannot_keep_in_one_line(tmp_path, topo_file, cmd, db):
    """The store is opened at start-up: a wrong `--db` stops the server in
    one line, and a file that is no database is left as it was."""
    import subprocess
    import sys

    junk = bytes(range(256)) * 20
    path = tmp_path / "nowhere" / "s.sqlite" if db == "missing directory" else tmp_path / "j.db"
    if db == "not a database":
        path.write_bytes(junk)
    out = subprocess.run([sys.executable, "-m", "netskel.cli", cmd, "--topology", str(topo_file),
                          "--db", str(path), "--listen", "127.0.0.1:0", "--insecure"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"netskel: error: {path}: "), lines
    assert db == "missing directory" or path.read_bytes() == junk


@pytest.mark.parametrize("content, says", [
    (b"src_pod\xe9,dst_pod\n", "not UTF-8 text"),
    ("\ufeff" + ",".join(__import__("netskel.csvimport", fromlist=["REQUIRED"]).REQUIRED)
     + "\np,q,1.1.1.1\n", "the row ends before column"),
    (b"a,b\n1,2\n", "missing column 'src_pod'"),
])
def test_import_csv_bad_input_is_one_line(tmp_path, capsys, content, says):
    """A latin-1 byte, a short row after a byte-order mark, a foreign header:
    one line each, no traceback, no output file."""
    from netskel.cli import main

    src = tmp_path / "in.csv"
    src.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "o.parquet"
    assert main(["import-csv", str(src), "--probes", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and not out.exists()


def test_agent_with_a_rate_of_zero_is_one_line(capsys):
    from netskel.cli import main

    assert main(["agent", "--insecure", "--container", "c", "--host", "h", "--endpoint",
                 "c/e0,h/n0,127.0.0.1", "--rate", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["netskel: error: agent.probe_rate_hz: must be positive, got 0.0"]


@pytest.mark.parametrize("in_time_order", [False, True])
def test_windows_in_parallel_time_slices_equal_one_pass(in_time_order):
    """Slices cut at window boundaries and computed on two threads give the
    very windows one pass gives, in the same order (rows in time order are
    sliced as views, others copied by mask)."""
    from analyzer.windows import compute_windows_parallel

    rng = np.random.default_rng(4)
    n = 300_000
    ts = rng.uniform(0, 600, n)
    rec = ProbeRecords(ts=np.sort(ts) if in_time_order else ts,
                       src=rng.choice(np.array(["a", "b", "c"], dtype=object), n),
                       dst=np.array(["d"] * n, dtype=object), size=rng.choice([64, 512], n),
                       rtt_us=np.where(rng.random(n) < 0.05, np.nan, rng.lognormal(3, 0.5, n)),
                       proto=np.array(["udp"] * n, dtype=object), route=None)
    assert compute_windows_parallel(rec, 30.0, parts=3) == compute_windows(rec, 30.0)


def _commands(tmp_path: Path, topo_file: Path, topo_doc: dict, out: str) -> list[list[str]]:
    table, _ = probe_table(topo_doc, seconds=5)
    pq.write_table(table, tmp_path / "p.parquet")
    eps = [e["id"] for c in topo_doc["containers"] for e in c["endpoints"]]
    pq.write_table(pa.table({"ts": np.repeat(np.arange(20, dtype=float), len(eps)),
                             "endpoint": eps * 20,
                             "tx_bytes": np.zeros(20 * len(eps), dtype=np.int64),
                             "rx_bytes": np.zeros(20 * len(eps), dtype=np.int64)}),
                   tmp_path / "tp.parquet")
    (tmp_path / "in.csv").write_text(
        ",".join(__import__("netskel.csvimport", fromlist=["REQUIRED"]).REQUIRED) + "\n")
    return [["analyze", "--topology", str(topo_file), "--probes", str(tmp_path / "p.parquet"),
             "-o", out],
            ["infer", "--topology", str(topo_file), "--throughput", str(tmp_path / "tp.parquet"),
             "-o", out],
            ["import-csv", str(tmp_path / "in.csv"), "--probes", out],
            ["simulate", "--job", "j,dp=2,tp=8,pp=1", "--seconds", "5", "-o", out],
            ["certs", "--agent", "c0", "--out", out]]


@pytest.mark.parametrize("where", ["missing directory", "directory in the way",
                                   "file in the way"])
def test_an_output_that_cannot_be_written_is_one_line_before_the_work(
        tmp_path, topo_file, topo_doc, capsys, where):
    """A typo in `-o` is told in one line, and before the run, not after it
    as a traceback: every command that writes files, each output kind."""
    (tmp_path / "a-file").write_text("kept\n")
    (tmp_path / "a-dir").mkdir()
    out = {"missing directory": tmp_path / "nowhere" / "x",
           "directory in the way": tmp_path / "a-dir",
           "file in the way": tmp_path / "a-file"}[where]
    for cmd in _commands(tmp_path, topo_file, topo_doc, str(out)):
        makes_dir = cmd[0] in ("simulate", "certs")
        if makes_dir != (where == "file in the way"):
            continue  # a missing directory is made, a directory is what they want
        assert main(cmd) == 2, cmd
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"netskel: error: {out}"), (cmd, err)
    assert (tmp_path / "a-file").read_text() == "kept\n"
    assert not (tmp_path / "nowhere").exists() and not any((tmp_path / "a-dir").iterdir())


@pytest.mark.parametrize("args, says", [
    (["analyze", "--topology", "t", "--probes", "p", "-o", "o", "--window", "0"],
     "argument --window: must be above 0, got '0'"),
    (["analyze", "--topology", "t", "--probes", "p", "-o", "o", "--window", "nan"],
     "argument --window: must be above 0, got 'nan'"),
    (["simulate", "--job", "j,dp=2,tp=8,pp=1", "--interval", "0", "-o", "o"],
     "argument --interval: must be above 0"),
    (["simulate", "--job", "j,dp=2,tp=8,pp=1", "--seconds", "-1", "-o", "o"],
     "argument --seconds: must be above 0"),
    (["certs", "--out", "o", "--days", "0"], "argument --days: must be at least 1, got '0'"),
    (["demo", "--hosts", "2"], "argument --hosts: must be at least 4, got '2'"),
    (["netdiag", "--pair", "a,b", "--check-seconds", "x"], "argument --check-seconds: 'x' is not a number"),
])
def test_a_number_that_cannot_work_is_a_usage_error(tmp_path, monkeypatch, capsys, args, says):
    """A zero window or a negative length used to surface as a numpy
    traceback (or a 36 GiB allocation) deep in the run."""
    monkeypatch.chdir(tmp_path)  # the relative outputs, were one written
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("job, says", [
    ("j,dp=0,tp=8,pp=1", "dp must be at least 1, got 0"),
    ("j,dp=4,tp=8,pp=1,ep=3", "ep 3 must divide dp 4"),
    ("j,dp=2,tp=8,pp=2,nics_per_host=0", "nics_per_host must be at least 1"),
    ("j,dp=2,tp=8,pp=2,period_s=0", "period_s must be positive"),
])
def test_a_simulated_job_that_cannot_exist_is_one_line(tmp_path, capsys, job, says):
    assert main(["simulate", "--job", job, "--seconds", "5", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[-1] and not (tmp_path / "o").exists()


def _run_briefly(args: list[str]) -> tuple[int, list[str]]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "netskel.cli", *args], capture_output=True,
                         text=True, timeout=60)
    # gRPC's core logs its own bind failure ("E1206 ... add_port.cc"); ours is the last line.
    return out.returncode, [x for x in out.stderr.strip().splitlines() if "add_port.cc" not in x]


def test_a_port_already_taken_stops_each_role_in_one_line(topo_file, topo_doc):
    """Another process on the gRPC port, the metrics port or the probe port:
    the role stops at once with one line naming it (it was a traceback)."""
    import socket

    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        taken, taken_udp = tcp.getsockname()[1], udp.getsockname()[1]
        base = ["--topology", str(topo_file), "--insecure"]
        cases = [
            (["controller", *base, "--db", ":memory:", "--listen", f"127.0.0.1:{taken}"],
             f"listen '127.0.0.1:{taken}': cannot listen there"),
            (["analyzer", *base, "--listen", f"127.0.0.1:{taken}"],
             f"listen '127.0.0.1:{taken}': cannot listen there"),
            (["controller", *base, "--db", ":memory:", "--listen", "127.0.0.1:0",
              "--metrics-port", str(taken), "--metrics-addr", "127.0.0.1"],
             f"metrics port 127.0.0.1:{taken}: Address already in use")]
        c = topo_doc["containers"][0]
        e = c["endpoints"][0]
        cases.append((["agent", "--insecure", "--container", c["id"], "--host", c["host"],
                       "--endpoint", f"{e['id']},{e['nic']},127.0.0.1", "--probe-port",
                       str(taken_udp), "--controller", "127.0.0.1:1"],
                      f"probe port 127.0.0.1:{taken_udp}: Address already in use"))
        for args, says in cases:
            rc, err = _run_briefly(args)
            assert rc == 2 and len(err) == 1 and says in err[0], (args[0], err)
