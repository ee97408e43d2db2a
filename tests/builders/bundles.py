"""Bundles, rows and topology documents for the tests, from published real numbers.

Everything here is labelled `imported` (numbers copied from a publication, not measured here),
except `sim_bundle`, which runs `pcieprof topology --backend sim` and is labelled `simulated`.

The numbers are the calibration points of ../shared/calibration/README.md (voipmonitor/rtx6kpro
@29f3863): P2P within a PCIe switch 53.7-56.4 GB/s at 0.45-0.53 us, across sockets ~39 GB/s (Genoa,
2 xGMI links), host-staged ~27 GB/s at ~14 us; the 8-GPU all-reduce of the WRX90 box (NCCL
2.27.5) and the dual-Turin default vs graph-file small-message latencies. The cross-switch latency
(0.9 us) of `two_switch` is an assumption (no published figure). They come from different boxes:
these bundles are fixtures for deciding and drawing, not a description of one machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from builders.cli import cli
from pcieprof.bundle import Bundle
from pcieprof.bundle.topology import Gpu, Iommu, Pair, Topology, Virtualization

GROUPS = ([0, 1, 2, 3], [4, 5, 6, 7])
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
#: Real bundles copied into tests/report/data/ (each folder has a NOTE.md).
REPORT_DATA = Path(__file__).resolve().parents[1] / "report" / "data"
#: The demo's two simulated boxes (`pcieprof demo`).
DEMO_PROFILES = ("rtxpro6000-8x-vm", "rtxpro6000-8x-switch")

# WRX90 8-GPU ring, NCCL_P2P_LEVEL=SYS: size -> time_us (calibration README)
AR_DEFAULT = {4 << 10: 23.93, 16 << 10: 18.66, 64 << 10: 18.13, 256 << 10: 25.09,
              1 << 20: 81.08, 4 << 20: 182.49}
# dual Turin: default (Simple, 2 channels) vs graph file / LL, size -> time_us
AR_TURIN_DEFAULT = {32 << 10: 48.16, 64 << 10: 48.69, 128 << 10: 51.56, 256 << 10: 56.48}
AR_TURIN_LL = {32 << 10: 26.20, 64 << 10: 25.59, 128 << 10: 32.09, 256 << 10: 37.26}


def two_switch(groups: tuple[list[int], ...] = tuple(GROUPS), seed: int = 7,
               cross_gbps: float = 39.0, cross_us: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """P2P bandwidth (GB/s) and latency (us) matrices of GPUs behind PCIe switches.

    GPUs of one group share a switch; a fixed seed adds +-1.5% spread across groups (and the
    published range within one), so that ties are not exact, as in real measurements. The
    diagonal is NaN.
    """
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


def p2p_rows(n: int, bw: Callable[[int, int], float], lat: Callable[[int, int], float], *,
             staged_gbps: float = 27.0, staged_us: float = 14.0,
             **bw_extra: object) -> list[dict[str, object]]:
    """The p2p table of `n` GPUs: per ordered pair a 256 MiB copy (GB/s) and a 4 B one (us), for
    the peer path and the host-staged path. `bw_extra` are more columns of the peer bandwidth row."""
    rows: list[dict[str, object]] = []
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            pair = {"backend": "imported", "src": s, "dst": d, "direction": "uni"}
            rows += [
                {**pair, "path": "p2p", "size_bytes": 256 << 20, "bandwidth_gbps": bw(s, d),
                 **bw_extra},
                {**pair, "path": "p2p", "size_bytes": 4, "latency_us": lat(s, d)},
                {**pair, "path": "host_staged", "size_bytes": 256 << 20,
                 "bandwidth_gbps": staged_gbps},
                {**pair, "path": "host_staged", "size_bytes": 4, "latency_us": staged_us}]
    return rows


def add_allreduce(b: Bundle, variant: str, env: dict[str, str], curve: dict[int, float],
                  nranks: int = 8, ranks: tuple[int, ...] | None = None) -> None:
    """Rows of one all-reduce variant: size_bytes -> time_us (busbw by nccl-tests' formula)."""
    f = 2 * (nranks - 1) / nranks
    b.append_rows("allreduce", [
        {"backend": "imported", "variant": variant, "env": env, "nranks": nranks,
         "ranks": ranks or tuple(range(nranks)), "size_bytes": s, "dtype": "bf16", "time_us": t,
         "algbw_gbps": s / t / 1e3, "busbw_gbps": s / t / 1e3 * f, "iters": 20}
        for s, t in curve.items()])
    b.set_part("allreduce", "ok")


def flat_topology(n: int, *, flat_vm: bool) -> Topology:
    """`n` GPUs as a VM shows them (all on one flat root, IOMMU translating) or, without
    `flat_vm`, as two sockets with a PCIe switch each."""
    gpus = [Gpu(index=i, name=GPU_NAME, bus_id=f"0000:00:{0x10 + i:02x}.0",
                numa_node=0 if flat_vm else int(i >= n // 2),
                pcie={"gen_max": 5, "width_max": 16, "gen_current": 5, "width_current": 16},
                memory_bytes=97887 << 20) for i in range(n)]
    pairs = [Pair(a=i, b=j, level="PHB" if flat_vm else ("PXB" if (i < n // 2) == (j < n // 2) else "SYS"),
                  p2p={"read": "OK", "write": "OK", "atomics": "NS"})
             for i in range(n) for j in range(i + 1, n)]
    return Topology(
        source="imported", gpus=gpus, pairs=pairs,
        iommu=Iommu(enabled=flat_vm, mode="translated" if flat_vm else "off"),
        virtualization=Virtualization(is_vm=flat_vm, hypervisor="KVM" if flat_vm else None,
                                      flat_pcie_tree=flat_vm),
        numa={"nodes": [{"id": 0, "cpus": "0-63"}]})


def write_matrix_bundle(path: Path, bw: np.ndarray, lat: np.ndarray, *, flat_vm: bool = True,
                        host_staged_us: float = 14.0, host_staged_gbps: float = 27.0) -> Bundle:
    """An `imported` bundle holding the matrices, with `flat_topology` in topology.json."""
    n = len(bw)
    b = Bundle.create(path, command="import", source="imported", backend="imported")
    b.write_doc(flat_topology(n, flat_vm=flat_vm))
    b.append_rows("p2p", p2p_rows(n, lambda s, d: float(bw[s, d]), lambda s, d: float(lat[s, d]),
                                  staged_gbps=host_staged_gbps, staged_us=host_staged_us))
    b.set_part("discovery", "ok")
    b.set_part("p2p", "ok")
    return b


def switch_topology(name: str, host_note: str) -> Topology:
    """Eight GPUs on two sockets, four behind one PCIe switch per socket, with the PCIe tree."""
    gpus, nodes, paths = [], [], {}
    for sw, group in enumerate(GROUPS):
        root = f"0000:{0x00 + sw * 0x80:02x}:01.1"
        up = f"0000:{0x01 + sw * 0x80:02x}:00.0"
        nodes.append({"bdf": root, "parent": None, "kind": "root_port", "numa_node": sw,
                      "link": {"gen": 5, "width": 16}, "acs": None, "description": "root port"})
        nodes.append({"bdf": up, "parent": root, "kind": "switch_upstream", "numa_node": sw,
                      "link": {"gen": 5, "width": 16}, "description": "PCIe switch",
                      "acs": None})
        for k, g in enumerate(group):
            down = f"0000:{0x02 + sw * 0x80:02x}:{k:02x}.0"
            bdf = f"0000:{0x03 + sw * 0x80 + k:02x}:00.0"
            nodes.append({"bdf": down, "parent": up, "kind": "switch_downstream", "numa_node": sw,
                          "link": {"gen": 5, "width": 16}, "description": "",
                          "acs": {"cap": {"ReqRedir": True, "CmpltRedir": True},
                                  "ctl": {"ReqRedir": False, "CmpltRedir": False}}})
            nodes.append({"bdf": bdf, "parent": down, "kind": "gpu", "numa_node": sw,
                          "link": {"gen": 5, "width": 16}, "description": "", "acs": None})
            paths[str(g)] = [bdf, down, up, root]
            gpus.append(Gpu(index=g, name=name, uuid=f"GPU-{g}", bus_id=bdf,
                            pcie={"gen_current": 5, "gen_max": 5, "width_current": 16,
                                  "width_max": 16}, numa_node=sw, memory_bytes=97887 << 20,
                            virtualization_mode="bare_metal"))
    pairs = [Pair(a=a, b=b, level="PXB" if (a < 4) == (b < 4) else "SYS",
                  p2p={"read": "OK", "write": "OK", "atomics": "NS"})
             for a in range(8) for b in range(a + 1, 8)]
    return Topology(source="imported",
                    driver={"driver_version": "580.95.05", "cuda_driver_version": "13.0",
                            "status": {}},
                    gpus=gpus, pairs=pairs, pcie_tree={"nodes": nodes, "gpu_paths": paths},
                    iommu=Iommu(enabled=False, mode="off", cmdline="amd_iommu=off iommu=off",
                                evidence=[host_note]),
                    virtualization=Virtualization(is_vm=False, flat_pcie_tree=False),
                    numa={"nodes": [{"id": 0, "cpus": "0-63"}, {"id": 1, "cpus": "64-127"}]})


def make_bundle(path: Path, *, host: str = "calib-box", gpu_name: str = GPU_NAME,
                cross_gbps: float = 39.0, tuned: bool = False) -> Bundle:
    """A finished `imported` bundle of the calibration numbers on `switch_topology`.

    Args:
        path: the bundle's folder.
        host: the manifest's host name.
        gpu_name: every GPU's name.
        cross_gbps: P2P bandwidth across the two switches, GB/s.
        tuned: the default all-reduce variant already has the LL times (as after tuning).
    """
    b = Bundle.create(path, command="import", source="imported", backend="imported")
    b.manifest.host = host
    b.write_doc(switch_topology(gpu_name, "calibration fixture: published numbers"))
    b.set_part("discovery", "ok")

    def same(s: int, d: int) -> bool:
        return (s < 4) == (d < 4)

    b.append_rows("p2p", p2p_rows(
        8, lambda s, d: (54.0 + (s + d) % 3) if same(s, d) else cross_gbps,
        lambda s, d: 0.45 + 0.02 * ((s * d) % 4) if same(s, d) else 0.53,
        iters=10, trials=3, detail="calibration README"))
    b.set_part("p2p", "ok")
    add_allreduce(b, "default", {}, AR_TURIN_LL if tuned else AR_TURIN_DEFAULT)
    add_allreduce(b, "proto_ll", {"NCCL_PROTO": "LL"}, AR_TURIN_LL)
    add_allreduce(b, "p2p_level_sys", {"NCCL_P2P_LEVEL": "SYS"}, AR_DEFAULT)
    b.finish()
    return b


def transposed(b: Bundle, out: Path) -> Bundle:
    """An `imported` copy of `b`'s topology and p2p table with every copy's direction reversed
    (src and dst swapped)."""
    t = Bundle.create(out, command="import", source="imported", backend="imported")
    topo = b.read_doc(Topology)
    if topo is not None:
        t.write_doc(topo)
    t.append_rows("p2p", b.read_table("p2p").rename(columns={"src": "dst", "dst": "src"})
                  .to_dict("records"))
    return t


def imported(files: list[Path], out: Path) -> Bundle:
    """`pcieprof import files --out out` (in-process); the bundle it wrote."""
    r = cli("import", *map(str, files), "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    return Bundle.open(out)


def sim_bundle(out: Path, profile: str, *args: str) -> Path:
    """`pcieprof topology --backend sim --sim-profile profile --no-report -q *args --out out`
    (a real process: the command installs signal handlers); the bundle's folder."""
    r = cli("topology", "--backend", "sim", "--sim-profile", profile, "--no-report", "-q", *args,
            "--out", str(out), process=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out


def cpu_copies_bundle(out: Path, nranks: int = 2) -> Bundle:
    """The concurrent copies of `pcieprof topology --backend cpu --quick` (1 MiB cases, no P2P
    matrix, no all-reduce), run for real: torchrun, gloo and /dev/shm windows between `nranks`
    local processes. Its concurrent.csv is what the cpu backend writes; its numbers are this
    machine's (and its load's), so tests assert what the rows say, not their values."""
    from pcieprof.probe_runner import ProbeRunner  # heavy: torch
    from probes.plan import build_plan

    plan = build_plan("cpu", list(range(nranks)), quick=True, max_size=1 << 20, timeout_s=120)
    plan.p2p = []
    b = Bundle.create(out, command="topology", source="measured", backend="cpu")
    runner = ProbeRunner(b, plan)
    try:
        result = runner.run_copies()
    finally:
        runner.cleanup()
    assert result["concurrent"]["status"] == "ok", result
    return b
