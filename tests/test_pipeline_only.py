"""A pipeline without data parallelism, read from its transfers alone
(controller/pipeline_only.py). Traffic here is the testbed job's own 1F1B
schedule (testbed/train_job.py) played out with jitter, one-way bursts and
host clocks; tests/test_real_recording.py holds the real job's recording."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest

from controller.pipeline_only import coarsened, greedy_path, pipeline_chain
from controller.timing import Iterations
from testbed.train_job import one_f_one_b

DT = 0.05
F_S, B_S, OPT_S, MB = 0.1, 0.2, 0.15, 4


def pipeline_traffic(order: list[int], rails: int, iterations: int, rng: np.random.Generator,
                     shuffle_transfers: bool = False, dt: float = DT
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Iterations]:
    """(tx, rx, rail_of, host_of, iterations) of a 1F1B pipeline whose stage
    s runs on host order[s] with one endpoint per rail. shuffle_transfers:
    each transfer goes to a random other host instead (no pipeline)."""
    pp = len(order)
    steps = [one_f_one_b(s, pp, MB) for s in range(pp)]
    t0, starts, events = 0.0, [], []
    for _ in range(iterations):
        # The iteration's pace, and each step's own compute time (a few %).
        pace = (1.0 + abs(rng.normal(0, 0.03))) * (1.0 + rng.normal(0, 0.05, (pp, 2 * MB)))

        @cache
        def end(s: int, k: int, t0: float = t0, pace: np.ndarray = pace) -> float:
            kind, mb = steps[s][k]
            ready = end(s, k - 1) if k else t0
            if kind == "F" and s > 0:
                ready = max(ready, end(s - 1, steps[s - 1].index(("F", mb))))
            if kind == "B" and s < pp - 1:
                ready = max(ready, end(s + 1, steps[s + 1].index(("B", mb))))
            return ready + pace[s, k] * (F_S if kind == "F" else B_S)

        starts.append(t0)
        for s in range(pp):
            for k, (kind, _mb) in enumerate(steps[s]):
                to = s + 1 if kind == "F" else s - 1
                if 0 <= to < pp:
                    if shuffle_transfers:
                        to = int(rng.choice([x for x in range(pp) if x != s]))
                    events.append((end(s, k), s, to))
        t0 = max(end(s, len(steps[s]) - 1) for s in range(pp)) + OPT_S
    n = int(t0 / dt) + 1
    hosts = pp
    tx = rng.normal(2e6, 5e5, (hosts * rails, n)).clip(0) * dt
    rx = rng.normal(2e6, 5e5, (hosts * rails, n)).clip(0) * dt
    clock = rng.uniform(-0.02, 0.02, hosts)
    for when, s, to in events:
        a, b = order[s], order[to]
        for r in range(rails):
            tx[a * rails + r, int((when + clock[a]) / dt)] += 30e6
            rx[b * rails + r, int((when + clock[b]) / dt)] += 30e6
    for _ in range(hosts * rails * iterations // 4):  # one-way bursts of hundreds of MB
        e, k = rng.integers(hosts * rails), rng.integers(n)
        (tx if rng.random() < 0.5 else rx)[e, k] += rng.uniform(20e6, 600e6)
    sync = (np.asarray(starts) / dt).astype(np.int64)
    it = Iterations(sync=sync, bounds=sync, period=float(np.median(np.diff(starts))),
                    regularity=1.0)
    rail_of = np.tile(np.arange(rails), hosts)
    host_of = np.repeat(np.arange(hosts), rails)
    return tx / dt, rx / dt, rail_of, host_of, it


@pytest.mark.parametrize("pp,rails,seed", [(4, 1, 1), (6, 2, 2), (8, 4, 3), (2, 8, 4)])
def test_a_pure_pipeline_is_read_in_order_from_its_transfers(pp: int, rails: int, seed: int
                                                              ) -> None:
    rng = np.random.default_rng(seed)
    order = [int(x) for x in rng.permutation(pp)]
    tx, rx, rail_of, host_of, it = pipeline_traffic(order, rails, 30, rng)
    chain = pipeline_chain(tx, rx, rail_of, host_of, it, DT, DT)
    assert chain is not None
    assert chain.oriented, chain.notes
    assert [sorted(host_of[s].tolist()) for s in chain.stages] == [[h] * rails for h in order]
    assert all(sorted(rail_of[s].tolist()) == list(range(rails)) for s in chain.stages)


def test_hosts_clocks_apart_by_more_than_a_fine_sample_still_chain() -> None:
    """At 10 ms samples, clocks 20 ms apart put a send and its receive
    several samples apart: transfers are compared in bins as long as the
    clocks may disagree."""
    rng = np.random.default_rng(8)
    order = [2, 0, 3, 1]
    tx, rx, rail_of, host_of, it = pipeline_traffic(order, 2, 30, rng, dt=0.01)
    assert coarsened(tx, rx, it, 0.01, 0.05)[3] == pytest.approx(0.05)
    chain = pipeline_chain(tx, rx, rail_of, host_of, it, 0.01, 0.05)
    assert chain is not None and chain.oriented, chain
    assert [int(host_of[s][0]) for s in chain.stages] == order


def test_transfers_that_make_no_path_make_no_pipeline() -> None:
    rng = np.random.default_rng(5)
    tx, rx, rail_of, host_of, it = pipeline_traffic(list(range(6)), 2, 30, rng,
                                                    shuffle_transfers=True)
    assert pipeline_chain(tx, rx, rail_of, host_of, it, DT, DT) is None
    # A collective (everyone sends and receives at once) is no pipeline either.
    burst = (rng.random(tx.shape[1]) < 0.1) * 1e10
    assert pipeline_chain(tx + burst, rx + burst, rail_of, host_of, it,
                          DT, DT) is None


def test_hosts_with_uneven_rails_are_left_alone() -> None:
    rng = np.random.default_rng(6)
    tx, rx, rail_of, host_of, it = pipeline_traffic([0, 1, 2], 2, 10, rng)
    rail_of = rail_of.copy()
    rail_of[0] = 1  # host 0 holds two endpoints on rail 1 and none on rail 0
    assert pipeline_chain(tx, rx, rail_of, host_of, it, DT, DT) is None


def weight(w: np.ndarray, path: tuple[int, ...]) -> float:
    return float(sum(w[a, b] for a, b in zip(path, path[1:], strict=False)))


def test_greedy_path_is_the_heaviest_path_where_its_edges_dominate() -> None:
    rng = np.random.default_rng(7)
    for n in range(2, 7):
        for _ in range(20):
            order = rng.permutation(n)
            w = rng.uniform(-0.1, 0.2, (n, n))
            w = (w + w.T) / 2
            for a, b in zip(order, order[1:], strict=False):
                w[a, b] = w[b, a] = rng.uniform(0.3, 0.9)
            np.fill_diagonal(w, -np.inf)
            path = greedy_path(w)
            assert path is not None

            best = max(itertools.permutations(range(n)), key=lambda p, w=w: weight(w, p))
            assert weight(w, tuple(path)) == pytest.approx(weight(w, best))
            assert path in (list(order), list(order[::-1]))
