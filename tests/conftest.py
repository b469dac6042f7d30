from __future__ import annotations

import json
import shutil
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


def _testbed_missing() -> str | None:
    import os

    if os.geteuid() != 0:
        return "the namespace testbed needs root"
    missing = [b for b in ("ip", "ovs-vswitchd", "ovsdb-server", "nft", "ethtool", "tc", "ping")
               if shutil.which(b) is None]
    return f"testbed tools missing: {', '.join(missing)} (scripts/setup.sh installs them)" \
        if missing else None


requires_testbed = pytest.mark.skipif(_testbed_missing() is not None,
                                      reason=_testbed_missing() or "")
requires_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus missing (scripts/setup.sh installs Debian's)")
