"""What each all-reduce launch gets (issue 15, defects 4, 7 and 8), seen where the runner starts
it. A GPU launch cannot run here, so torchrun is replaced by a process that prints what NCCL 2.28.9
printed on a real 4-GPU box (../shared/samples/tool-outputs/nccl_debug_info_4x5060ti_p2p_cumem.log:
4 ranks on NVML devices 1-4, ring 0 1 2 3 on both channels) and, when asked for NCCL's graph dump,
writes the graph file NCCL wrote on a real Azure VM; the runner around it is the real one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pcieprof import probe_runner
from pcieprof.bundle import Bundle
from pcieprof.importers.nccl_xml import parse_graph_xml
from pcieprof.probe_runner import ProbeRunner, launch_environ
from probes import variants as V
from probes.nccl_graph import check_ring, ring_graph_xml, same_ring
from pcieprof.bundle.plan import Plan
from probes.plan import build_plan

LOG = "tool-outputs/nccl_debug_info_4x5060ti_p2p_cumem.log"
GRAPH = "tool-outputs/nccl_graph_azure_ncv4_4xA100pcie_vm.xml"


class Launches:
    """Stands in for subprocess.Popen in the runner: records each launch (argv, environment, the
    plan file as it was then) and runs a real process that replays `log` as its output."""

    def __init__(self, log: Path | None = None, graph: Path | None = None) -> None:
        self.log, self.graph = log, graph
        self.seen: list[dict[str, Any]] = []
        self.real = subprocess.Popen

    def __call__(self, cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
        if "torch.distributed.run" not in cmd:  # not a launch (e.g. `uname -p` of platform)
            return self.real(cmd, **kw)
        env = kw["env"]
        plan = json.loads(Path(cmd[cmd.index("--plan") + 1]).read_text())
        self.seen.append({"cmd": cmd, "env": env, "plan": plan})
        dump = env.get("NCCL_GRAPH_DUMP_FILE")
        if dump and self.graph is not None:
            shutil.copy(self.graph, dump)
        replay = ["cat", str(self.log)] if self.log else [sys.executable, "-c", "pass"]
        return self.real(replay, **kw)


def _allreduce_only(tmp_path: Path, plan: Plan) -> Bundle:
    """The plan's all-reduce cases (no copies) run by the probe runner into a new bundle."""
    plan.p2p, plan.concurrent = [], []
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured",
                           backend=plan.backend)
    runner = ProbeRunner(bundle, plan)
    try:
        runner.run_allreduce()
    finally:
        runner.cleanup()
    return bundle


