"""Which component explains a window's anomalous pairs (first cut).

Agent first: a pair whose prober or responder agent is gone is an agent
problem, not a network one. The rest vote over underlay links: each
anomalous pair accuses the links it may cross (an ECMP stage's alternatives
share the vote), healthy single-path pairs clear theirs, and a greedy cover
names links until every pair is explained."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from netskel.model import Component

Pair = tuple[str, str]
# pair -> {link id: weight}; weight 1 for a link every path crosses.
Candidates = Callable[[Pair], Mapping[str, float]]


@dataclass
class Finding:
    component: Component
    layer: str
    symptom: str
    pairs: list[Pair]
    confidence: float
    evidence: dict[str, Any] = field(default_factory=dict)


def localize(anomalous: Mapping[Pair, str], healthy: set[Pair], dead_endpoints: set[str],
             candidates: Candidates) -> list[Finding]:
    findings: list[Finding] = []
    by_agent: dict[str, list[Pair]] = defaultdict(list)
    network: dict[Pair, str] = {}
    for pair, symptom in anomalous.items():
        dead = [e for e in pair if e in dead_endpoints]
        if dead:
            by_agent[dead[0]].append(pair)
        else:
            network[pair] = symptom
    for ep, pairs in sorted(by_agent.items()):
        findings.append(Finding(component=Component("agent", ep), layer="agent",
                                symptom=worst_symptom(anomalous[p] for p in pairs), pairs=sorted(pairs),
                                confidence=0.9,
                                evidence={"reason": "the agent stopped heartbeating; its pairs "
                                                    "fail because nobody probes or answers"}))

    # A healthy pair speaks for the links all its paths cross; a link stays a
    # suspect only while more anomalous pairs accuse it than healthy ones clear it
    # (a fault seen on 5 of its 7 pairs in a window is still that link's).
    clears: dict[str, int] = defaultdict(int)
    for pair in healthy:
        for link, w in candidates(pair).items():
            if w >= 1.0:
                clears[link] += 1
    cand = {p: dict(candidates(p)) for p in network}
    unexplained = {p for p in network if cand[p]}
    for p in sorted(set(network) - unexplained):
        findings.append(Finding(component=Component("endpoint", p[1]), layer="unknown",
                                symptom=network[p], pairs=[p], confidence=0.2,
                                evidence={"reason": "no underlay path known for this pair"}))
    while unexplained:
        accused: dict[str, float] = defaultdict(float)
        for p in unexplained:
            for link, w in cand[p].items():
                accused[link] += w
        score = {k: v for k, v in accused.items() if v > clears.get(k, 0)}
        if not score:
            pairs = sorted(unexplained)
            findings.append(Finding(component=Component("endpoint", pairs[0][1]), layer="unknown",
                                    symptom=worst_symptom(network[p] for p in pairs), pairs=pairs,
                                    confidence=0.2,
                                    evidence={"reason": "every candidate link is cleared by "
                                                        "healthy pairs"}))
            break
        ranked = sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))
        best, best_score = ranked[0]
        explained = sorted(p for p in unexplained if best in cand[p])
        confidence = best_score / (len(explained) + clears.get(best, 0))
        findings.append(Finding(
            component=Component("link", best), layer="underlay",
            symptom=worst_symptom(network[p] for p in explained), pairs=explained,
            confidence=round(min(1.0, confidence), 3),
            evidence={"votes": {k: round(v, 3) for k, v in ranked[:5]},
                      "healthy_pairs_on_link": clears.get(best, 0),
                      "anomalous_pairs": len(explained)}))
        unexplained -= set(explained)
    return findings


def worst_symptom(symptoms: Iterable[str]) -> str:
    s = set(symptoms)
    for name in ("unreachable", "loss", "latency", "degradation"):
        if name in s:
            return name
    return "loss"
