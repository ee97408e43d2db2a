"""Formats are recognised by content: the same text under a misleading name gives the same answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.importers.formats import detect

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"

EXPECTED_SAMPLES = {
    "tool-outputs/all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt": "nccl-tests",
    "tool-outputs/nccl_debug_info_4x5060ti_p2p_cumem.log": "nccl-log",
    "tool-outputs/nccl_graph_azure_ncv4_4xA100pcie_vm.xml": "nccl-graph-xml",
    "tool-outputs/nccl_topo_azure_ncv4_4xA100pcie_vm.xml": "nccl-topo-xml",
    "tool-outputs/p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt": "p2pBandwidthLatencyTest",
    "tool-outputs/topo_m_5gpu_5060ti_5070_proxmox_host.txt": "nvidia-smi-topo-m",
    "tool-outputs/topo_m_8x_rtxpro6000_server_baremetal_broadcom.txt": "nvidia-smi-topo-m",
    "tool-outputs/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt": "nvidia-smi-topo-p2p",
    "rtxpro6000-8x-asus-baremetal/lspci_full.log": "lspci",
    "rtxpro6000-8x-asus-baremetal/nvidia_smi_full.log": "nvidia-smi-q",
    "rtxpro6000-8x-asus-baremetal/nvidia_topo.log": "nvidia-smi-topo-m",
    "rtxpro6000-8x-asus-baremetal/cmdline.log": "cmdline",
    "rtxpro6000-8x-asus-baremetal/numa.log": "numactl",
    "rtxpro6000-8x-asus-baremetal/lscpu.log": "lscpu",
    "rtxpro6000-8x-asus-baremetal/dmesg.log": "dmesg",
    "tool-outputs-more/topo_m_4x_rtx6000ada_asus_esc8000a_e12_4nic.txt": "nvidia-smi-topo-m",
    "tool-outputs-more/p2pbwlat_4x_rtx6000ada_asus_esc8000a_e12.txt": "p2pBandwidthLatencyTest",
    "tool-outputs-more/p2pbwlat_4xA100pcie_vm_pci_domains_nvlink_pairs.txt":
        "p2pBandwidthLatencyTest",
    "tool-outputs-more/p2pbwlat_2x4090_trpro5995wx_driver525_p2p_reported_but_broken.txt":
        "p2pBandwidthLatencyTest",
    "tool-outputs-more/simpleP2P_2x4090_trpro5995wx_driver525_nan_verification.txt": "simpleP2P",
}

EXPECTED_DATA = {
    "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt": "nccl-tests",
    "all_reduce_perf_4xV100_old_error_column.txt": "nccl-tests",
    "nvbandwidth_1gpu_v0.5_dcgm_tests.json": "nvbandwidth-json",
    "nvbandwidth_2x2080ti_waived.txt": "nvbandwidth",
    "nvbandwidth_6xA6000_read_ce.txt": "nvbandwidth",
    "p2pbwlat_2x4090_overflowing_columns.txt": "p2pBandwidthLatencyTest",
    "p2pbwlat_6gpu_sections_with_p2p_reads.txt": "p2pBandwidthLatencyTest",
    "nvbandwidth_8x4090_h2d_d2h.txt": "nvbandwidth",
    "topo_m_4xH100_nv6_4nic_markdown.txt": "nvidia-smi-topo-m",
    "topo_m_4x3090_nvlink_pairs_prompt.txt": "nvidia-smi-topo-m",
    "topo_m_and_p2p_p_5gpu_5060ti_epyc_prompts.txt": "nvidia-smi-topo-m",
    # topo -mp prints topo -m's matrix (PCIe paths only): one importer, which labels the view
    "topo_mp_3xP100_pcie_only_legend_prompt.txt": "nvidia-smi-topo-m",
    "nccl_log_2.10_8gpu_direct_shared_memory_no_init_pytorch72835.log": "nccl-log",
    "nccl_log_old_16rank_channels_before_init_complete_nccl429.log": "nccl-log",
    "nccl_log_old_4gpu_channels_without_n_nccl671.log": "nccl-log",
    "nccl_log_8gpu_rings_before_comm_line_nccl1027.log": "nccl-log",
    "nccl_warn_shm_extend_no_space_timestamp_pytorch_ci_infra490.log": "nccl-log",
    "nccl_warn_shm_extend_ray_worker_kserve3791.log": "nccl-log",
    "p2pbwlat_8xA100sxm4_ce_then_sm_copy_runs.txt": "p2pBandwidthLatencyTest",
    "topo_p2p_rw_2x5090_gns_spaces_details.txt": "nvidia-smi-topo-p2p",
    "nccl_topo_dump_vm_4xA800_numaid_minus1.xml": "nccl-topo-xml",
    "nccl_log_2.29.2_2rank_socket_warn_timestamp.log": "nccl-log",
    "nccl_warn_lines_nccl_tests_issue166.log": "nccl-log",
    "all_reduce_perf_rows_only_tinygrad_pr22.txt": "nccl-tests",
}


@pytest.mark.parametrize("rel,fmt", sorted(EXPECTED_SAMPLES.items()))
def test_shared_samples_detected(samples: Path, rel: str, fmt: str) -> None:
    assert detect((samples / rel).read_text(errors="replace")) == fmt


@pytest.mark.parametrize("name,fmt", sorted(EXPECTED_DATA.items()))
def test_fixtures_detected(name: str, fmt: str) -> None:
    assert detect((DATA / name).read_text()) == fmt


def test_detection_ignores_the_file_name(samples: Path, tmp_path: Path) -> None:
    from pcieprof.importers.formats import parse_text

    text = (samples / "tool-outputs/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt").read_text()
    misleading = tmp_path / "all_reduce_perf.log"
    misleading.write_text(text)
    parsed = parse_text(misleading.read_text(), str(misleading))
    assert parsed.format == "nvidia-smi-topo-p2p"


def test_unknown_text_is_not_claimed() -> None:
    assert detect("hello world\nnothing a GPU tool prints\n") is None
    assert detect("") is None
