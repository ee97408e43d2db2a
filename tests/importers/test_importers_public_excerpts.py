"""Real outputs pasted into public issue threads (tests/data/importers/NOTE.md says which), one
test per variant: the values are checked against the text, not only that the import succeeds."""

from __future__ import annotations

import json
from pathlib import Path

from builders.cli import cli

from pcieprof.importers.formats import detect, parse_text
from pcieprof.importers.records import CollectiveRecord, Parsed

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"


def parse(name: str) -> Parsed:
    return parse_text((DATA / name).read_text(), name)


def by_key(parsed: Parsed, place: str) -> dict[int, CollectiveRecord]:
    return {c.size_bytes: c for c in parsed.collectives if c.variant.endswith(place)}


# --- nvidia-smi topo -m -----------------------------------------------------------------------

def test_all_sys_box_with_tabs_and_nic_rows_without_affinity() -> None:
    p = parse("topo_m_8x4090_all_sys_2nic_tabs_gpuallocator17.txt")
    t = p.documents["topo_m"]
    assert p.format == "nvidia-smi-topo-m" and t["gpus"] == 8
    assert set(p.pair_levels.values()) == {"SYS"} and len(p.pair_levels) == 56
    assert t["devices"][-2:] == ["NIC0", "NIC1"]
    assert t["matrix"]["GPU6"]["NIC0"] == "PHB" and t["matrix"]["NIC0"]["NIC1"] == "PIX"
    assert t["cpu_affinity"][3] == "0-55,112-167" and t["cpu_affinity"][4] == "56-111,168-223"
    assert [t["numa_affinity"][g] for g in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert set(t["gpu_numa_id"].values()) == {None}  # "N/A" after a double tab


def test_sglang_check_env_nvswitch_box_with_nic_legend() -> None:
    p = parse("sglang_check_env_8xH100_nv18_8nic_sglang30401.txt")
    t = p.documents["topo_m"]
    assert p.format == "nvidia-smi-topo-m" and p.facts["levels"] == {"NV18": 56}
    assert all(pair["nvlinks"] == 18 for pair in t["pairs"])
    assert t["nics"] == {f"NIC{i}": f"mlx5_{i}" for i in range(8)}
    assert [t["matrix"][f"GPU{g}"][f"NIC{g}"] for g in range(8)] == ["PIX"] * 8
    assert t["matrix"]["NIC7"]["GPU3"] == "SYS" and t["matrix"]["NIC7"]["NIC4"] == "NODE"
    assert t["cpu_affinity"][7] == "48-95,144-191" and t["numa_affinity"][7] == 1
    assert t["view"] == "full"


def test_one_gpu_vm_has_no_pairs_and_says_so() -> None:
    p = parse("sglang_check_env_1xH100pcie_kvm_sglang24413.txt")
    t = p.documents["topo_m"]
    assert t["gpus"] == 1 and p.pair_levels == {}
    assert t["matrix"]["GPU0"]["NIC0"] == "PHB" and t["nics"] == {"NIC0": "mlx5_0"}
    assert t["cpu_affinity"] == {0: "0-251"} and t["numa_affinity"] == {0: 0}
    # was "1 GPUs, " with nothing after the comma
    assert p.summary == "nvidia-smi topo -m: 1 GPU, no GPU pairs"


# --- p2pBandwidthLatencyTest ------------------------------------------------------------------

def test_connectivity_rows_with_tabs_and_wide_diagonal() -> None:
    p = parse("p2pbwlat_8xH100_tab_connectivity_nccl1264.txt")
    assert p.format == "p2pBandwidthLatencyTest"
    assert len(p.facts["connectivity"]) == 56 and all(p.facts["connectivity"].values())
    rows = {(r.src, r.dst): r for r in p.p2p}
    assert len(rows) == 56 and {r.path for r in p.p2p} == {"host_staged"}
    assert rows[(0, 1)].bandwidth_gbps == 37.19 and rows[(1, 0)].bandwidth_gbps == 36.36
    assert rows[(5, 6)].bandwidth_gbps == 38.05 and rows[(7, 6)].bandwidth_gbps == 37.38


# --- nccl-tests -------------------------------------------------------------------------------

def test_collective_named_by_the_command_line() -> None:
    p = parse("alltoall_perf_1x5090_command_line_nccltests287.txt")
    out, inp = p.collectives
    # was "unknown": the output itself never names alltoall
    assert (out.collective, out.variant) == ("alltoall", "imported:alltoall:out_of_place")
    assert (out.size_bytes, out.time_us, out.algbw_gbps, out.busbw_gbps, out.wrong) == (
        33554432, 19.56, 1715.44, 0.0, 0)
    assert (inp.time_us, inp.algbw_gbps, inp.wrong) == (0.78, 43046.10, None)
    assert out.iters == 20 and p.gpus[0].name == "NVIDIA GeForce RTX 5090"


def test_mpirun_broadcast_with_validation_off_and_warn_lines() -> None:
    p = parse("broadcast_perf_2node_c0_warn_lines_nccltests82.txt")
    out, inp = p.collectives
    assert out.collective == "broadcast" and out.nranks == 2  # was "unknown"
    assert (out.size_bytes, out.dtype, out.time_us, out.wrong) == (8, "fp32", 45.82, None)
    assert inp.time_us == 38.17 and "max error N/A" in inp.detail
    assert p.facts["hosts"] == ["v100-gpu-1", "v100-gpu-5"] and out.iters == 100
    assert p.facts["nccl_version"] == "2.9.6+cuda11.2"


def test_sendrecv_is_not_taken_for_an_all_reduce() -> None:
    p = parse("sendrecv_perf_2node_a40_inplace_na_nccltests214.txt")
    # redop sum, root -1 and count x 4 == size looked like all-reduce; the unchecked in-place
    # half says it is not (it was imported as all_reduce)
    assert {c.collective for c in p.collectives} == {"unknown"}
    out = by_key(p, ":out_of_place")
    assert (out[256].time_us, out[256].wrong, out[4096].algbw_gbps) == (34.24, 0, 0.13)
    assert by_key(p, ":in_place")[2048].wrong is None
    assert out[256].nranks == 2 and p.facts["hosts"] == ["gpu23", "gpu24"]


def test_nccl1_layout_times_are_milliseconds() -> None:
    p = parse("nccl1_all_reduce_test_4x_titanx_ms_readme.txt")
    assert p.format == "nccl-tests"
    rows = {(c.dtype, c.variant): c for c in p.collectives}
    assert len(p.collectives) == 40
    r = rows[("int8", "imported:out_of_place")]
    # 1.628 ms for 10 MB at 6.14 GB/s: 1628 us (it was read as 1.628 us)
    assert (r.time_us, r.algbw_gbps, r.busbw_gbps, r.nranks) == (1628.0, 6.14, 9.21, 4)
    assert r.size_bytes == 10000000 and r.collective == "all_reduce"
    # each reduction its own curve (four rows of one size were one variant)
    assert rows[("fp16", "imported:in_place:prod")].time_us == 1657.0
    assert rows[("fp64", "imported:out_of_place:min")].time_us == 1622.0
    assert "max error 4e-03" in rows[("fp16", "imported:out_of_place")].detail
    assert [(g.index, g.bus_id) for g in p.gpus] == [
        (0, "0000:0a:00.0"), (1, "0000:09:00.0"), (2, "0000:06:00.0"), (3, "0000:05:00.0")]
    assert p.gpus[0].name == "GeForce GTX TITAN X"


# --- nvbandwidth ------------------------------------------------------------------------------

def test_quoted_running_lines_name_the_cases_and_host_rows_are_host_rows() -> None:
    p = parse("nvbandwidth_8gpu_quoted_running_sm_nvb24.txt")
    assert p.facts["testcases"] == {"host_to_device_memcpy_sm": "Passed",
                                    "device_to_host_memcpy_sm": "Passed"}
    h2d = {r.dst: r for r in p.p2p if r.path == "h2d"}
    d2h = {r.src: r for r in p.p2p if r.path == "d2h"}
    # were one "unnamed_testcase" of 16 rows with path "p2p"
    assert len(h2d) == len(d2h) == 8 and not [r for r in p.p2p if r.path == "p2p"]
    assert (h2d[0].src, h2d[0].bandwidth_gbps, h2d[6].bandwidth_gbps) == (-1, 35.19, 35.39)
    assert (d2h[3].dst, d2h[3].bandwidth_gbps, d2h[4].bandwidth_gbps) == (-1, 52.78, 52.76)


def test_a_run_stopped_by_an_assertion_keeps_its_gpus_and_the_error() -> None:
    text = (DATA / "nvbandwidth_v0.7_8xA100_assert_nvb34.txt").read_text()
    assert detect(text) == "nvbandwidth"
    p = parse("nvbandwidth_v0.7_8xA100_assert_nvb34.txt")  # was a one-line import error
    assert p.facts["testcases"] == {"device_to_device_memcpy_read_ce": "Error"}
    (row,) = p.p2p
    assert row.status == "error" and "Invalid value when checking the pattern" in row.detail
    assert "h_errorFlag == 0" in row.detail
    assert len(p.gpus) == 8 and p.gpus[4].bus_id == "0000:9b:00.0"
    assert (p.facts["version"], p.facts["driver_version"]) == ("v0.7", "550.127.08")


# --- NCCL_DEBUG=INFO --------------------------------------------------------------------------

def test_nccl_lines_between_cloudwatch_timestamps() -> None:
    p = parse("nccl_log_8gpu_cloudwatch_timestamps_awsofinccl715.log")
    doc = p.documents["nccl_choices"]
    assert doc.lines["nccl"] == 13 and doc.nranks == 8
    assert doc.transports == ["P2P/CUMEM/read"]
    assert doc.peer_transport == {f"{a}->{a + 1}": "P2P/CUMEM/read" for a in (0, 3, 4, 5, 6)}
    assert doc.comms[0].connected_rings is True


def test_transport_lines_with_bus_ids_in_brackets() -> None:
    p = parse("nccl_log_8gpu_ipc_read_busid_megatron516.log")
    doc = p.documents["nccl_choices"]
    assert doc.transports == ["P2P/IPC/read"]
    assert set(doc.peer_transport) == {"0->1", "2->3", "5->6", "6->7", "7->6"}
    t = {(x.channel, x.src, x.dst): x for x in doc.comms[0].transports}
    assert (t[(23, 2, 3)].src_dev, t[(23, 2, 3)].dst_dev) == ("201c0", "201d0")
    assert (22, 5, 6) in t and t[(0, 7, 6)].via == "P2P/IPC/read"


# --- more nvidia-smi topo -m ------------------------------------------------------------------

def test_sxm_box_pasted_without_nvlink_or_gpu_numa_id_is_not_called_pcie_only() -> None:
    p = parse("topo_m_8xA100sxm4_no_nv_no_gpu_numa_id_nvb53.txt")
    t = p.documents["topo_m"]
    assert p.facts["levels"] == {"PXB": 8, "NODE": 16, "SYS": 32}
    assert t["matrix"]["GPU1"]["GPU0"] == "PXB" and t["matrix"]["GPU6"]["GPU7"] == "PXB"
    assert t["cpu_affinity"][4] == "32-63,96-127" and t["numa_affinity"][4] == 1
    assert set(t["gpu_numa_id"].values()) == {None}  # no such column
    # no legend, no command, no NV#: whether NVLink exists is not known from this paste
    assert t["view"] == "unknown"


def test_header_line_quoted_in_prose_before_the_real_matrix() -> None:
    p = parse("env_report_4xA4000_threadripper_topo_header_twice.md")
    t = p.documents["topo_m"]
    assert p.format == "nvidia-smi-topo-m" and p.facts["levels"] == {"NODE": 12}
    assert t["header_line"] == 37 and t["legend"] is True
    assert t["cpu_affinity"] == {g: "0-31" for g in range(4)}


# --- NCCL topology XML ------------------------------------------------------------------------

def test_cloud_topology_file_places_gpus_and_nics_by_pci_class() -> None:
    p = parse("nccl_topo_azure_ndv4_8xA100_vm_pci_class_only.xml")
    doc = p.documents["nccl_topo"]
    # NCCL adds <gpu>/<net> at run time: the file itself names them only by PCI class
    assert doc.gpus == [] and doc.nics == []
    gpus = {g.busid: g.numaid for g in doc.pci_gpus}
    assert gpus == {"0003:00:00.0": 0, "0004:00:00.0": 0, "0001:00:00.0": 1, "0002:00:00.0": 1,
                    "000d:00:00.0": 2, "000e:00:00.0": 2, "000b:00:00.0": 3, "000c:00:00.0": 3}
    assert [n.busid for n in doc.pci_nics][:2] == ["0103:00:00.0", "0104:00:00.0"]
    assert {n.class_ for n in doc.pci_nics} == {"0x020700"} and len(doc.pci_nics) == 8
    assert doc.pci_gpus[0].pci_path == ["0003:00:00.0", "ffff:ff:01.0"]
    # was "0 GPUs, 0 NICs" and no word on the VM
    assert "8 GPUs and 8 NICs placed by PCI class" in p.summary
    assert doc.virtual_tree.flat is True
    assert "each in a PCI domain of its own" in doc.virtual_tree.evidence[0]
    assert [c.cpus for c in doc.cpus] == ["0-23", "24-47", "48-71", "72-95"]


def test_cloud_topology_file_without_bridges() -> None:
    p = parse("nccl_topo_azure_ndv2_8xV100_vm_pci_class_only.xml")
    doc = p.documents["nccl_topo"]
    assert [g.numaid for g in doc.pci_gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [n.busid for n in doc.pci_nics] == ["0101:00:00.0"]
    assert doc.virtual_tree.flat is True
    assert any("no PCI bridge" in e for e in doc.virtual_tree.evidence)


def test_cloud_topology_file_makes_the_bundle_a_vm(tmp_path: Path) -> None:
    out = tmp_path / "b"
    r = cli("import", str(DATA / "nccl_topo_azure_ndv4_8xA100_vm_pci_class_only.xml"),
            "--out", str(out), "-q")
    assert r.returncode == 0
    virt = json.loads((out / "topology.json").read_text())["virtualization"]
    assert (virt["is_vm"], virt["flat_pcie_tree"]) == (True, True)  # was unknown


# --- nccl-tests that stopped with an error ----------------------------------------------------

def test_failure_before_any_row_keeps_the_gpus_and_the_error() -> None:
    p = parse("all_reduce_perf_8xP100_nccl1.0_failure_no_rows_nccltests5.txt")
    # was: "expected result rows under the column header (the file is cut short)"
    assert p.collectives == [] and p.facts["runs"] == []
    assert p.facts["failures"] == [{"line": 16, "text": "NCCL failure all_reduce.cu:95 "
                                                        "'unhandled cuda error'"}]
    assert "no size was run" in p.facts["warnings"][0]
    assert [g.name for g in p.gpus] == ["Tesla P100-PCIE-16GB"] * 8
    assert p.facts["hosts"] == ["node03"]  # device lines without Pid
    # `[0x00]` is only a bus number, the same for all eight: no bus id invented for them (was
    # 0000:00:00.0 eight times); all on bus 0 is a VM's root bus
    assert {g.bus_id for g in p.gpus} == {None}
    assert "every GPU (8) sits on bus 00" in p.facts["flat_pcie_tree"][0]


def test_rows_before_the_failure_are_kept_and_the_failure_said() -> None:
    p = parse("all_reduce_perf_multinode_rows_then_failures_nccltests322.txt")
    out = by_key(p, ":out_of_place")
    assert sorted(out) == [1073741824 * 2 ** k for k in range(5)]
    assert (out[17179869184].time_us, out[17179869184].busbw_gbps) == (93457.0, 367.29)
    assert by_key(p, ":in_place")[2147483648].algbw_gbps == 108.01
    assert len(p.facts["failures"]) == 8 and p.facts["failures"][0]["line"] == 7
    assert p.facts["failures"][1]["text"] == ".. HCA-128 pid 757466: Test failure common.cu:915"
    assert any("sizes after the last row were not run" in w for w in p.facts["warnings"])
    assert "failed: HCA-128: Test NCCL failure common.cu:1204" in p.summary


def test_old_output_without_hashes_wrong_data_and_topo_in_one_paste() -> None:
    p = parse("all_gather_perf_8xV100_oob_failed_then_topo_m_dgx1_nccltests37.txt")
    out, inp = p.collectives
    assert out.collective == "all_gather"  # from the command line
    # no device lines: `-g 8` without a launcher is 8 ranks (was 0, unknown)
    assert out.nranks == 8 and "8 ranks from the command line" in out.detail
    assert (out.size_bytes, out.time_us, out.algbw_gbps, out.busbw_gbps) == (
        4294967296, 29122.0, 129.05, 129.05)
    # max error 1 on float data is wrong data (nccl-tests' bound 1e-5): was status ok
    assert (out.status, inp.status) == ("error", "error") and "wrong data" in out.detail
    run = p.facts["runs"][0]
    assert (run["avg_busbw_gbps"], run["out_of_bounds"]) == (128.942, 2)  # lines without '#'
    assert any("2 values written outside" in w for w in p.facts["warnings"])
    # the topo -m pasted after it is read too (was dropped)
    assert p.facts["topo_m"] == {"gpus": 8, "levels": {"NV1": 16, "NV2": 16, "SYS": 24}}
    assert (p.pair_levels[(0, 3)], p.pair_levels[(0, 4)], p.pair_levels[(7, 6)]) == (
        "NV2", "SYS", "NV1")
    assert p.documents["topo_m"]["cpu_affinity"][7] == "0-95"


def test_error_column_within_bounds_stays_ok() -> None:
    p = parse("nccl1_all_reduce_test_4x_titanx_ms_readme.txt")
    assert {c.status for c in p.collectives} == {"ok"}  # 4e-03 on half, 5e-07 on float


# --- simpleP2P --------------------------------------------------------------------------------

def test_old_simplep2p_capable_lines_and_a_cut_pair_list() -> None:
    p = parse("simpleP2P_4xK40m_capable_lines_cut_tf2145.txt")
    assert p.facts["p2p_capable"] == {"0": True, "1": True, "2": True, "3": True}
    assert p.facts["device_count"] == 4 and [g.name for g in p.gpus] == ["Tesla K40m"] * 4
    access = p.facts["peer_access"]
    assert (access["0->1"], access["1->0"], access["2->3"]) == (True, True, True)
    assert (access["0->2"], access["3->0"]) == (False, False)
    # 3->1 and 3->2 are not in the file: said, not guessed
    assert "3->1" not in access
    assert "10 of the 12 ordered GPU pairs" in p.facts["warnings"][0]


def test_empty_affinity_cells_are_not_filled_from_the_gpu_numa_id() -> None:
    p = parse("vllm_collect_env_2gpu_nv12_8nic_empty_affinity_vllm19607.txt")
    t = p.documents["topo_m"]
    assert p.pair_levels == {(0, 1): "NV12", (1, 0): "NV12"}
    assert t["matrix"]["GPU0"]["NIC6"] == "PXB" and t["matrix"]["NIC7"]["NIC6"] == "PIX"
    # only "N/A" follows the levels: it is the GPU NUMA ID, the affinities are unknown
    assert t["cpu_affinity"] == {0: None, 1: None} and t["numa_affinity"] == {0: None, 1: None}
