"""NetDiag's answers: a verdict per pair and one overall, from the
analyzer's state or overruled by an active check. Plain data, no state:
the engine builds them, the servicer turns them into protobuf."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field

from analyzer.localize import Pair
from netskel.model import Incident

OK, FAULT, INCONCLUSIVE = "NETWORK_OK", "NETWORK_FAULT", "INCONCLUSIVE"
NO_WINDOW = "no probe window in range"  # the reason of an INCONCLUSIVE verdict with no data


@dataclass(frozen=True)
class PairVerdict:
    pair: Pair
    verdict: str
    reason: str
    route_from: str = ""  # the endpoint whose agent traced `route`
    route: str = ""       # latest traced underlay route from there, switch ids joined by ">"


@dataclass(frozen=True)
class Diagnosis:
    verdict: str
    pairs: list[PairVerdict]
    incidents: list[Incident]
    check_findings: list[Incident] = field(default_factory=list)


@dataclass(frozen=True)
class CheckOutcome:
    """An active check judged: why each checked pair is anomalous (absent:
    healthy), and the components those anomalies point to now."""

    checked: set[Pair]
    reasons: dict[Pair, str]
    findings: list[Incident]


def overall(verdicts: list[PairVerdict]) -> str:
    """Any fault is a fault; otherwise any doubt is inconclusive."""
    kinds = {v.verdict for v in verdicts}
    return FAULT if FAULT in kinds else INCONCLUSIVE if INCONCLUSIVE in kinds else OK


def with_check(d: Diagnosis, outcome: CheckOutcome, unchecked: dict[Pair, str],
               asked: Collection[Pair]) -> Diagnosis:
    """A diagnosis from state, overruled by an active check where the
    check measured: its result is seconds old, the state's minutes.
    `asked`: the pairs the check was run for; a pair first monitored
    while it ran (its first window arrived meanwhile) is in the
    diagnosis but was never checked, and says so."""
    verdicts = []
    for v in d.pairs:
        if v.pair in outcome.reasons:
            v = dataclasses.replace(v, verdict=FAULT,
                                    reason=f"active check: {outcome.reasons[v.pair]}")
        elif v.pair in outcome.checked:
            v = dataclasses.replace(v, verdict=OK, reason="active check: every size healthy")
        elif v.pair in unchecked:
            v = dataclasses.replace(v, reason=f"{v.reason}; not checked: {unchecked[v.pair]}")
        elif v.pair not in asked and v.pair[0] != v.pair[1]:
            v = dataclasses.replace(v, reason=f"{v.reason}; not checked: first monitored "
                                              "while the check ran")
        verdicts.append(v)
    return Diagnosis(verdict=overall(verdicts), pairs=verdicts, incidents=d.incidents,
                     check_findings=outcome.findings)
