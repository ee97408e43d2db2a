"""`nvidia-smi topo -mp` (the PCIe-only matrix: NVLink pairs show their PCIe level) is labelled as
such, and no finding reads "no NVLink pair" from it.

Real file: tests/data/importers/topo_mp_3xP100_pcie_only_legend_prompt.txt (NOTE.md). The
NVLink box this matters for is DeepEP issue #60's (8 GPUs, NODE/SYS only in its `topo -mp`);
the excerpt public search returns of it stops inside a row, so it is not a fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

from builders.bundles import imported

from pcieprof.bundle.topology import Topology
from pcieprof.cards import load_card
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.discover.topo_matrix import parse_topo_matrix
from pcieprof.importers.formats import parse_text
from pcieprof.tune.recommend import recommend

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
MP = DATA / "topo_mp_3xP100_pcie_only_legend_prompt.txt"
M_PROMPT = DATA / "topo_m_4x3090_nvlink_pairs_prompt.txt"


def test_topo_mp_is_labelled_by_its_command_line_and_by_its_legend() -> None:
    text = MP.read_text()
    t = parse_topo_matrix(text)
    assert t["view"] == "pcie_only" and "topo -mp" in t["view_evidence"]
    # the same output without the prompt line: the legend (no NV# line after PIX) still tells
    bare = parse_topo_matrix(text.split("\n", 1)[1])
    assert bare["view"] == "pcie_only" and "legend" in bare["view_evidence"]
    assert parse_topo_matrix(M_PROMPT.read_text())["view"] == "full"
    parsed = parse_text(text, MP.name)
    assert parsed.summary.startswith("nvidia-smi topo -mp (PCIe-only view: NVLink not shown)")
    assert parsed.facts["topo_view"] == "pcie_only"
    assert any("NVLink hidden" in w for w in parsed.facts["warnings"])


def test_no_nvlink_claim_from_topo_mp(tmp_path: Path) -> None:
    b = imported([MP], tmp_path / "b")
    raw = json.loads((tmp_path / "b" / "topology.json").read_text())
    assert {p["level_source"] for p in raw["pairs"]} == {"topo -mp"}
    assert raw["status"]["nvlink"].startswith("unknown: nvidia-smi topo -mp")
    topo = Topology.from_json(raw)
    assert topo.nvlink_hidden() and not topo.has_nvlink()
    card = load_card("glm5-nvfp4")
    doc = recommend(b, card, band=DecodeBand.of_card(card), layouts=False, write_files=False)
    said = json.dumps(doc.to_json())
    assert "no NVLink pair" not in said
    assert not [r for r in doc.recommendations if r.rule == "sglang_custom_ar"]


def test_topo_m_of_the_same_kind_still_says_no_nvlink(tmp_path: Path) -> None:
    """Control: a full `topo -m` of PCIe GPUs (levels only, no NV#) does let the rule speak."""
    b = imported([MP.parent / "topo_m_and_p2p_p_5gpu_5060ti_epyc_prompts.txt"], tmp_path / "b")
    card = load_card("glm5-nvfp4")
    doc = recommend(b, card, band=DecodeBand.of_card(card), layouts=False, write_files=False)
    (rec,) = [r for r in doc.recommendations if r.rule == "sglang_custom_ar"]
    assert "no NVLink pair in topology.json" in rec.evidence[1]
