"""NCCL_DEBUG logs from other boxes (2.4 to 2.2x releases, multi-node, launcher tags, failures).

Each fixture is a real excerpt (tests/data/importers/NOTE.md names its source); each test asserts
what the source shows: communicators, ranks, transports per pair, P2P decisions, warnings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcieprof.bundle.nccl_choices import NcclParsed
from pcieprof.cli import main
from pcieprof.importers.formats import detect, parse_text
from pcieprof.importers.nccl_log import parse_nccl_log

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"


def parse(name: str) -> NcclParsed:
    text = (DATA / name).read_text()
    assert detect(text) == "nccl-log", name
    return parse_nccl_log(text, name)


def test_nccl_2_4_init_line_without_bus_id_in_nccl_tests_output(tmp_path: Path) -> None:
    # NCCL 2.4 prints `comm 0x.. rank 3 nranks 16 cudaDev 3 nvmlDev 3 - Init COMPLETE`: no busId.
    name = "all_reduce_perf_16x_2node_efa_nccl2.4.8_init_without_busid_dlami.txt"
    text = (DATA / name).read_text()
    assert detect(text) == "nccl-tests"
    parsed = parse_text(text, name)
    assert len(parsed.collectives) == 56  # 28 sizes x out-of-place/in-place
    c: NcclParsed = parsed.documents["nccl_choices"]
    assert c.nccl_version == "2.4.8+cuda10.0" and c.env == {"NCCL_TREE_THRESHOLD": "0"}
    assert c.nranks == 16 and len(c.comms) == 1
    ranks = c.comms[0].ranks
    assert sorted(map(int, ranks)) == list(range(1, 16))  # rank 0's line is not in the excerpt
    assert ranks["3"].pid == 3804 and ranks["3"].cuda_dev == 3
    assert ranks["3"].nvml_dev == 3 and ranks["3"].bus_id is None
    assert ranks["12"].host == "ip-172-31-41-36" and ranks["12"].init == "COMPLETE"
    assert {r.host for r in ranks.values()} == {"ip-172-31-41-105", "ip-172-31-41-36"}
    # The imported case maps rank r to index r, whatever ranks the excerpt names.
    out = tmp_path / "b"
    main(["import", "-q", "-o", str(out), str(DATA / name)])
    case = json.loads((out / "nccl_choices.json").read_text())[f"imported:{name}"]
    assert case["ranks"] == list(range(16))


def test_nccl_2_4_network_hops_without_device() -> None:
    c = parse("nccl_log_2.4_ring_net_hops_without_dev_shm_warn_pytorch23534.log")
    comm = c.comms[0]
    net = [e for e in comm.transports if e.family == "NET"]
    assert [(e.channel, e.src, e.dst, e.direction, e.src_dev) for e in net] == [
        (2, 4, 19, "send", None), (2, 19, 4, "receive", None)]
    assert c.peer_transport == {"19->4": "NET/Socket/0", "4->1": "direct shared memory",
                                "4->19": "NET/Socket/0", "4->3": "direct shared memory",
                                "4->5": "P2P/IPC", "4->7": "P2P/IPC"}
    assert c.transport_families == ["NET", "P2P", "SHM"]
    assert c.nranks == 20  # the highest rank the excerpt names (19) + 1; the job had 32
    assert [(w["source"], w["text"]) for w in c.warnings] == [
        ("include/shm.h:42", "Cuda failure 'invalid argument'")]


def test_ray_tag_and_peer_access_unsupported_failure() -> None:
    c = parse("nccl_log_2.7_ray_pid_tag_peer_access_unsupported_raylightning24.log")
    assert c.rings == {"0": [0, 1], "1": [0, 1]} and c.nchannels == 2
    assert c.peer_transport == {"0->1": "P2P/IPC"}
    assert c.comms[0].trees["0"]["1"] == "1/-1/-1->0->-1|-1->0->1/-1/-1"
    assert c.comms[0].thread_thresholds == "8/8/64 | 16/8/64 | 8/8/64"
    (w,) = c.warnings
    assert w["host"] == "z-pc" and w["pid"] == 909608 and w["source"] == "transport/p2p.cc:238"
    (f,) = c.failures
    assert f["kind"] == "peer_access_unsupported" and f["count"] == 1 and f["line"] == 8
    assert "NCCL_P2P_DISABLE=1" in f["fix"]


def test_p2p_disabled_between_connected_gpus() -> None:
    c = parse("nccl_log_p2p_disabled_between_connected_gpus_pytorch130113.log")
    # Both orders and repeats, from three ranks: three unordered pairs of NVML indexes.
    assert c.p2p_disabled == [[0, 1], [0, 2], [1, 2]]
    assert c.failures == [] and c.comms == []


def test_joined_lines_and_a_line_wrapped_after_via() -> None:
    c = parse("nccl_log_2node_ibext_lines_joined_and_wrapped_deepep106.log")
    assert c.lines["total"] == 3 and c.lines["nccl"] == 9
    assert c.peer_transport["12->4"] == "NET/IBext/4/GDRDMA"  # `via` / ` NET/IBext/4/GDRDMA`
    assert c.peer_transport == {f"{a}->{b}": f"NET/IBext/{d}/GDRDMA" for a, b, d in (
        (1, 9, 1), (12, 4, 4), (13, 5, 5), (14, 6, 6), (15, 7, 7), (2, 10, 2), (3, 11, 3),
        (8, 0, 0))}
    sends = {(e.src, e.dst) for e in c.comms[0].transports if e.direction == "send"}
    assert sends == {(2, 10), (1, 9), (3, 11)}
    assert c.nranks == 16


def test_python_logging_prefix_and_per_channel_tree_lines() -> None:
    c = parse("nccl_log_python_logging_prefix_tree_lines_easydistill4.log")
    trees = c.comms[0].trees
    assert trees["7"] == {str(ch): "-1/-1/-1->7->6" for ch in range(15)}
    # `Tree 14 : -1 -> 0 -> 1/-1/-1` (parent -> rank -> children) in the `Trees` spelling.
    assert trees["0"] == {str(ch): "1/-1/-1->0->-1" for ch in (3, 4, 5, 6, 14, 15, 16, 17)}
    assert c.lines["spliced"] == 1 and c.nranks == 8


def test_four_hosts_libfabric_and_channels_without_count() -> None:
    c = parse("nccl_log_4node_aws_libfabric_mixed_channel_forms_nccl527.log")
    assert c.nranks == 32
    assert c.peer_transport["19->26"] == "NET/AWS Libfabric/0/GDRDMA"
    assert c.peer_transport["24->31"] == "P2P/IPC/read"
    assert c.transports == ["NET/AWS Libfabric/0/GDRDMA", "P2P/IPC/read"]
    assert c.transport_families == ["NET", "P2P"]
    channels = sorted({(e.channel, e.src, e.dst) for e in c.comms[0].transports})
    assert (3, 19, 26) in channels and (4, 8, 15) in channels and len(channels) == 12


@pytest.mark.parametrize("name", [
    "nccl_log_2.7_ray_pid_tag_peer_access_unsupported_raylightning24.log",
    "nccl_log_p2p_disabled_between_connected_gpus_pytorch130113.log",
])
def test_import_summary_names_what_failed(name: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    main(["import", "-o", str(tmp_path / "b"), str(DATA / name)])
    out = capsys.readouterr().out
    assert ("peer access" in out) or ("P2P disabled between 3 GPU pairs" in out)


def test_torchrun_tag_glued_to_prefix_and_nvls_support() -> None:
    c = parse("nccl_log_torchrun_rank_tag_glued_nvls_available_torchtitan1570.log")
    (comm,) = c.comms
    assert comm.ranks["0"].host == "costa-671b-5-worker-1"
    assert comm.ranks["0"].pid == 382 and comm.ranks["0"].local_rank == 0
    assert comm.nranks == 4 and comm.nnodes == 1 and comm.nchannels == 24
    assert c.rings == {str(ch): [0, 1, 2, 3] for ch in range(10)}
    assert comm.nvls_multicast is True  # printed before the comm line: waits for it
    assert c.env == {"NCCL_TOPO_FILE": "/proc/self/fd/156"}


def test_channel_counts_kept_without_a_communicator_line() -> None:
    c = parse("nccl_log_8xB200_channel_counts_without_comm_line_nccl1646.log")
    (comm,) = c.comms
    assert (comm.coll_channels, comm.collnet_channels, comm.nvls_channels,
            comm.p2p_channels) == (32, 32, 32, 32)
    assert comm.thread_thresholds == "8/8/64 | 64/8/64 | 512 | 512"
    assert comm.p2p_type == "intraNodeP2pSupport 1 directMode 0"
    assert c.nchannels == 32


def test_graph_search_of_two_hosts_with_the_older_speed_word() -> None:
    c = parse("nccl_log_2node_graph_search_speed_pattern_lines_nccl601.log")
    (comm,) = c.comms
    graphs = comm.graphs
    assert [(g.host, g.pattern_name, g.nchannels, g.bw_intra, g.type_inter)
            for g in graphs] == [("gpu23", "ring", 4, 1.2, "SYS"), ("gpu24", "ring", 4, 1.2, "SYS")]
    assert graphs[0].channels[3] == ["NET/3", "GPU/2", "GPU/3", "GPU/0", "GPU/1", "NET/3"]
    assert graphs[1].channels[0] == ["NET/0", "GPU/4", "GPU/5", "GPU/6", "GPU/7", "NET/0"]
    assert all(len(g.channels) == 4 for g in graphs)


def test_nvls_graph_waits_for_the_comm_line() -> None:
    c = parse("nccl_log_2node_h100_nvls_pattern5_graph_before_comm_nccl1519.log")
    (comm,) = c.comms
    assert comm.nranks == 16 and comm.nnodes == 2 and comm.ranks["0"].local_rank == 0
    (g,) = comm.graphs
    assert (g.pattern, g.pattern_name, g.nchannels, g.type_intra,
            g.type_inter, g.reported_by) == (5, "nvls", 7, "NVL", "PHB", 0)
    assert [ch[0] for ch in g.channels] == ["NET/1", "NET/3", "NET/2", "NET/4", "NET/6",
                                               "NET/7", "NET/5"]


def test_one_process_many_threads_graph_search() -> None:
    c = parse("nccl_log_8x4090_one_process_graph_search_per_thread_nccltests307.log")
    (comm,) = c.comms
    # Dev 0's thread printed both searches; the others' excerpts hold one each.
    assert [(g.pattern_name, g.type_intra, g.type_inter) for g in comm.graphs] == [
        ("ring", "SYS", "PIX"), ("balanced_tree", "SYS", "PIX")]
    assert comm.graphs[0].channels == [[f"GPU/{i}" for i in range(8)]]


def test_network_lines_without_a_communicator_and_set_to_without_by_environment() -> None:
    c = parse("nccl_log_ib_hca_set_to_using_network_ib_no_comm_nccltests228.log")
    assert c.env == {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_2:1,mlx5_0:1"}
    (comm,) = c.comms
    assert comm.network == "IB" and comm.comm_id is None


def test_ib_completion_error_names_the_status() -> None:
    c = parse("nccl_warn_ib_completion_status12_ib_plugin_nccl1405.log")
    assert len(c.warnings) == 3 and {w["source"] for w in c.warnings} == {"ib_plugin.c:1615"}
    (f,) = c.failures
    assert (f["kind"], f["count"], f["status"], f["status_name"], f["vendor_err"], f["peer"],
            f["dev"]) == ("ib_completion_error", 3, 12, "IBV_WC_RETRY_EXC_ERR", 129,
                          "10.216.210.236<54862>", 4)
    assert f["fix"].startswith("retry exceeded")


def test_bazel_version_string_and_warnings_of_one_process() -> None:
    c = parse("nccl_log_2.8.3_bazel_version_ibv_create_qp_warn_nccl562.log")
    assert c.nccl_version == "2.8.3+cudaCUDA_MAJOR.CUDA_MINOR"
    assert [(w["dev"], w["source"], w["text"]) for w in c.warnings] == [
        (d, "ibvwrap.c:130", "Call to ibv_create_qp failed") for d in (4, 5, 6)]
    assert c.comms[0].network == "IBext" and c.failures == []


def test_topology_xml_of_a_vm_with_nvswitch_targets_outside_the_tree() -> None:
    name = "nccl_topo_ibm_h100_vsi_nvswitch_targets_link_width_0.xml"
    text = (DATA / name).read_text()
    assert detect(text) == "nccl-topo-xml"
    doc = parse_text(text, name).documents["nccl_topo"]
    gpus = doc.gpus
    assert [g.dev for g in gpus] == list(range(8)) and {g.sm for g in gpus} == {90}
    switches = {"0000:f3:00.0", "0000:f4:00.0", "0000:f5:00.0", "0000:f6:00.0"}
    for g in gpus:
        assert {n.target for n in g.nvlinks} == switches
        assert sum(n.count for n in g.nvlinks) == 18
        assert {n.tclass for n in g.nvlinks} == {"0x068000"}
    assert not switches & {p.busid for p in doc.pci}
    assert [(n.name, n.dev, n.speed) for n in doc.nics][:2] == [
        ("mlx5_7", 7, 200000), ("mlx5_6", 6, 200000)]
    assert len(doc.nics) == 8
    by_bus = {p.busid: p for p in doc.pci}
    assert by_bus["0000:a4:00.0"].link_width == 0
    assert by_bus["0000:a1:00.0"].link_speed == "2.5 GT/s PCIe"
    assert gpus[4].numaid == 1 and gpus[0].pci_path == ["0000:a4:00.0", "0000:a1:00.0"]


def test_rccl_transport_lines_end_with_their_communicator() -> None:
    c = parse("rccl_log_2node_mi250x_transport_lines_with_comm_suffix_rccl1026.log")
    assert c.transports == ["NET/Socket/1", "NET/Socket/2", "P2P/IPC"]
    assert c.peer_transport == {"1->4": "NET/Socket/1", "2->0": "P2P/IPC", "2->3": "P2P/IPC",
                                "3->6": "NET/Socket/2", "7->5": "P2P/IPC"}
    assert c.nranks == 8 and c.comms[0].connected_rings is True


def test_rccl_init_complete_with_used_bytes() -> None:
    c = parse("rccl_log_4gpu_init_complete_used_bytes_rccl419.log")
    (comm,) = c.comms
    assert comm.ranks["3"].init == "COMPLETE" and comm.ranks["3"].bus_id == "63000"
    assert comm.nranks == 4 and comm.coll_channels == 4 and comm.nchannels == 4
    assert c.env == {"NCCL_NTHREADS": "256"}
    assert c.peer_transport == {"1->0": "P2P/IPC", "2->1": "P2P/IPC", "3->0": "P2P/IPC",
                                "3->2": "P2P/IPC"}


def test_joined_lines_keep_the_version_printed_mid_line() -> None:
    c = parse("nccl_log_vllm_worker_lines_joined_version_mid_line_vllm12292.log")
    assert c.nccl_version == "2.20.5+cuda12.4" and c.cuda_driver_version == "12060"
    assert c.lines["total"] == 3 and c.lines["nccl"] == 9 and c.lines["spliced"] == 2


def test_two_vms_pxn_hops_and_a_plugin_name_with_spaces() -> None:
    name = "alltoall_perf_2vm_h20_pxn_rdma_plugin_with_spaces_nccltests321.txt"
    parsed = parse_text((DATA / name).read_text(), name)
    assert parsed.format == "nccl-tests" and len(parsed.collectives) == 26
    c: NcclParsed = parsed.documents["nccl_choices"]
    (comm,) = c.comms
    assert comm.comm_id == "0x5bfdf821d2742f21" and comm.nnodes == 2
    assert {r: (i.host, i.cuda_dev, i.nvml_dev, i.init)
            for r, i in comm.ranks.items()} == {
        "0": ("vm-host40", 0, 1, "COMPLETE"), "1": ("vm-host40", 1, 0, "COMPLETE"),
        "2": ("vm-host38", 0, 1, "COMPLETE"), "3": ("vm-host38", 1, 0, "COMPLETE")}
    assert c.rings == {"0": [0, 3, 2, 1], "1": [0, 1, 2, 3], "2": [0, 3, 2, 1],
                       "3": [0, 1, 2, 3]}
    assert c.env["NCCL_P2P_LEVEL"] == "NVL" and c.env["NCCL_PXN_DISABLE"] == "0"
    assert (comm.coll_channels, comm.collnet_channels, comm.nvls_channels) == (4, 4, 0)
    sends = {(e.src, e.dst): e for e in comm.transports
             if e.direction == "send" and e.channel == 1}
    assert sends[(3, 0)].via == "NET/NCCL RDMA Plugin v6/0(2)/GDRDMA/Shared"
    assert sends[(3, 0)].pxn_rank == 2 and sends[(3, 0)].family == "NET"
    assert sends[(2, 0)].pxn_rank is None  # rank 2's own NIC
    assert c.peer_transport["2->3"] == "P2P/CUMEM"
    assert c.transport_families == ["NET", "P2P"]


def test_network_name_with_spaces() -> None:
    # The line as NVIDIA/nccl-tests issue #321 shows it, before the excerpt above starts.
    line = "vm-host40:34002:34044 [1] NCCL INFO Using network NCCL RDMA Plugin v6\n"
    assert parse_nccl_log(line * 2, "l").comms[0].network == "NCCL RDMA Plugin v6"


def test_comm_split_named_by_its_color_and_its_init_phases_read() -> None:
    c = parse("nccl_log_comm_split_color_runtime_connect_deepspeed_4node_g6e.log")
    (comm,) = c.comms
    assert comm.comm_id == "split:2003953581:1" and comm.nranks == 4
    assert comm.nnodes == 4 and comm.network == "Socket"
    r0 = comm.ranks["0"]
    assert (r0.init, r0.bus_id, r0.comm, r0.local_rank) == (
        "COMPLETE", "36000", "0x562b2ca93860", 0)
    assert c.rings == {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3]}
    assert c.peer_transport == {"0->1": "NET/Socket/0", "0->2": "NET/Socket/0",
                                "1->0": "NET/Socket/0", "2->0": "NET/Socket/0",
                                "3->0": "NET/Socket/0"}
    assert comm.connected_rings and comm.connected_trees
    assert (comm.ring_pxn, comm.ring_gdr) == (False, False)  # `use ring PXN 0 GDR 0`
    assert comm.p2p_type == "isAllDirectP2p 0 directMode 0"


def test_four_split_communicators_of_one_size_stay_apart() -> None:
    c = parse("nccl_log_four_comm_splits_torchrun_default_tag_elided_host.log")
    assert [(x.comm_id, x.nranks, x.ranks["0"].cuda_dev, x.ranks["0"].pid,
             x.ranks["0"].host, x.ranks["0"].init) for x in c.comms] == [
        ("split:923304772:1", 2, 0, 78, "...", "START"),
        ("split:1449462471:1", 2, 1, 79, "...", "START"),
        ("split:120142604:1", 2, 2, 80, "...", "START"),
        ("split:1211335945:1", 2, 3, 81, "...", "START")]


def test_sglang_tp_lines_and_a_kubernetes_pod_name_as_host() -> None:
    # SGLang's `[time TP0]` lines between NCCL's, whose prefix starts with a pod name full of
    # dashes and digits (sgl-project/sglang issue #8974)
    c = parse("nccl_log_2.27.6_sglang_tp_lines_k8s_pod_host_sglang8974.log")
    assert c.nccl_version == "2.27.6+cuda12.9" and c.env == {"NCCL_IB_DISABLE": "1"}
    (comm,) = c.comms
    assert (comm.comm_id, comm.nranks, comm.network) == ("0xb6ef167071e271f7", 4, "Socket")
    r0 = comm.ranks["0"]
    assert (r0.host, r0.pid, r0.bus_id, r0.init) == (
        "adp-us-llm-1-00001-deployment-6f47c67945-s59dl", 234, "18000", "START")
    assert c.lines["nccl"] == 11  # of 13 lines: the two SGLang lines are not NCCL's


def test_init_complete_wrapped_inside_the_comm_id() -> None:
    # the paste broke `commId 0x9d61c66c9945bb3e - Init COMPLETE` after `0x9d61c66c9945`
    # (sgl-project/sglang issue #14382): the id is whole and the rank counts as initialised
    c = parse("nccl_log_init_complete_wrapped_inside_commid_pod_host_sglang14382.log")
    (comm,) = c.comms
    assert comm.comm_id == "0x9d61c66c9945bb3e" and comm.nranks == 8
    r0 = comm.ranks["0"]
    assert (r0.host, r0.init) == ("s-20260228211257-kg9mw-mr-jwgtl-prefill-h7wpr-prefill-0",
                                        "COMPLETE")
    assert (comm.coll_channels, comm.ring_pxn, comm.ring_gdr) == (24, 0, 1)


def test_launcher_host_colon_prefix_before_ncccls_own() -> None:
    # pdsh-style `host: ` before every line, NCCL's own `host:pid:tid [dev]` after it
    # (NVIDIA/nccl issue #1029): the host is the prefix's, not `rdma-test-gpu-worker-1: rdma...`
    text = (DATA / "nccl_log_pdsh_host_colon_prefix_before_nccl_prefix_nccl1029.log").read_text()
    assert detect(text) == "nccl-log"
    c = parse_nccl_log(text, "nccl1029")
    assert c.lines["nccl"] == 1 and c.lines["without_prefix"] == 0
    assert [w for w in c.warnings if "host" in w.lower()] == []


def test_trees_line_cut_by_another_process_output_keeps_the_whole_channels() -> None:
    # DeepGEMM's `All deep_gemm operations loaded successfully!` landed inside channel 25's tree
    # (sgl-project/sglang issue #11208): channels 0-24 are whole and kept, 25 is not invented
    c = parse("nccl_log_trees_line_cut_by_deep_gemm_output_gb200_sglang11208.log")
    (comm,) = c.comms
    trees = comm.trees["0"]
    assert sorted(map(int, trees)) == list(range(25))
    assert (trees["0"], trees["8"], trees["24"]) == ("1/-1/-1->0->-1", "-1/-1/-1->0->1",
                                                     "-1/-1/-1->0->1")
