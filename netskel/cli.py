"""`netskel` command line: one entry point, one subcommand per role."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netskel.errors import InputError, NetskelError, OutputError
from netskel.heap import retain_freed_memory
from netskel.outputs import output_dir, output_file, write_json_atomic
from netskel.progress import Progress
from netskel.settings import reloader, settings_of
from netskel.stopping import wait_for_signal

if TYPE_CHECKING:
    from netskel.security import Security


def at_least(kind: type[int] | type[float], low: float, above: bool = False
             ) -> Callable[[str], Any]:
    """An argparse type: a finite number of `kind` at least `low` (or above
    it): a zero window or a negative length is a usage error, not a crash
    deep in the run."""
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"'{text}' is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(v) or (v <= low if above else v < low):
            raise argparse.ArgumentTypeError(
                f"must be {'above' if above else 'at least'} {low:g}, got '{text}'")
        return v
    return parse


POSITIVE_S = at_least(float, 0, above=True)


def _tuple(values: list[Any] | None) -> tuple[Any, ...] | None:
    """A repeatable flag's values, None when it was not given."""
    return tuple(values) if values else None


def _env_list(name: str) -> tuple[str, ...]:
    raw = os.environ.get(name, "")
    return tuple(x for x in raw.split(";") if x)


def cmd_controller(a: argparse.Namespace) -> int:
    from controller.metrics import CONFIG, REGISTRY
    from controller.server import start_controller
    from netskel.config import ControllerConfig
    from netskel.metrics import serve

    flags = {"topology": a.topology, "listen": _tuple(a.listen), "db": a.db,
             "heartbeat_interval_ms": a.heartbeat_ms, "heartbeat_timeout_s": a.heartbeat_timeout,
             "window_seconds": a.window, "metrics_port": a.metrics_port,
             "switch_addresses": a.switch_addresses}
    cfg: ControllerConfig = settings_of(a.config, "controller", flags)
    sec = _security(a, "controller")
    serve(cfg.metrics_port, a.metrics_addr, REGISTRY)
    running = start_controller(cfg, sec)
    _warn_if_insecure(sec, "controller")
    print(f"controller listening on {running.ports}", flush=True)
    wait_for_signal(reloader(a.config, "controller", flags, lambda: cfg, lambda _new: None, CONFIG))
    running.stop()
    return 0


def cmd_agent(a: argparse.Namespace) -> int:
    from netskel.config import AgentConfig
    from netskel.metrics import serve
    from probe_agent.agent import Agent
    from probe_agent.metrics import CONFIG, REGISTRY

    def env(name: str) -> str | None:  # a sidecar's environment, where no flag says
        return os.environ.get(name) or None

    flags = {"controller": a.controller or env("NETSKEL_CONTROLLER"),
             "container": a.container or env("NETSKEL_CONTAINER"),
             "job": a.job or env("NETSKEL_JOB"), "host": a.host or env("NETSKEL_HOST"),
             "endpoints": _tuple(a.endpoint) or _env_list("NETSKEL_ENDPOINTS") or None,
             "probe_port": a.probe_port, "probe_rate_hz": a.rate, "counter_hz": a.counter_hz,
             "busy_poll_us": a.busy_poll_us, "dscp": a.dscp, "hw_timestamps": a.hw_timestamps,
             "metrics_port": a.metrics_port, "vswitch": a.vswitch or env("NETSKEL_VSWITCH"),
             "vswitch_tunnel_ports": _tuple(a.vswitch_tunnel_port), "vswitch_vni": a.vswitch_vni,
             "vswitch_interval_s": a.vswitch_interval, "vswitch_refresh_s": a.vswitch_refresh,
             "vswitch_db": a.vswitch_db or env("NETSKEL_VSWITCH_DB"),
             "vswitch_datapath": a.vswitch_datapath or env("NETSKEL_VSWITCH_DATAPATH"),
             "vswitch_datapath_type": a.vswitch_datapath_type,
             "underlay_netns": a.underlay_netns or env("NETSKEL_UNDERLAY_NETNS"),
             "trace_interval_s": a.trace_interval, "flows": a.flows, "tunnel_port": a.tunnel_port,
             "rdma": a.rdma or env("NETSKEL_RDMA")}
    cfg: AgentConfig = settings_of(a.config, "agent", flags)
    sec = _security(a, "agent")
    agent = Agent(cfg, sec)
    agent.start()
    _warn_if_insecure(sec, "agent")
    try:  # up only once the agent is: readiness for scrapers too
        serve(cfg.metrics_port, a.metrics_addr, REGISTRY)
    except NetskelError:
        agent.stop(deregister=True)
        raise
    print(f"agent {cfg.container} probing from {len(agent.endpoints)} endpoint(s)", flush=True)
    wait_for_signal(reloader(a.config, "agent", flags, lambda: agent.cfg, agent.reconfigure, CONFIG))
    agent.stop(deregister=True)  # a clean stop leaves the cluster; a crash is an incident
    return 0


