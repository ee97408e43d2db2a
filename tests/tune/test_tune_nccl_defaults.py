"""Findings on NODE/SYS/PHB boxes say what NCCL does there by default (paths.cc: P2P up to PXB,
the AMD two-GPU exception); an NVLink pair with fewer links than its siblings is flagged; NVLink
levels are listed by their own pairs, not cumulatively. Real files: the 4x RTX 6000 Ada box
(NODE/SYS) and the 5-GPU Proxmox host (all PHB) of ../shared/samples, the 4x H100 NV6 paste of
tests/data/importers; the NV-deficit case is that H100 file with one pair's two cells changed
(no public paste of an NV17 box was found), the test says so where it does it."""

from __future__ import annotations

import re
from pathlib import Path

from builders.bundles import imported

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.infer import NVLINK, infer
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.bundle.topology import Topology
from pcieprof.cards import load_card
from pcieprof.tune.recommend import recommend

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
ADA = "tool-outputs-more/topo_m_4x_rtx6000ada_asus_esc8000a_e12_4nic.txt"
PROXMOX = "tool-outputs/topo_m_5gpu_5060ti_5070_proxmox_host.txt"
H100 = DATA / "topo_m_4xH100_nv6_4nic_markdown.txt"


def tuned(path: Path, out: Path) -> Recommendations:
    card = load_card("glm5-nvfp4")
    return recommend(imported([path], out), card, band=DecodeBand.of_card(card), layouts=False,
                     write_files=False)


def gpu_levels(text: str) -> dict[tuple[int, int], str]:
    rows = [ln.split() for ln in text.splitlines() if re.match(r"^GPU\d+\s", ln)]
    n = len(rows)
    return {(a, b): rows[a][1 + b] for a in range(n) for b in range(n) if a != b}


def test_node_sys_box_says_what_nccl_does(samples: Path, tmp_path: Path) -> None:
    text = (samples / ADA).read_text()
    far = sorted((a, b) for (a, b), lv in gpu_levels(text).items()
                 if a < b and lv in ("PHB", "NODE", "SYS"))
    (card,) = [r for r in tuned(samples / ADA, tmp_path / "b").recommendations
               if r.rule == "p2p_levels"]
    note = card.evidence[1]  # the console shows a card's first two evidence lines
    assert "src/graph/paths.cc" in note and "only up to PXB" in note and "SHM" in note
    assert f"{len(far)} pair(s)" in note and "NCCL_P2P_LEVEL=SYS" in note
    assert "AMD" in note and "two GPUs only" in note


def test_all_phb_box_names_the_flat_picture(samples: Path, tmp_path: Path) -> None:
    (card,) = [r for r in tuned(samples / PROXMOX, tmp_path / "b").recommendations
               if r.rule == "p2p_levels"]
    assert "none within PXB" in card.evidence[1] and "VM" in card.evidence[1]


def test_nv_deficit_flagged_and_levels_not_cumulative(tmp_path: Path) -> None:
    text = H100.read_text()
    assert not [r for r in tuned(H100, tmp_path / "real").recommendations
                if r.rule == "nvlink_links"]
    # The real matrix with pair 0-1 at one link fewer, both of its cells (a link down).
    n = int(re.search(r"NV(\d+)", text).group(1))  # type: ignore[union-attr]
    rows = text.splitlines()
    for k, ln in enumerate(rows):
        if re.match(r"^GPU[01]\s", ln):
            cells = ln.split(f"NV{n}", 1)
            rows[k] = cells[0] + f"NV{n - 1}" + cells[1]
    variant = tmp_path / "nv_short.txt"
    variant.write_text("\n".join(rows) + "\n")
    doc = tuned(variant, tmp_path / "b")
    (card,) = [r for r in doc.recommendations if r.rule == "nvlink_links"]
    assert card.kind == "warn" and f"0-1 NV{n - 1}" in card.title and f"NV{n}" in card.title
    assert "nvidia-smi nvlink --status -i 0" in card.action
    b = Bundle.open(tmp_path / "b")
    t = infer(b.read_table("p2p"), None, b.read_doc(Topology))
    assert t is not None
    nv = {lv.smi_level: k for k, lv in enumerate(t.levels) if lv.kind == NVLINK}
    assert t.where(nv[f"NV{n - 1}"]) == "groups 0,1"  # its own pair, not every GPU
    assert t.where(nv[f"NV{n}"]).startswith("pairs ")


def test_mixed_counts_by_design_are_not_flagged(tmp_path: Path) -> None:
    """NVLinked pairs beside PCIe pairs (the 4x3090 bridge pairs): one count, nothing short."""
    doc = tuned(DATA / "topo_m_4x3090_nvlink_pairs_prompt.txt", tmp_path / "b")
    assert not [r for r in doc.recommendations if r.rule == "nvlink_links"]
