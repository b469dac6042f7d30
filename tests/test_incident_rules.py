"""The run rules on their own, without an engine: how one window's finding
continues, restarts or doubles a run of windows (next_streak), which run it
may continue (may_follow), and one component named twice in a window
(joined). The engine tests drive the same rules through whole windows."""

from __future__ import annotations

from analyzer.incident_rules import Key, Streak, joined, may_follow, next_streak
from analyzer.localize import Finding
from netskel.model import Component

PAIRS = [(f"a{i}", f"b{i}") for i in range(8)]


def finding(kind: str, ident: str, pairs: list[tuple[str, str]], symptom: str = "latency"
            ) -> Finding:
    return Finding(Component(kind, ident), "underlay", symptom, pairs, 0.9)


def step(st: Streak, f: Finding, start: float, *, tail=(), strong=(), held=(),
         every_path: bool = True, slow_s: float = 0.0) -> Streak:
    return next_streak(st, f, start, tail_only=set(tail), strong=set(strong), held=set(held),
                       on_every_path=every_path, slow_s=slow_s)


def tor_run(windows: list[str], every_path: bool = True) -> Streak:
    """A ToR's run over windows 30 s apart, each 'slow' (slow for part of
    it), 'tail' (only a slow tail on every pair) or 'full' (slow for most
    of it)."""
    f = finding("switch", "tor-0", PAIRS)
    st = Streak(0, 0.0)
    for i, kind in enumerate(windows):
        st = step(st, f, 30.0 * i, tail=PAIRS if kind == "tail" else (),
                  strong=PAIRS if kind == "full" else (), every_path=every_path)
    return st


def test_a_window_of_tails_after_a_slower_one_restarts_a_tors_run_but_not_a_spines():
    # Two short congestions 38 s apart: a slow window, a tail, a tail.
    tor = tor_run(["slow", "tail", "tail"])
    assert (tor.count, tor.first) == (2, 30.0)
    spine = tor_run(["slow", "tail", "tail"], every_path=False)
    assert (spine.count, spine.first) == (3, 0.0)


def test_a_run_with_a_window_slow_throughout_is_not_cut_by_the_tail_that_ends_it():
    st = tor_run(["full", "tail"])
    assert (st.count, st.first, st.filled) == (3, 0.0, True)


def test_a_slowdown_creeping_up_through_its_tails_keeps_its_run():
    # Only tails, window after window, on as many pairs: no slower window
    # before, so no gap; the run grows.
    st = tor_run(["tail", "tail", "tail"])
    assert (st.count, st.first, st.tails) == (3, 0.0, True)


def test_a_window_slow_throughout_counts_twice_except_after_tails_or_on_held_pairs():
    assert tor_run(["full"]).count == 2
    assert tor_run(["tail", "full"]).count == 2  # a tail, then one: two congestions
    f = finding("switch", "tor-0", PAIRS)
    held = step(Streak(0, 0.0), f, 0.0, strong=PAIRS, held=PAIRS)
    assert (held.count, held.filled) == (1, False)
    loss = step(Streak(0, 0.0), finding("switch", "tor-0", PAIRS, "loss"), 0.0, strong=PAIRS)
    assert loss.count == 1


def test_a_window_counts_as_slow_throughout_only_for_most_of_its_free_pairs():
    """Two ToRs of one rail congested back to back, 14 s each: the pairs
    across them were slow for 28 s of the window, each ToR's own pairs for
    14 s. Two of one ToR's 64 pairs slow throughout counted its window
    twice, as filled, and a second slow window opened an incident
    (bench/inject.py torloss + tordown over 30 congestions an hour, draw
    4017 of session 62). A fault of a component on every path slows all
    its pairs alike; a few of them slow throughout were slow for more
    than its reason."""
    f = finding("switch", "tor-0", PAIRS)
    few = step(Streak(0, 0.0), f, 0.0, strong=PAIRS[:2])
    assert (few.count, few.filled) == (1, False)
    most = step(Streak(0, 0.0), f, 0.0, strong=PAIRS[:5])
    assert (most.count, most.filled) == (2, True)
    # An open incident's pairs are slow for its own fault: not counted either way.
    free = step(Streak(0, 0.0), f, 0.0, strong=PAIRS[:3], held=PAIRS[3:])
    assert (free.count, free.filled) == (2, True)


