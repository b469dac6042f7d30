"""Typed configuration. Defaults are documented here; a file may override
them (TOML, one table per component) and unknown keys are rejected so a typo
never silently keeps a default."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from netskel.errors import InputError

T = TypeVar("T")


def _positive(cfg: Any, where: str, names: tuple[str, ...]) -> None:
    """One clear error for a rate or period that cannot work (not a crash later)."""
    for n in names:
        v = getattr(cfg, n)
        if not v > 0:
            raise InputError(f"{where}.{n}: must be positive, got {v}")


def _at_least(cfg: Any, where: str, lows: dict[str, float]) -> None:
    for n, low in lows.items():
        v = getattr(cfg, n)
        if not v >= low:
            raise InputError(f"{where}.{n}: must be at least {low:g}, got {v}")


def _share(cfg: Any, where: str, names: tuple[str, ...]) -> None:
    """A probability or fraction: above 0 (a zero would make every test
    impossible to pass or fail) and at most 1."""
    for n in names:
        v = getattr(cfg, n)
        if not 0 < v <= 1:
            raise InputError(f"{where}.{n}: must be in (0, 1], got {v}")


def _port(cfg: Any, where: str, names: tuple[str, ...]) -> None:
    for n in names:
        v = getattr(cfg, n)
        if not 0 <= v < 65536:
            raise InputError(f"{where}.{n}: {v} is no port (0-65535; 0: any free or off)")


@dataclass(frozen=True)
class ControllerConfig:
    topology: str = ""                 # contract section 1 file
    listen: tuple[str, ...] = ("127.0.0.1:7000",)  # gRPC addresses (unix:PATH allowed)
    db: str = "netskel-controller.sqlite"  # SQLite file; ":memory:" keeps nothing
    heartbeat_interval_ms: int = 1000  # how often agents say they are alive
    heartbeat_timeout_s: float = 10.0  # silence after which an agent counts as gone
    window_seconds: int = 30           # statistics window the agents report
    reinfer_seconds: float = 60.0      # skeleton re-inference period; 0 = never
    metrics_port: int = 0              # Prometheus /metrics; 0 = off
    # JSON {"router interface address": "switch id"} from the network's
    # inventory, handed to agents so their route traces name switches; "" = none
    switch_addresses: str = ""

    def __post_init__(self) -> None:
        _positive(self, "controller", ("heartbeat_interval_ms", "heartbeat_timeout_s",
                                       "window_seconds"))
        _at_least(self, "controller", {"reinfer_seconds": 0})
        _port(self, "controller", ("metrics_port",))


@dataclass(frozen=True)
class AgentConfig:
    controller: str = "127.0.0.1:7000"  # gRPC target of the controller
    container: str = ""
    job: str = ""
    host: str = ""
    # "ID,NIC,IP,IFNAME" per endpoint of this container
    endpoints: tuple[str, ...] = ()
    probe_port: int = 7100             # UDP port the responder answers on
    probe_rate_hz: float = 10.0        # probes per second per target
    probe_timeout_s: float = 1.0       # a probe unanswered this long is lost
    # SO_BUSY_POLL (us) on the probe sockets; 0 = off. RTTs are kernel stamp
    # to kernel stamp, so a faster wake-up is not in them: on veth it moved
    # the median by -1.7 and +0.3 us in two runs (bench/fidelity.py --busy-poll).
    busy_poll_us: int = 0
    # DSCP of every probe and reply (0-63; IP TOS and the RoCE traffic class
    # carry it shifted left by 2). Set it to the class the job's RDMA traffic
    # runs in (often 26, lossless with PFC), so probes wait in the queues the
    # training traffic waits in and see the faults it sees; 0 = best effort.
    dscp: int = 0
    # Turn on the NIC's hardware stamping (every packet, both ways) where it
    # is offered and off: one setting of the whole device, needs NET_ADMIN,
    # so off by default; the agent always logs what each interface offers.
    hw_timestamps: bool = False
    sizes: tuple[int, ...] = (64, 256, 1024, 2048, 4096)  # payload bytes, capped by the MTU
    counter_hz: float = 10.0           # NIC byte-counter sampling rate
    window_seconds: int = 30           # overridden by the controller at registration
    vswitch: str = ""                  # ovs-ofctl target of the host's switch; "" = no dumps
    vswitch_tunnel_ports: tuple[int, ...] = ()  # OpenFlow ports that are tunnels
    vswitch_vni: int = 0               # VNI of those tunnels when rules do not set one
    vswitch_interval_s: float = 10.0   # seconds between table dumps
    # An unchanged table (and datapath) is sent again only after this long:
    # a host's table is one rule per destination, a megabyte at 32 K
    # endpoints, from every agent with --vswitch; the resend is for an
    # analyzer that restarted meanwhile.
    vswitch_refresh_s: float = 60.0
    vswitch_db: str = ""               # ovsdb of that switch (ovs-vsctl --db): tunnel ports' far
                                       # ends and types; "" = the flows and --vswitch-tunnel-port
    # ovs-appctl target of that switch's daemon (ovs-vswitchd, or the path
    # of its .ctl socket): its datapath flows are read with each dump, so a
    # NIC whose offloaded flows disagree with the tables is named; "" = not read.
    vswitch_datapath: str = ""
    # Which datapath flows: "offloaded" (in hardware: the NIC's copy), "ovs"
    # (the software cache, where nothing offloads), "tc", "all".
    vswitch_datapath_type: str = "offloaded"
    # Network namespace file of the host (e.g. /proc/1/ns/net with hostPID,
    # /var/run/netns/NAME): where the NICs' underlay addresses live. Route
    # traces hear the routers' answers there; "" = no traces (the analyzer
    # then spreads its link vote over the ECMP alternatives).
    underlay_netns: str = ""
    trace_interval_s: float = 60.0     # seconds between route traces of each probe flow
    # UDP source ports each endpoint probes from: a pair's probes spread over
    # this many 5-tuples, hence over the ECMP paths, each flow traced on its
    # own (probe_agent/flowtrace.py).
    flows: int = 4
    # UDP destination port of the host's overlay tunnel (VXLAN 4789): how a
    # router's time-exceeded quoting the tunnel's packet is read back to the
    # probe flow inside it.
    tunnel_port: int = 4789
    rdma: str = "auto"                 # "auto": RDMA UD probes from endpoints whose interface
    #                                    has an RDMA device (pyverbs), UDP elsewhere; "off"
    metrics_port: int = 0

    def __post_init__(self) -> None:
        _positive(self, "agent", ("probe_rate_hz", "probe_timeout_s", "counter_hz",
                                  "window_seconds", "vswitch_interval_s", "vswitch_refresh_s",
                                  "trace_interval_s"))
        if not self.sizes or min(self.sizes) <= 0:
            raise InputError("agent.sizes: one or more positive probe sizes")
        if self.busy_poll_us < 0:
            raise InputError(f"agent.busy_poll_us: {self.busy_poll_us} is negative")
        if not 0 <= self.dscp <= 63:
            raise InputError(f"agent.dscp: {self.dscp} is not 0..63")
        _port(self, "agent", ("probe_port", "metrics_port"))
        if not 1 <= self.flows <= 64:
            raise InputError(f"agent.flows: {self.flows} is not 1..64")
        if not 0 < self.tunnel_port < 65536:
            raise InputError(f"agent.tunnel_port: {self.tunnel_port} is no UDP port")
        if self.vswitch_datapath_type not in ("offloaded", "ovs", "tc", "all"):
            raise InputError(f"agent.vswitch_datapath_type: '{self.vswitch_datapath_type}' is "
                             "not offloaded, ovs, tc or all")
        if self.rdma not in ("auto", "off"):
            raise InputError(f"agent.rdma: '{self.rdma}' is not 'auto' or 'off'")


@dataclass(frozen=True)
class AnalyzerConfig:
    topology: str = ""
    controller: str = "127.0.0.1:7000"  # where the report feed comes from
    listen: tuple[str, ...] = ("127.0.0.1:7001",)  # NetDiag gRPC addresses
    web_listen: str = ""               # HOST:PORT of the web page (port 0: any free); "" = off
    loss_baseline: float = 0.0001      # least loss a healthy path shows (its history may raise it)
    loss_alpha: float = 0.01           # false loss alarms per window, across all tests (Bonferroni)
    loss_min_lost: int = 3             # fewer lost probes are never a loss anomaly
    loss_near_alpha: float = 0.01      # loss this suspicious (uncorrected p) stays out of the
    #                                    baseline, and a link's is re-tested with the next window
    persist_windows: int = 1           # lossy windows in a row before an incident opens
    close_windows: int = 4             # clean windows in a row before an incident closes
    #                                    (it ends where the clean run began)
    close_loss_alpha: float = 0.05     # a window whose losses on a loss incident's pairs are
    #                                    this unlikely at the healthy rate is not clean
    latency_persist_windows: int = 3   # slow windows in a row (one slow for 3/4 of it counts
    #                                    as two): a congestion burst under 20 s is not a fault
    latency_min_seconds: float = 20.0  # ... and slow for at least this long, whatever the
    #                                    window length (short windows need more of them); a
    #                                    ToR's run filling no window: twice this of slow tail
    lof_neighbors: int = 5             # k of the Local Outlier Factor
    lof_history_windows: int = 10      # earlier windows a new one is judged against (5 min of 30 s)
    lof_min_history: int = 4           # fewer earlier windows: no latency verdict yet
    lof_threshold: float = 2.0         # LOF above this (and outside the history) is an outlier
    tail_floor: float = 0.02           # least share of a healthy path's probes >= 20 us above
    #                                    its window's p25 (spikes; its history may raise it)
    tail_margin: float = 0.0           # ... and how far above it a window's share must be
    #                                    (a slow flow's probes come in runs, not one by one)
    latency_min_shift_us: float = 20.0  # the median must rise by at least this much ...
    latency_rel_shift: float = 0.2     # ... and by this fraction of its usual value
    slow_reference_blocks: int = 6     # blocks of lof_history_windows healthy windows whose
    #                                    median is the slow reference (6 x 5 min = 30 min at 30 s
    #                                    windows): a window slower than it by the latency shift
    #                                    is slow, however its recent windows crept; 0 = off
    drift_period_s: float = 1800.0     # long-term test period (30 min)
    drift_fdr: float = 0.01            # Benjamini-Hochberg false discovery rate across pairs
    drift_min_shift: float = 0.05      # a drift must move the median by this fraction
    drift_min_windows: int = 10        # windows a period needs to be tested or be a reference
    history_seconds: float = 900.0     # windows kept per pair for Diagnose
    metrics_port: int = 0
    db: str = ""                       # SQLite file keeping incidents across restarts; "" = none
    incidents_kept: int = 10_000       # closed incidents kept (the oldest go first) ...
    incidents_max_age_s: float = 7 * 86400.0  # ... and none closed longer ago than this

    def __post_init__(self) -> None:
        _share(self, "analyzer", ("loss_baseline", "loss_alpha", "loss_near_alpha",
                                  "close_loss_alpha", "drift_fdr"))
        _positive(self, "analyzer", ("persist_windows", "close_windows",
                                     "latency_persist_windows", "lof_neighbors",
                                     "lof_history_windows", "lof_min_history", "lof_threshold",
                                     "drift_period_s", "drift_min_windows", "history_seconds",
                                     "incidents_max_age_s"))
        _at_least(self, "analyzer", {"loss_min_lost": 0, "latency_min_seconds": 0,
                                     "tail_floor": 0, "tail_margin": 0,
                                     "latency_min_shift_us": 0, "latency_rel_shift": 0,
                                     "slow_reference_blocks": 0, "drift_min_shift": 0,
                                     "incidents_kept": 0})
        if self.tail_floor >= 1:
            raise InputError(f"analyzer.tail_floor: must be below 1, got {self.tail_floor}")
        if self.lof_neighbors > self.lof_history_windows:
            raise InputError(f"analyzer.lof_neighbors: {self.lof_neighbors} is more than the "
                             f"{self.lof_history_windows} lof_history_windows it is drawn from")
        _port(self, "analyzer", ("metrics_port",))


@dataclass(frozen=True)
class Config:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)


def _type_ok(default: Any, v: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(v, bool)
    if isinstance(default, float):
        return isinstance(v, int | float) and not isinstance(v, bool)
    if isinstance(default, int):
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, type(default))


def _build(cls: type[T], raw: Any, where: str) -> T:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    defaults = cls()
    for k, v in raw.items():
        default = getattr(defaults, k)
        if dataclasses.is_dataclass(default):
            kwargs[k] = _build(type(default), v, f"{where}.{k}")
            continue
        if isinstance(default, tuple):
            if not isinstance(v, list):
                raise InputError(f"{where}.{k}: expected a list")
            v = tuple(v)
        elif not _type_ok(default, v):
            raise InputError(f"{where}.{k}: expected {type(default).__name__}, "
                             f"got {type(v).__name__}")
        kwargs[k] = v
    return dataclasses.replace(defaults, **kwargs)  # type: ignore[type-var]


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{p}: malformed TOML: {e}") from None
    try:
        return _build(Config, raw, str(p))
    except InputError as e:  # a value out of range says its key, not yet its file
        said = str(e)
        raise InputError(said if said.startswith(str(p)) else f"{p}: {said}") from None


def role_config(config: Config, role: str, flags: Mapping[str, Any]) -> Any:
    """One role's config: its table of the file (defaults where the file is
    silent), then the command line's flags (None: not given), which win:
    a flag is the most specific thing a person wrote."""
    base = getattr(config, role)
    return dataclasses.replace(base, **{k: v for k, v in flags.items() if v is not None})


# What a running role takes from a reloaded file (SIGHUP): the analyzer's
# thresholds, read at every window, and the agent's probe rate (the sidecar
# shares its container's CPU: its load may need turning down without a
# restart) and its switch-read and trace intervals. The rest size state or
# open sockets (addresses, files, sizes and flows, the LOF ring, the
# long-term period): a restart applies them. The controller hands all of
# its settings to its state at start.
_AGENT_LIVE = {"probe_rate_hz", "vswitch_interval_s", "vswitch_refresh_s", "trace_interval_s"}
RESTART_ONLY = {
    "controller": frozenset(f.name for f in dataclasses.fields(ControllerConfig)),
    "agent": frozenset(f.name for f in dataclasses.fields(AgentConfig)) - _AGENT_LIVE,
    "analyzer": frozenset({"topology", "controller", "listen", "web_listen", "metrics_port", "db",
                           "lof_history_windows", "slow_reference_blocks", "drift_period_s"}),
}


def take_live(running: T, new: T, role: str) -> tuple[T, list[str]]:
    """`running` with `new`'s values where the role takes them live, and
    the names of the fields that changed but wait for a restart. InputError
    when the mixture is invalid (a live value that needs a restart-only one
    beside it)."""
    changed = [f.name for f in dataclasses.fields(running)  # type: ignore[arg-type]
               if getattr(running, f.name) != getattr(new, f.name)]
    later = RESTART_ONLY[role]
    now = dataclasses.replace(running, **{n: getattr(new, n)  # type: ignore[type-var]
                                          for n in changed if n not in later})
    return now, [n for n in changed if n in later]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else "inf" if v > 0 else "-inf")
    if isinstance(v, str):
        # TOML's basic string: quote, backslash and control characters
        # escaped, the rest as itself (JSON's \\uD83D-style surrogate
        # escapes are no TOML).
        return '"' + "".join(
            f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F
            else "\\" + c if c in '"\\' else c for c in v) + '"'
    if isinstance(v, tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def to_toml(config: Config, roles: tuple[str, ...] = ("controller", "agent", "analyzer")) -> str:
    """The settings as a file `load_config` reads back to the same values:
    what a role runs with, every key spelled out (`netskel config show`)."""
    out: list[str] = []
    for role in roles:
        section = getattr(config, role)
        out.append(f"[{role}]")
        out += [f"{f.name} = {_toml_value(getattr(section, f.name))}"
                for f in dataclasses.fields(section)]
        out.append("")
    return "\n".join(out)