def cmd_analyzer(a: argparse.Namespace) -> int:
    from analyzer.metrics import CONFIG, REGISTRY
    from analyzer.server import start_analyzer
    from netskel.config import AnalyzerConfig
    from netskel.metrics import serve

    flags = {"topology": a.topology, "controller": a.controller, "listen": _tuple(a.listen),
             "metrics_port": a.metrics_port, "web_listen": a.web, "db": a.db}
    cfg: AnalyzerConfig = settings_of(a.config, "analyzer", flags)
    sec = _security(a, "analyzer")
    serve(cfg.metrics_port, a.metrics_addr, REGISTRY)
    running = start_analyzer(cfg, sec=sec)
    _warn_if_insecure(sec, "analyzer")
    print(f"analyzer (NetDiag) listening on {running.ports}", flush=True)
    if running.web is not None:
        print(f"web page on http://{cfg.web_listen.rpartition(':')[0] or '127.0.0.1'}:"
              f"{running.web.port}/", flush=True)

    def take(new: AnalyzerConfig) -> None:
        with running.lock:
            running.engine.reconfigure(new)

    wait_for_signal(reloader(a.config, "analyzer", flags, lambda: running.engine.cfg, take, CONFIG))
    running.stop()
    return 0


def _progress(a: argparse.Namespace) -> Progress | None:
    """Progress on a terminal (or when asked): a batch log gets only the result."""
    return Progress() if a.progress or sys.stderr.isatty() else None


def _warn(line: str) -> None:
    """What a batch command read but could not use: the answer stands."""
    print(f"netskel: warning: {line}", file=sys.stderr)


def cmd_analyze(a: argparse.Namespace) -> int:
    from analyzer.offline import analyze_files
    from netskel.config import load_config

    output_file(a.output)
    cfg = load_config(a.config).analyzer if a.config else None
    retain_freed_memory()
    doc = analyze_files(a.topology, a.probes, window_s=a.window, cfg=cfg, progress=_progress(a),
                        warn=_warn)
    write_json_atomic(a.output, doc)
    print(f"{len(doc['incidents'])} incident(s) -> {a.output}", file=sys.stderr)
    return 0


def cmd_infer(a: argparse.Namespace) -> int:
    from controller.infer import infer_files

    output_file(a.output)
    retain_freed_memory()
    doc = infer_files(a.topology, a.throughput, job=a.job, progress=_progress(a), warn=_warn)
    write_json_atomic(a.output, doc)
    print(f"{len(doc['jobs'])} job(s) -> {a.output}", file=sys.stderr)
    return 0


