"""The report feed's coalescing (controller/service.py `_coalesce`): window
batches queued behind one another leave as one event, in order, bounded,
and never jump an agent or vswitch event."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from analyzer.batch import WindowBatch
from controller import service
from controller.state import ReportEvent
from netskel.grpcserver import Mailbox
from netskel.model import AgentState, WindowStats

T0 = 1_733_988_600.0


def _batch(tag: int, n: int) -> WindowBatch:
    return WindowBatch.from_windows([WindowStats(f"a{tag}", f"b{i}", T0, T0 + 30, 64, 10, 0,
                                                 1, 2, 3, 4, 3, 1, 9) for i in range(n)])


def _pairs(b: WindowBatch) -> list[tuple[str, str]]:
    return [(b.names[int(s)], b.names[int(d)]) for s, d in zip(b.src, b.dst, strict=True)]


@pytest.fixture
def box():
    loop = asyncio.new_event_loop()
    yield Mailbox[ReportEvent](loop, 100)
    loop.close()


def test_queued_batches_leave_as_one_event_up_to_an_agent_event(box):
    first, queued = _batch(0, 3), [_batch(1, 2), _batch(2, 4)]
    agent = AgentState("c9", ("a9",), True, True, T0)
    for e in [*queued, agent, _batch(3, 1)]:
        box.offer(e)
    got = service._coalesce(first, box)
    assert _pairs(got) == [p for b in (first, *queued) for p in _pairs(b)]
    assert np.array_equal(got.stats, np.concatenate([first.stats, *(b.stats for b in queued)]))
    assert box.take_while(lambda e: True)[0] is agent  # still in its place


def test_an_event_stays_within_its_bound(box, monkeypatch):
    monkeypatch.setattr(service, "FEED_EVENT_WINDOWS", 6)
    parts = [_batch(1, 2), _batch(2, 3), _batch(3, 1)]
    for b in parts:
        box.offer(b)
    got = service._coalesce(_batch(0, 2), box)
    assert len(got) == 4  # 2 + 2; the next 3 would pass 6
    rest = box.take_while(lambda e: True)
    assert [len(e) for e in rest if isinstance(e, WindowBatch)] == [3, 1]


def test_nothing_queued_leaves_the_batch_as_it_came(box):
    first = _batch(0, 5)
    assert service._coalesce(first, box) is first
