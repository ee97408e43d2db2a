"""Malformed and truncated inputs, made by cutting the real files: one line naming file and line."""

from __future__ import annotations

import csv
from pathlib import Path

from builders.cli import cli

TOOL = "tool-outputs"
DATA = Path(__file__).resolve().parents[1] / "data" / "importers"


def error_line(args: list[str]) -> str:
    r = cli("import", *args)
    assert r.returncode == 2
    err = r.stderr
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, never a traceback
    assert "Traceback" not in err
    return lines[0]


def cut(src: Path, tmp: Path, keep_lines: int, extra: str = "") -> Path:
    lines = src.read_text().splitlines(keepends=True)
    out = tmp / src.name
    out.write_text("".join(lines[:keep_lines]) + extra)
    return out


def test_nccl_tests_cut_after_the_last_row_is_kept_with_a_warning(samples: Path,
                                                                  tmp_path: Path) -> None:
    # Every row is complete: not "truncated". The row is imported; one warning says what is not
    # in the file.
    f = cut(samples / TOOL / "all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt", tmp_path, 14)
    r = cli("import", str(f), "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    err = r.stderr
    warnings = [l for l in err.splitlines() if l.startswith("warning:")]
    assert warnings == [f"warning: {f}: 1 complete rows kept; not in the file: the "
                        "'# Avg bus bandwidth' trailer"]
    with (tmp_path / "b" / "allreduce.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["variant"], r["size_bytes"], r["time_us"], r["busbw_gbps"]) for r in rows] == [
        ("imported:out_of_place", "33554432", "2275.1", "24.58"),
        ("imported:in_place", "33554432", "2282.5", "24.5")]


def test_nccl_tests_cut_inside_a_row(samples: Path, tmp_path: Path) -> None:
    src = samples / TOOL / "all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt"
    lines = src.read_text().splitlines(keepends=True)
    f = tmp_path / "cut.txt"
    f.write_text("".join(lines[:13]) + lines[13][:70])
    line = error_line([str(f)])
    assert f"{f}:14: expected 13 fields" in line


def test_p2pbwlat_cut_inside_a_matrix(samples: Path, tmp_path: Path) -> None:
    src = samples / TOOL / "p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"
    lines = src.read_text().splitlines()
    k = lines.index("Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)")
    f = cut(src, tmp_path, k + 4)  # title, header, rows 0 and 1
    line = error_line([str(f)])
    assert f"{f}:{k + 5}: expected row 2 of 'Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)'" in line


def test_p2pbwlat_row_cut_short(samples: Path, tmp_path: Path) -> None:
    src = samples / TOOL / "p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"
    lines = src.read_text().splitlines(keepends=True)
    k = next(i for i, l in enumerate(lines) if l.startswith("P2P=Disabled Latency"))
    f = tmp_path / "p2p.txt"
    f.write_text("".join(lines[:k + 3]) + lines[k + 3][:20] + "\n")
    line = error_line([str(f)])
    assert f"{f}:{k + 4}: expected 5 values in row 1" in line


def test_topo_p2p_cut(samples: Path, tmp_path: Path) -> None:
    f = cut(samples / TOOL / "topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt", tmp_path, 3)
    line = error_line([str(f)])
    assert f"{f}:4: expected 5 GPU rows (found 2)" in line


def test_graph_xml_cut(samples: Path, tmp_path: Path) -> None:
    f = cut(samples / TOOL / "nccl_graph_azure_ncv4_4xA100pcie_vm.xml", tmp_path, 20)
    line = error_line([str(f)])
    assert f"{f}:20: expected well-formed XML" in line and "truncated" in line


def test_topology_xml_cut(samples: Path, tmp_path: Path) -> None:
    f = cut(samples / TOOL / "nccl_topo_azure_ncv4_4xA100pcie_vm.xml", tmp_path, 9)
    line = error_line([str(f)])
    assert f"{f}:9: expected well-formed XML" in line


def test_nvbandwidth_matrix_cut(tmp_path: Path) -> None:
    src = DATA / "nvbandwidth_6xA6000_read_ce.txt"
    lines = src.read_text().splitlines(keepends=True)
    f = tmp_path / "nvb.txt"
    f.write_text("".join(lines[:14]) + lines[14][:30] + "\n")
    line = error_line([str(f)])
    assert f"{f}:15: expected 6 values in row 3" in line


def test_nvbandwidth_json_cut(tmp_path: Path) -> None:
    f = cut(DATA / "nvbandwidth_1gpu_v0.5_dcgm_tests.json", tmp_path, 100)
    line = error_line([str(f)])
    assert line.startswith(f"pcieprof: error: {f}:") and "valid JSON" in line


def test_topo_m_cut(samples: Path, tmp_path: Path) -> None:
    f = cut(samples / TOOL / "topo_m_8x_rtxpro6000_server_baremetal_broadcom.txt", tmp_path, 4)
    line = error_line([str(f)])
    # the discovery topo -m parser names the missing rows; the importer adds where they end
    assert f"{f}:4: rows missing for GPU3" in line and "GPU7" in line


def test_unknown_binary_and_missing(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("shopping list\n")
    line = error_line([str(f)])
    assert f"{f}: expected the output of one of:" in line and "nccl-tests" in line
    b = tmp_path / "blob.bin"
    b.write_bytes(b"\x00\x01\x02" * 10)
    assert f"{b}: expected a text file" in error_line([str(b)])
    assert "cannot read" in error_line([str(tmp_path / "nope.txt")])


def test_truncated_nccl_log_still_imports(samples: Path, tmp_path: Path) -> None:
    # A log is a stream: cut anywhere, it still says what it says so far.
    f = cut(samples / TOOL / "nccl_debug_info_4x5060ti_p2p_cumem.log", tmp_path, 30)
    r = cli("import", str(f), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 0, r.stderr
    assert "NCCL 2.28.9+cuda13.0" in r.stdout


BOX = "rtxpro6000-8x-asus-baremetal"


def test_smi_q_cut_after_two_gpus(samples: Path, tmp_path: Path) -> None:
    f = cut(samples / BOX / "nvidia_smi_full.log", tmp_path, 300)
    line = error_line([str(f)])
    assert f"{f}:300: expected 8 GPU sections ('Attached GPUs : 8'), found 2" in line


def test_lspci_cut_mid_line(samples: Path, tmp_path: Path) -> None:
    f = tmp_path / "lspci.log"
    f.write_bytes((samples / BOX / "lspci_full.log").read_bytes()[:200000])
    line = error_line([str(f)])
    n = len(f.read_text().splitlines())
    assert f"{f}:{n}: expected a complete last line (the file ends mid-line" in line


def test_lspci_cut_at_a_line_warns(samples: Path, tmp_path: Path) -> None:
    f = cut(samples / BOX / "lspci_full.log", tmp_path, 3000)
    r = cli("import", str(f), "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert "no blank line after the last device; it may be cut short" in err
