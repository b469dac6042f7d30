"""Route evidence (analyzer/routes.py) on its own: windows in, what their
traced probes say about links out, no engine around it."""

from __future__ import annotations

from analyzer.batch import WindowBatch
from analyzer.paths import UnderlayPaths
from analyzer.routes import RouteEvidence
from netskel.config import AnalyzerConfig
from netskel.model import RouteStats, WindowStats
from netskel.topology import link_id, parse_topology
from testbed.layout import Layout, layout_doc

LAY = Layout(hosts=4, rails=1, hosts_per_tor=2, spines=2)
T0 = 1_700_000_010.0 // 30 * 30


def _cross_windows(k: int, lost: int, routed: bool) -> list[WindowStats]:
    """Every rail-0 pair across the two ToRs, one window each, half of its
    probes through spine 0 (losing `lost` there), half through spine 1."""
    start = T0 + 30 * k
    out = []
    for a in range(2):
        for b in range(2, 4):
            ea, eb = LAY.endpoint(a, 0), LAY.endpoint(b, 0)
            via = [f"{LAY.tor(0, 0)}>{LAY.spine(s)}>{LAY.tor(0, 1)}" for s in (0, 1)]
            routes = (RouteStats(via[0], 30, lost, 13.0), RouteStats(via[1], 30, 0, 13.0))
            out.append(WindowStats(ea, eb, start, start + 30, 64, 60, lost, 10, 12, 13, 14, 13,
                                   1, 20, route=via[1] if routed else "",
                                   routes=routes if routed else ()))
    return out


def test_a_lossy_links_counts_are_this_windows_or_none():
    """The probes a link an open incident names carried this window tell
    that incident whether its link still loses. A window without a single
    traced probe has no such counts: the last routed window's must not
    stand in for them (they kept a healed link's incident open)."""
    topo = parse_topology(layout_doc(LAY))
    ev = RouteEvidence(topo, UnderlayPaths(topo), AnalyzerConfig())
    link = link_id(LAY.tor(0, 0), LAY.spine(0))
    ev.note(WindowBatch.from_windows(_cross_windows(0, lost=10, routed=True)))
    found = ev.lossy_links(4, set(), set(), {link})
    assert found and all(link in v for v in found.values())
    sent, lost, _expected = ev.link_window[link]
    assert (sent, lost) == (4 * 30, 4 * 10)
    ev.note(WindowBatch.from_windows(_cross_windows(1, lost=0, routed=False)))
    assert ev.lossy_links(4, set(), set(), {link}) == {}
    assert ev.link_window == {}
