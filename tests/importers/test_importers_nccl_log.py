"""NCCL_DEBUG=INFO logs: interleaved ranks and spliced lines, as real multi-process logs are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcieprof.errors import BadInput
from pcieprof.bundle.nccl_choices import NcclParsed
from pcieprof.importers.nccl_log import parse_nccl_log

LOG = "tool-outputs/nccl_debug_info_4x5060ti_p2p_cumem.log"


@pytest.fixture(scope="module")
def choices(samples: Path) -> NcclParsed:
    return parse_nccl_log((samples / LOG).read_text(), "vllm_tp4.log")


def test_version_env_and_json(choices: NcclParsed) -> None:
    assert choices.source == "vllm_tp4.log"
    assert choices.nccl_version == "2.28.9+cuda13.0"
    assert choices.cuda_driver_version == "13030"
    assert choices.env == {"NCCL_CUMEM_ENABLE": "1", "NCCL_P2P_LEVEL": "PHB",
                              "NCCL_IGNORE_CPU_AFFINITY": "1", "NCCL_MAX_NCHANNELS": "4",
                              "NCCL_PROTO": "Simple"}
    doc = json.loads(json.dumps(choices.to_json()))
    assert doc["format"] == "pcieprof.nccl_choices/2"
    assert NcclParsed.from_json(doc) == choices  # written and read back, the same document


def test_ranks_of_interleaved_processes(choices: NcclParsed) -> None:
    assert len(choices.comms) == 2  # vLLM inits two communicators over the same 4 ranks
    main = choices.comms[0]
    assert main.comm_id == "0xecf1aa0ad32ab8b2" and main.nranks == 4 and main.nnodes == 1
    assert {r: (v.pid, v.cuda_dev, v.nvml_dev, v.bus_id) for r, v in main.ranks.items()} == {
        "0": (113060, 0, 1, "9000"), "1": (113124, 1, 2, "a000"),
        "2": (113134, 2, 3, "b000"), "3": (113224, 3, 4, "c000")}
    assert all(v.init == "COMPLETE" for v in main.ranks.values())
    assert main.trees["2"] == {"0": "3/-1/-1->2->1", "1": "3/-1/-1->2->1"}


def test_channels_rings_transports(choices: NcclParsed) -> None:
    assert choices.nranks == 4 and choices.nchannels == 2
    assert choices.rings == {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3]}
    assert choices.transports == ["P2P/CUMEM"] and choices.transport_families == ["P2P"]
    assert choices.peer_transport["3->0"] == "P2P/CUMEM"
    main = choices.comms[0]
    assert {(t.channel, t.src, t.dst, t.src_dev, t.dst_dev) for t in main.transports} >= {
        (0, 0, 1, "1", "2"), (1, 3, 2, "4", "3")}
    assert main.coll_channels == 2 and main.p2p_channels == 2
    assert main.thread_thresholds == "8/8/64 | 32/8/64 | 512 | 512"
    assert main.connected_rings and main.connected_trees
    second = choices.comms[1]
    assert second.comm_id == "0x1d743bc535ed823" and second.rings["1"] == [0, 1, 2, 3]


def test_spliced_lines_are_split(samples: Path, choices: NcclParsed) -> None:
    # Three physical lines hold two log lines each (ncclCommInitRankCon|proxmox:113134:...).
    lines = [l for l in (samples / LOG).read_text().splitlines() if l.strip()]
    assert sum(1 for l in lines if " NCCL INFO " in l) == len(lines)
    assert choices.lines["spliced"] == 3
    assert choices.lines["nccl"] == len(lines) + 3
    rank2 = choices.comms[0].ranks["2"]
    assert rank2.host == "proxmox"  # host recovered from the glued 'ncclCommInitRankConproxmox'


def test_tuner_choices_and_other_transports() -> None:
    text = "\n".join([
        "h1:10:10 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "h1:10:10 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
        "busId 1000 commId 0xabc - Init START",
        "h1:11:11 [1] NCCL INFO ncclCommInitRank comm 0x2 rank 1 nranks 2 cudaDev 1 nvmlDev 1 "
        "busId 2000 commId 0xabc - Init START",
        "h1:10:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct",
        "h1:11:21 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/direct pointer",
        "h1:10:10 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
        "",
        "h1:11:11 [1] transport/p2p.cc:272 NCCL WARN Cuda failure 'peer access is not supported'",
    ])
    # the Channel lines come from other threads (tid 20, 21) of the same processes
    c = parse_nccl_log(text, "mini.log")
    assert c.peer_transport == {"0->1": "SHM/direct/direct", "1->0": "P2P/direct pointer"}
    assert c.transport_families == ["P2P", "SHM"]
    assert c.tuner == [{"coll": "AllReduce", "bytes": 4096, "algo": "RING", "proto": "LL",
                           "channels": [0, 1], "time_us": None}]
    # the WARN line as NCCL prints it (src/debug.cc: a blank line, then `[dev] file.cc:N NCCL
    # WARN`); the line itself is built here, real ones are in test_importers_variants_logs.py
    [w] = c.warnings
    assert (w["rank"], w["source"], w["line"]) == (1, "transport/p2p.cc:272", 8)
    assert w["text"] == "Cuda failure 'peer access is not supported'"


def test_no_nccl_lines() -> None:
    with pytest.raises(BadInput) as e:
        parse_nccl_log("just some text\n", "empty.log")
    assert e.value.one_line().startswith("empty.log: expected NCCL_DEBUG=INFO lines")


# Real lines of older and multi-node NCCL versions, verbatim from public issue threads:
# NVIDIA/nccl #300 (NCCL 2.5.6), #1189 (H20, two nodes), #743 (P2P/IPC/read), #952 (NET [send]).
OLD_AND_MULTINODE = """\
73e9f9f45158:6243:6442 [3] NCCL INFO threadThresholds 8/8/64 | 32/8/64
73e9f9f45158:6243:6442 [3] NCCL INFO Trees [0] -1/-1/-1->3->2|2->3->-1/-1/-1 [1] 1/-1/-1->3->2|2->3->1/-1/-1 [2] -1/-1/-1->3->2|2->3->-1/-1/-1 [3] 1/-1/-1->3->2|2->3->1/-1/-1
73e9f9f45158:6243:6442 [3] NCCL INFO Ring 00 : 3[b0] -> 0[80] via direct shared memory
73e9f9f45158:6241:6447 [1] NCCL INFO Ring 00 : 1[90] -> 2[c0] via direct shared memory
H20-GPU-05:1789224:1789735 [0] NCCL INFO Ring 02 : 2 -> 0 -> 1
H20-GPU-05:1789225:1789736 [1] NCCL INFO Ring 06 : 0 -> 1 -> 3
H20-GPU-06:4015540:4015653 [1] NCCL INFO comm 0x5b0bc60 rank 3 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0
task272117-mq5ss:1902:2004 [3] NCCL INFO Channel 00 : 3[50000] -> 2[4a000] via P2P/IPC/read
<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
"""


def test_older_and_multinode_formats() -> None:
    c = parse_nccl_log(OLD_AND_MULTINODE, "old.log")
    vias = {v for comm in c.comms for v in comm.peer_transport.values()}
    # lines before any init line have no communicator: they must not crash nor be invented
    assert c.nccl_version is None and isinstance(vias, set)
    h20 = [comm for comm in c.comms if comm.nnodes == 2]
    assert h20 and h20[0].ranks["3"].local_rank == 1


def test_older_formats_with_their_init_lines() -> None:
    init = ("73e9f9f45158:6243:6442 [3] NCCL INFO comm 0x7f0 rank 3 nranks 4 cudaDev 3 "
            "busId b0 - Init COMPLETE\n"
            "73e9f9f45158:6241:6447 [1] NCCL INFO comm 0x7f1 rank 1 nranks 4 cudaDev 1 "
            "busId 90 - Init COMPLETE\n")
    c = parse_nccl_log(init + OLD_AND_MULTINODE, "old.log")
    main = [comm for comm in c.comms if comm.nranks == 4 and "3" in comm.ranks][0]
    assert main.comm_id is None and set(main.ranks) == {"1", "3"}
    assert main.ranks["3"].bus_id == "b0" and main.ranks["1"].pid == 6241
    assert main.peer_transport["3->0"] == "direct shared memory"
    assert main.trees["3"]["1"] == "1/-1/-1->3->2|2->3->1/-1/-1"
    assert main.thread_thresholds == "8/8/64 | 32/8/64"
