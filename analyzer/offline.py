"""`netskel analyze`: a whole recording through the live analyzer's logic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analyzer.engine import Analyzer
from analyzer.records import read_probe_records
from analyzer.windows import compute_windows
from netskel.config import AnalyzerConfig
from netskel.topology import load_topology


def analyze_files(topology: str | Path, probes: str | Path, window_s: float = 30.0,
                  cfg: AnalyzerConfig | None = None) -> dict[str, Any]:
    topo = load_topology(topology)
    records = read_probe_records(probes, topo)
    engine = Analyzer(topo, cfg or AnalyzerConfig())
    windows = compute_windows(records, window_s)
    engine.add_windows(windows)
    engine.flush()
    return {"incidents": [i.to_doc() for i in engine.list_incidents()]}
