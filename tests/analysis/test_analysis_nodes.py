"""A multi-node bundle in words (pcieprof.analysis.nodes) and its compare metrics, on the
committed two-node run (tests/data/bundle_schema3/cpu_2node) and a real two-node NCCL log."""

from __future__ import annotations

from pathlib import Path

from pcieprof.analysis.decode_band import band_for
from pcieprof.cards import DEFAULT_CARD
from pcieprof.analysis.metrics import bundle_metrics
from pcieprof.analysis.nodes import Nodes, internode_transport
from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclCase, NcclChoices
from pcieprof.bundle.nodes import NodeLayout
from pcieprof.importers.nccl_log import parse_nccl_log

ROOT = Path(__file__).resolve().parents[2]
TWO = ROOT / "tests" / "data" / "bundle_schema3" / "cpu_2node"
LOG = ROOT / "tests" / "data" / "importers" / "nccl_log_2.29.2_2rank_socket_warn_timestamp.log"


def test_the_layout_of_each_node() -> None:
    zero, one = Nodes.of(Bundle.open(TWO / "node0")), Nodes.of(Bundle.open(TWO / "node1"))
    assert zero is not None and one is not None
    assert zero.describe() == one.describe() == "2 nodes x 2 processes"
    assert zero.group((0, 1, 2, 3)) == "2 nodes x 2 processes (4 ranks, inter-node)"
    assert zero.group((0, 1)) == "2 processes of node 0 (intra-node)"
    assert zero.scope((2, 3)) == "intra-node" and zero.scope((1, 2)) == "inter-node"
    facts = dict(one.facts())
    assert facts["layout"] == "2 nodes x 2 processes; this bundle is node 1 of 2"
    assert facts["collective rows"].startswith("node 0 (") and facts["collective rows"].endswith(
        "cpu_2node/node0")
    assert facts["node 1"].startswith("host ") and "devices 0,1 = global 2,3" in facts["node 1"]
    assert zero.transport == "gloo over TCP (cpu backend: NCCL not used)"
    assert Nodes.of(Bundle.open(ROOT / "tests" / "data" / "bundle_schema2" / "sim_vm_4gpu")) is None


def test_nccls_inter_node_transport_from_a_real_two_node_log() -> None:
    parsed = parse_nccl_log(LOG.read_text(encoding="utf-8"), LOG.name)
    assert any(c.nnodes == 2 for c in parsed.comms)  # the log is of 2 nodes
    choices = NcclChoices(cases={"default": NcclCase("default", ranks=(0, 1), parsed=parsed)})
    two = NodeLayout(nnodes=2, node_rank=0, stride=1)
    assert internode_transport(choices, two, "cuda") == "Socket (NET/Socket/0/Shared)"
    # a case inside one node says nothing about the network between them
    inside = NodeLayout(nnodes=2, node_rank=0, stride=2)
    assert internode_transport(choices, inside, "cuda").startswith("not in the NCCL logs")


def test_compare_metrics_name_groups_by_nodes() -> None:
    m = bundle_metrics(Bundle.open(TWO / "node0"), band_for(DEFAULT_CARD))
    ar = sorted({k.split(".")[2] for k in m if k.startswith("allreduce.")})
    # across the nodes 2x2; node 0's own GPUs as on one box (n2)
    assert ar == ["2x2", "n2"]
    assert "allreduce.default.2x2.time_us@12KiB" in m and "allreduce.default.n2.busbw_gbps@max" in m
    assert not any(k.startswith("allreduce.") for k in bundle_metrics(
        Bundle.open(TWO / "node1"), band_for(DEFAULT_CARD)))
