"""Which components explain a window's anomalous pairs: pure logic.

In order, each step taking the pairs the previous ones left unexplained:

1. Agent. A pair whose prober or responder agent is gone (no heartbeat live;
   no probes of its own offline) is an agent problem, not a network one.
2. Overlay and NIC. Follow the virtual switches' rules both ways; a pair whose
   forwarding breaks (blackhole, loop) is explained by that rule, and one
   whose path crosses a NIC whose offloaded rule disagrees with its switch's
   by that NIC. These findings are certain: the tables say so.
3. Underlay. Anomalous pairs accuse the links they may cross (traced routes
   when known, ECMP alternatives sharing the vote when not); healthy pairs
   clear links all their paths cross. A link stays a suspect only while it is
   accused more than cleared. A greedy cover names links until the pairs are
   explained — the smallest set it can find, whatever the other layers found.
   Links of one switch named together become that switch, and a link named
   only for pairs that all certainly cross that switch is the same fault
   (the greedy cover's pick among equally accused links, not a second one).
   Links of several NICs of one host named together become that host: its
   NICs sit on different rails under different ToRs, so nothing in the
   fabric joins them but the host itself.
4. What is left is reported as unknown, never forced onto a link.

The cover counts slow and lossy pairs alike; `rehome_stray_loss` (the
engine applies it with its own may-cross) then gives a finding's lost
probes to the larger loss finding whose component they all may cross.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from analyzer.overlay import Trace
from netskel.model import Component

Pair = tuple[str, str]
# pair -> {link id: weight}; weight 1 for a link every path crosses.
Candidates = Callable[[Pair], Mapping[str, float]]
# A weight that is a sum of route shares may miss 1 by rounding: still certain.
CERTAIN = 1.0 - 1e-9
POOLED_CONFIDENCE = 0.4  # a link named by its pairs' pooled loss alone: a weak finding
OverlayTrace = Callable[[Pair], Trace]
SwitchesOf = Callable[[str], tuple[str, ...]]  # link id -> the switches at its ends
HostOf = Callable[[str], str | None]  # link id -> the host of the NIC at one end, if any


@dataclass
class Finding:
    component: Component
    layer: str
    symptom: str
    pairs: list[Pair]
    confidence: float
    evidence: dict[str, Any] = field(default_factory=dict)


def _no_overlay(_pair: Pair) -> Trace:
    return Trace("unknown")


def localize(anomalous: Mapping[Pair, str], healthy: set[Pair], dead_endpoints: set[str],
             candidates: Candidates, overlay: OverlayTrace = _no_overlay,
             switches_of: SwitchesOf | None = None,
             clears: Mapping[str, int] | None = None,
             switch_clears: Callable[[str], int] | None = None,
             host_of: HostOf | None = None,
             container_of: Callable[[str], str | None] | None = None,
             pooled: Mapping[Pair, str] | None = None,
             partly_slow: Container[Pair] = ()) -> list[Finding]:
    """`clears`: healthy pairs per link all their paths cross, when the caller
    has it counted already (else counted here from `healthy`);
    `switch_clears`: the same per switch (healthy pairs certainly crossing
    it), asked only when named links could be one switch's fault;
    `pooled`: pairs whose loss the pooled test of a link all their paths
    cross explained, and that link; `partly_slow`: pairs slow on only a
    share of their probes (their only anomaly a slow tail, or slow on the
    routes through a slow link and not on the others)."""
    findings: list[Finding] = []
    by_agent: dict[str, list[Pair]] = defaultdict(list)
    network: dict[Pair, str] = {}
    for pair, symptom in anomalous.items():
        dead = [e for e in pair if e in dead_endpoints]
        if dead:
            by_agent[dead[0]].append(pair)
        else:
            network[pair] = symptom
    # One agent serves a container's endpoints: several of them stopping
    # together is that agent, one incident, not one per endpoint.
    units: dict[str, list[str]] = defaultdict(list)
    for ep in by_agent:
        units[(container_of(ep) if container_of else None) or ep].append(ep)
    for unit, eps in sorted(units.items()):
        ep = unit if len(eps) > 1 else eps[0]
        pairs = sorted({p for e in eps for p in by_agent[e]})
        findings.append(Finding(component=Component("agent", ep), layer="agent",
                                symptom=worst_symptom(anomalous[p] for p in pairs), pairs=pairs,
                                confidence=0.9,
                                evidence={"reason": "the agent stopped (no heartbeat, or no probes "
                                                    "of its own): its pairs fail because nobody "
                                                    "probes or answers, not the network",
                                          "endpoints": sorted(eps)}))
    traces = {p: overlay(p) for p in network}
    # A dropping rule or a loop loses every probe of the pairs it serves
    # (rules match the destination, not the flow): a pair only slow, or
    # losing some probes, is not the broken rule's this window, whatever
    # its trace says (the dump is of now, not of that window). A ToR's
    # congestion slowed a pair whose rule broke a minute later, and dated
    # its blackhole that early (bench/inject.py blackhole over 30
    # congestions an hour, draw 3112); a spine down, 8 minutes after a
    # blackhole was mended, cost the rule's pair its flows through the
    # spine, and the rule came back as two more incidents (draw 4010 of
    # session 62). Where the rule breaks or is mended mid-window, the
    # window's loss is the underlay's; the windows either side of it
    # name the rule, and its start is read from the windows' sums
    # (analyzer/onset.py).
    broken = {p: s for p, s in network.items()
              if traces[p].kind in ("blackhole", "loop") and s == "unreachable"}
    findings += _overlay_findings(broken, traces)
    rest = {p: s for p, s in network.items() if p not in broken}
    # A NIC whose offloaded rule for the pair's flow differs from its switch's
    # is a fact about that NIC; its ToR link would only be the nearest vote.
    # A rule sends every packet of its flows one way, so the slow path slows
    # all of a pair's probes: a pair with only a slow tail is not the NIC's
    # (the dump is of now; congestions slowed a share of the probes of pairs
    # whose NIC went wrong 25 minutes later, and three such windows opened
    # an incident: bench/inject.py nicoffload over 30 congestions an hour,
    # draw 3131), nor one slow on its routes through a slow link and not on
    # its others (a slow spine's pair on the NIC's stale rule: spinelat,
    # then nicoffload 53 minutes later, draw 4606 of session 66). Nor is a
    # pair that lost some of its probes: the rule sends them all one way,
    # slow or nowhere (a spine down cost a NIC's pairs their flows through
    # it 12 minutes before the NIC went wrong, and the NIC's incident began
    # there: spinedown then nicoffload, draw 4103 of session 63).
    nic_pairs: dict[str, list[Pair]] = defaultdict(list)
    for p in sorted(rest):
        t = traces[p]
        if t.kind == "nic" and t.nic and p not in partly_slow and rest[p] != "loss":
            nic_pairs[t.nic].append(p)
    for nic, pairs in sorted(nic_pairs.items()):
        t = traces[pairs[0]]
        findings.append(Finding(component=Component("nic", nic), layer="nic",
                                symptom=worst_symptom(rest[p] for p in pairs), pairs=pairs,
                                confidence=0.8,
                                evidence={"reason": "the NIC's offloaded rule for this flow differs "
                                                    "from its virtual switch's",
                                          "rule": t.rule, **t.detail}))
    explained = {p for ps in nic_pairs.values() for p in ps}
    rest = {p: s for p, s in rest.items() if p not in explained}
    # Lost probes and slow ones are covered apart: a link's loss under a
    # congested ToR was voted onto the links of the congestion's slow pairs
    # that shared an end with its own, two of them met at the ToR as one
    # lossy switch, and loss opens at once (bench/inject.py linkloss twice
    # over 30 congestions an hour, draw 4003 of session 62). Which links
    # lost probes the lossy pairs say; what a congestion's losses are, the
    # switches decide below (`_absorb_into_switches`).
    if clears is None:
        clears = _link_clears(healthy, candidates)
    links, unexplained = _underlay_findings(
        {p: s for p, s in rest.items() if s in LOSSY}, candidates, clears)
    slow_links, slow_unexplained = _underlay_findings(
        {p: s for p, s in rest.items() if s not in LOSSY}, candidates, clears)
    links += slow_links
    unexplained |= slow_unexplained
    slow_loss, links = _pooled_findings(unexplained, links, rest, pooled or {}, candidates,
                                        switches_of)
    unexplained -= {p for f in slow_loss for p in f.pairs}
    if switches_of:
        sw_of = switches_of

        def crossed(pair: Pair) -> set[str]:
            return {sw for link, w in candidates(pair).items() if w >= CERTAIN
                    for sw in sw_of(link)}

        if switch_clears is None:
            tally: dict[str, int] = defaultdict(int)
            for pair in healthy:
                for sw in crossed(pair):
                    tally[sw] += 1
            switch_clears = lambda sw: tally.get(sw, 0)  # noqa: E731
        # Not merged into a switch (one NIC link each, a spine link's loss
        # hits many of them), but a failed switch's finding takes their pairs.
        links = _absorb_into_switches(
            _merge_switches(links, switches_of, crossed, rest, switch_clears, host_of)
            + slow_loss,
            candidates, switches_of)
    else:
        links += slow_loss
    # After the switches: a dead ToR's links include one NIC of each host
    # under it, which must not join another NIC's trouble to make a host.
    findings += _merge_hosts(links, host_of) if host_of else links
    if unexplained:
        pairs = sorted(unexplained)
        findings.append(Finding(component=Component("endpoint", pairs[0][1]), layer="unknown",
                                symptom=worst_symptom(rest[p] for p in pairs), pairs=pairs,
                                confidence=0.2,
                                evidence={"reason": "no overlay break, no link accused more than "
                                                    "healthy pairs clear it, no NIC disagreement"}))
    return findings


def _pooled_findings(unexplained: set[Pair], links: list[Finding], rest: Mapping[Pair, str],
                     pooled: Mapping[Pair, str], candidates: Candidates,
                     switches_of: SwitchesOf | None) -> tuple[list[Finding], list[Finding]]:
    """(findings from pooled loss, `links` less the pairs those took).

    A slow loss on a link few pairs cross: each window one or two of its
    pairs lose a probe and the others clear it, yet their losses added up
    over the windows were the significant test (`pooled`: the link all of a
    lossy pair's paths cross whose pooled loss explained it). That names
    the link, weakly, for pairs nothing else explained, or that a link
    finding holds more weakly still (one lossy pair between two ToRs votes
    for every spine link it may cross, and no healthy pair clears those);
    a guessed endpoint would be another pair's each window, and never the
    same finding twice. Not where two such links meet at a switch: the
    pooled groups are the links every path crosses (a NIC's), so a lossy
    ToR or spine link makes several of its NICs' groups significant, and
    none of them is the fault."""
    weak = {p: f.component.id for f in links if unshared(f, switches_of) < POOLED_CONFIDENCE
            for p in f.pairs}
    by_link: dict[str, list[Pair]] = defaultdict(list)
    for p in sorted(unexplained | set(weak)):
        link = pooled.get(p)
        if link and link != weak.get(p) and rest.get(p) == "loss" \
                and candidates(p).get(link, 0.0) >= CERTAIN:
            by_link[link].append(p)
    if switches_of is not None:
        meets: dict[str, int] = defaultdict(int)
        for link in by_link:
            for sw in switches_of(link):
                meets[sw] += 1
        by_link = {k: v for k, v in by_link.items()
                   if all(meets[sw] == 1 for sw in switches_of(k))}
    taken = {p for ps in by_link.values() for p in ps}
    kept = [f if taken.isdisjoint(f.pairs) else replace(f, pairs=[p for p in f.pairs
                                                                   if p not in taken])
            for f in links]
    return [Finding(component=Component("link", link), layer="underlay", symptom="loss",
                    pairs=pairs, confidence=POOLED_CONFIDENCE,
                    evidence={"reason": "the pairs crossing this link lost more probes "
                                        "together, over the last windows, than their healthy "
                                        "rates explain", "pooled_loss": True,
                              "votes": {link: float(len(pairs))}})
            for link, pairs in sorted(by_link.items())], [f for f in kept if f.pairs]


def _overlay_findings(network: Mapping[Pair, str], traces: Mapping[Pair, Trace]) -> list[Finding]:
    """One finding per broken rule, and per loop: pairs entering one cycle
    through different rules are one loop, named by the entry most of them
    took (the smaller id on a tie)."""
    by_rule: dict[tuple[str, str], list[Pair]] = defaultdict(list)
    for p in network:
        t = traces[p]
        if t.kind == "blackhole" and t.rule:
            by_rule[(t.kind, t.rule)].append(p)
        elif t.kind == "loop" and t.rule:
            by_rule[(t.kind, min(t.detail["cycle"]))].append(p)  # a loop's key: its cycle
    out = []
    for (kind, key), pairs in sorted(by_rule.items()):
        entries = Counter(str(traces[p].rule) for p in pairs)
        rule = min(entries, key=lambda r: (-entries[r], r)) if kind == "loop" else key
        t = traces[min(p for p in pairs if traces[p].rule == rule)]
        out.append(Finding(component=Component("vswitch_rule", rule), layer="overlay",
                           symptom=worst_symptom(network[p] for p in pairs), pairs=sorted(pairs),
                           confidence=0.95,
                           evidence={"reason": f"overlay {kind}", "broken_at": rule,
                                     "hops": list(t.hops), **t.detail}))
    return out


def _link_clears(healthy: set[Pair], candidates: Candidates) -> dict[str, int]:
    """Per link, the healthy pairs all of whose paths cross it."""
    tally: dict[str, int] = defaultdict(int)
    for pair in healthy:
        for link, w in candidates(pair).items():
            if w >= CERTAIN:
                tally[link] += 1
    return tally


def _underlay_findings(rest: Mapping[Pair, str], candidates: Candidates,
                       clears: Mapping[str, int]) -> tuple[list[Finding], set[Pair]]:
    # A healthy pair speaks for the links all its paths cross; a link stays a
    # suspect only while more anomalous pairs accuse it than healthy ones clear it
    # (a fault seen on 5 of its 7 pairs in a window is still that link's).
    cand = {p: dict(candidates(p)) for p in rest}
    unexplained = {p for p in rest if cand[p]}
    findings: list[Finding] = []
    while unexplained:
        accused: dict[str, float] = defaultdict(float)
        for p in unexplained:
            for link, w in cand[p].items():
                accused[link] += w
        # Rounded: the votes are sums of route shares taken in set order, and
        # a last-bit difference must not break a tie one way or the other.
        score = {k: round(v, 9) for k, v in accused.items() if round(v, 9) > clears.get(k, 0)}
        if not score:
            break
        # Net of clearances first: of two links the same pairs accuse, the one
        # healthy pairs also cross is the less likely.
        ranked = sorted(score.items(), key=lambda kv: (-(kv[1] - clears.get(kv[0], 0)), -kv[1], kv[0]))
        best, best_score = ranked[0]
        explained = sorted(p for p in unexplained if best in cand[p])
        confidence = best_score / (len(explained) + clears.get(best, 0))
        # Links every accusing pair crosses together with the best one, equally
        # voted and cleared (the two spine links of a path between the only
        # two ToRs of a rail): probes cannot tell them apart, so say so.
        twins = [k for k, v in ranked[1:] if abs(v - best_score) < 1e-9
                 and clears.get(k, 0) == clears.get(best, 0)
                 and all(k in cand[p] for p in explained)]
        # How far ahead of the next link its own pairs put it: one pair's
        # stray loss accuses both its ends alike (margin 0).
        own: dict[str, float] = defaultdict(float)
        for p in explained:
            for link, w in cand[p].items():
                own[link] += w
        margin = own[best] - max((v for k, v in own.items() if k != best), default=0.0)
        evidence: dict[str, Any] = {"votes": {k: round(v, 3) for k, v in ranked[:5]},
                                    "healthy_pairs_on_link": clears.get(best, 0),
                                    "anomalous_pairs": len(explained),
                                    "margin_on_its_pairs": round(margin, 3)}
        if twins:
            evidence["indistinguishable_from"] = twins
            confidence /= 1 + len(twins)
        findings.append(Finding(
            component=Component("link", best), layer="underlay",
            symptom=worst_symptom(rest[p] for p in explained), pairs=explained,
            confidence=round(min(1.0, confidence), 3), evidence=evidence))
        unexplained -= set(explained)
    return findings, unexplained | {p for p in rest if not cand[p]}


def _merge_hosts(links: list[Finding], host_of: HostOf) -> list[Finding]:
    """Links of two or more of one host's NICs named in one window: the host.

    Each NIC of a host hangs off its own rail's ToR, so no switch or link of
    the fabric is shared by their paths; what they share is the host (its
    PCIe complex, memory, CPU, its virtual switch). Two independent link
    faults on one host at once are far rarer than one fault of the host, and
    reporting a link per rail would make one fault as many incidents. Which
    links count towards a host `_host_links` says: a stray loss's must not."""
    used: set[int] = set()
    out: list[Finding] = []
    for (host, _), idx in sorted(_by_host(links, host_of).items()):
        standing = _host_links(links, idx)
        if not standing:
            continue
        used.update(idx)
        out.append(Finding(
            component=Component("host", host), layer="host",
            symptom=worst_symptom(links[i].symptom for i in idx),
            pairs=sorted({p for i in idx for p in links[i].pairs}),
            confidence=round(min(links[i].confidence for i in standing), 3),
            evidence={"reason": "links of several of the host's NICs, each under its own "
                                "rail's ToR, failed together: nothing but the host joins them",
                      "links": sorted(links[i].component.id for i in idx),
                      "votes": {links[i].component.id: links[i].evidence.get("votes", {})
                                for i in idx}}))
    return out + [f for i, f in enumerate(links) if i not in used]


def unshared(f: Finding, switches_of: SwitchesOf | None, at: str | None = None) -> float:
    """A link's confidence before it was shared with the twins its pairs
    cannot tell it from, where link and twins meet at one switch: the two
    links of one path through it, which the pairs cross together. How
    surely their trouble lies on that path the twins do not weaken, only
    which link of it. Twins through other switches (ECMP alternatives no
    route pinned) are doubt about the path itself, and keep their share.
    (A switch named from its links keeps their shared confidence: a lossy
    window of a congested switch is weak evidence, and must hold a window.)
    `at`: only where the twins meet at that switch."""
    ev = f.evidence
    twins = ev.get("indistinguishable_from") or []
    if not twins or switches_of is None:
        return f.confidence
    common = set(switches_of(f.component.id))
    for t in twins:
        common &= set(switches_of(t))
    if not common or (at is not None and at not in common):
        return f.confidence
    pairs = int(ev["anomalous_pairs"]) + int(ev["healthy_pairs_on_link"])
    return min(1.0, float(ev["votes"][f.component.id]) / pairs)


def at_least_two(p: Sequence[float]) -> float:
    """The chance that two or more of independent findings are right, each
    right with its own probability."""
    none = math.prod(1.0 - x for x in p)
    one = sum(x * math.prod(1.0 - y for j, y in enumerate(p) if j != i)
              for i, x in enumerate(p))
    return max(0.0, 1.0 - none - one)


def _slow(f: Finding) -> bool:
    """Slow, not lossy: a link that loses probes and others that are merely
    slow in the same window (a benign congestion of their switch) are not
    one fault of the component they share."""
    return f.symptom in SLOW


def _stands_out(f: Finding) -> bool:
    """Accused by at least two pairs, and by them more than any other link."""
    return len(f.pairs) >= 2 and float(f.evidence.get("margin_on_its_pairs", 0.0)) > 1e-9


def _host_links(links: list[Finding], idx: list[int]) -> list[int]:
    """Which of one host's NIC links (`idx`) make it the host: two or more
    that stand out, accused by several pairs and by them more than by any
    other link they may cross (one pair's stray loss accuses both its ends
    alike; joined to a real fault of one NIC link, it would turn that link
    into its host). Else three or more that no healthy pair crosses: a
    slow spine's cover took all but one pair of each of a slow host's
    eight NICs, and each NIC's link, named on one pair, opened an
    incident of its own (bench/inject.py hostslow inside spinelat, draw
    4907 of session 67). A stray loss names no link its NIC's healthy
    pairs clear, and no pair joins two NICs of one host (they sit on
    different rails)."""
    standing = [i for i in idx if _stands_out(links[i])]
    if len(standing) >= 2:
        return standing
    bare = [i for i in idx if links[i].evidence.get("healthy_pairs_on_link") == 0]
    return bare if len(bare) >= 3 else []


def _host_peers(links: list[Finding], host_of: HostOf) -> dict[int, int]:
    """Per NIC link: how many other links of its host, slow or lossy as it
    is, make it the host (what `_merge_hosts` joins)."""
    out: dict[int, int] = {}
    for idx in _by_host(links, host_of).values():
        joins = _host_links(links, idx)
        out.update({i: sum(1 for j in joins if j != i) for i in idx})
    return out


def _by_host(links: list[Finding], host_of: HostOf) -> dict[tuple[str, bool], list[int]]:
    """NIC links by host, slow apart from lossy."""
    at: dict[tuple[str, bool], list[int]] = defaultdict(list)
    for i, f in enumerate(links):
        host = host_of(f.component.id) if f.component.type == "link" else None
        if host is not None:
            at[(host, _slow(f))].append(i)
    return at


def _merge_switches(links: list[Finding], switches_of: SwitchesOf,
                    crossed: Callable[[Pair], set[str]], failing: Mapping[Pair, str],
                    switch_clears: Callable[[str], int],
                    host_of: HostOf | None = None) -> list[Finding]:
    """Two or more named links meeting at one switch: the switch failed
    (slow links with a NIC's among them: only where the healthy pairs
    through it do not outnumber the failing ones).

    Which switch: a switch losing a few % of everything through it makes a
    different random handful of pairs fail each window, and the greedy
    cover names whichever links those share — often the links of hosts
    under the ToR across from the faulty one (a pair between two ToRs
    crosses both). So when every pair of the merged finding certainly
    crosses another switch too, the one accused by the most failing pairs
    net of the healthy pairs that cross it is named (the healthy side's
    own pairs clear it). Every pair failing the group's way (lossy or
    slow) counts there; a pair failing the other way belongs to another
    fault. `failing`: each failing pair's symptom."""
    at: dict[tuple[str, bool], list[int]] = defaultdict(list)
    for i, f in enumerate(links):
        for sw in switches_of(f.component.id):
            at[(sw, _slow(f))].append(i)
    accused: dict[str, int] | None = None  # failing pairs per switch they certainly cross
    used: set[int] = set()
    out: list[Finding] = []
    # A NIC link is its host's where two other links of the host stand out
    # (`_merge_hosts` names the host without it): a slow host beside one
    # slow spine link must not make their ToR. A switch's own fault names
    # one NIC link per host (each NIC sits under its own rail's ToR), and
    # one more troubled NIC of that host leaves the link to the switch.
    hosts = _host_peers(links, host_of) if host_of else {}
    for (sw, slow), idx in sorted(at.items(), key=lambda kv: -len(kv[1])):
        idx = [i for i in idx if i not in used and hosts.get(i, 0) < 2]
        if len(idx) < 2:
            continue
        pairs = sorted({p for i in idx for p in links[i].pairs})
        # A slow host's pair under its own ToR, named on its NIC's link
        # beside the pairs a dead ToR across cut off, crosses only its own
        # ToR: counted, it kept the dead ToR out of `common` (draw 843).
        own = [p for p in pairs if (failing[p] in SLOW) == slow] or pairs
        common = set.intersection(*(crossed(p) for p in own)) | {sw}
        if accused is None:
            accused = defaultdict(int)
            for p in failing:
                for s in crossed(p):
                    accused[s] += 1
        net = {s: accused.get(s, 0) - switch_clears(s) for s in sorted(common)}
        best = min(common, key=lambda s: (-net[s], s != sw, s))
        # A slow switch slows every probe through it: where more healthy
        # pairs certainly cross it than failing ones, its slow links are
        # faults of their own (a slow spine link and a slow NIC link under
        # one ToR, 35-47 failing pairs and up to 34 more healthy ones
        # through it, were one slow ToR for 17 minutes and the NIC's fault
        # was never reported:
        # bench/inject.py uplinklat then nicslow, draw 4812 of session 67).
        # A lossy switch loses a few probes of a few pairs each window.
        # Only where a NIC's link is among them: links between switches
        # meeting at one are joined by nothing else (a spine's congestion
        # split into its links ran on into a ToR's death the next window
        # and dated it 27 s early: draws 4815, 5002 of session 67).
        if slow and net[best] < 0 and any(len(switches_of(links[i].component.id)) < 2
                                          for i in idx):
            continue
        used.update(idx)
        evidence: dict[str, Any] = {"reason": "its links failed together",
                                    "links": sorted(links[i].component.id for i in idx),
                                    "votes": {links[i].component.id: links[i].evidence["votes"]
                                              for i in idx},
                                    "failing_minus_healthy_pairs": net}
        if best != sw:
            evidence["named_at"] = sw
            sw = best
        shared = round(min(links[i].confidence for i in idx), 3)
        # How surely the switch failed: its links' twins that meet at it
        # (the two links of one path through it) say which link, not
        # whether the switch; the shared figure only paces the engine.
        # Each link was named by pairs of its own (the cover gives a pair
        # to one link), and two of them right already make it the switch:
        # a slow spine named on all 16 of its links, the least at 0.78, is
        # surer than any one of them (draw 4801 of session 67).
        sure = [unshared(links[i], switches_of, sw) for i in idx]
        whole = round(max(min(sure), at_least_two(sure)), 3)
        if whole > shared:
            evidence["switch_confidence"] = whole
        out.append(Finding(component=Component("switch", sw), layer="underlay",
                           symptom=worst_symptom(links[i].symptom for i in idx), pairs=pairs,
                           confidence=shared, evidence=evidence))
    out += [f for i, f in enumerate(links) if i not in used]
    return out


def _absorb_into_switches(found: list[Finding], candidates: Candidates,
                          switches_of: SwitchesOf) -> list[Finding]:
    """A failed switch explains every pair that certainly crosses one of its
    links (weight 1: every path, or its traced route). A link finding whose
    pairs all do is that switch's fault seen from one end (a ToR down: an
    endpoint under the other ToR, all of whose partners sit under the dead
    one, accuses its own link exactly as much as theirs), so its pairs join
    the switch's finding instead of opening an incident of their own."""
    switches = [f for f in found if f.component.type == "switch"]
    if not switches:
        return found
    out: list[Finding] = []
    for f in found:
        home = None
        if f.component.type == "link":
            crossed = [{sw for link, w in candidates(p).items() if w >= CERTAIN
                        for sw in switches_of(link)} for p in f.pairs]
            home = next((s for s in switches if all(s.component.id in c for c in crossed)), None)
        if home is None:
            out.append(f)
            continue
        home.pairs = sorted(set(home.pairs) | set(f.pairs))
        if _slow(home) == _slow(f):
            home.symptom = worst_symptom([home.symptom, f.symptom])
        # else a congested switch drops a few probes too: its losses are the
        # congestion's, which must last like any slowdown before it counts.
        home.evidence.setdefault("also_explains", []).append(
            {"link": f.component.id, "votes": f.evidence.get("votes", {})})
    return out


def rehome_stray_loss(findings: list[Finding], anomalous: Mapping[Pair, str],
                      may_cross: Callable[[Pair, tuple[str, str]], bool]) -> list[Finding]:
    """A located finding's lost probes handed to a larger loss finding of the
    same window whose component every one of those pairs may cross; what
    it keeps is judged by its own symptoms. A short congestion's finding
    can hold a few lost pairs of a fault elsewhere (the greedy cover
    counted slow and lossy pairs alike until session 62, and a congested
    switch still takes the lossy links under it: `_absorb_into_switches`),
    which the lost probes then name as loss, certain at once: a host
    losing probes on all its NICs beside a 9 s congestion under one of
    their ToRs opened a second incident on a NIC link of that rail, and an
    agent dying 2 s before a window's end beside an 8 s congestion of its
    ToR a loss incident on the ToR (bench/inject.py hostloss and agentdown
    over 30 congestions an hour, draws 1813, 1814). A lost probe is
    evidence about what it crossed: the larger loss finding explains it.
    A finding that itself moves is no home (its pairs need not cross the
    next one's component)."""
    lost = {id(f): [p for p in f.pairs if anomalous.get(p) in LOSSY] for f in findings}
    homes = sorted((f for f in findings if f.component.type in ("link", "switch", "host")
                    and f.symptom in LOSSY), key=lambda g: -len(lost[id(g)]))
    may_move = {id(g) for g in homes}

    def home_of(f: Finding) -> Finding | None:
        mine = lost[id(f)]
        if not mine or id(f) not in may_move:
            return None
        return next((g for g in homes if len(lost[id(g)]) > len(mine)
                     and all(may_cross(p, (g.component.type, g.component.id)) for p in mine)),
                    None)

    home = {id(f): home_of(f) for f in findings}
    moved: dict[int, list[Pair]] = defaultdict(list)
    out: list[Finding] = []
    for f in findings:
        h = home[id(f)]
        if h is None or home[id(h)] is not None:
            out.append(f)
            continue
        moved[id(h)] += lost[id(f)]
        rest = [p for p in f.pairs if anomalous.get(p) not in LOSSY]
        if rest:
            out.append(replace(f, pairs=rest, symptom=worst_symptom(anomalous[p] for p in rest)))
    return [replace(f, pairs=sorted(set(f.pairs) | set(moved[id(f)]))) if id(f) in moved else f
            for f in out]


# The symptoms of lost probes, and of slow ones.
LOSSY = ("loss", "unreachable")
SLOW = ("latency", "degradation")


def worst_symptom(symptoms: Iterable[str]) -> str:
    s = set(symptoms)
    for name in ("unreachable", "loss", "latency", "degradation"):
        if name in s:
            return name
    return "loss"
