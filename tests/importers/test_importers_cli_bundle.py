"""`pcieprof import`: every shared tool output becomes a bundle whose numbers match the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.bundle import Bundle

TOOL = "tool-outputs"


def run_import(files: list[Path], out: Path, *, check: bool = True) -> tuple[Bundle, str]:
    """`pcieprof import files --out out`: the bundle and stdout; with `check`, its provenance
    checked (`check_provenance`)."""
    r = cli("import", *map(str, files), "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    b = Bundle.open(out)
    if check:
        check_provenance(b, files)
    return b, r.stdout


def check_provenance(b: Bundle, files: list[Path]) -> None:
    m = b.manifest
    assert (m.source, m.backend, m.status, m.command) == ("imported", "imported", "ok", "import")
    for f in files:
        assert (b.path / "imported" / f.name).read_bytes() == f.read_bytes()
        assert f"imported/{f.name}" in m.files
    topo = b.read_json("topology.json")
    assert topo["source"] == "imported"
    for table in ("p2p", "allreduce", "concurrent"):
        df = b.read_table(table)
        assert set(df["backend"]) <= {"imported"}


def test_topo_m_8x_server(samples: Path, tmp_path: Path) -> None:
    f = samples / TOOL / "topo_m_8x_rtxpro6000_server_baremetal_broadcom.txt"
    b, out = run_import([f], tmp_path / "b")
    topo = b.read_json("topology.json")
    level = {(p["a"], p["b"]): p["level"] for p in topo["pairs"]}
    # cells as the file prints them: GPU0 row "X PIX NODE NODE SYS ...", GPU6 row "... NODE NODE X PIX"
    row0 = f.read_text().splitlines()[1].split("\t")
    assert [level[(0, b_)] for b_ in range(1, 8)] == [c.strip() for c in row0[2:9]]
    assert (level[(0, 1)], level[(0, 2)], level[(3, 4)], level[(6, 7)]) == ("PIX", "NODE", "SYS", "PIX")
    gpus = {g["index"]: g for g in topo["gpus"]}
    assert (gpus[4]["cpu_affinity"], gpus[4]["numa_node"]) == ("64-127,192-238", 1)
    assert (gpus[0]["cpu_affinity"], gpus[0]["numa_node"]) == ("0-63,128-191", 0)
    assert "8 GPUs" in out


def test_topo_m_and_p2p_of_one_box(samples: Path, tmp_path: Path) -> None:
    files = [samples / TOOL / "topo_m_5gpu_5060ti_5070_proxmox_host.txt",
             samples / TOOL / "topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt"]
    b, _out = run_import(files, tmp_path / "b")
    pairs = {(p["a"], p["b"]): p for p in b.read_json("topology.json")["pairs"]}
    assert len(pairs) == 20
    assert all(p["level"] == "PHB" for p in pairs.values())
    assert pairs[(3, 1)]["p2p"] == {"read": "OK", "write": "OK", "atomics": None}
    assert pairs[(3, 1)]["status"] == {"p2p": "unknown"}  # atomics were not asked


def test_p2p_bandwidth_latency(samples: Path, tmp_path: Path) -> None:
    f = samples / TOOL / "p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"
    b, out = run_import([f], tmp_path / "b")
    df = b.read_table("p2p")
    assert len(df) == 120  # off-diagonal cells of 4 bandwidth matrices and 2 GPU latency blocks

    def value(matrix: str, row: int, col: int, column: str) -> float:
        sel = df[df["detail"].str.contains(matrix, regex=False)
                 & df["detail"].str.contains(f"; row {row} col {col}", regex=False)]
        assert len(sel) == 1
        return float(sel.iloc[0][column])

    lines = f.read_text().splitlines()
    i = lines.index("Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)")
    row3 = lines[i + 2 + 3].split()  # header, then rows 0..4
    assert value("Bidirectional P2P=Enabled Bandwidth Matrix", 3, 1, "bandwidth_gbps") == float(row3[2])
    assert value("Unidirectional P2P=Disabled Bandwidth Matrix", 0, 4, "bandwidth_gbps") == 3.42
    assert value("P2P=Enabled Latency (P2P Writes) Matrix (us) GPU", 2, 3, "latency_us") == 0.50
    cpu = b.part("import").extra["files"][0]["facts"]["cpu_latency_us"]
    assert cpu["P2P=Disabled Latency Matrix (us)"][1][0] == 8.39
    uni = df[(df["path"] == "p2p") & (df["direction"] == "uni") & df["bandwidth_gbps"].notna()]
    assert len(uni) == 20
    topo = b.read_json("topology.json")
    assert [g["bus_id"] for g in topo["gpus"]] == ["0000:04:00.0", "0000:09:00.0", "0000:0a:00.0",
                                                  "0000:0b:00.0", "0000:0c:00.0"]
    assert b.part("p2p").status == "ok" and b.part("p2p").source == "imported"


def test_all_reduce_perf(samples: Path, tmp_path: Path) -> None:
    f = samples / TOOL / "all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt"
    b, out = run_import([f], tmp_path / "b")
    df = b.read_table("allreduce")
    row = next(l for l in f.read_text().splitlines() if l.strip().startswith("33554432")).split()
    got = {r["variant"]: r for r in df.to_dict("records")}
    o, i = got["imported:out_of_place"], got["imported:in_place"]
    assert (o["size_bytes"], o["nranks"], o["ranks"], o["dtype"]) == (33554432, 6, (0, 1, 2, 3, 4, 5), "fp32")
    assert (o["time_us"], o["algbw_gbps"], o["busbw_gbps"]) == tuple(map(float, row[5:8]))
    assert (i["time_us"], i["algbw_gbps"], i["busbw_gbps"]) == tuple(map(float, row[9:12]))
    assert o["iters"] == 20 and o["status"] == "ok"
    facts = b.part("import").extra["files"][0]["facts"]
    assert facts["runs"][0]["avg_busbw_gbps"] == 24.5413
    names = {g["index"]: g["name"] for g in b.read_json("topology.json")["gpus"]}
    assert names[5] == "NVIDIA GeForce RTX 4090"


def test_nccl_debug_log(samples: Path, tmp_path: Path) -> None:
    f = samples / TOOL / "nccl_debug_info_4x5060ti_p2p_cumem.log"
    b, out = run_import([f], tmp_path / "b")
    choices = b.read_json("nccl_choices.json")
    entry = choices[f"imported:{f.name}"]
    assert entry["log"] == f"imported/{f.name}" and entry["ranks"] == [0, 1, 2, 3]
    parsed = entry["parsed"]
    assert parsed["nccl_version"] == "2.28.9+cuda13.0"
    assert parsed["rings"]["0"] == [0, 1, 2, 3] and parsed["peer_transport"]["0->1"] == "P2P/CUMEM"
    assert b.manifest.versions["nccl"] == "2.28.9+cuda13.0"
    assert "P2P/CUMEM" in out


def test_nccl_graph_and_topology_xml(samples: Path, tmp_path: Path) -> None:
    files = [samples / TOOL / "nccl_topo_azure_ncv4_4xA100pcie_vm.xml",
             samples / TOOL / "nccl_graph_azure_ncv4_4xA100pcie_vm.xml"]
    b, out = run_import(files, tmp_path / "b")
    graph = b.read_json("nccl_graph.json")
    text = files[1].read_text()
    first = re.search(r"<graph [^>]*>", text).group(0)
    assert f'nchannels="{graph["graphs"][0]["nchannels"]}"' in first
    assert graph["graphs"][0]["channels"][1]["gpus"] == [0, 3, 2, 1]
    topo_doc = b.read_json("nccl_topo.json")
    assert topo_doc["gpus"][3]["busid"] == "0004:00:00.0"
    topo = b.read_json("topology.json")
    gpus = {g["index"]: g for g in topo["gpus"]}
    assert (gpus[2]["bus_id"], gpus[2]["numa_node"], gpus[2]["cpu_affinity"]) == (
        "0003:00:00.0", 2, "48-71")
    assert [n["id"] for n in topo["numa"]["nodes"]] == [0, 1, 2, 3]


def test_every_shared_tool_output_imports(samples: Path, tmp_path: Path) -> None:
    files = sorted(p for p in (samples / TOOL).iterdir() if p.name != "SOURCES.md")
    for k, f in enumerate(files):
        b, out = run_import([f], tmp_path / f"b{k}")
        rec = b.part("import").extra["files"][0]
        assert rec["format"] and rec["summary"] in out
        json.loads((b.path / "topology.json").read_text())


def test_out_directory_not_empty(samples: Path, tmp_path: Path) -> None:
    f = samples / TOOL / "topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt"
    run_import([f], tmp_path / "b")
    r = cli("import", str(f), "--out", str(tmp_path / "b"))
    assert r.returncode == 2
    assert "not empty" in r.stderr
    assert cli("import", str(f), "--out", str(tmp_path / "b"), "--force", "-q").returncode == 0
    assert Bundle.open(tmp_path / "b").manifest.status == "ok"


def test_cuda_numbering_mapped_to_nvidia_smi_by_bus_id(samples: Path, tmp_path: Path) -> None:
    # A p2pBandwidthLatencyTest run on the ASUS box whose CUDA order differs from the PCI order:
    # its device lines are rewritten from nvidia-smi -q's bus ids, the matrix is the real sample's.
    box = samples / "rtxpro6000-8x-asus-baremetal"
    pytest.importorskip("pcieprof.discover.from_logs")
    data = Path(__file__).resolve().parents[1] / "data" / "importers"
    text = (data / "p2pbwlat_2x4090_overflowing_columns.txt").read_text()
    text = text.replace("pciBusID: 2,", "pciBusID: 85,").replace("pciBusID: 17,", "pciBusID: 6,")
    f = tmp_path / "p2p_on_asus.txt"
    f.write_text(text)
    b, _out = run_import([box / "nvidia_smi_full.log", box / "lspci_full.log", f], tmp_path / "b",
                         check=False)
    df = b.read_table("p2p")
    row = df[(df["path"] == "host_staged") & (df["direction"] == "uni")
             & df["detail"].str.contains("row 0 col 1", regex=False)].iloc[0]
    # CUDA device 0 (bus 85) is nvidia-smi GPU 5, device 1 (bus 06) is GPU 0
    assert (row["src"], row["dst"], row["bandwidth_gbps"]) == (5, 0, 6.34)
    assert "CUDA device -> nvidia-smi index by bus id: 0->5, 1->0" in row["detail"]


def test_same_file_name_from_two_folders(samples: Path, tmp_path: Path) -> None:
    a = samples / TOOL / "topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt"
    other = tmp_path / "again"
    other.mkdir()
    (other / "p2p.txt").write_bytes((samples / TOOL / "p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt").read_bytes())
    first = tmp_path / "p2p.txt"
    first.write_bytes(a.read_bytes())
    b, _out = run_import([first, other / "p2p.txt"], tmp_path / "b", check=False)
    stored = [f["stored_as"] for f in b.part("import").extra["files"]]
    assert stored == ["imported/p2p.txt", "imported/p2p-2.txt"]
    assert (b.path / "imported/p2p-2.txt").read_bytes() == (other / "p2p.txt").read_bytes()
