from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.layout import Layout, layout_doc


def loopback_ip(h: int, r: int) -> str:
    """Distinct loopback addresses stand in for overlay IPs off the testbed."""
    return f"127.0.{10 + r}.{h + 1}"


@pytest.fixture
def layout() -> Layout:
    return Layout(hosts=4, rails=2, hosts_per_tor=2, spines=2)


@pytest.fixture
def topo_doc(layout: Layout) -> dict[str, Any]:
    return layout_doc(layout, loopback_ip)


@pytest.fixture
def topo_file(tmp_path: Path, topo_doc: dict[str, Any]) -> Path:
    p = tmp_path / "topology.json"
    p.write_text(json.dumps(topo_doc))
    return p
