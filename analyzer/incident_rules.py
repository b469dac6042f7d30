"""How one window's findings become incidents, rule by rule: how a
finding's run of windows grows, restarts or counts a window twice; which
finding may carry another's run on, stand for it, or rename it; and the
confidence an incident reports. Pure functions of findings and their pair
sets, kept apart from the engine's state so each rule reads on its own and
is tested without one (tests/test_incident_rules.py)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Sequence
from dataclasses import dataclass

from analyzer.localize import LOSSY, Finding, Pair

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
Key = tuple[str, str]  # a component: (type, id)


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
    # carrying the run on may pass it to (may_follow). Empty: none yet.
    anchor: frozenset[Pair] = frozenset()
    # That finding's component (two, where one window named two): a guess
    # passes the run only to a name touching it, as the run itself would.
    named: frozenset[tuple[str, str]] = frozenset()
    # A window of it was slow for most of its length (on pairs no open
    # incident holds): a slowdown of 22 s at least, longer than any
    # congestion.
    filled: bool = False
    # Seconds of slow tail summed over its windows (each window's share of
    # the finding's probes in the slow tail, times its length). On a
    # component every flow of its pairs crosses, how long the run was slow.
    slow_s: float = 0.0
    lost: bool = False  # a window of it lost probes (not only slow ones)


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


def alike(symptom: str, other: str) -> bool:
    """Whether two symptoms fail the same way: both lose probes, or
    neither does (a slowdown is not a loss, nor the reverse)."""
    return (symptom in LOSSY) == (other in LOSSY)


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


def may_follow(f: Finding, st: Streak, k: Key, related: Callable[[Key, Key], bool]) -> bool:
    """Whether finding `f` may continue last window's streak `st` of
    component `k`: a related component (`related`: the same or touching,
    Analyzer._related), or after a guess (an endpoint, or a link named by a
    pooled loss alone, which may be either end's) any component related to
    the run's last located one; not a flow's fact the finding is mostly not
    about (stands_for)."""
    key = (f.component.type, f.component.id)
    shared = sum(1 for p in f.pairs if p in st.pairs)
    located = st.pairs if not st.guess else st.anchor
    about = shared if not st.guess else sum(1 for p in f.pairs if p in located)
    if located and not guessed(f) and 2 * about < len(located):
        # A located finding's run (or a guess's that carried one on: its
        # leftover pairs) passes on only to a finding about at least half
        # of its pairs: a ToR's congestion, then a spine's 40 s later
        # sharing one leftover pair, are two episodes; so are a ToR's
        # congestion over its 75 pairs and a spike on three of them the
        # window after (it named one of its NIC links).
        return False
    if guessed(f) and f.symptom in LOSSY and not st.lost:
        # A guess at lost probes after a run of windows only slow: a
        # ToR's congestion slowed a pair a window before its rule broke
        # and cut it off, and the rule's incident began with the
        # congestion (bench/inject.py blackhole over 30 congestions an
        # hour, draw 3112 of session 61, again once a rule's pairs that
        # lost only some probes went to the vote in session 62). A guess
        # names nothing to tie the two by; a located loss may still be
        # the slow run's own fault losing probes too (a NIC's slow path).
        return False
    if st.guess and st.named and not any(related(key, n) for n in st.named):
        # A guess left over by one ToR's congestion, then the other
        # ToR's of the rail: most pairs of either cross both, but they
        # are two switches' episodes, as without the guess between.
        return False
    return (related(key, k) or st.guess) and stands_for(k[0], shared, f)


def next_streak(st: Streak, f: Finding, start: float, *, tail_only: Container[Pair],
                strong: Container[Pair], held: Container[Pair], on_every_path: bool,
                slow_s: float = 0.0) -> Streak:
    """The run `st` one window longer by finding `f` (a window starting at
    `start`). `tail_only`: pairs whose only anomaly this window is a slow
    tail; `strong`: pairs slow for most of it; `held`: pairs of incidents
    open at its start; `on_every_path`: every flow of the finding's pairs
    crosses its component (Analyzer._on_every_path); `slow_s`: the seconds
    of this window the finding's probes were in the slow tail."""
    latency = f.symptom == "latency"
    tail = sum(1 for p in f.pairs if p in tail_only) if latency else 0
    if 2 * tail > len(f.pairs) and st.count and not st.filled and on_every_path and (
            not st.tails or 2 * len(f.pairs) < len(st.pairs)):
        # A gap: only a slow tail on most pairs the component is on
        # every path of, after a slower window or on fewer than half of
        # the last window's pairs, in a run no window of which was slow
        # for most of its length. A slowdown lasting from before this
        # window into the next would have filled it (a creeping one
        # fills it more, not less); a congestion under 20 s fills none.
        # The run starts here: two congestions of one ToR 38 s apart
        # made three slow windows in a row and an incident.
        st = Streak(0, start)
    thin = latency and tail == len(f.pairs)
    # A window slow for most of its length counts twice, except after
    # windows that had only a slow tail: a tail then a slow window can
    # be two short congestions of one switch, each of them benign. The
    # pairs of an open incident are slow for its fault: a slow host's
    # pairs under a ToR counted the ToR's 14 s congestion twice. Slow for
    # most of it on most of the other pairs: a fault slows its pairs
    # alike, and two of a ToR's 64 pairs slow throughout were the pairs
    # across to the other ToR of the rail, congested just after it (draw
    # 4017 of session 62).
    free = [p for p in f.pairs if p not in held]
    full = latency and 2 * sum(p in strong for p in free) > len(free)
    double = full and (st.count == 0 or not st.tails)
    pairs = frozenset(f.pairs)
    guess = guessed(f)
    anchor, named = ((st.anchor, st.named) if guess
                     else (pairs, frozenset({(f.component.type, f.component.id)})))
    return Streak(st.count + (2 if double else 1), st.first, st.tails and thin, pairs,
                  guess, anchor, named, st.filled or full, st.slow_s + slow_s,
                  st.lost or f.symptom in LOSSY)


def joined(a: Streak, b: Streak) -> Streak:
    """One component's two streaks of one window (two sets of its links
    named) as one window of evidence, not two: counted twice, an 18 s
    congestion over two windows opened an incident."""
    return Streak(max(a.count, b.count), min(a.first, b.first), a.tails and b.tails,
                  a.pairs | b.pairs, a.guess and b.guess, a.anchor | b.anchor,
                  a.named | b.named, a.filled or b.filled, max(a.slow_s, b.slow_s),
                  a.lost or b.lost)
