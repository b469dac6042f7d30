"""Domain objects that cross process boundaries. `netskel.serde` converts them
to and from protobuf; nothing else touches generated code."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SYMPTOMS = ("loss", "latency", "degradation", "unreachable")
LAYERS = ("underlay", "overlay", "nic", "host", "agent", "unknown")
COMPONENT_TYPES = ("link", "switch", "nic", "vswitch_rule", "host", "endpoint", "agent")


@dataclass(frozen=True)
class RouteStats:
    """A window's probes that took one traced forward route (several flows
    of a pair spread over ECMP paths): where its losses and delays went."""

    route: str
    sent: int
    lost: int
    rtt_median: float = math.nan


# A window's RTT statistics in the order the detector's columns keep them.
RTT_STATS = ("rtt_p25", "rtt_median", "rtt_p75", "rtt_min", "rtt_mean", "rtt_std", "rtt_max")
TAIL_SHIFT_US = 20.0  # a probe this much above its window's own p25 is in the slow tail
CLOCKS = ("user", "kernel", "hardware")  # RTT clocks, least exact first


@dataclass(frozen=True)
class WindowStats:
    """One probe target, one size class, one window. RTTs in microseconds."""

    src: str
    dst: str
    window_start: float
    window_end: float
    size: int
    sent: int
    lost: int
    rtt_min: float = math.nan
    rtt_p25: float = math.nan
    rtt_median: float = math.nan
    rtt_p75: float = math.nan
    rtt_mean: float = math.nan
    rtt_std: float = math.nan
    rtt_max: float = math.nan
    proto: str = "udp"
    route: str = ""  # traced forward route (switch ids joined by ">"), "" when unknown
    routes: tuple[RouteStats, ...] = ()  # the probes by traced forward route, when known
    slow: int = 0  # received probes >= TAIL_SHIFT_US above the window's own p25
    # The clock of its RTTs, the least exact of its probes': "hardware",
    # "kernel" or "user" (CLOCKS); "" when unknown (records read from files).
    clock: str = ""

    def problem(self) -> str | None:
        """Why this window cannot be trusted, or None. Bad windows are dropped
        with this reason instead of poisoning a pair's history."""
        if not self.src or not self.dst:
            return "empty src or dst"
        if self.src == self.dst:
            return "src equals dst"
        if not (math.isfinite(self.window_start) and math.isfinite(self.window_end)):
            return "non-finite window bounds"
        if self.window_end <= self.window_start:
            return "window ends before it starts"
        if self.sent < 0 or self.lost < 0 or self.lost > self.sent:
            return f"impossible counts sent={self.sent} lost={self.lost}"
        if not 0 <= self.slow <= self.sent - self.lost:
            return f"impossible slow count {self.slow} of {self.sent - self.lost} received"
        if self.sent == 0:
            return "no probe sent"
        if self.lost < self.sent:
            # Written out: this runs for every window of every pair. A NaN or an
            # infinity fails `0 <= v < 1e8` just as a negative value does.
            lo, q1, med, q3, hi = (self.rtt_min, self.rtt_p25, self.rtt_median, self.rtt_p75,
                                   self.rtt_max)
            if not (0 <= lo < 1e8 and 0 <= q1 < 1e8 and 0 <= med < 1e8 and 0 <= q3 < 1e8
                    and 0 <= hi < 1e8 and 0 <= self.rtt_mean < 1e8 and 0 <= self.rtt_std < 1e8):
                return "RTT statistics missing, negative or absurd"
            if q1 < lo - 1e-6 or med < q1 - 1e-6 or q3 < med - 1e-6 or hi < q3 - 1e-6:
                return "RTT quantiles out of order"
        return None


@dataclass(frozen=True)
class CounterSample:
    endpoint: str
    ts: float
    tx_bytes: int
    rx_bytes: int

    def problem(self) -> str | None:
        if not self.endpoint:
            return "empty endpoint"
        if not math.isfinite(self.ts) or self.ts <= 0:
            return "bad timestamp"
        if self.tx_bytes < 0 or self.rx_bytes < 0:
            return "negative counter"
        return None


@dataclass(frozen=True)
class FlowRule:
    """A virtual-switch forwarding rule in the topology contract's terms. For
    a tunnel, `to` is the outer destination IP when the switch sets one; for a
    delivery, empty (the local endpoint owning `dst`)."""

    vni: int
    dst: str          # an address or a CIDR prefix (contract 1.1)
    action: str       # deliver | tunnel | drop | forward | unknown
    to: str = ""
    priority: int = 0  # the highest wins, then the longest prefix


@dataclass(frozen=True)
class DatapathRule:
    """One datapath flow (what a NIC offloading the switch holds) said as a
    rule: `port` is its input port; a delivery's `to` names the output port,
    a tunnel's the outer destination IP when the flow sets one."""

    port: str
    from_tunnel: bool  # arrived by tunnel (decapsulated), else from a local port
    rule: FlowRule


@dataclass(frozen=True)
class VSwitchDump:
    host: str
    ts: float
    rules: tuple[FlowRule, ...]
    # None: the agent did not read its datapath; else every flow that said
    # one destination's fate (possibly none: nothing cached or offloaded).
    datapath: tuple[DatapathRule, ...] | None = None


@dataclass(frozen=True)
class AgentState:
    container: str
    endpoints: tuple[str, ...]
    registered: bool
    ready: bool
    last_heartbeat: float


@dataclass(frozen=True)
class Component:
    type: str
    id: str


@dataclass
class Incident:
    id: str
    start: float
    end: float | None
    symptom: str
    layer: str
    component: Component
    pairs: list[tuple[str, str]]
    confidence: float
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        """Contract section 5 form."""
        return {
            "id": self.id,
            "start": self.start,
            "end": self.end,
            "symptom": self.symptom,
            "layer": self.layer,
            "component": {"type": self.component.type, "id": self.component.id},
            "pairs": [list(p) for p in self.pairs],
            "confidence": self.confidence,
            "evidence": self.evidence,
        }


def as_likely(evidence: Mapping[str, Any]) -> list[str]:
    """Components of the named one's type that the probes cannot tell from
    it (the two spine links of every path between a rail's only two ToRs):
    a person replacing the named link should check these too."""
    twins = evidence.get("indistinguishable_from")
    return [str(t) for t in twins] if isinstance(twins, list) else []


def pair_key(a: str, b: str) -> tuple[str, str]:
    """Pairs are unordered: one canonical order for dict keys."""
    return (a, b) if a <= b else (b, a)
