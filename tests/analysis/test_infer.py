"""The fabric inference (pcieprof.analysis.infer) on every real `nvidia-smi topo -m` and P2P matrix
the project holds (../shared/samples and tests/data/importers), each as the file has it and with
its matrices transposed: the invariants every box must keep, and the levels of the boxes whose
structure the files themselves show (values read from the files by the test)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from builders.bundles import imported, transposed

from pcieprof.analysis.infer import NO_P2P, NVLINK, PCIE, InferredTopology, infer
from pcieprof.analysis.matrices import gpu_indices, pair_matrix, pair_support
from pcieprof.bundle import Bundle
from pcieprof.bundle.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "importers"
SHARED = ROOT.parent.parent / "shared" / "samples"
#: Files holding a GPU x GPU matrix: topo -m levels, p2pBandwidthLatencyTest, nvbandwidth.
MATRIX_NAME = re.compile(r"^(topo_m|p2pbwlat|nvbandwidth|nvidia_topo)")


def matrix_files() -> list[str]:
    found = [p for p in sorted(DATA.iterdir()) if MATRIX_NAME.match(p.name)]
    if SHARED.is_dir():
        for d in ("tool-outputs", "tool-outputs-more", "rtxpro6000-8x-asus-baremetal"):
            found += [p for p in sorted((SHARED / d).iterdir()) if MATRIX_NAME.match(p.name)]
    return [str(p) for p in found]


def inferred(b: Bundle) -> InferredTopology | None:
    return infer(b.read_table("p2p"), b.read_table("allreduce"), b.read_doc(Topology))


def check_invariants(t: InferredTopology, b: Bundle) -> None:
    kinds = [lv.kind for lv in t.levels]
    assert kinds == sorted(kinds, key=(NVLINK, PCIE, NO_P2P).index), kinds
    seen: set[tuple[int, int]] = set()
    for lv in t.levels:
        assert not seen & set(lv.pairs), "a pair in two levels"
        seen |= set(lv.pairs)
        if not t.measured:
            assert lv.value is None
        elif lv.kind == NO_P2P:  # no P2P is a fact even where no copy through the host ran
            assert lv.value is None or lv.value > 0, f"{lv.name}: {lv.value}"
        else:
            assert lv.value is not None and lv.value > 0, f"{lv.name}: {lv.value}"
    assert t.levels[-1].groups == [sorted({g for p in seen for g in p})]
    pcie = [lv.value for lv in t.pcie_levels() if lv.value is not None]
    fastest_first = sorted(pcie, reverse=t.unit == "GB/s")
    assert pcie == fastest_first
    topo = b.read_doc(Topology) or Topology()
    for (a, c), level in topo.levels().items():
        if a < c and level.startswith("NV") and (a, c) in seen:
            assert t.kind_of(a, c) in (NVLINK, NO_P2P)
    for (a, c), status in pair_support(b.read_table("p2p")).items():
        if status == "not_supported":
            assert t.kind_of(a, c) == NO_P2P, (a, c)


@pytest.mark.parametrize("path", matrix_files(), ids=lambda p: Path(p).name)
def test_levels_keep_their_invariants_as_read_and_transposed(path: str, tmp_path: Path) -> None:
    b = imported([Path(path)], tmp_path / "b")
    t = inferred(b)
    p2p = b.read_table("p2p")
    gpus = gpu_indices(p2p)
    has_rows = any(np.isfinite(pair_matrix(p2p, path="p2p", metric=m, gpus=gpus)).any()
                   for m in ("bandwidth_gbps", "latency_us")) if gpus else False
    has_levels = bool((b.read_doc(Topology) or Topology()).levels())
    if not (has_rows or has_levels):  # nvbandwidth host<->device only, or a waived case
        assert t is None
        return
    assert t is not None
    check_invariants(t, b)
    if has_rows:
        bt = transposed(b, tmp_path / "t")
        tt = inferred(bt)
        assert tt is not None
        check_invariants(tt, bt)
        # a level is a property of the pair, whichever way its copies ran
        assert [(lv.kind, lv.pairs) for lv in tt.levels] == [(lv.kind, lv.pairs) for lv in t.levels]


def _rows_of(text: str, title: str) -> list[list[float]]:
    """A p2pBandwidthLatencyTest matrix read by the test: the rows under `title`."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip() == title)
    n = len(lines[i + 1].split()) - 1
    return [[float(x) for x in lines[i + 2 + r].split()[1:]] for r in range(n)]


