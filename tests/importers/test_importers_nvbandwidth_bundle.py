"""An nvbandwidth import: the driver version it prints lands in topology.json, and the N/A
diagonal (a GPU to itself) gives no p2p.csv row. Real file: nvbandwidth_6xA6000_read_ce.txt."""

from __future__ import annotations

import json
import re
from pathlib import Path

from builders.bundles import imported

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
FILE = DATA / "nvbandwidth_6xA6000_read_ce.txt"


def test_driver_version_and_no_diagonal_rows(tmp_path: Path) -> None:
    text = FILE.read_text()
    driver = re.search(r"^Driver Version: (\S+)", text, re.M).group(1)  # type: ignore[union-attr]
    b = imported([FILE], tmp_path / "b")
    topo = json.loads((tmp_path / "b" / "topology.json").read_text())
    assert topo["driver"]["driver_version"] == driver
    assert "driver_version" not in topo["driver"].get("status", {})
    p2p = b.read_table("p2p")
    assert len(p2p) and (p2p["src"] != p2p["dst"]).all()
