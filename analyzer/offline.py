"""`netskel analyze`: a whole recording through the live analyzer's logic."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer.engine import Analyzer
from analyzer.records import read_probe_records, unknown_protocols, unplaceable_routes
from analyzer.windows import window_batch_parallel
from netskel.config import AnalyzerConfig
from netskel.topology import load_topology


def analyze_files(topology: str | Path, probes: str | Path, window_s: float = 30.0,
                  cfg: AnalyzerConfig | None = None,
                  progress: Callable[[str, int, int], None] | None = None,
                  warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Incidents of a whole recording (contract section 5); `warn` hears what
    the file holds that the analysis cannot use."""
    say = progress or (lambda stage, done, total: None)
    say("reading topology", 0, 0)
    topo = load_topology(topology)
    say("reading probe records", 0, 0)
    records = read_probe_records(probes, topo)
    if warn is not None:  # checked only for someone who hears it
        bad, routes = unplaceable_routes(records, topo)
        if bad:
            warn(f"{probes}: column 'route': {len(bad)} of {routes} distinct routes name "
                 f"switches or links the topology does not have (first: '{bad[0]}'; a route is "
                 "switch ids joined by '>'); only the links it has are used")
        odd = unknown_protocols(records)
        if odd:
            listed = ", ".join(f"'{name}' ({rows} rows)" for name, rows in sorted(odd.items()))
            warn(f"{probes}: column 'proto': {listed} outside the contract's 'rdma' and 'udp'; "
                 "each is analysed as an instrument of its own")
    engine = Analyzer(topo, cfg or AnalyzerConfig())
    say(f"{len(records)} records -> {window_s:g} s windows", 0, 0)
    # Windows computed from checked records, as columns; no charts offline.
    engine.add_batch(window_batch_parallel(records, window_s))
    engine.flush(progress)
    return {"incidents": [i.to_doc() for i in engine.list_incidents()]}
