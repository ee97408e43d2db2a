"""The tuner on the simulated rtxpro6000-8x-vm box (2 switches of 4 GPUs, flat VM tree)."""

from __future__ import annotations

from pathlib import Path

from pcieprof.bundle import Bundle
from pcieprof.analysis.infer import infer
from pcieprof.analysis.matrices import gpu_indices, pair_matrix
from pcieprof.bundle.topology import Topology
from pcieprof.tune.ring import best_ring


def test_sim_vm_switches_found_and_ring_crosses_twice(sim_vm_bundle: Path) -> None:
    b = Bundle.open(sim_vm_bundle)
    p2p = b.read_table("p2p")
    topo = b.read_doc(Topology)
    t = infer(p2p, b.read_table("allreduce"), topo)
    assert t.switch_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert t.hidden_structure  # the guest sees a flat tree, the copies see two switches
    gpus = gpu_indices(p2p)
    ring = best_ring(pair_matrix(p2p, path="p2p", metric="bandwidth_gbps", gpus=gpus),
                     pair_matrix(p2p, path="p2p", metric="latency_us", gpus=gpus), gpus)
    side = {g: k for k, grp in enumerate(t.switch_groups()) for g in grp}
    n = len(ring.order)
    assert sum(side[ring.order[i]] != side[ring.order[(i + 1) % n]] for i in range(n)) == 2
