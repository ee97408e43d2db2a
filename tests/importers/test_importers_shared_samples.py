"""Every file under ../shared/samples imports (`pcieprof import FILE --out DIR`) with the right
content: the cells of the bundle are checked against the file itself, read by the test."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.discover.from_logs import topology_from_logs
from pcieprof.importers.nccl_xml import parse_topo_xml
from pcieprof.importers.formats import parse_text
from pcieprof.importers.simple_p2p import COPY_BYTES, parse_simple_p2p
from pcieprof.importers.topology import merge_virtualization, skeleton

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
FOLDERS = ("tool-outputs", "tool-outputs-more", "rtxpro6000-8x-asus-baremetal")


def shared_files() -> list[str]:
    root = Path(__file__).resolve().parents[2].parent / "shared" / "samples"
    if not root.is_dir():
        return []
    return sorted(f"{d}/{p.name}" for d in FOLDERS for p in (root / d).iterdir()
                  if p.is_file() and p.name != "SOURCES.md")


def import_one(files: list[Path], out: Path) -> Path:
    r = cli("import", *map(str, files), "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    return out


def table(bundle: Path, name: str) -> list[dict[str, str]]:
    p = bundle / f"{name}.csv"
    if not p.exists():
        return []
    with p.open() as fh:
        return list(csv.DictReader(fh))


def matrices_of(text: str) -> dict[str, list[list[float]]]:
    """p2pBandwidthLatencyTest matrices read by the test: title -> rows of numbers (the first
    block under each title; the `CPU` latency block is left out, as it is no transfer)."""
    lines = text.splitlines()
    out: dict[str, list[list[float]]] = {}
    for i, l in enumerate(lines):
        s = l.strip()
        if s.endswith(("Matrix (GB/s)", "Matrix (us)")) or s == "P2P Connectivity Matrix":
            head = lines[i + 1].split()
            n = len(head) - 1
            out[s] = [[float(x) for x in lines[i + 2 + r].split()[1:]] for r in range(n)]
    return out


@pytest.mark.parametrize("rel", shared_files() or ["(no shared samples)"])
def test_every_shared_file_imports(samples: Path, tmp_path: Path, rel: str) -> None:
    f = samples / rel
    b = import_one([f], tmp_path / "b")
    manifest = json.loads((b / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    [entry] = manifest["parts"]["import"]["files"]
    assert entry["format"] != "" and entry["summary"]
    assert (b / "imported" / f.name).read_bytes() == f.read_bytes()


@pytest.mark.parametrize("name", ["p2pbwlat_2x4090_trpro5995wx_driver525_p2p_reported_but_broken.txt",
                                  "p2pbwlat_4xA100pcie_vm_pci_domains_nvlink_pairs.txt",
                                  "p2pbwlat_4x_rtx6000ada_asus_esc8000a_e12.txt"])
def test_p2pbwlat_every_cell_as_the_file_prints_it(samples: Path, tmp_path: Path, name: str) -> None:
    f = samples / "tool-outputs-more" / name
    text = f.read_text()
    b = import_one([f], tmp_path / "b")
    rows = table(b, "p2p")
    mats = matrices_of(text)
    assert len(mats) == 7  # Connectivity, 4 bandwidth, 2 latency
    access = {(int(a), int(c)): v == "CAN" for a, v, c in
              re.findall(r"Device=(\d+) (CAN|CANNOT) Access Peer Device=(\d+)", text)}
    n = len(mats["P2P Connectivity Matrix"])
    checked = 0
    for title, mat in mats.items():
        if "Connectivity" in title:
            continue
        for a in range(n):
            for c in range(n):
                if a == c:
                    continue
                [r] = [r for r in rows if f": {title}" in r["detail"] and
                       f"; row {a} col {c}" in r["detail"]]
                value = float(r["latency_us"] if "Latency" in title else r["bandwidth_gbps"])
                assert value == mat[a][c] and value > 0, (title, a, c)
                assert (int(r["src"]), int(r["dst"])) == (a, c)
                assert r["path"] == ("p2p" if "P2P=Enabled" in title else "host_staged")
                want = "not_supported" if "P2P=Enabled" in title and not access[(a, c)] else "ok"
                assert r["status"] == want, (title, a, c)
                checked += 1
    assert checked == len(rows) == 6 * n * (n - 1)


def test_broken_4090_directions_and_simplep2p(samples: Path, tmp_path: Path) -> None:
    more = samples / "tool-outputs-more"
    files = [more / "p2pbwlat_2x4090_trpro5995wx_driver525_p2p_reported_but_broken.txt",
             more / "simpleP2P_2x4090_trpro5995wx_driver525_nan_verification.txt"]
    b = import_one(files, tmp_path / "b")
    rows = table(b, "p2p")
    uni = {(r["src"], r["dst"]): float(r["bandwidth_gbps"]) for r in rows
           if "Unidirectional P2P=Enabled" in r["detail"]}
    assert uni == {("0", "1"): 27.07, ("1", "0"): 11.46}
    # both latency matrices, P2P=Enabled and Disabled
    lat = {(r["path"], r["src"], r["dst"]): float(r["latency_us"]) for r in rows
           if r["latency_us"]}
    assert lat[("p2p", "0", "1")] == 1.14 and lat[("host_staged", "1", "0")] == 11.66
    [copy] = [r for r in rows if "simpleP2P" in r["detail"]]
    assert copy["status"] == "error" and int(copy["size_bytes"]) == COPY_BYTES
    assert float(copy["bandwidth_gbps"]) == pytest.approx(10.39 * 2**30 / 1e9)
    assert "verification FAILED" in copy["detail"] and "val = nan" in copy["detail"]
    facts = json.loads((b / "manifest.json").read_text())["parts"]["import"]["files"][1]["facts"]
    assert facts["verification"] == {"result": "failed", "errors_shown": 12, "first_errors": [
        "element 0: val = nan, ref = 0.000000", "element 1: val = nan, ref = 4.000000",
        "element 2: val = nan, ref = 8.000000"]}
    assert facts["peer_access"] == {"0->1": True, "1->0": True}
    assert all(float(r["bandwidth_gbps"] or 1) != 0.0 for r in rows)


def test_simplep2p_verdicts_built_from_the_real_run(samples: Path) -> None:
    text = (samples / "tool-outputs-more/simpleP2P_2x4090_trpro5995wx_driver525_nan_verification.txt"
            ).read_text()
    ok = "\n".join(l for l in text.splitlines() if not l.startswith("Verification error"))
    passed = parse_simple_p2p(ok.replace("Test failed!", "Test passed"), "ok.txt")
    assert passed.facts["verification"]["result"] == "passed" and passed.p2p[0].status == "ok"
    cut = text.split("Disabling peer access")[0]  # the paste stops after the errors
    assert parse_simple_p2p(cut, "cut.txt").facts["verification"]["result"] == "failed"


def test_vm_with_pci_domains_is_a_flat_virtual_tree(samples: Path, tmp_path: Path) -> None:
    f = samples / "tool-outputs-more/p2pbwlat_4xA100pcie_vm_pci_domains_nvlink_pairs.txt"
    b = import_one([f], tmp_path / "b")
    topo = json.loads((b / "topology.json").read_text())
    assert [g["bus_id"] for g in topo["gpus"]] == [f"000{i}:00:00.0" for i in range(1, 5)]
    v = topo["virtualization"]
    assert v["flat_pcie_tree"] is True and v["is_vm"] is True
    assert any("bus 00, each in a PCI domain of its own (0001, 0002, 0003, 0004)" in e
               for e in v["evidence"])
    # NVLink-bridge pairs 0-1 and 2-3: P2P over the pair, staged copies (not 0 GB/s) elsewhere
    rows = table(b, "p2p")
    enabled = {(r["src"], r["dst"]): (float(r["bandwidth_gbps"]), r["status"]) for r in rows
               if "Unidirectional P2P=Enabled" in r["detail"]}
    assert enabled[("0", "1")] == (275.07, "ok") and enabled[("2", "3")] == (275.34, "ok")
    assert enabled[("0", "2")] == (21.62, "not_supported")


@pytest.mark.parametrize("rel", ["tool-outputs/nccl_topo_azure_ncv4_4xA100pcie_vm.xml",
                                 "data:nccl_topo_dump_vm_4xA800_numaid_minus1.xml"])
def test_nccl_xml_made_in_a_vm(samples: Path, tmp_path: Path, rel: str) -> None:
    f = DATA / rel[5:] if rel.startswith("data:") else samples / rel
    doc = parse_topo_xml(f.read_text(), f.name)
    assert doc.virtual_tree.flat is True
    ev = " | ".join(doc.virtual_tree.evidence)
    assert "sits on bus 00" in ev and 'link_speed="" and link_width="0" on every GPU' in ev
    b = import_one([f], tmp_path / "b")
    topo = json.loads((b / "topology.json").read_text())
    assert topo["virtualization"]["flat_pcie_tree"] is True
    assert topo["virtualization"]["is_vm"] is True
    if "numaid_minus1" in rel:
        assert 'numaid="-1"' in ev
        assert [g["numa_node"] for g in topo["gpus"]] == [None] * 4  # not -1
        assert [g["bus_id"] for g in topo["gpus"]] == ["0000:00:09.0", "0000:00:0a.0",
                                                       "0000:00:0b.0", "0000:00:0c.0"]


def test_bare_metal_files_are_not_called_flat(samples: Path, tmp_path: Path) -> None:
    box = samples / "rtxpro6000-8x-asus-baremetal"
    b = import_one(sorted(p for p in box.iterdir() if p.suffix == ".log"), tmp_path / "b")
    v = json.loads((b / "topology.json").read_text())["virtualization"]
    assert v["flat_pcie_tree"] is False and v["is_vm"] is False
    f = samples / "tool-outputs-more/p2pbwlat_4x_rtx6000ada_asus_esc8000a_e12.txt"
    v = json.loads((import_one([f], tmp_path / "c") / "topology.json").read_text())["virtualization"]
    assert v["flat_pcie_tree"] is None


def test_lspci_of_a_vm_is_flat(samples: Path) -> None:
    """The ASUS box's real GPU blocks of `lspci -vvv`, re-addressed as a Hyper-V guest shows them
    (each GPU at bus 00 of a PCI domain of its own, no bridge listed): recorded data replayed
    at other addresses, the way discovery sees a flat virtual tree."""
    text = (samples / "rtxpro6000-8x-asus-baremetal/lspci_full.log").read_text()
    blocks = [b for b in text.split("\n\n") if re.match(r"^[0-9a-f:.]+ (3D|VGA).*NVIDIA", b)][:2]
    assert len(blocks) == 2
    vm = "\n\n".join(re.sub(r"^[0-9a-f:]+:[0-9a-f]{2}\.0", f"000{i + 1}:00:00.0", blk)
                     for i, blk in enumerate(blocks)) + "\n\n"
    topo = topology_from_logs(lspci=vm, names={"lspci": "vm_lspci.log"})
    v = topo["virtualization"]
    assert v["flat_pcie_tree"] is True
    assert any("root buses 0001:00, 0002:00" in e for e in v["evidence"])


def test_topo_m_says_flat_only_with_a_vm(samples: Path) -> None:
    f = samples / "tool-outputs/topo_m_5gpu_5060ti_5070_proxmox_host.txt"
    parsed = parse_text(f.read_text(), f.name)
    bare = skeleton()
    merge_virtualization(bare, [parsed])
    assert bare["virtualization"]["flat_pcie_tree"] is None
    assert "not decided from topo -m alone" in bare["virtualization"]["evidence"][0]
    vm = skeleton()
    vm["virtualization"]["is_vm"] = True
    merge_virtualization(vm, [parsed])
    assert vm["virtualization"]["flat_pcie_tree"] is True
    assert "no GPU pair below a PCIe switch or bridge (levels PHB)" in vm["virtualization"]["evidence"][0]
