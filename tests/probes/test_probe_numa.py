"""Pinned host buffers next to their GPU (issue 15, defect 10): the GPU's NUMA node from sysfs and
the allocation run from that node's CPUs; a fake sysfs tree stands in for a two-node box."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from builders.cuda import CudaStandin, PeerCopies
from probes.numa import on_numa_node, parse_cpulist, pci_numa_node
from probes.p2p_worker import CudaCopier
from pcieprof.bundle.plan import P2PCase, Plan


def _sysfs(tmp_path: Path, gpus: dict[str, str], nodes: dict[int, str]) -> Path:
    for bdf, node in gpus.items():
        d = tmp_path / "bus/pci/devices" / bdf
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")
    for n, cpus in nodes.items():
        d = tmp_path / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return tmp_path


def test_cpulist_ranges() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}


def test_gpu_node_from_sysfs(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path, {"0000:1b:00.0": "1", "0000:3d:00.0": "-1"}, {})
    assert pci_numa_node("0000:1B:00.0", sysfs) == 1
    assert pci_numa_node("0000:3d:00.0", sysfs) is None  # one node, or a VM that does not say
    assert pci_numa_node("0000:99:00.0", sysfs) is None and pci_numa_node(None, sysfs) is None


def test_the_block_runs_on_the_nodes_cpus_and_the_binding_comes_back(tmp_path: Path) -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    sysfs = _sysfs(tmp_path, {}, {1: str(cpu), 2: "100000"})
    with on_numa_node(1, sysfs) as placed:
        assert placed and os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before
    with on_numa_node(2, sysfs) as placed:  # none of its CPUs is ours to use: stays put
        assert not placed and os.sched_getaffinity(0) == before
    with on_numa_node(None, sysfs) as placed:
        assert not placed


class _OnNode(CudaStandin):
    """The stand-in, telling the copier each GPU's bus id and noting the thread's CPUs at each
    pinned allocation."""

    def __init__(self, devices: list[int], bus: dict[int, str]) -> None:
        super().__init__(devices)
        self.bus = bus
        self.alloc_cpus: list[set[int]] = []

    def bus_id(self, device: int) -> str | None:
        return self.bus.get(device)

    def pinned(self, nbytes: int) -> torch.Tensor:
        self.alloc_cpus.append(os.sched_getaffinity(0))
        return super().pinned(nbytes)


def test_copier_allocates_each_host_buffer_on_its_gpus_node(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    sysfs = _sysfs(tmp_path, {"0000:1b:00.0": "1"}, {1: str(cpu)})
    api = _OnNode([0, 1], {0: "0000:1b:00.0"})
    case = P2PCase(-1, 0, "h2d", "uni", "bandwidth", 4096, 2, 2)
    copier = CudaCopier(Plan(backend="cuda", devices=[0, 1], p2p=[case]), api, PeerCopies(),
                        sysfs=sysfs)
    assert api.alloc_cpus[0] == {cpu}  # GPU 0's buffer allocated from node 1's CPUs
    assert "NUMA node 1" in copier.host_note[0]
    assert "not placed" in copier.host_note[1]  # GPU 1: no bus id, allocated where we run
    times, ok, detail = copier.run_p2p(0, case)
    assert ok and "NUMA node 1" in detail