def cmd_import_csv(a: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from netskel.csvimport import read_rows, to_records, to_topology

    out = output_file(a.probes)
    if a.topology:
        output_file(a.topology)
    rows = read_rows(a.csv)
    table = to_records(rows, source=str(a.csv))
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        pq.write_table(table, tmp)
        if a.topology:
            write_json_atomic(a.topology, to_topology(rows))
        os.replace(tmp, out)
    except OSError as e:
        raise OutputError(f"{out}: cannot write ({e.strerror})") from None
    finally:
        tmp.unlink(missing_ok=True)
    print(f"{table.num_rows} probe record(s) -> {out}", file=sys.stderr)
    return 0


def _vswitch_inputs(a: argparse.Namespace) -> tuple[Any, Any]:
    """The dump and the port facts the flags give; InputError on bad ones."""
    from netskel.ofdump import DumpError, read_dump
    from netskel.ofpipeline import Port, Ports
    from probe_agent.vswitch import parse_ports

    try:
        text = Path(a.dump).read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise InputError(f"{a.dump}: cannot read ({e.strerror or e})") from None
    try:
        dump = read_dump(text)
    except DumpError as e:
        raise InputError(f"{a.dump}: not ovs-ofctl dump-flows output: {e}") from None
    tunnels: list[Port] = []
    for spec in a.tunnel_port or ():
        num, _, remote = spec.partition("=")
        if not num.isdigit():
            raise InputError(f"--tunnel-port '{spec}': expected PORT or PORT=REMOTE_IP")
        tunnels.append(Port(int(num), num, "tunnel", remote or None))
    ports = Ports(tuple(tunnels))
    if a.ports:
        try:
            show = Path(a.ports).read_text(errors="replace")
        except OSError as e:
            raise InputError(f"{a.ports}: cannot read ({e.strerror or e})") from None
        listed = parse_ports(show, tuple(t.number for t in tunnels))
        if not listed.ports:
            raise InputError(f"{a.ports}: no port lines ('N(name): addr:...') as ovs-ofctl show "
                             "prints them")
        remote = {t.number: t.remote_ip for t in tunnels}
        ports = Ports(tuple(Port(p.number, p.name, p.kind, remote.get(p.number)) for p in
                            listed.ports), complete=True)
    return dump, ports


def cmd_vswitch_parse(a: argparse.Namespace) -> int:
    from netskel.ofrules import line_rules

    dump, ports = _vswitch_inputs(a)
    doc = {"rules": line_rules(dump, ports),
           "not_understood": [{"line": b.line, "text": b.text, "why": b.why}
                              for b in dump.not_understood]}
    print(json.dumps(doc, indent=1))
    return 0


def cmd_vswitch_datapath(a: argparse.Namespace) -> int:
    """What the datapath (or a NIC offloading it) does per input port and
    destination, as the agent's --vswitch-datapath reports it."""
    from netskel.dpflows import DatapathError, read_datapath

    try:
        text = Path(a.dump).read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise InputError(f"{a.dump}: cannot read ({e.strerror or e})") from None
    try:
        got = read_datapath(text, frozenset(a.tunnel_port or ()), a.vni)
    except DatapathError as e:
        raise InputError(f"{a.dump}: not ovs-appctl dpctl/dump-flows output: {e}") from None
    rules = [{"port": f.port, "from_tunnel": f.from_tunnel, "vni": f.rule.vni, "dst": f.rule.dst,
              "action": f.rule.action, "to": f.rule.to} for f in got.rules]
    print(json.dumps({"flows": got.flows, "skipped": got.skipped, "followed": got.followed,
                      "rules": rules}, indent=1))
    return 0


def cmd_vswitch_trace(a: argparse.Namespace) -> int:
    from netskel.ofdump import mac_int
    from netskel.ofpipeline import Packet, Pipeline

    dump, ports = _vswitch_inputs(a)
    fields: dict[str, int] = {}
    for spec in a.field or ():
        name, _, value = spec.partition("=")
        num = mac_int(value) if ":" in value else None
        try:
            fields[name] = num if num is not None else int(value, 0)
        except ValueError:
            raise InputError(f"--field '{spec}': expected NAME=NUMBER or NAME=MAC") from None
    in_port: int | str | None = None
    if a.in_port is not None:
        in_port = int(a.in_port) if a.in_port.isdigit() else a.in_port
    table = None
    if a.table is not None:
        table = int(a.table) if a.table.isdigit() else dump.table_names.get(a.table)
        if table is None:
            raise InputError(f"--table '{a.table}': no such table in {a.dump}")
    try:
        pkt = Packet(a.dst, in_port=in_port, vni=a.vni, src=a.src, proto=a.proto, fields=fields)
        out = Pipeline(dump, ports).trace(pkt, table)
    except ValueError as e:
        raise InputError(str(e)) from None
    print(json.dumps(out.summary(), indent=1))
    return 0


def cmd_simulate(a: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from netskel.simulate import JobShape, Noise, simulate

    shapes = []
    for spec in a.job:
        try:
            name, *kv = spec.split(",")
            fields: dict[str, Any] = {k: (float(v) if k in ("period_s", "a2a_share") else int(v))
                                      for k, v in (x.split("=") for x in kv)}
            shapes.append(JobShape(name, **fields))
        except (ValueError, TypeError) as e:
            raise InputError(f"--job '{spec}': expected NAME,dp=D,tp=T,pp=P[,ep=E] ({e})") from None
    out = output_dir(a.out)
    topo, table, truth = simulate(shapes, Noise(duration_s=a.seconds, interval_s=a.interval),
                                  seed=a.seed)
    write_json_atomic(out / "topology.json", topo)
    pq.write_table(table, out / "throughput.parquet")
    # The truth in the dev set's layout, so bench/accuracy.py scores it.
    jobs = [{"job": sh.name, "kind": "training" if sh.periodic else "debug",
             "parallelism": {"dp": sh.dp, "tp": sh.tp, "pp": sh.pp, "ep": sh.ep},
             "dp_groups": truth[sh.name].dp_groups, "pp_stages": truth[sh.name].pp_stages,
             "ep_groups": truth[sh.name].ep_groups,
             "pairs": sorted(map(list, truth[sh.name].pairs))} for sh in shapes]
    write_json_atomic(out / "truth.json", {"jobs": jobs})
    print(f"{table.num_rows} samples of {sum(len(c['endpoints']) for c in topo['containers'])} "
          f"endpoints -> {out}/{{topology.json,throughput.parquet,truth.json}}", file=sys.stderr)
    return 0


def cmd_certs(a: argparse.Namespace) -> int:
    from netskel.security import make_certs

    agents = list(a.agent or [])
    if a.topology:
        from netskel.topology import load_topology

        agents += sorted(load_topology(a.topology).containers)
    files = make_certs(output_dir(a.out), dict.fromkeys(agents), hosts=tuple(a.host or ["localhost"]),
                       days=a.days)
    print(f"{len(files)} certificate(s) in {a.out} (keys beside them, mode 0600)",
          file=sys.stderr)
    return 0


def cmd_config(a: argparse.Namespace) -> int:
    """`check`: a file read as the roles would read it, before a SIGHUP
    or a rollout puts it in force; `show`: the settings it amounts to, every
    key spelled out (defaults where the file is silent)."""
    from netskel.config import Config, load_config, to_toml

    cfg = load_config(a.file) if a.file else Config()
    if a.config_cmd == "check":
        print(f"{a.file}: ok")
    else:
        print(to_toml(cfg, tuple(a.role) if a.role else ("controller", "agent", "analyzer")),
              end="")
    return 0


def cmd_netdiag(a: argparse.Namespace) -> int:
    from netskel.netdiag_client import run_netdiag

    return run_netdiag(a)


def cmd_demo(a: argparse.Namespace) -> int:
    from testbed.demo import run_demo

    return run_demo(a)


def _security(a: argparse.Namespace, role: str) -> Security:
    """TLS from flags (or NETSKEL_TLS_CERT/KEY/CA, NETSKEL_INSECURE=1 for
    sidecars configured by environment); plaintext only when asked for."""
    from netskel.security import from_flags

    env = os.environ.get
    return from_flags(a.tls_cert or env("NETSKEL_TLS_CERT", ""),
                      a.tls_key or env("NETSKEL_TLS_KEY", ""),
                      a.tls_ca or env("NETSKEL_TLS_CA", ""),
                      a.insecure or env("NETSKEL_INSECURE", "") == "1", role,
                      getattr(a, "token_file", None) or "")


def _warn_if_insecure(sec: Security, role: str) -> None:
    from netskel.security import warn_if_insecure

    warn_if_insecure(sec, role)


def _tls_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-cert", help="this process's certificate (PEM; `netskel certs`)")
    p.add_argument("--tls-key", help="its private key (PEM)")
    p.add_argument("--tls-ca", help="the CA that signs every netskel certificate (PEM)")
    p.add_argument("--insecure", action="store_true",
                   help="plaintext gRPC, no identities (testbed only; logged)")


def _config_flag(p: argparse.ArgumentParser, role: str) -> None:
    p.add_argument("--config", metavar="TOML",
                   help=f"settings file: its [{role}] table (netskel/config.py documents every "
                        "key); flags given here win. SIGHUP reads it again: the analyzer takes "
                        "its thresholds live, the agent its probe rate and switch-read and trace "
                        "intervals, the rest waits for a restart (logged); a bad file is logged "
                        "and the running settings stay")


def _metrics_flags(p: argparse.ArgumentParser) -> None:
    """Every role serves its own /metrics (controller, agent, analyzer)."""
    p.add_argument("--metrics-port", type=int,
                   help="Prometheus /metrics port (default 0: off)")
    p.add_argument("--metrics-addr", default="0.0.0.0",
                   help="address /metrics listens on (default all)")


def build_parser() -> argparse.ArgumentParser:
    # The roles' defaults live in their dataclasses; the help reads them there.
    from netskel.config import AgentConfig as Ag
    from netskel.config import AnalyzerConfig as An
    from netskel.config import ControllerConfig as Co

    p = argparse.ArgumentParser(prog="netskel", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO (default: warnings)")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("controller", help="serve agents: registrations, ping lists, reports")
    _config_flag(c, "controller")
    c.add_argument("--topology", help="topology JSON (contract section 1; required here or in "
                   "the config file)")
    c.add_argument("--listen", action="append", default=None,
                   help=f"gRPC address (repeatable; unix:PATH allowed; default {Co.listen[0]})")
    c.add_argument("--db", help="SQLite file keeping registrations and ping lists across "
                   f"restarts; :memory: keeps nothing (default {Co.db})")
    c.add_argument("--heartbeat-ms", type=int,
                   help=f"how often agents say they are alive, ms (default {Co.heartbeat_interval_ms})")
    c.add_argument("--heartbeat-timeout", type=float,
                   help="silence after which an agent counts as gone, s (default "
                        f"{Co.heartbeat_timeout_s:g})")
    c.add_argument("--window", type=int,
                   help=f"statistics window the agents report, s (default {Co.window_seconds})")
    _metrics_flags(c)
    _tls_flags(c)
    c.add_argument("--switch-addresses", help="JSON file: router interface address -> switch "
                   "id, to name the hops of agents' route traces")
    c.set_defaults(fn=cmd_controller)

    g = sub.add_parser("agent", help="the probing sidecar (flags or NETSKEL_* environment)")
    _config_flag(g, "agent")
    g.add_argument("--controller", help="controller's gRPC address (env NETSKEL_CONTROLLER; "
                   f"default {Ag.controller})")
    _tls_flags(g)
    g.add_argument("--container", help="this container's id in the topology "
                   "(env NETSKEL_CONTAINER)")
    g.add_argument("--job", help="the job it runs (env NETSKEL_JOB)")
    g.add_argument("--host", help="the host it runs on (env NETSKEL_HOST)")
    g.add_argument("--endpoint", action="append",
                   help="ID,NIC,IP[,IFNAME] (repeatable; at least one; env NETSKEL_ENDPOINTS, "
                        "entries separated by ';')")
    g.add_argument("--probe-port", type=int,
                   help=f"UDP port the responder answers probes on (default {Ag.probe_port})")
    g.add_argument("--rate", type=float,
                   help=f"probes per second per target (default {Ag.probe_rate_hz:g})")
    g.add_argument("--counter-hz", type=float,
                   help=f"NIC counter samples per second (default {Ag.counter_hz:g})")
    g.add_argument("--busy-poll-us", type=int,
                   help="SO_BUSY_POLL on the probe sockets, microseconds (default 0: off)")
    g.add_argument("--dscp", type=int,
                   help="DSCP of probes and replies (0-63): the class the job's RDMA traffic "
                        "runs in (often 26), so probes share its queues (default 0: best effort)")
    g.add_argument("--hw-timestamps", action="store_true", default=None,
                   help="turn on the NIC's hardware stamping where offered and off (device-wide, "
                        "needs NET_ADMIN); without it the agent only reports what it finds")
    _metrics_flags(g)
    g.add_argument("--vswitch", help="ovs-ofctl target of the host's virtual switch (dumped for "
                   "overlay localization), e.g. unix:/run/openvswitch/br0.mgmt")
    g.add_argument("--vswitch-tunnel-port", type=int, action="append",
                   help="OpenFlow port that is a tunnel (repeatable)")
    g.add_argument("--vswitch-vni", type=int, help=f"VNI of the tunnel ports (default {Ag.vswitch_vni})")
    g.add_argument("--vswitch-interval", type=float,
                   help=f"seconds between dumps (default {Ag.vswitch_interval_s:g})")
    g.add_argument("--vswitch-refresh", type=float,
                   help="seconds after which an unchanged table is sent again (else only "
                        f"changes; default {Ag.vswitch_refresh_s:g})")
    g.add_argument("--vswitch-db", help="the switch's ovsdb (ovs-vsctl --db), e.g. "
                   "unix:/run/openvswitch/db.sock: which ports are tunnels and to where")
    g.add_argument("--vswitch-datapath", help="ovs-appctl target of the switch's daemon (e.g. "
                   "ovs-vswitchd, or its .ctl socket): its datapath flows are read with each "
                   "dump, so a NIC whose offloaded flows disagree with the tables is named")
    g.add_argument("--vswitch-datapath-type",
                   choices=("offloaded", "ovs", "tc", "all"),
                   help="datapath flows to read: offloaded (default: the NIC's copy), ovs (the "
                        "software cache, where nothing offloads), tc, all")
    g.add_argument("--underlay-netns", help="the host's network namespace file (e.g. "
                   "/proc/1/ns/net): route traces listen there for the routers' answers")
    g.add_argument("--rdma", choices=("auto", "off"), default=None,
                   help="auto (default, env NETSKEL_RDMA): probe over RDMA UD queue pairs from "
                        "endpoints whose interface has an RDMA device; off: UDP only")
    g.add_argument("--trace-interval", type=float,
                   help="seconds between route traces of each probe flow (default "
                        f"{Ag.trace_interval_s:g})")
    g.add_argument("--flows", type=int,
                   help="UDP source ports per endpoint: each pair's probes spread over this many "
                        f"flows (ECMP paths), each traced on its own (default {Ag.flows})")
    g.add_argument("--tunnel-port", type=int,
                   help="UDP port of the hosts' overlay tunnel (VXLAN): route traces read the "
                        f"probe flow inside the tunnel packets routers quote (default {Ag.tunnel_port})")
    g.set_defaults(fn=cmd_agent)

    n = sub.add_parser("analyzer", help="follow the report feed and serve NetDiag")
    _config_flag(n, "analyzer")
    n.add_argument("--topology", help="topology JSON (contract section 1; required here or in "
                   "the config file)")
    n.add_argument("--controller",
                   help=f"controller whose report feed is followed (default {An.controller})")
    n.add_argument("--listen", action="append", default=None,
                   help="NetDiag gRPC address (repeatable; unix:PATH allowed; default "
                        f"{An.listen[0]})")
    _metrics_flags(n)
    n.add_argument("--web", metavar="HOST:PORT",
                   help="serve the web page (incidents, fabric, charts) there (default: none)")
    n.add_argument("--db", help="SQLite file: incidents survive a restart (even SIGKILL)")
    _tls_flags(n)
    n.add_argument("--token-file", help="a bearer token NetDiag and the web page accept "
                   "instead of a client certificate")
    n.set_defaults(fn=cmd_analyzer)

    z = sub.add_parser("analyze", help="offline: probe records -> incidents")
    z.add_argument("--topology", required=True, help="topology JSON (contract section 1)")
    z.add_argument("--probes", required=True, help="probe records, Parquet (contract section 3)")
    z.add_argument("--window", type=POSITIVE_S, default=30.0,
                   help="statistics window, s (default %(default)s)")
    z.add_argument("-o", "--output", required=True, help="incidents JSON (contract section 5)")
    z.add_argument("--config", metavar="TOML", help="the live analyzer's settings file: its "
                   "[analyzer] thresholds replay here (addresses and files in it are unused)")
    z.add_argument("--progress", action="store_true",
                   help="progress on stderr even when it is not a terminal")
    z.set_defaults(fn=cmd_analyze)

    i = sub.add_parser("infer", help="offline: NIC throughput -> skeleton and ping lists")
    i.add_argument("--topology", required=True, help="topology JSON (contract section 1)")
    i.add_argument("--throughput", required=True,
                   help="NIC throughput samples, Parquet (contract section 2)")
    i.add_argument("--job", help="only this job (default: every job of the topology)")
    i.add_argument("-o", "--output", required=True, help="skeleton JSON (contract section 4)")
    i.add_argument("--progress", action="store_true",
                   help="progress on stderr even when it is not a terminal")
    i.set_defaults(fn=cmd_infer)

    c = sub.add_parser("import-csv", help="SkeletonHunter-format probe CSV -> contract probe "
                       "records (and a topology stub) for replay")
    c.add_argument("csv", help="the probe CSV to read")
    c.add_argument("--probes", required=True, help="output Parquet (contract section 3)")
    c.add_argument("--topology", help="also write a topology stub built from the rows")
    c.set_defaults(fn=cmd_import_csv)

    v = sub.add_parser("vswitch", help="read an ovs-ofctl dump-flows file: its rules, or a "
                       "packet's path through it; or a datapath flow dump's rules")
    vs = v.add_subparsers(dest="vswitch_cmd", required=True)
    for name, fn, doc in (("parse", cmd_vswitch_parse, "every line as a contract rule, and the "
                           "lines not understood (JSON)"),
                          ("trace", cmd_vswitch_trace, "follow one packet through the pipeline "
                           "to its end (JSON)")):
        w = vs.add_parser(name, help=doc)
        w.add_argument("--dump", required=True, help="ovs-ofctl dump-flows output")
        w.add_argument("--ports", help="ovs-ofctl show output: port numbers and names")
        w.add_argument("--tunnel-port", action="append", metavar="PORT[=REMOTE_IP]",
                       help="an OpenFlow port that is a tunnel (repeatable)")
        w.set_defaults(fn=fn)
        if name == "trace":
            w.add_argument("--dst", required=True, help="the packet's IPv4 destination")
            w.add_argument("--in-port", help="input port number or name (default: left open)")
            w.add_argument("--vni", type=int, help="tunnel id of a packet arriving from a tunnel")
            w.add_argument("--src", help="the packet's IPv4 source")
            w.add_argument("--proto", choices=["udp", "tcp", "icmp"], default="udp",
                           help="the packet's IP protocol (default %(default)s)")
            w.add_argument("--table", help="start in this table (number or name; default 0)")
            w.add_argument("--field", action="append", metavar="NAME=VALUE",
                           help="any other field the packet has, e.g. dl_src=aa:bb:cc:dd:ee:ff")

    w = vs.add_parser("datapath", help="read an ovs-appctl dpctl/dump-flows -m --names file: "
                      "each terminal IPv4 flow as a rule of its input port (JSON)")
    w.add_argument("--dump", required=True, help="dpctl/dump-flows output (type=offloaded: what "
                   "the NICs hold)")
    w.add_argument("--tunnel-port", action="append", metavar="NAME",
                   help="a datapath port that is a tunnel, by name (repeatable)")
    w.add_argument("--vni", type=int, default=0, help="VNI of flows that carry no tunnel key "
                   "(default %(default)s)")
    w.set_defaults(fn=cmd_vswitch_datapath)

    s = sub.add_parser("simulate", help="contract files of simulated training traffic")
    s.add_argument("--job", action="append", required=True,
                   help="NAME,dp=D,tp=T,pp=P[,ep=E][,period_s=...][,a2a_share=...] "
                        "(repeatable: jobs share a cluster)")
    s.add_argument("--seconds", type=POSITIVE_S, default=120.0,
                   help="length of the recording, s (default %(default)s)")
    s.add_argument("--interval", type=POSITIVE_S, default=0.05,
                   help="counter sampling interval, s (default %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    s.add_argument("-o", "--out", required=True, help="output directory")
    s.set_defaults(fn=cmd_simulate)

    t = sub.add_parser("certs", help="a CA and certificates for the controller, analyzer, "
                       "an operator and each agent (for TLS; made here, never committed)")
    t.add_argument("--out", required=True, help="directory for the PEM files")
    t.add_argument("--agent", action="append", help="a container's name (repeatable)")
    t.add_argument("--topology", help="also one certificate per container of this topology")
    t.add_argument("--host", action="append",
                   help="a DNS name or IP the servers are reached at (default localhost)")
    t.add_argument("--days", type=at_least(int, 1), default=30,
                   help="how long the certificates are valid (default %(default)s)")
    t.set_defaults(fn=cmd_certs)

    f = sub.add_parser("config", help="a settings file (--config of the roles): check it, or "
                       "show the settings it amounts to")
    fs = f.add_subparsers(dest="config_cmd", required=True)
    fc = fs.add_parser("check", help="read it as the roles would: one line, ok or the error")
    fc.add_argument("file", help="the TOML file")
    fw = fs.add_parser("show", help="every key of every role with its value (defaults where the "
                       "file is silent), as TOML that reads back the same")
    fw.add_argument("file", nargs="?", help="the TOML file (default: none, the defaults)")
    fw.add_argument("--role", action="append", choices=("controller", "agent", "analyzer"),
                    help="only this role's table (repeatable)")
    f.set_defaults(fn=cmd_config)

    d = sub.add_parser("netdiag", help="ask NetDiag: diagnose endpoints or pairs, list incidents")
    d.add_argument("--server", default="127.0.0.1:7001",
                   help="the analyzer's NetDiag address (default %(default)s)")
    d.add_argument("--tls-ca", help="verify the analyzer against this CA (TLS)")
    d.add_argument("--tls-cert", help="present this client certificate")
    d.add_argument("--tls-key", help="its private key")
    d.add_argument("--token-file", help="send this bearer token")
    d.add_argument("--endpoint", action="append", default=[],
                   help="diagnose every monitored pair with this endpoint at one end "
                        "(repeatable)")
    d.add_argument("--pair", action="append", default=[],
                   help="A,B: diagnose this pair (repeatable)")
    d.add_argument("--incidents", action="store_true", help="list incidents instead")
    d.add_argument("--blamed", action="store_true",
                   help="the components blamed (links, switches, rules, NICs), one row each")
    d.add_argument("--open", action="store_true", help="open incidents only")
    d.add_argument("--component-type", choices=["link", "switch", "nic", "vswitch_rule", "host",
                                                 "endpoint", "agent"],
                   help="with --incidents or --blamed: only components of this type")
    d.add_argument("--check", action="store_true",
                   help="active check: probe the pairs now at every size, trace their routes")
    d.add_argument("--check-seconds", type=POSITIVE_S, default=3.0,
                   help="probing time of --check, s (default %(default)s)")
    d.add_argument("--history", metavar="A,B", help="one pair's recent windows instead")
    d.add_argument("--json", action="store_true", help="print JSON instead of a table")
    d.set_defaults(fn=cmd_netdiag)

    m = sub.add_parser("demo", help="a whole cluster on this machine: build, fault, diagnose")
    m.add_argument("--hosts", type=at_least(int, 4), default=4,
                   help="hosts (network namespaces) to build, 4 or more: the faults sit "
                        "between the first three (default %(default)s)")
    m.add_argument("--rails", type=at_least(int, 1), default=2, help="NICs per host (default %(default)s)")
    m.add_argument("--window", type=at_least(int, 1), default=10,
                   help="statistics window, s (default %(default)s)")
    m.add_argument("--fault", default="link-down",
                   choices=["link-down", "loss", "mtu", "queue", "rule-delete", "stale-flow"],
                   help="the fault to make once every pair is healthy (default %(default)s)")
    m.add_argument("--keep", action="store_true", help="leave the cluster up until Ctrl-C")
    m.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(a.fn(a))
    except NetskelError as e:
        print(f"netskel: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
