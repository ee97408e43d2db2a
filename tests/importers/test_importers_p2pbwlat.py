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
    # 4 bandwidth matrices + 2 latency matrices x (GPU + CPU blocks), 5x5 cells each
    assert len(proxmox.p2p) == 8 * 25


def test_bandwidth_cells(proxmox) -> None:
    r = cell(proxmox.p2p, "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)", 1, 2)
    assert (r.src, r.dst, r.path, r.direction, r.bandwidth_gbps) == (1, 2, "host_staged", "uni", 3.41)
    r = cell(proxmox.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", 3, 4)
    assert (r.path, r.bandwidth_gbps, r.status) == ("p2p", 3.44, "ok")
    r = cell(proxmox.p2p, "Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)", 2, 1)
    assert (r.path, r.direction, r.bandwidth_gbps) == ("p2p", "bi", 4.57)
    r = cell(proxmox.p2p, "Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)", 0, 0)
    assert (r.src, r.dst, r.bandwidth_gbps) == (0, 0, 581.17)
    assert "device-local" in r.detail


def test_no_peer_access_is_not_called_p2p(proxmox) -> None:
    # Device 0 (the RTX 5070) cannot reach the others: the sample fell back to a staged copy.
    r = cell(proxmox.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", 0, 1)
    assert (r.bandwidth_gbps, r.status) == (3.42, "not_supported")


def test_latency_gpu_and_cpu_blocks(proxmox) -> None:
    gpu = [r for r in proxmox.p2p if "P2P=Enabled Latency (P2P Writes) Matrix (us) GPU latency" in r.detail
           and "row 1 col 2" in r.detail]
    cpu = [r for r in proxmox.p2p if "P2P=Enabled Latency (P2P Writes) Matrix (us) CPU latency" in r.detail
           and "row 1 col 2" in r.detail]
    assert [r.latency_us for r in gpu] == [0.42]
    assert [r.latency_us for r in cpu] == [2.25]
    assert gpu[0].size_bytes == 16 and gpu[0].bandwidth_gbps is None
    r = cell(proxmox.p2p, "P2P=Disabled Latency Matrix (us) GPU latency", 0, 1)
    assert (r.path, r.latency_us) == ("host_staged", 18.60)
    r = cell(proxmox.p2p, "P2P=Disabled Latency Matrix (us) CPU latency", 4, 3)
    assert r.latency_us == 8.10


def test_values_overflowing_their_column() -> None:
    p = DATA / "p2pbwlat_2x4090_overflowing_columns.txt"
    parsed = parse_p2p_bandwidth_latency(p.read_text(), p.name)
    r = cell(parsed.p2p, "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)", 0, 0)
    assert r.bandwidth_gbps == 1008.06
    r = cell(parsed.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", 0, 1)
    assert r.bandwidth_gbps == 6.60
    r = cell(parsed.p2p, "Bidirectional P2P=Disabled Bandwidth Matrix (GB/s)", 1, 0)
    assert (r.direction, r.bandwidth_gbps) == ("bi", 8.67)
    assert [g.bus_id for g in parsed.gpus] == ["0000:02:00.0", "0000:17:00.0"]


def test_sections_on_their_own_and_p2p_reads() -> None:
    p = DATA / "p2pbwlat_6gpu_sections_with_p2p_reads.txt"
    parsed = parse_p2p_bandwidth_latency(p.read_text(), p.name)
    assert parsed.gpus == [] and len(parsed.p2p) == 3 * 36
    # In the P2P Reads matrix the row GPU reads from the column GPU: data flows column -> row.
    r = cell(parsed.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Reads) Matrix (GB/s)", 3, 2)
    assert (r.src, r.dst, r.bandwidth_gbps) == (2, 3, 10.45)
    r = cell(parsed.p2p, "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)", 3, 2)
    assert (r.src, r.dst, r.bandwidth_gbps) == (3, 2, 10.23)
