"""The finding rules (p2p_asymmetry, p2p_below_staged, p2p_support_mismatch, p2p_levels,
p2p_data_errors) on the real files of the boxes they are about, on the same files with every
copy's direction reversed, and on rows built to sit on either side of the measurement spread.
Numbers the assertions compare against are read from the files by the test."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders.bundles import imported, transposed

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendation, Recommendations
from pcieprof.cards import load_card
from pcieprof.tune.recommend import recommend

MORE = "tool-outputs-more"
P2P_4090 = f"{MORE}/p2pbwlat_2x4090_trpro5995wx_driver525_p2p_reported_but_broken.txt"
SIMPLE_4090 = f"{MORE}/simpleP2P_2x4090_trpro5995wx_driver525_nan_verification.txt"
A100_VM = f"{MORE}/p2pbwlat_4xA100pcie_vm_pci_domains_nvlink_pairs.txt"
ADA = f"{MORE}/p2pbwlat_4x_rtx6000ada_asus_esc8000a_e12.txt"
FIVE = "tool-outputs/p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"
FIVE_TOPO_P2P = "tool-outputs/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt"
FIVE_TOPO_M = "tool-outputs/topo_m_5gpu_5060ti_5070_proxmox_host.txt"
READS_6GPU = Path(__file__).resolve().parents[1] / "data" / "importers" / \
    "p2pbwlat_6gpu_sections_with_p2p_reads.txt"
UNI_WRITES = "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)"
UNI_STAGED = "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)"


def matrix(text: str, title: str) -> list[list[float]]:
    """A p2pBandwidthLatencyTest matrix as the test reads it: the rows under `title`."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip() == title)
    n = len(lines[i + 1].split()) - 1
    return [[float(x) for x in lines[i + 2 + r].split()[1:]] for r in range(n)]


def tuned(b: Bundle) -> Recommendations:
    card = load_card("glm5-nvfp4")
    return recommend(b, card, band=DecodeBand.of_card(card), layouts=False, write_files=False)


def by_rule(doc: Recommendations, rule: str) -> list[Recommendation]:
    return [r for r in doc.recommendations if r.rule == rule]


def test_asymmetry_on_the_broken_4090_box_and_its_transpose(samples: Path, tmp_path: Path) -> None:
    f = samples / P2P_4090
    w = matrix(f.read_text(), UNI_WRITES)
    b = imported([f], tmp_path / "b")
    (rec,) = by_rule(tuned(b), "p2p_asymmetry")
    assert rec.kind == "warn" and "likely broken" in rec.title
    assert f"0->1 moves {w[0][1]:.1f} GB/s but 1->0 only {w[1][0]:.1f} GB/s" in rec.title
    assert f"{w[0][1] / w[1][0]:.1f}x" in rec.title
    assert "simpleP2P" in rec.action and any("spread" in e for e in rec.evidence)
    doc = tuned(b)
    assert doc.bottleneck.startswith(rec.title)  # nothing measured outranks it
    (rt,) = by_rule(tuned(transposed(b, tmp_path / "t")), "p2p_asymmetry")
    assert f"1->0 moves {w[0][1]:.1f} GB/s but 0->1 only {w[1][0]:.1f} GB/s" in rt.title


@pytest.mark.parametrize("rel", [A100_VM, ADA, FIVE])
def test_no_asymmetry_where_directions_agree(samples: Path, tmp_path: Path, rel: str) -> None:
    b = imported([samples / rel], tmp_path / "b")
    assert not by_rule(tuned(b), "p2p_asymmetry")
    assert not by_rule(tuned(transposed(b, tmp_path / "t")), "p2p_asymmetry")


def _two_gpu_trials(path: Path, fast: tuple[float, float, float],
                    slow: tuple[float, float, float]) -> Bundle:
    """Two GPUs measured with repeated trials: (median, min, max) GB/s each way."""
    b = Bundle.create(path, command="topology", source="measured", backend="cuda")
    rows = []
    for (s, d), (v, lo, hi) in (((0, 1), fast), ((1, 0), slow)):
        rows.append({"backend": "cuda", "src": s, "dst": d, "path": "p2p", "direction": "uni",
                     "size_bytes": 256 << 20, "bandwidth_gbps": v, "bandwidth_gbps_min": lo,
                     "bandwidth_gbps_max": hi, "iters": 20, "trials": 5})
    b.append_rows("p2p", rows)
    return b


def test_asymmetry_needs_trials_that_do_not_overlap(tmp_path: Path) -> None:
    apart = _two_gpu_trials(tmp_path / "apart", (30.0, 29.0, 31.0), (20.0, 19.5, 20.5))
    assert by_rule(tuned(apart), "p2p_asymmetry")
    overlap = _two_gpu_trials(tmp_path / "overlap", (30.0, 20.0, 40.0), (25.0, 22.0, 28.0))
    assert not by_rule(tuned(overlap), "p2p_asymmetry")
    # a wide spread raises the bar: 1.3x apart with trials spreading 40% is no finding
    wide = _two_gpu_trials(tmp_path / "wide", (26.0, 21.0, 31.5), (20.0, 16.0, 20.9))
    assert not by_rule(tuned(wide), "p2p_asymmetry")


