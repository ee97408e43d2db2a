"""The measurement plan and the variant table (no processes started)."""

from __future__ import annotations

import json

import pytest

from pcieprof.errors import BadInput
from probes import variants as V
from pcieprof.bundle.plan import Plan
from probes.plan import MiB, build_plan, iters_for, shared_uplink_flows, sizes_pow2


def test_quick_cpu_plan_covers_every_ordered_pair_on_both_paths() -> None:
    plan = build_plan("cpu", [0, 1, 2, 3], quick=True)
    bw = {(c.src, c.dst, c.path) for c in plan.p2p if c.kind == "bandwidth" and c.direction == "uni"}
    for path in ("p2p", "host_staged"):
        pairs = {(a, b) for a, b, p in bw if p == path}
        assert len(pairs) == 12 and all(a != b for a, b in pairs)
    assert {c.path for c in plan.p2p} == {"p2p", "host_staged", "h2d", "d2h"}
    assert any(c.kind == "latency" for c in plan.p2p)
    # three variants, 8 B .. 64 MiB, both dtypes; NCCL-only variants are labelled on gloo
    assert [c.variant for c in plan.allreduce] == ["default", "p2p_disable", "proto_ll"]
    for c in plan.allreduce:
        assert c.sizes[0] == 8 and c.sizes[-1] == 64 * MiB and len(c.sizes) == 24
        assert c.dtypes == ["bf16", "fp32"]
        assert (c.detail == V.GLOO_IGNORES_NCCL) == bool(c.env)


def test_full_plan_sweeps_to_256mib_with_the_rules_variants_and_groups() -> None:
    plan = build_plan("cuda", list(range(8)))
    allv = [c for c in plan.allreduce if c.ranks == list(range(8))]
    # the variants recommend's rules compare with default; the other four with --variants all
    assert [c.variant for c in allv] == V.DEFAULT_VARIANTS
    env = {k for c in allv for k in c.env}
    assert env == {"NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_PROTO", "NCCL_MIN_NCHANNELS"}
    every = build_plan("cuda", list(range(8)), variants=V.parse_variants("all"))
    assert [c.variant for c in every.allreduce if c.ranks == list(range(8))] == list(V.VARIANTS)
    assert allv[0].sizes[-1] == 256 * MiB and len(allv[0].sizes) == 26
    assert all(c.detail == "" for c in plan.allreduce)  # cuda: NCCL reads them
    groups = [c.ranks for c in plan.allreduce if c.ranks != list(range(8))]
    assert [0, 1, 2, 3] in groups and [4, 5, 6, 7] in groups
    # the pairs TP2 layouts use (every pair with group_kinds=["pairs"]: 28 cases)
    assert [g for g in groups if len(g) == 2] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert {c.pattern for c in plan.concurrent} == {"ring", "shared_uplink", "all_to_all"}
    assert {c.op for c in plan.concurrent} == {"write", "read"}


def test_plan_round_trips_through_json() -> None:
    plan = build_plan("cpu", [0, 1, 2], quick=True, orders=[[2, 0, 1]], p2p_sweep=True)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert plan.to_json()["nranks"] == 3
    assert isinstance(again.concurrent[0].flows[0], tuple)


def test_one_rank_per_node_is_a_cross_node_all_reduce() -> None:
    assert build_plan("cpu", [0], quick=True).allreduce == []  # one rank on one node: none
    plan = build_plan("cpu", [0], quick=True, nnodes=2, variants=[V.VARIANTS["default"]])
    [case] = plan.allreduce
    assert not case.node0_only and plan.world(case) == 2 and plan.global_ranks(case) == (0, 1)
    d = plan.to_json()
    assert (d["nranks"], d["ranks_per_node"], d["nnodes"], d["stride"]) == (2, 1, 2, 1)
    assert Plan.from_json(plan.to_json()) == plan


def test_multi_node_plan_numbers_ranks_globally_and_adds_node0s_own_case() -> None:
    plan = build_plan("cuda", [0, 1, 2, 3], quick=True, nnodes=2, group_kinds=["pairs"],
                      variants=[V.VARIANTS["default"], V.VARIANTS["proto_ll"]])
    cross = [c for c in plan.allreduce if not c.node0_only]
    [own] = [c for c in plan.allreduce if c.node0_only]
    assert plan.allreduce[-1] is own  # last: the other nodes go on with their copies
    assert own.variant == "default" and own.ranks == [0, 1, 2, 3] and own.label.endswith(".node0")
    assert plan.world(own) == 4 and plan.global_ranks(own) == (0, 1, 2, 3)
    full = cross[0]
    assert plan.world(full) == 8 and plan.global_ranks(full) == tuple(range(8))
    pair = next(c for c in cross if c.ranks == [2, 3])
    assert plan.global_ranks(pair) == (2, 3, 6, 7)  # node x 4 + device, node 0 first
    d = plan.to_json()
    assert [c["global_ranks"] for c in d["allreduce"]][:2] == [list(range(8))] * 2
    assert len({c.label for c in plan.allreduce}) == len(plan.allreduce)
    with pytest.raises(BadInput, match="nnodes 0"):
        build_plan("cpu", [0, 1], nnodes=0)


