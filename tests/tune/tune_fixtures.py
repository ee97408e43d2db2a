"""Matrices and bundles for the tuner tests (helpers; the fixtures are in conftest.py).

`two_switch_matrices` is an 8-GPU box with two PCIe switches of four GPUs each, using published
P2P figures of RTX PRO 6000 boxes (../shared/calibration/README.md, voipmonitor/rtx6kpro @29f3863):
53.7-56.4 GB/s and 0.45-0.53 us between GPUs behind one switch, ~39 GB/s across sockets (Genoa,
2 xGMI links); the cross-switch latency (0.9 us) is an assumption (no published figure). A fixed
seed adds +-1.5% spread so that ties are not exact, as in real measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pcieprof.bundle import Bundle
from pcieprof.bundle.topology import Gpu, Iommu, Pair, Topology, Virtualization


def two_switch(groups: tuple[list[int], ...] = ([0, 1, 2, 3], [4, 5, 6, 7]), seed: int = 7,
               cross_gbps: float = 39.0, cross_us: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    n = sum(len(g) for g in groups)
    rng = np.random.default_rng(seed)
    side = {g: k for k, grp in enumerate(groups) for g in grp}
    bw = np.zeros((n, n))
    lat = np.zeros((n, n))
    for a in range(n):
        for b in range(n):
            if a == b:
                bw[a, b], lat[a, b] = np.nan, np.nan
            elif side[a] == side[b]:
                bw[a, b] = rng.uniform(53.7, 56.4)
                lat[a, b] = rng.uniform(0.45, 0.53)
            else:
                bw[a, b] = cross_gbps * rng.uniform(0.985, 1.015)
                lat[a, b] = cross_us * rng.uniform(0.985, 1.015)
    return bw, lat


def write_matrix_bundle(path: Path, bw: np.ndarray, lat: np.ndarray, *, flat_vm: bool = True,
                        host_staged_us: float = 14.0, host_staged_gbps: float = 27.0) -> Bundle:
    """An `imported` bundle holding the matrices, with a flat VM tree in topology.json."""
    n = len(bw)
    b = Bundle.create(path, command="import", source="imported", backend="imported")
    gpus = [Gpu(index=i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                bus_id=f"0000:00:{0x10 + i:02x}.0", numa_node=0 if flat_vm else int(i >= n // 2),
                pcie={"gen_max": 5, "width_max": 16, "gen_current": 5, "width_current": 16},
                memory_bytes=97887 << 20) for i in range(n)]
    pairs = [Pair(a=i, b=j, level="PHB" if flat_vm else ("PXB" if (i < n // 2) == (j < n // 2) else "SYS"),
                  p2p={"read": "OK", "write": "OK", "atomics": "NS"})
             for i in range(n) for j in range(i + 1, n)]
    b.write_doc(Topology(
        source="imported", gpus=gpus, pairs=pairs,
        iommu=Iommu(enabled=flat_vm, mode="translated" if flat_vm else "off"),
        virtualization=Virtualization(is_vm=flat_vm, hypervisor="KVM" if flat_vm else None,
                                      flat_pcie_tree=flat_vm),
        numa={"nodes": [{"id": 0, "cpus": "0-63"}]}))
    rows = []
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            rows += [
                {"backend": "imported", "src": s, "dst": d, "path": "p2p", "direction": "uni",
                 "size_bytes": 256 << 20, "bandwidth_gbps": float(bw[s, d])},
                {"backend": "imported", "src": s, "dst": d, "path": "p2p", "direction": "uni",
                 "size_bytes": 4, "latency_us": float(lat[s, d])},
                {"backend": "imported", "src": s, "dst": d, "path": "host_staged",
                 "direction": "uni", "size_bytes": 256 << 20, "bandwidth_gbps": host_staged_gbps},
                {"backend": "imported", "src": s, "dst": d, "path": "host_staged",
                 "direction": "uni", "size_bytes": 4, "latency_us": host_staged_us}]
    b.append_rows("p2p", rows)
    b.set_part("discovery", "ok")
    b.set_part("p2p", "ok")
    return b


def add_allreduce(b: Bundle, variant: str, env: dict[str, str], curve: dict[int, float],
                  nranks: int = 8, ranks: str | None = None) -> None:
    """Rows of one all-reduce variant: size_bytes -> time_us (busbw by nccl-tests' formula)."""
    ranks = ranks or ",".join(str(i) for i in range(nranks))
    f = 2 * (nranks - 1) / nranks
    b.append_rows("allreduce", [
        {"backend": "imported", "variant": variant, "env": json.dumps(env), "nranks": nranks,
         "ranks": ranks, "size_bytes": s, "dtype": "bf16", "time_us": t,
         "algbw_gbps": s / t / 1e3, "busbw_gbps": s / t / 1e3 * f, "iters": 20}
        for s, t in curve.items()])
    b.set_part("allreduce", "ok")


def run_cli(*args: str, cwd: Path | None = None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pcieprof", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)
