"""cuda-samples p2pBandwidthLatencyTest: specific cells of every matrix, as the file prints them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.importers.p2p_bandwidth_latency import parse_p2p_bandwidth_latency
from pcieprof.importers.records import P2PRecord

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"


def cell(rows: list[P2PRecord], matrix: str, row: int, col: int) -> P2PRecord:
    found = [r for r in rows if f": {matrix}" in r.detail and f"; row {row} col {col}" in r.detail]
    assert len(found) == 1, (matrix, row, col, len(found))
    return found[0]


@pytest.fixture(scope="module")
def proxmox(samples: Path):
    p = samples / "tool-outputs/p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"
    return parse_p2p_bandwidth_latency(p.read_text(), p.name)


def test_devices_and_connectivity(proxmox) -> None:
    assert [g.index for g in proxmox.gpus] == [0, 1, 2, 3, 4]
    assert proxmox.gpus[0].name == "NVIDIA GeForce RTX 5070"
    assert proxmox.gpus[2].bus_id == "0000:0a:00.0"  # pciBusID: a
    conn = proxmox.facts["connectivity"]
    assert conn["0->1"] is False and conn["1->2"] is True and conn["4->3"] is True


def test_every_matrix_is_read(proxmox) -> None:
    assert len(proxmox.facts["matrices"]) == 7
    # rows: the off-diagonal cells of 4 bandwidth matrices and 2 GPU latency blocks (5x5 each)
    assert len(proxmox.p2p) == 6 * 20
    assert all(r.src != r.dst for r in proxmox.p2p)
    # the diagonal (copies inside one GPU) and the CPU latency blocks are kept as facts
    local = proxmox.facts["device_local"]
    assert local["Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)"] == [
        582.18, 388.59, 388.20, 388.78, 389.26]
    assert local["P2P=Enabled Latency (P2P Writes) Matrix (us)"][2] == 1.08
    cpu = proxmox.facts["cpu_latency_us"]
    assert cpu["P2P=Disabled Latency Matrix (us)"][4] == [8.07, 8.09, 8.06, 8.10, 2.72]


def test_bandwidth_cells(proxmox) -> None:
    r = cell(proxmox.p2p, "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)", 1, 2)
    assert (r.src, r.dst, r.path, r.direction, r.bandwidth_gbps) == (1, 2, "host_staged", "uni", 3.41)
    r = cell(proxmox.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", 3, 4)
    assert (r.path, r.bandwidth_gbps, r.status) == ("p2p", 3.44, "ok")
    r = cell(proxmox.p2p, "Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)", 2, 1)
    assert (r.path, r.direction, r.bandwidth_gbps) == ("p2p", "bi", 4.57)
    r = cell(proxmox.p2p, "Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)", 0, 4)
    assert (r.src, r.dst, r.bandwidth_gbps) == (0, 4, 4.32)


def test_no_peer_access_is_not_called_p2p(proxmox) -> None:
    # Device 0 (the RTX 5070) cannot reach the others: the sample fell back to a staged copy.
    r = cell(proxmox.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", 0, 1)
    assert (r.bandwidth_gbps, r.status) == (3.42, "not_supported")


def test_latency_gpu_and_cpu_blocks(proxmox) -> None:
    gpu = cell(proxmox.p2p, "P2P=Enabled Latency (P2P Writes) Matrix (us) GPU latency", 1, 2)
    assert (gpu.latency_us, gpu.size_bytes, gpu.bandwidth_gbps, gpu.path) == (0.42, 16, None, "p2p")
    cpu = proxmox.facts["cpu_latency_us"]["P2P=Enabled Latency (P2P Writes) Matrix (us)"]
    assert cpu[1][2] == 2.25
    r = cell(proxmox.p2p, "P2P=Disabled Latency Matrix (us) GPU latency", 0, 1)
    assert (r.path, r.latency_us) == ("host_staged", 18.60)
    assert proxmox.facts["cpu_latency_us"]["P2P=Disabled Latency Matrix (us)"][4][3] == 8.10
    assert not [r for r in proxmox.p2p if "CPU" in r.detail]


def test_values_overflowing_their_column() -> None:
    p = DATA / "p2pbwlat_2x4090_overflowing_columns.txt"
    parsed = parse_p2p_bandwidth_latency(p.read_text(), p.name)
    assert parsed.facts["device_local"]["Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)"] == [
        1008.06, 926.75]
    r = cell(parsed.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", 0, 1)
    assert r.bandwidth_gbps == 6.60
    r = cell(parsed.p2p, "Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)", 1, 0)
    assert (r.direction, r.bandwidth_gbps) == ("bi", 8.67)
    assert [g.bus_id for g in parsed.gpus] == ["0000:02:00.0", "0000:17:00.0"]


def test_sections_on_their_own_and_p2p_reads() -> None:
    p = DATA / "p2pbwlat_6gpu_sections_with_p2p_reads.txt"
    parsed = parse_p2p_bandwidth_latency(p.read_text(), p.name)
    assert parsed.gpus == [] and len(parsed.p2p) == 3 * 30
    # In the P2P Reads matrix the row GPU reads from the column GPU: data flows column -> row.
    r = cell(parsed.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Reads) Matrix (GB/s)", 3, 2)
    assert (r.src, r.dst, r.bandwidth_gbps) == (2, 3, 10.45)
    r = cell(parsed.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", 3, 2)
    assert (r.src, r.dst, r.bandwidth_gbps) == (3, 2, 10.23)


def test_old_layout_titles_and_latency_header(samples: Path) -> None:
    """Older cuda-samples titled the matrices without '(P2P Writes)' (e.g. 'Unidirectional
    P2P=Enabled Bandwidth Matrix (GB/s)', as quoted in Dell's C4130 V100 paper) and headed the
    latency matrix with 'D\\D' and no CPU block. The real 5-GPU matrices under those headings:"""
    text = (samples / "tool-outputs/p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt").read_text()
    lines = text.splitlines()
    i = lines.index("Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)")
    k = lines.index("P2P=Disabled Latency Matrix (us)")
    old = ["Unidirectional P2P=Enabled Bandwidth Matrix (GB/s)"] + lines[i + 1:i + 7] + \
          ["P2P=Disabled Latency Matrix (us)", lines[k + 1].replace("   GPU", "   D\\D")] + lines[k + 2:k + 7]
    parsed = parse_p2p_bandwidth_latency("\n".join(old) + "\n", "old.txt")
    r = cell(parsed.p2p, "Unidirectional P2P=Enabled Bandwidth Matrix (GB/s)", 3, 4)
    assert (r.path, r.bandwidth_gbps) == ("p2p", 3.44)
    r = cell(parsed.p2p, "P2P=Disabled Latency Matrix (us) GPU latency", 2, 0)
    assert r.latency_us == 20.52
    assert parsed.facts["cpu_latency_us"] == {}