def test_a_guess_carries_the_anchor_and_name_of_the_run_it_continues():
    st = step(Streak(0, 0.0), finding("switch", "tor-0", PAIRS), 0.0)
    guess = step(st, finding("endpoint", "a1", PAIRS[:2]), 30.0)
    assert guess.guess and guess.anchor == frozenset(PAIRS)
    assert guess.named == frozenset({("switch", "tor-0")})
    located = step(guess, finding("link", "l1", PAIRS[:2]), 60.0)
    assert not located.guess and located.named == frozenset({("link", "l1")})


def test_a_runs_slow_seconds_add_up_and_start_again_with_it():
    f = finding("switch", "tor-0", PAIRS)
    st = Streak(0, 0.0)
    for start, slow_s in ((0.0, 6.0), (30.0, 4.0)):
        st = step(st, f, start, slow_s=slow_s)
    assert (st.count, st.slow_s) == (2, 10.0)
    # A gap (a tail after a slower window) starts the run and its seconds again.
    st = step(st, f, 60.0, tail=PAIRS, slow_s=3.0)
    assert (st.count, st.first, st.slow_s) == (1, 60.0, 3.0)


def test_joined_is_one_window_of_evidence():
    a = Streak(3, 10.0, True, frozenset(PAIRS[:2]), True, filled=False, slow_s=4.0)
    b = Streak(2, 5.0, False, frozenset(PAIRS[2:4]), False, filled=True, slow_s=9.0)
    j = joined(a, b)
    assert (j.count, j.first, j.tails, j.guess, j.filled, j.slow_s) == (3, 5.0, False, False,
                                                                        True, 9.0)
    assert j.pairs == frozenset(PAIRS[:4])


def related(a: Key, b: Key) -> bool:
    """Two ToRs are unrelated; a ToR and a link into it are related."""
    touching = {("switch", "tor-0"): {"l0"}, ("switch", "tor-1"): {"l1"}}
    return a == b or b[1] in touching.get(a, set()) or a[1] in touching.get(b, set())


def test_a_run_passes_on_only_to_a_related_finding_about_half_of_its_pairs():
    run = Streak(2, 0.0, False, frozenset(PAIRS), named=frozenset({("switch", "tor-0")}))
    k = ("switch", "tor-0")
    assert may_follow(finding("link", "l0", PAIRS[:4]), run, k, related)
    assert not may_follow(finding("link", "l0", PAIRS[:3]), run, k, related)
    assert not may_follow(finding("switch", "tor-1", PAIRS), run, k, related)


def test_a_guess_passes_its_run_only_to_a_name_touching_the_one_it_carried_it_from():
    # A guess left over by tor-0's congestion, then tor-1's over most of
    # the same pairs: two episodes; tor-0 again: the same one.
    left = Streak(3, 0.0, False, frozenset(PAIRS[:2]), True, frozenset(PAIRS),
                  frozenset({("switch", "tor-0")}))
    k = ("endpoint", "a1")
    assert not may_follow(finding("switch", "tor-1", PAIRS), left, k, related)
    assert may_follow(finding("switch", "tor-0", PAIRS), left, k, related)
    assert may_follow(finding("link", "l0", PAIRS), left, k, related)


def test_a_guess_at_lost_probes_does_not_carry_on_a_run_that_was_only_slow():
    """A ToR's congestion slowed a pair a window before its rule broke: the
    next window's guess at the pair's lost probes carried the congestion's
    run on, and the rule's incident began a minute early (draw 3112).
    A located loss may continue a slow run (a slow path losing probes
    too), and a guess at loss a run that lost probes before."""
    slow = step(Streak(0, 0.0), finding("switch", "tor-0", PAIRS), 0.0)
    k = ("switch", "tor-0")

    def related(a: Key, b: Key) -> bool:  # as the engine's: a guess is related to anything
        return True

    guess = finding("endpoint", "a1", PAIRS[:1], "loss")
    assert not slow.lost and not may_follow(guess, slow, k, related)
    assert may_follow(finding("endpoint", "a1", PAIRS[:1]), slow, k, related)
    assert may_follow(finding("link", "l0", PAIRS[:4], "loss"), slow, k, related)
    lossy = step(slow, finding("switch", "tor-0", PAIRS, "loss"), 30.0)
    assert lossy.lost and may_follow(guess, lossy, k, related)
    assert joined(slow, lossy).lost
