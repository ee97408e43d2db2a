"""NCCL topology and graph XML: parsed as NCCL reads them, refused where NCCL would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.errors import BadInput
from pcieprof.importers.nccl_xml import parse_graph_xml, parse_topo_xml

GRAPH = "tool-outputs/nccl_graph_azure_ncv4_4xA100pcie_vm.xml"
TOPO = "tool-outputs/nccl_topo_azure_ncv4_4xA100pcie_vm.xml"


def test_graph_file(samples: Path) -> None:
    doc = parse_graph_xml((samples / GRAPH).read_text(), "graph.xml")
    assert [g["id"] for g in doc["graphs"]] == [0, 1, 2]
    ring = doc["graphs"][0]
    assert (ring["pattern"], ring["pattern_name"], ring["nchannels"]) == (4, "ring", 2)
    assert (ring["speedintra"], ring["speedinter"], ring["typeintra"], ring["typeinter"]) == (
        12.0, 12.0, "SYS", "PIX")
    assert [c["gpus"] for c in ring["channels"]] == [[0, 1, 2, 3], [0, 3, 2, 1]]
    tree = doc["graphs"][1]
    assert tree["pattern_name"] == "balanced_tree" and tree["channels"][2]["gpus"] == [3, 2, 1, 0]
    assert doc["graphs"][2]["pattern"] == 3 and doc["graphs"][2]["channels"][3]["gpus"] == [2, 3, 0, 1]


def test_topology_file(samples: Path) -> None:
    doc = parse_topo_xml((samples / TOPO).read_text(), "topo.xml")
    assert [c["numaid"] for c in doc["cpus"]] == [0, 1, 2, 3]
    assert doc["cpus"][3]["cpus"] == "72-95"  # ffffff00,00000000,00000000
    g1 = doc["gpus"][1]
    assert (g1["dev"], g1["rank"], g1["sm"], g1["busid"], g1["numaid"]) == (1, 1, 80, "0002:00:00.0", 1)
    assert g1["nvlinks"] == [{"target": "0002:00:00.0", "count": 12, "tclass": "0x030200"}]
    assert [(n["name"], n["speed"], n["numaid"]) for n in doc["nics"]] == [("eth0", 100000, 0)]
    assert doc["pci"][0]["link_speed"] is None and doc["pci"][0]["link_width"] == 0


RING = ('<graphs version="1">\n'
        '  <graph id="0" pattern="4" crossnic="0" nchannels="{n}" speedintra="20" speedinter="20" '
        'latencyinter="0" typeintra="{t}" typeinter="PIX" samechannels="0">\n{ch}  </graph>\n'
        '</graphs>\n')
CH = "    <channel>\n{gpus}    </channel>\n"


def ring(channels: list[list[int]], n: int | None = None, t: str = "PHB") -> str:
    ch = "".join(CH.format(gpus="".join(f'      <gpu dev="{d}"/>\n' for d in c)) for c in channels)
    return RING.format(n=len(channels) if n is None else n, t=t, ch=ch)


def test_a_written_ring_parses() -> None:
    doc = parse_graph_xml(ring([[0, 1, 2, 3, 7, 6, 5, 4]]), "ring.xml")
    assert doc["graphs"][0]["channels"][0]["gpus"] == [0, 1, 2, 3, 7, 6, 5, 4]


@pytest.mark.parametrize("text,line,expected", [
    ("<graph/>", 1, "the root element <graphs"),
    ('<graphs version="2"></graphs>', 1, 'graphs version="1"'),
    (ring([[0, 1], []]), 7, "at least one <gpu dev=...> in the channel"),
    (ring([[0, 1], [1, 0, 2]]), 7, "2 GPUs in every channel"),
    (ring([[0, 1, 0]]), 6, "each GPU once per channel"),
    (ring([[0, 1]], n=2), 2, 'nchannels="1"'),
    (ring([[0, 1]], t="FAST"), 2, "typeintra in LOC"),
    (ring([[0, 1]]).replace(' crossnic="0"', ""), 2, 'attribute crossnic="<integer>"'),
    (ring([[0, 1]]).replace('<gpu dev="1"/>', "<gpu/>"), 5, 'attribute dev="<integer>" on <gpu>'),
    ('<graphs version="1">\n</graphs>', 1, "at least one <graph>"),
    (ring([[0, 1]])[:-30], 6, "well-formed XML"),
])
def test_what_nccl_would_refuse(text: str, line: int, expected: str) -> None:
    with pytest.raises(BadInput) as e:
        parse_graph_xml(text, "g.xml")
    msg = e.value.one_line()
    assert msg.startswith(f"g.xml:{line}: expected") and expected in msg, msg


def test_topology_root_and_truncation(samples: Path) -> None:
    text = (samples / TOPO).read_text()
    with pytest.raises(BadInput, match=r"^t.xml:1: expected the root element <system"):
        parse_topo_xml(text.replace("<system", "<sys").replace("</system>", "</sys>"), "t.xml")
    cut = "\n".join(text.splitlines()[:12])
    with pytest.raises(BadInput, match=r"^t.xml:12: expected well-formed XML .*truncated"):
        parse_topo_xml(cut, "t.xml")