def test_p2p_slower_than_staging(samples: Path, tmp_path: Path) -> None:
    f = samples / P2P_4090
    text = f.read_text()
    w, st = matrix(text, UNI_WRITES), matrix(text, UNI_STAGED)
    (rec,) = by_rule(tuned(imported([f], tmp_path / "b")), "p2p_below_staged")
    assert (f"P2P 1->0 ({w[1][0]:.1f} GB/s) is slower than the same copy through host memory "
            f"({st[1][0]:.1f} GB/s)") in rec.title
    assert w[0][1] > st[0][1]  # the other direction is faster than staging: not named
    assert "0->1" not in rec.title and "NCCL_P2P_DISABLE=1 all_reduce_perf" in rec.action
    # NVIDIA/nccl issue #814: every P2P write (and read) slower than the staged copy
    text6 = READS_6GPU.read_text()
    w6, st6 = matrix(text6, UNI_WRITES), matrix(text6, UNI_STAGED)
    assert all(w6[a][b] < st6[a][b] for a in range(6) for b in range(6) if a != b)
    (rec6,) = by_rule(tuned(imported([READS_6GPU], tmp_path / "six")), "p2p_below_staged")
    assert "on 30 of 30 GPU directions" in rec6.title


@pytest.mark.parametrize("rel", [A100_VM, ADA, FIVE])
def test_no_below_staged_where_p2p_keeps_up(samples: Path, tmp_path: Path, rel: str) -> None:
    assert not by_rule(tuned(imported([samples / rel], tmp_path / "b")), "p2p_below_staged")


def test_not_supported_where_nvidia_smi_says_ok(samples: Path, tmp_path: Path) -> None:
    f = samples / FIVE
    lines = f.read_text().splitlines()
    cannot = sorted((int(l.split("=")[1].split()[0]), int(l.rsplit("=", 1)[1]))
                    for l in lines if "CANNOT Access Peer" in l)
    rows = [l.split()[1:] for l in (samples / FIVE_TOPO_P2P).read_text().splitlines()
            if l.split()[:1] and l.split()[0].startswith("GPU") and "X" in l.split()]
    assert sorted({c for r in rows for c in r}) == ["OK", "X"] and len(rows) == 5
    b = imported([f, samples / FIVE_TOPO_P2P, samples / FIVE_TOPO_M], tmp_path / "b")
    (rec,) = by_rule(tuned(b), "p2p_support_mismatch")
    assert f"No peer access on {len(cannot)} GPU direction(s)" in rec.title
    assert ", ".join(f"{a}->{b}" for a, b in cannot) in rec.title
    assert "read OK, write OK" in rec.evidence[0] and "cudaDeviceCanAccessPeer" not in rec.title
    # without nvidia-smi's word there is nothing to disagree with
    alone = imported([f], tmp_path / "alone")
    assert not by_rule(tuned(alone), "p2p_support_mismatch")


def test_nvlink_pairs_without_p2p_across(samples: Path, tmp_path: Path) -> None:
    f = samples / A100_VM
    doc = tuned(imported([f], tmp_path / "b"))
    (rec,) = by_rule(doc, "p2p_levels")
    assert rec.kind == "warn"
    assert rec.title.startswith("4 of 6 GPU pairs have no P2P (0-2, 0-3, 1-2, 1-3)")
    assert "P2P only within 0,1 | 2,3 (NVLink 275 GB/s)" in rec.title
    assert doc.bottleneck.startswith(rec.title)
    assert doc.inferred is not None and [lv["kind"] for lv in doc.inferred["levels"]] == \
        ["nvlink", "no_p2p"]
    # the ring over all four crosses two pairs without P2P: through host memory, never 0 GB/s
    staged = matrix(f.read_text(), UNI_STAGED)
    assert doc.ring is not None
    assert doc.ring.bottleneck_gbps == pytest.approx(min(
        staged[a][b] for a in range(4) for b in range(4) if a != b and {a, b} not in
        ({0, 1}, {2, 3})), abs=0.3)
    custom_ar = by_rule(doc, "sglang_custom_ar")
    assert custom_ar and "NVLink only between 0-1, 2-3" in custom_ar[0].evidence[1]


def test_data_error_with_the_matrix_of_the_same_box(samples: Path, tmp_path: Path) -> None:
    b = imported([samples / P2P_4090, samples / SIMPLE_4090], tmp_path / "b")
    doc = tuned(b)
    assert [r.rule for r in doc.recommendations[:3]] == \
        ["p2p_data_errors", "p2p_asymmetry", "p2p_below_staged"]
    err = doc.recommendations[0]
    assert err.env == {"NCCL_P2P_DISABLE": "1"}
    assert "verification FAILED" in err.evidence[0]
    assert any(c.startswith("likely:") for c in err.caveats)
    assert any(c.startswith("next:") and "simpleP2P" in c for c in err.caveats)
    assert doc.bottleneck.startswith("P2P between GPUs is broken")
