"""How one window's findings become incidents, rule by rule: which finding
may carry another's run of windows on, stand for it, or rename it; and the
confidence an incident reports. Pure functions of findings and their pair
sets, kept apart from the engine's state so each rule reads on its own."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from analyzer.localize import Finding, Pair

# How certain a component type is, when two findings name the same pairs: an
# agent that stopped, a rule the tables show broken or a NIC whose offloaded
# table disagrees are facts; a link is a vote; an endpoint is a guess. A host
# is named only where links of several of its NICs failed together: more
# specific than any one of those links.
_RANK = {"agent": 6, "vswitch_rule": 5, "nic": 4, "host": 3, "switch": 2, "link": 2,
         "endpoint": 0}
# Facts about where one flow's packets go (a broken rule, a NIC's stale copy
# of one): they lose or misdeliver that flow's packets and slow nothing.
FLOW_FACTS = {"vswitch_rule", "nic"}


@dataclass
class Streak:
    """A finding's run of windows in a row: how many (a window slow for most
    of its length counts two), since when, whether only slow tails made it,
    and the pairs of its last window."""

    count: int
    first: float
    tails: bool = True
    pairs: frozenset[Pair] = frozenset()
    guess: bool = False  # named by a guess (guessed): any name may follow
    # The pairs of the run's last located (not guessed) finding: what a guess
    # carrying the run on may pass it to (Analyzer._may_follow). Empty: none yet.
    anchor: frozenset[Pair] = frozenset()
    # That finding's component (two, where one window named two): a guess
    # passes the run only to a name touching it, as the run itself would.
    named: frozenset[tuple[str, str]] = frozenset()
    # A window of it was slow for most of its length (on pairs no open
    # incident holds): a slowdown of 22 s at least, longer than any
    # congestion.
    filled: bool = False


def guessed(f: Finding) -> bool:
    """Named by nothing surer than a guess: an endpoint nothing explained,
    or a link only a pooled loss named (either end's of a lone pair)."""
    return f.component.type == "endpoint" or bool(f.evidence.get("pooled_loss"))


def stands_for(kind: str, shared: int, f: Finding) -> bool:
    """Whether an incident or streak about a component of type `kind`,
    sharing `shared` of finding `f`'s pairs, may stand for it. A flow's fact
    (a broken rule, a NIC's stale flow) explains its own pairs only: a
    vaguer finding mostly about others (their host slow) is another fault."""
    return (kind not in FLOW_FACTS or 2 * shared >= len(f.pairs)
            or outranks(f.component.type, kind))


def outranks(kind: str, other: str) -> bool:
    """Whether a component of type `kind` is the more specific name for a
    fault than one of type `other` (_RANK; unknown types rank lowest)."""
    return _RANK.get(kind, 0) > _RANK.get(other, 0)


def reported(f: Finding) -> float:
    """The confidence an incident reports: a switch's own where its links'
    twins meet at it (a spine down on every rail was reported at 0.32, its
    links' share with their twins, below a slow link beside it), the
    finding's otherwise (which also paces the engine: WEAK_CONFIDENCE)."""
    return max(f.confidence, float(f.evidence.get("switch_confidence", 0.0)))


def continued(streaks: dict[tuple[str, str], Streak], pairs: Sequence[Pair],
              related: Callable[[tuple[str, str]], bool] = lambda _k: True) -> Streak | None:
    """The earliest streak of the last window, of a related component,
    sharing at least half of the smaller of the two pair sets with these
    pairs."""
    mine = set(pairs)
    best = None
    for k, st in streaks.items():
        if related(k) and half_shared(mine, st.pairs) and (
                best is None or st.first < best.first
                or (st.first == best.first and st.count > best.count)):
            best = st
    return best


def half_shared(mine: set[Pair], theirs: Collection[Pair]) -> int:
    """How many pairs the two sets share, when that is at least half of the
    smaller one (the same fault seen twice), else 0."""
    n = sum(1 for p in theirs if p in mine)
    return n if n and 2 * n >= min(len(mine), len(theirs)) else 0
