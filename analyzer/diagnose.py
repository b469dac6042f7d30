"""NetDiag's questions answered from what the analyzer holds: which pairs
an ask covers, each pair's verdict over a time range, and an active
check's detector flags turned into symptoms and reasons. Functions of the
state handed in: the engine owns the state, the servicer the protobuf, and
these rules can be read (and tested) apart from both."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from analyzer.localize import Pair, worst_symptom
from analyzer.verdicts import FAULT, INCONCLUSIVE, Diagnosis, PairVerdict, overall
from netskel.errors import InputError, NotFoundError
from netskel.model import Incident, WindowStats, pair_key

DEFAULT_RANGE_S = 300.0  # what Diagnose looks back over when the ask names no range


def require_known(endpoints: Iterable[str], known: Collection[str], rpc: str) -> None:
    """An unknown endpoint is the caller's mistake (NOT_FOUND), not a pair
    with no data: nothing would ever be monitored for it."""
    for e in endpoints:
        if e not in known:
            raise NotFoundError(f"{rpc}: unknown endpoint '{e}'")


def asked_pairs(endpoints: Sequence[str], pairs: Sequence[Pair],
                by_endpoint: Mapping[str, Collection[Pair]], known: Collection[str]
                ) -> tuple[list[Pair], list[str]]:
    """The pairs an ask covers, in the order asked and each once (an
    endpoint stands for its monitored pairs), and the asked endpoints that
    have none."""
    if not endpoints and not pairs:
        raise InputError("Diagnose: name at least one endpoint or pair")
    require_known((*endpoints, *(x for p in pairs for x in p)), known, "Diagnose")
    asked = [pair_key(a, b) for a, b in pairs]
    lonely = []
    for e in endpoints:
        mine = sorted(by_endpoint.get(e, ()))
        if not mine:
            lonely.append(e)
        asked.extend(mine)
    return list(dict.fromkeys(asked)), lonely


def time_range(start: float, end: float, now: float) -> tuple[float, float]:
    """The range an ask names, its zeros read as "until now" and "the
    default look-back before the end"."""
    end = end or now
    start = start or end - DEFAULT_RANGE_S
    if start > end:
        raise InputError(f"Diagnose: start {start} is after end {end}")
    return start, end


def diagnosis(asked: Sequence[Pair], lonely: Sequence[str], incidents: Iterable[Incident],
              judge: Callable[[Pair], tuple[str, str]],
              routes: Mapping[Pair, tuple[str, str]], start: float, end: float) -> Diagnosis:
    """Each pair's verdict: FAULT where an incident covering it overlaps
    [start, end] (its ids the reason), otherwise what its analysed windows
    say (`judge`); each verdict carries the pair's latest traced route."""
    verdicts = [PairVerdict((e, e), INCONCLUSIVE, f"no monitored pair has endpoint '{e}'")
                for e in lonely]
    live = [i for i in incidents if i.start <= end and (i.end is None or i.end > start)]
    cited: dict[str, Incident] = {}
    for pair in asked:
        hits = [i for i in live if pair in i.pairs]
        if hits:
            cited.update((i.id, i) for i in hits)
            verdicts.append(PairVerdict(pair, FAULT, ", ".join(sorted(i.id for i in hits))))
        else:
            verdicts.append(PairVerdict(pair, *judge(pair)))
    verdicts = [dataclasses.replace(v, route_from=routes[v.pair][0], route=routes[v.pair][1])
                if v.pair in routes else v for v in verdicts]
    return Diagnosis(verdict=overall(verdicts), pairs=verdicts,
                     incidents=sorted(cited.values(), key=lambda i: i.id))


def check_symptoms(windows: Sequence[WindowStats], loss: np.ndarray, slow: np.ndarray,
                   unreachable: np.ndarray, typical_us: np.ndarray
                   ) -> tuple[set[Pair], dict[Pair, str], dict[Pair, str]]:
    """An active check's windows (one per pair and size) and the detector's
    flags on them: (the pairs checked, why each anomalous one is, its worst
    symptom). A pair is unreachable only when no size got through; lost
    sizes beside ones that did are loss."""
    checked: set[Pair] = set()
    notes: dict[Pair, list[str]] = defaultdict(list)
    symptoms: dict[Pair, list[str]] = defaultdict(list)
    for i, w in enumerate(windows):
        p = pair_key(w.src, w.dst)
        checked.add(p)
        if unreachable[i]:
            symptoms[p].append("unreachable")
            notes[p].append(f"{w.size} B: all {w.sent} probes lost")
        elif loss[i]:
            symptoms[p].append("loss")
            notes[p].append(f"{w.size} B: {w.lost}/{w.sent} lost")
        if slow[i]:
            symptoms[p].append("latency")
            notes[p].append(f"{w.size} B: median RTT {w.rtt_median:.0f} us, "
                            f"typically {typical_us[i]:.0f} us")
    for p, s in symptoms.items():
        if "unreachable" in s and not all(x == "unreachable" for x in s):
            symptoms[p] = [x if x != "unreachable" else "loss" for x in s]
    return (checked, {p: "; ".join(n) for p, n in notes.items()},
            {p: worst_symptom(s) for p, s in symptoms.items()})
