"""NCCL topology and graph XML: parsed as NCCL reads them, refused where NCCL would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.errors import BadInput
from pcieprof.bundle.nccl_topo import NvLink
from pcieprof.importers.nccl_xml import parse_graph_xml, parse_topo_xml

GRAPH = "tool-outputs/nccl_graph_azure_ncv4_4xA100pcie_vm.xml"
TOPO = "tool-outputs/nccl_topo_azure_ncv4_4xA100pcie_vm.xml"


def test_graph_file(samples: Path) -> None:
    doc = parse_graph_xml((samples / GRAPH).read_text(), "graph.xml")
    assert [g.id for g in doc.graphs] == [0, 1, 2]
    ring = doc.graphs[0]
    assert (ring.pattern, ring.pattern_name, ring.nchannels) == (4, "ring", 2)
    assert (ring.speedintra, ring.speedinter, ring.typeintra, ring.typeinter) == (
        12.0, 12.0, "SYS", "PIX")
    assert [c.gpus for c in ring.channels] == [[0, 1, 2, 3], [0, 3, 2, 1]]
    tree = doc.graphs[1]
    assert tree.pattern_name == "balanced_tree" and tree.channels[2].gpus == [3, 2, 1, 0]
    assert doc.graphs[2].pattern == 3 and doc.graphs[2].channels[3].gpus == [2, 3, 0, 1]


def test_topology_file(samples: Path) -> None:
    doc = parse_topo_xml((samples / TOPO).read_text(), "topo.xml")
    assert [c.numaid for c in doc.cpus] == [0, 1, 2, 3]
    assert doc.cpus[3].cpus == "72-95"  # ffffff00,00000000,00000000
    g1 = doc.gpus[1]
    assert (g1.dev, g1.rank, g1.sm, g1.busid, g1.numaid) == (1, 1, 80, "0002:00:00.0", 1)
    assert g1.nvlinks == [NvLink(target="0002:00:00.0", count=12, tclass="0x030200")]
    assert [(n.name, n.speed, n.numaid) for n in doc.nics] == [("eth0", 100000, 0)]
    assert doc.pci[0].link_speed is None and doc.pci[0].link_width == 0


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
    assert doc.graphs[0].channels[0].gpus == [0, 1, 2, 3, 7, 6, 5, 4]


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


DATA = Path(__file__).resolve().parents[1] / "data" / "importers"


@pytest.mark.parametrize("name,ids,empty", [
    ("nccl_graph_dump_issue524_4gpu_2net_tree_without_channels.xml", [0, 1, 2], [2]),
    ("nccl_graph_dump_issue1406_rccl_4graphs_nvls_without_channels.xml", [0, 1, 2, 3], [2, 3]),
])
def test_real_dumps_list_graphs_that_found_nothing(name: str, ids: list[int],
                                                   empty: list[int]) -> None:
    # NCCL dumps every graph of the communicator; one that found nothing has nchannels="0" and
    # no <channel> (tests/data/importers/NOTE.md says where each dump comes from)
    doc = parse_graph_xml((DATA / name).read_text(), name)
    assert [g.id for g in doc.graphs] == ids
    assert [g.id for g in doc.graphs if not g.channels] == empty
    ring = doc.graphs[0]
    assert ring.pattern_name == "ring" and ring.channels[0].nets


def nccl_22x_dump(ngpus: int = 8) -> str:
    """A graph dump as NCCL 2.2x writes it, built in this test: no public dump of a 2.2x release
    was found (the public ones are older: decimal `dev`). Written the way the source writes it:
    search.cc ncclTopoGetXmlFromGraphs with the five graphs of init.cc (ring id 0, tree id 1,
    CollNet chain id 2, NVLS id 3 with only the first GPU of each channel, CollNet direct id 4),
    `dev` through xml.h xmlSetAttrLong ("%#lx": "0", "0x1", ..., "0xa"), floats "%g"."""
    def graph(gid: int, pattern: int, channels: list[list[int]], speed: str = "0",
              tin: str = "LOC", tout: str = "LOC") -> str:
        head = (f'  <graph id="{gid}" pattern="{pattern}" crossnic="0" nchannels="{len(channels)}" '
                f'speedintra="{speed}" speedinter="{speed}" latencyinter="0" typeintra="{tin}" '
                f'typeinter="{tout}" samechannels="{1 if channels else 0}"')
        if not channels:
            return head + "/>\n"
        body = "".join("    <channel>\n" + "".join(
            f'      <gpu dev="{format(d, "#x") if d else 0}"/>\n' for d in c) + "    </channel>\n"
            for c in channels)
        return head + ">\n" + body + "  </graph>\n"
    order = list(range(ngpus))
    return ('<graphs version="1">\n'
            + graph(0, 4, [order, order], "24", "SYS", "PIX")
            + graph(1, 1, [order, order], "24", "SYS", "PIX")
            + graph(2, 3, [])
            + graph(3, 5, [[0], [1]], "40", "NVL", "PIX")
            + graph(4, 6, [])
            + "</graphs>\n")


def test_a_22x_dump_with_hex_devs_and_five_graphs() -> None:
    text = nccl_22x_dump(12)
    assert '<gpu dev="0xa"/>' in text and '<gpu dev="0"/>' in text
    doc = parse_graph_xml(text, "dump.xml")
    assert [g.id for g in doc.graphs] == [0, 1, 2, 3, 4]
    assert doc.graphs[0].channels[0].gpus == list(range(12))  # 0xa is GPU 10, not 0
    assert [c.gpus for c in doc.graphs[3].channels] == [[0], [1]]  # NVLS: first GPU


def test_the_forced_ring_takes_its_header_from_a_22x_dump() -> None:
    from probes.nccl_graph import header_from_dump

    h = header_from_dump(nccl_22x_dump(), "default.graph.xml")
    assert (h.nchannels, h.speedintra, h.typeintra) == (2, 24.0, "SYS")
    assert h.source.startswith("NCCL's own ring graph")


@pytest.mark.parametrize("name", [
    "nccl_graph_dump_issue524_4gpu_2net_tree_without_channels.xml",
    "nccl_graph_dump_issue1406_rccl_4graphs_nvls_without_channels.xml",
])
def test_real_dump_with_empty_graphs_imports(name: str, tmp_path: Path) -> None:
    # imported alone, a dump whose later graphs found no channel was an IndexError in the
    # one-line summary (audit of issue 22 on every fixture)
    r = cli("import", str(DATA / name), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 0, r.stderr
    assert "(no channels)" in r.stdout