def test_variant_env_names_match_nccl_docs() -> None:
    assert V.VARIANTS["p2p_disable"].env == {"NCCL_P2P_DISABLE": "1"}
    assert V.VARIANTS["p2p_level_sys"].env == {"NCCL_P2P_LEVEL": "SYS"}
    assert V.VARIANTS["proto_ll"].env == {"NCCL_PROTO": "LL"}
    assert V.VARIANTS["proto_simple"].env == {"NCCL_PROTO": "Simple"}
    assert V.VARIANTS["algo_ring"].env == {"NCCL_ALGO": "Ring"}
    assert V.VARIANTS["algo_tree"].env == {"NCCL_ALGO": "Tree"}
    assert V.VARIANTS["nch8"].env == {"NCCL_MIN_NCHANNELS": "8"}
    assert [v.name for v in V.parse_variants("default,nch2")] == ["default", "nch2"]
    with pytest.raises(BadInput, match="unknown variant"):
        V.parse_variants("default,proto_fast")


def test_groups_and_orders() -> None:
    assert V.groups([0, 1, 2], "pairs") == [[0, 1], [0, 2], [1, 2]]
    assert V.groups(list(range(8)), "tp4") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert V.groups([0, 1, 2, 3], "tp4") == []
    assert V.parse_order("3,1,0,2", [0, 1, 2, 3]) == [3, 1, 0, 2]
    with pytest.raises(BadInput):
        V.parse_order("0,0,1", [0, 1, 2])
    with pytest.raises(BadInput, match="not in this run"):
        V.parse_order("0,7", [0, 1, 2])


def test_sizes_and_iterations() -> None:
    assert sizes_pow2(8, 64) == [8, 16, 32, 64]
    assert iters_for(8, 20) == 20
    assert iters_for(256 * MiB, 20) == 3  # large sizes keep a median of three


def test_shared_uplink_flows_from_the_pcie_tree() -> None:
    # GPUs 0,1 under switch S1 (root port R1), GPU 2 under R2, GPU 3 under R3
    topo = {"pcie_tree": {"gpu_paths": {
        "0": ["g0", "d0", "S1", "R1"], "1": ["g1", "d1", "S1", "R1"],
        "2": ["g2", "d2", "S2", "R2"], "3": ["g3", "d3", "S3", "R3"]}}}
    flows, why = shared_uplink_flows([0, 1, 2, 3], topo)
    assert flows == [(0, 2), (1, 3)] and "S1" in why
    flows, why = shared_uplink_flows([0, 1, 2, 3], None)
    assert flows == [(0, 2), (1, 3)] and why.startswith("assumed layout")
    assert shared_uplink_flows([0, 1], None)[0] == []


def test_bad_plans() -> None:
    with pytest.raises(BadInput):
        build_plan("cpu", [])
    with pytest.raises(BadInput):
        build_plan("cpu", [0, 0])
    with pytest.raises(BadInput):
        build_plan("rocm", [0, 1])


def test_each_ring_order_runs_with_nccl_algo_ring_beside_its_baseline() -> None:
    # issue 23 pt 3: a graph file sets the ring graph only and the tuner may still pick the tree,
    # so the order and the plain order ran different algorithms at some sizes. Each order now
    # also runs with NCCL_ALGO=Ring, beside the same GPUs in plain order with NCCL_ALGO=Ring
    # (one baseline per group of GPUs).
    plan = build_plan("cuda", [0, 1, 2, 3], quick=True, variants=[V.VARIANTS["default"]],
                      orders=[[0, 2, 1, 3], [0, 3, 1, 2]])
    by = {c.label: c for c in plan.allreduce}
    assert list(by) == ["default@0-1-2-3", "default@0-2-1-3", "default@0-3-1-2",
                        "algo_ring@0-2-1-3", "algo_ring@0-1-2-3", "algo_ring@0-3-1-2"]
    for label in ("algo_ring@0-2-1-3", "algo_ring@0-1-2-3", "algo_ring@0-3-1-2"):
        assert by[label].env == {"NCCL_ALGO": "Ring"}
        assert by[label].sizes == by["default@0-1-2-3"].sizes
    assert "runs at every size; its baseline is algo_ring@0-1-2-3" in by["algo_ring@0-2-1-3"].detail
    assert "baseline of ring order 0,2,1,3" in by["algo_ring@0-1-2-3"].detail
    # a plan that already runs algo_ring over every GPU (--variants all) has the baseline: not
    # run twice; the default plan has no algo_ring case and gets it from the order
    every = build_plan("cuda", [0, 1, 2, 3], orders=[[0, 2, 1, 3]],
                       variants=V.parse_variants("all"))
    assert [c.label for c in every.allreduce].count("algo_ring@0-1-2-3") == 1
    full = build_plan("cuda", [0, 1, 2, 3], orders=[[0, 2, 1, 3]])
    assert [c.label for c in full.allreduce][-2:] == ["algo_ring@0-2-1-3", "algo_ring@0-1-2-3"]
    assert plan.allreduce == Plan.from_json(plan.to_json()).allreduce


def test_on_gloo_the_ring_pair_says_it_is_two_rank_orders() -> None:
    plan = build_plan("cpu", [0, 1, 2], quick=True, variants=[V.VARIANTS["default"]],
                      orders=[[2, 0, 1]])
    order, base = plan.allreduce[-2:]
    assert (order.label, base.label) == ("algo_ring@2-0-1", "algo_ring@0-1-2")
    assert order.detail.startswith(V.GLOO_IGNORES_NCCL) and "only this rank order" in order.detail
    assert "NCCL_ALGO=Ring" not in order.detail + base.detail
