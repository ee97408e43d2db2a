"""nvidia-smi topo -p2p: every pair's status code for the capability asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.errors import BadInput
from pcieprof.importers.topo_p2p import capability_from_name, parse_topo_p2p


def test_rw_matrix(samples: Path) -> None:
    p = samples / "tool-outputs/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt"
    parsed = parse_topo_p2p(p.read_text(), p.name)
    assert parsed.facts["capability"] == "rw" and parsed.facts["gpus"] == 5
    assert len(parsed.pair_p2p) == 20
    assert parsed.pair_p2p[(0, 4)] == {"read": "OK", "write": "OK"}
    assert (2, 2) not in parsed.pair_p2p


def test_other_codes_and_explicit_capability(samples: Path) -> None:
    text = (samples / "tool-outputs/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt").read_text()
    lines = text.splitlines()
    lines[1] = lines[1].replace("\tOK\tOK\tOK\tOK", "\tCNS\tGNS\tTNS\tDR")
    parsed = parse_topo_p2p("\n".join(lines), "x.txt", capability="a")
    assert [parsed.pair_p2p[(0, b)] for b in (1, 2, 3, 4)] == [
        {"atomics": "CNS"}, {"atomics": "GNS"}, {"atomics": "TNS"}, {"atomics": "DR"}]


def test_capability_from_name() -> None:
    assert capability_from_name("topo_p2p_rw_box.txt") == "rw"
    assert capability_from_name("smi-p2p-n.log") == "n"
    assert capability_from_name("matrix.txt") == "unknown"


def test_unknown_code_names_line(samples: Path) -> None:
    text = (samples / "tool-outputs/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt").read_text()
    with pytest.raises(BadInput) as e:
        parse_topo_p2p(text.replace("OK\tX", "MAYBE\tX", 1), "p2p.txt")
    assert e.value.one_line().startswith("p2p.txt:3: expected a status code")
