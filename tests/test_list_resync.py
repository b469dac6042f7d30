"""A ping-list stream that fell behind gets the whole list again; nothing
older may follow it, and what it refused meanwhile is not waited for."""

from __future__ import annotations

import threading
import time
from typing import Any

from controller.state import ListUpdate
from netskel.topology import parse_topology
from tests.helpers import registered_state


class SlowSink:
    """A stream's mailbox whose emptying takes a moment, as the real one's
    does (the stream's coroutine hops to a worker thread between emptying
    its mailbox and reading the list)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[ListUpdate] = []

    def offer(self, item: ListUpdate) -> bool:
        with self.lock:
            self.items.append(item)
        return True

    def reset(self) -> None:
        with self.lock:
            self.items.clear()
        time.sleep(0.002)

    def versions(self) -> list[int]:
        with self.lock:
            return [u.version for u in self.items]


def test_no_update_older_than_a_resynced_list_follows_it(topo_doc: dict[str, Any]) -> None:
    """Peers turning ready and unready change a container's list over and
    over while its stream resyncs: every update the stream holds after a
    resync is newer than the whole list it just sent. (Emptied, then read
    in a second step, an update slipped in between and went out after the
    newer list, winding the agent's targets back.)"""
    topo = parse_topology(topo_doc)
    state = registered_state(topo)
    me = sorted(state.lists)[0]
    peers = sorted({topo.endpoints[t.dst].container for t in state.lists[me].values()})
    assert peers, "the container must have targets"
    sink = SlowSink()
    state.subscribe_list(me, sink)
    stop = threading.Event()

    def churn() -> None:
        ready = False
        while not stop.is_set():
            ready = not ready
            for p in peers:
                state.heartbeat(p, ready, now=1.0)

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    stale = []
    try:
        for _ in range(200):
            snap = state.resync_list(me, sink.reset)
            stale += [v for v in sink.versions() if v <= snap.version]
    finally:
        stop.set()
        t.join()
    assert state.versions[me] > 200, "the list must have changed throughout"
    assert stale == [], f"{len(stale)} updates older than the list they followed"


class Refusing:
    """A stream's mailbox while it is overflowed: it takes nothing."""

    def offer(self, item: ListUpdate) -> bool:
        return False


def test_a_check_order_its_stream_refused_is_named_at_once(topo_doc: dict[str, Any]) -> None:
    """A check order that no stream took (the prober's is being resynced)
    went nowhere: its pairs come back as not checked at once, instead of
    the caller waiting out the timeout for an answer that cannot come."""
    topo = parse_topology(topo_doc)
    state = registered_state(topo, ready=True)
    me = sorted(state.lists)[0]
    pair = sorted(state.lists[me])[0]
    state.subscribe_list(me, Refusing())
    check_id, unchecked = state.start_check([pair], 1.0, 50.0)
    assert [(p, "catching up" in why) for p, why in unchecked] == [(pair, True)], unchecked
    # Nothing to wait for: even without waiting, no prober is still due.
    windows, silent, missing = state.wait_check(check_id, 0.0)
    assert windows == [] and silent == [] and missing == []


def test_a_check_wakes_one_switch_reader_on_each_target_host_and_waits_for_none(
        topo_doc: dict[str, Any]) -> None:
    """Each overlay path a check traces ends in its target host's table: one
    agent there gets an order with no targets (read your switch now); the
    prober's own host needs none, and the check waits only for the prober."""
    topo = parse_topology(topo_doc)
    state = registered_state(topo, ready=True)
    me = sorted(state.lists)[0]
    mailboxes = {cid: SlowSink() for cid in state.regs}
    for cid, box in mailboxes.items():
        state.subscribe_list(cid, box)
    pairs = sorted(state.lists[me])
    check_id, unchecked = state.start_check(pairs, 1.0, 50.0)
    assert unchecked == []
    orders = {cid: [u.check for u in box.items if u.check is not None]
              for cid, box in mailboxes.items()}
    (mine,) = orders.pop(me)
    assert {(t.src, t.dst) for t in mine.targets} == set(pairs)
    target_hosts = {topo.host_of_endpoint(t.dst) for t in mine.targets}
    target_hosts.discard(state.regs[me].host)
    woken = {cid: o for cid, os in orders.items() for o in os}
    assert sorted(state.regs[cid].host for cid in woken) == sorted(target_hosts)
    assert all(o.id == check_id and o.targets == () for o in woken.values())
    # Only the prober is waited for: its answer (no window here) alone
    # completes the check; no woken agent is missing from it.
    state.accept_check(me, check_id, [])
    windows, silent, missing = state.wait_check(check_id, 0.0)
    assert windows == [] and silent == []
    assert sorted(p for p, _why in missing) == pairs
    assert all(me in why for _p, why in missing)