def test_vm_with_nvlink_pairs_shows_two_levels(samples: Path, tmp_path: Path) -> None:
    f = samples / "tool-outputs-more" / "p2pbwlat_4xA100pcie_vm_pci_domains_nvlink_pairs.txt"
    text = f.read_text()
    conn = _rows_of(text, "P2P Connectivity Matrix")
    peer = _rows_of(text, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)")
    staged = _rows_of(text, "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)")
    t = inferred(imported([f], tmp_path / "b"))
    assert t is not None
    assert [lv.kind for lv in t.levels] == [NVLINK, NO_P2P]
    nv, none = t.levels
    connected = [(a, b) for a in range(4) for b in range(a + 1, 4) if conn[a][b]]
    assert nv.pairs == connected == [(0, 1), (2, 3)]
    assert nv.groups == [[0, 1], [2, 3]] and none.groups == [[0, 1, 2, 3]]
    assert none.pairs == [(a, b) for a in range(4) for b in range(a + 1, 4) if not conn[a][b]]
    # NVLink at the slower direction of its pairs; no P2P at the pairs' copy through host memory
    assert nv.value == pytest.approx(np.median([min(peer[a][b], peer[b][a]) for a, b in nv.pairs]))
    assert none.value == pytest.approx(
        np.median([min(staged[a][b], staged[b][a]) for a, b in none.pairs]))
    assert none.value > 20 and nv.smi_level == "NV#"
    assert any("NVLink" in e for e in t.evidence)
    assert any("flat virtual PCIe tree" in e and "PCI domain" in e for e in t.evidence)
    assert not t.hidden_structure and t.switch_groups() == [[0, 1, 2, 3]]


def test_latency_spread_makes_no_level(samples: Path, tmp_path: Path) -> None:
    """4x RTX 6000 Ada: P2P latencies 1.21-1.44 us, one pair's two directions up to 0.12 us
    apart: no level there, and nvidia-smi's NODE/SYS split is said to be equally fast."""
    more = samples / "tool-outputs-more"
    p2p = more / "p2pbwlat_4x_rtx6000ada_asus_esc8000a_e12.txt"
    topo = more / "topo_m_4x_rtx6000ada_asus_esc8000a_e12_4nic.txt"
    lat = _rows_of(p2p.read_text(), "P2P=Enabled Latency (P2P Writes) Matrix (us)")
    assert max(abs(lat[a][b] - lat[b][a]) for a in range(4) for b in range(4)) > 0.1
    t = inferred(imported([p2p, topo], tmp_path / "b"))
    assert t is not None and len(t.levels) == 1 and t.levels[0].kind == PCIE
    assert t.levels[0].smi_level == "SYS"  # the farthest nvidia-smi level among its pairs
    assert any("NODE, SYS" in e and "equally fast" in e for e in t.evidence)


def test_topo_m_alone_gives_nvidia_smis_levels(tmp_path: Path) -> None:
    t = inferred(imported([DATA / "topo_m_4x3090_nvlink_pairs_prompt.txt"], tmp_path / "b"))
    assert t is not None and not t.measured and t.metric == "topology levels"
    assert [(lv.kind, lv.smi_level, lv.pairs) for lv in t.levels] == [
        (NVLINK, "NV4", [(0, 2), (1, 3)]), (PCIE, "PHB", [(0, 1), (2, 3)]),
        (PCIE, "NODE", [(0, 3), (1, 2)])]
    assert t.where(1) == "groups 0,1 | 2,3"
    assert t.where(2) == "pairs 0-3, 1-2"  # NODE pairs alone do not join a group


def test_gpu_without_p2p_is_its_own_group(samples: Path, tmp_path: Path) -> None:
    f = samples / "tool-outputs" / "p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"
    t = inferred(imported([f], tmp_path / "b"))
    assert t is not None
    assert [lv.kind for lv in t.levels] == [PCIE, NO_P2P]
    assert t.levels[0].groups == [[0], [1, 2, 3, 4]]
    assert t.levels[1].pairs == [(0, 1), (0, 2), (0, 3), (0, 4)]


def _no_peer_bundle(path: Path, staged: bool) -> Bundle:
    """Three GPUs, none with peer access (a consumer box without a P2P driver): the p2p rows are
    not_supported, with host-staged copies or without any copy."""
    b = Bundle.create(path, command="topology", source="measured", backend="cuda")
    rows = []
    for s in range(3):
        for d in range(3):
            if s != d:
                rows.append({"backend": "cuda", "src": s, "dst": d, "path": "p2p",
                             "direction": "uni", "size_bytes": 256 << 20,
                             "status": "not_supported", "detail": "no peer access"})
                if staged:
                    rows.append({"backend": "cuda", "src": s, "dst": d, "path": "host_staged",
                                 "direction": "uni", "size_bytes": 256 << 20,
                                 "bandwidth_gbps": 20.0 + s + d})
    b.append_rows("p2p", rows)
    return b


@pytest.mark.parametrize("staged", [True, False])
def test_no_peer_access_anywhere_is_one_level(tmp_path: Path, staged: bool) -> None:
    t = inferred(_no_peer_bundle(tmp_path / "b", staged))
    assert t is not None and [lv.kind for lv in t.levels] == [NO_P2P]
    (lv,) = t.levels
    assert lv.pairs == [(0, 1), (0, 2), (1, 2)] and lv.groups == [[0, 1, 2]]
    # the median pair (20 + s + d GB/s: 21, 22, 23) through host memory; never 0
    assert lv.value == (pytest.approx(22.0) if staged else None)