def test_the_users_nccl_settings_reach_no_launch(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_P2P_LEVEL", "SYS")
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    launches = Launches()
    monkeypatch.setattr(probe_runner.subprocess, "Popen", launches)
    plan = build_plan("cpu", [0, 1], quick=True, max_size=64,
                      variants=[V.VARIANTS["default"], V.VARIANTS["proto_ll"]])
    plan.keep_env = ["NCCL_SOCKET_IFNAME"]  # chosen by the caller: passed on
    bundle = _allreduce_only(tmp_path, plan)
    assert len(launches.seen) == 2
    default, proto_ll = (s["env"] for s in launches.seen)
    for env in (default, proto_ll):
        assert "NCCL_P2P_LEVEL" not in env and "TORCH_NCCL_BLOCKING_WAIT" not in env
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert "NCCL_ALGO" not in default and "NCCL_PROTO" not in default
    assert proto_ll["NCCL_PROTO"] == "LL" and "NCCL_ALGO" not in proto_ll
    user = bundle.read_json("nccl_choices.json")["default"]["user_env"]
    assert user["left_out"] == {"NCCL_P2P_LEVEL": "SYS", "NCCL_ALGO": "Tree",
                                "TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert user["kept"] == {"NCCL_SOCKET_IFNAME": "eth0"}


def test_launch_environ_masks_nothing_it_keeps_and_drops_by_prefix() -> None:
    env, dropped = launch_environ({"PATH": "/bin", "NCCL_DEBUG": "WARN", "TORCH_NCCL_X": "1",
                                   "NCCL_IB_HCA": "mlx5"}, ["NCCL_IB_HCA"])
    assert env == {"PATH": "/bin", "NCCL_IB_HCA": "mlx5"}
    assert dropped == {"NCCL_DEBUG": "WARN", "TORCH_NCCL_X": "1"}


def test_ring_graph_file_is_one_nccl_reads() -> None:
    doc = parse_graph_xml(ring_graph_xml([0, 2, 3, 1]))
    (g,) = doc.graphs
    assert (g.id, g.pattern, g.nchannels) == (0, 4, 2)
    assert [c.gpus for c in g.channels] == [[0, 2, 3, 1]] * 2
    # NCCL 2.2x writes <gpu dev> "%#lx" and reads it with strtol(..., 16), older releases with
    # strtol base 0 (search.cc ncclTopoGetChannelFromXml): "0xa" is 10 to both, a bare "a" is not
    assert '<gpu dev="0xa"/>' in ring_graph_xml([0, 10]) and '<gpu dev="0"/>' in ring_graph_xml([0, 10])
    assert [c.gpus for c in parse_graph_xml(ring_graph_xml([0, 10])).graphs[0].channels] \
        == [[0, 10]] * 2


def test_same_ring_is_rotation_or_reversal() -> None:
    assert same_ring([0, 1, 2, 3], [2, 3, 0, 1]) and same_ring([0, 1, 2, 3], [0, 3, 2, 1])
    assert not same_ring([0, 1, 2, 3], [0, 2, 1, 3])


def test_the_ring_nccl_used_comes_from_its_log(samples: Path) -> None:
    from pcieprof.importers.nccl_log import parse_nccl_log

    parsed = parse_nccl_log((samples / LOG).read_text())
    wrong_map = {r: 10 + r for r in range(4)}  # the log's nvmlDev wins over the launch's order
    ok = check_ring(parsed, [2, 3, 4, 1], wrong_map)
    assert ok["applied"] and ok["used"] == [[1, 2, 3, 4], [1, 2, 3, 4]]
    assert ok["mapped_by"].startswith("nvmlDev")
    no = check_ring(parsed, [1, 3, 2, 4], wrong_map)
    assert not no["applied"] and "NCCL used 1 2 3 4" in no["why"]


def test_ring_orders_go_through_a_graph_file_and_are_checked(
        tmp_path: Path, samples: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launches = Launches(samples / LOG, samples / GRAPH)
    monkeypatch.setattr(probe_runner.subprocess, "Popen", launches)
    plan = build_plan("cuda", [1, 2, 3, 4], quick=True, max_size=64,
                      variants=[V.VARIANTS["default"]], group_kinds=[],
                      orders=[[2, 3, 4, 1], [1, 3, 2, 4]])
    bundle = _allreduce_only(tmp_path, plan)
    # default, then each order; then each order with NCCL_ALGO=Ring and their one baseline:
    # each an untimed launch with the tuner log, then the timed one
    assert len(launches.seen) == 12
    untimed = [s for s in launches.seen if "--untimed" in s["cmd"]]
    timed = [s for s in launches.seen if "--untimed" not in s["cmd"]]
    assert len(untimed) == len(timed) == 6
    for s in untimed:
        assert "TUNING" in s["env"]["NCCL_DEBUG_SUBSYS"].split(",")
    for s in timed:
        assert "TUNING" not in s["env"]["NCCL_DEBUG_SUBSYS"].split(",")
    for s in launches.seen:  # rank r on the r-th GPU in PCI order; the ring is NCCL's graph's
        assert s["env"]["CUDA_VISIBLE_DEVICES"] == "1,2,3,4"
    assert "NCCL_GRAPH_DUMP_FILE" in untimed[0]["env"] and "NCCL_GRAPH_FILE" not in untimed[0]["env"]
    graph_file = Path(untimed[1]["env"]["NCCL_GRAPH_FILE"])
    assert graph_file == bundle.path / "nccl" / "default@2-3-4-1.graph.xml"
    (g,) = parse_graph_xml(graph_file.read_text()).graphs
    azure = next(x for x in parse_graph_xml((samples / GRAPH).read_text()).graphs
                 if x.pattern == 4)
    assert all(c.gpus == [2, 3, 4, 1] for c in g.channels)
    assert (g.nchannels, g.speedintra) == (azure.nchannels, azure.speedintra)

    choices = bundle.read_json("nccl_choices.json")
    applied = choices["default@2-3-4-1"]
    assert applied["ring_check"]["untimed"]["applied"] and applied["ring_check"]["timed"]["applied"]
    assert "NCCL's own ring graph" in applied["ring_graph"]["header"]
    refused = choices["default@1-3-2-4"]
    assert not refused["ring_check"]["untimed"]["applied"]
    # the timed launch of that order says so in every row it writes
    detail = timed[2]["plan"]["allreduce"][2]["detail"]
    assert "ring order NOT applied" in detail and "NCCL used 1 2 3 4" in detail
    assert "applied through NCCL_GRAPH_FILE" in timed[1]["plan"]["allreduce"][1]["detail"]
    assert choices["default"]["tuner"] == [] and choices["default"]["parsed"]["rings"]
    # issue 23 pt 3: the order with NCCL_ALGO=Ring goes through its own graph file; its
    # baseline, the same GPUs in plain order, with NCCL_ALGO=Ring and NCCL's own graph
    ring_order, baseline = timed[3], timed[4]
    assert ring_order["env"]["NCCL_ALGO"] == baseline["env"]["NCCL_ALGO"] == "Ring"
    assert Path(ring_order["env"]["NCCL_GRAPH_FILE"]).name == "algo_ring@2-3-4-1.graph.xml"
    assert "NCCL_GRAPH_FILE" not in baseline["env"]
    assert choices["algo_ring@2-3-4-1"]["ring_check"]["timed"]["applied"]
    assert choices["algo_ring"]["ring_check"] is None  # the baseline is in plain order
    assert [s["env"]["NCCL_ALGO"] for s in untimed[3:]] == ["Ring"] * 3


def test_sizes_where_the_tuner_chose_tree_do_not_claim_the_ring(
        tmp_path: Path, samples: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 23 pt 3: a graph file sets the ring graph (id 0) only; the tree is searched apart and
    # stays enabled on one node, so where the tuner picks TREE the requested ring did not run.
    # The replayed log is the real 4-GPU one plus TUNING lines in NCCL 2.2x's form (enqueue.cc,
    # as pcieprof.importers.nccl_log reads them): TREE at 8 and 16 B, RING at 32 and 64 B.
    tuning = "".join(
        f"proxmox:113060:113060 [0] NCCL INFO AllReduce: {b} Bytes -> Algo {a} proto LL "
        "channel{Lo..Hi}={0..1}\n" for b, a in ((8, "TREE"), (16, "TREE"), (32, "RING"),
                                                 (64, "RING")))
    log = tmp_path / "tuning.log"
    log.write_text((samples / LOG).read_text() + tuning)
    launches = Launches(log, samples / GRAPH)
    monkeypatch.setattr(probe_runner.subprocess, "Popen", launches)
    plan = build_plan("cuda", [1, 2, 3, 4], quick=True, max_size=64,
                      variants=[V.VARIANTS["default"]], group_kinds=[], orders=[[2, 3, 4, 1]])
    bundle = _allreduce_only(tmp_path, plan)
    timed = [s for s in launches.seen if "--untimed" not in s["cmd"]]
    case = Plan.from_json(timed[1]["plan"]).allreduce[1]
    assert "ring order applied" in case.detail
    assert "TREE at 8 B" in case.detail_at(8) and "TREE at 16 B" in case.detail_at(16)
    assert "TREE" not in case.detail_at(32) and "TREE" not in case.detail_at(64)
    check = bundle.read_json("nccl_choices.json")["default@2-3-4-1"]["ring_check"]
    assert check["not_ring_sizes"] == {"8": "TREE", "16": "TREE"}


def test_gpus_are_named_by_their_nvml_uuid_when_discovery_has_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 23 pt 8: CUDA ordinal = NVML index was assumed (PCI_BUS_ID order); the UUIDs NVML
    # reported name the same GPUs whatever order CUDA enumerates in
    launches = Launches()
    monkeypatch.setattr(probe_runner.subprocess, "Popen", launches)
    plan = build_plan("cuda", [1, 3], quick=True, max_size=64, variants=[V.VARIANTS["default"]],
                      group_kinds=[])
    plan.p2p, plan.concurrent = [], []
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cuda")
    bundle.write_json("topology.json", {"gpus": [{"index": i, "uuid": f"GPU-0000000{i}"}
                                                 for i in range(4)]})
    runner = ProbeRunner(bundle, plan)
    try:
        runner.run_allreduce()
    finally:
        runner.cleanup()
    assert {s["env"]["CUDA_VISIBLE_DEVICES"] for s in launches.seen} == {"GPU-00000001,GPU-00000003"}
