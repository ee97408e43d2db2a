"""The box a bundle describes: how many GPUs, which architecture, how much memory each has.

Advice is for the box the bundle measured, not for the box a model card was written for: a
launch line must not name more GPUs, another architecture or more memory than the box has.

- GPU count: topology.json's GPUs, else the GPU indices of p2p.csv.
- Architecture (`sm120`, `sm89`, ...): the compute capability NVML reported
  (nvmlDeviceGetCudaComputeCapability, topology.json `gpus[].compute_capability`), else the
  product name looked up in gpus.toml (NVIDIA's CUDA GPUs page); "" when neither tells.
- Memory per GPU (bytes, the smallest GPU's): NVML's total (`gpus[].memory_bytes`), else the
  product's from gpus.toml: the total NVML reported for it in a real paste where the table has
  one (`nvml_mib`), else its nominal size, said to be nominal; None when neither tells.
- An assumed memory (a model card's, pcieprof.tune.layout.gpu_memory) is a range: `memory_bytes`
  its high end, `memory_low_bytes` its low end (nominal size vs NVML's total after the driver's
  reservation); the fit is checked at both (pcieprof.tune.memory).
- Fabric (`nvlink`, `pcie`, "" unknown): NVLink where a pair shows NV# (nvidia-smi topo -m) or
  NVML's NVLink P2P status is OK; PCIe-only where every pair's level comes from a view that
  shows NVLink (topo -m, not -mp; NVML's common-ancestor level is a PCIe path and does not) and
  none is NV#, where NVML answers "no NVLink P2P" for every pair, or for the fabric model
  (it models PCIe only). A card's box settings (pcieprof.cards.BoxSetting) are set by it.

Units: bytes in the data, GiB (2^30 bytes) in every line shown to a user (`gib`), MiB (2^20
bytes) where NVML's own number is quoted.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pcieprof.analysis.matrices import gpu_indices
from pcieprof.bundle import Bundle
from pcieprof.bundle.topology import P2P_CODE_STATUS, Topology
from pcieprof.cards import NVLINK, PCIE, LaunchTarget
from pcieprof.units import GIB as GIB  # the analysis layer's callers import it from here

GPU_TABLE = Path(__file__).with_name("gpus.toml")
#: NVML / nvidia-smi P2P codes that say a pair has no P2P of that kind.
P2P_NO = frozenset(code for code, state in P2P_CODE_STATUS.items() if state == "not_supported")
MIB = 1 << 20


def gib(nbytes: float) -> str:
    """`55.2 GiB`: bytes as the one memory unit users see."""
    return f"{nbytes / GIB:.1f} GiB"


@dataclass(frozen=True)
class Product:
    """One row of gpus.toml."""

    match: str
    compute_capability: str
    memory_gib: float | None
    bar1_gib: float | None = None
    nvml_mib: float | None = None  # the total NVML reported for it in a real paste (MiB)
    exact: bool = False  # the whole product name must equal `match`

    def memory_bytes(self) -> float | None:
        """NVML's total where a paste showed it, else the nominal size; None when unknown."""
        if self.nvml_mib:
            return self.nvml_mib * MIB
        return self.memory_gib * GIB if self.memory_gib else None

    def memory_words(self) -> str:
        """Where `memory_bytes` comes from, for the box's memory_source."""
        if self.nvml_mib:
            nominal = f"; nominal {self.memory_gib:g} GB" if self.memory_gib else ""
            return (f"{self.nvml_mib:g} MiB, the total NVML reported for it in a real "
                    f"nvidia-smi paste{nominal}")
        return (f"nominal size {self.memory_gib:g} GB read as GiB; NVML reports less after the "
                "driver's reservation, how much is not known for this product")


@cache
def products() -> tuple[Product, ...]:
    """gpus.toml's rows, longest match first (the most specific name wins)."""
    data = tomllib.loads(GPU_TABLE.read_text(encoding="utf-8"))
    rows = [Product(str(r["match"]), str(r["compute_capability"]),
                    float(r["memory_gib"]) if "memory_gib" in r else None,
                    float(r["bar1_gib"]) if "bar1_gib" in r else None,
                    float(r["nvml_mib"]) if "nvml_mib" in r else None,
                    bool(r.get("exact", False)))
            for r in data["gpu"]]
    return tuple(sorted(rows, key=lambda p: -len(p.match)))


def product(name: str | None) -> Product | None:
    """The gpus.toml row whose `match` the product name contains, or None."""
    if not name:
        return None
    low = name.strip().lower()
    return next((p for p in products()
                 if (p.match.lower() == low if p.exact else p.match.lower() in low)), None)


def arch_of(compute_capability: str) -> str:
    """`12.0` -> `sm120`, `8.9` -> `sm89` (SGLang's and the cards' spelling)."""
    major, _, minor = compute_capability.partition(".")
    return f"sm{int(major)}{int(minor or 0)}"


@dataclass(frozen=True)
class Box:
    """What a bundle says about its machine's GPUs.

    Attributes:
        gpus: number of GPUs (0: none seen).
        names: the product names seen (distinct, in index order).
        arch: `sm120`, ... or "" when unknown.
        arch_source: where `arch` came from, or why it is unknown.
        memory_bytes: the smallest GPU's memory (bytes), or None when unknown; of an assumed
            range, its high end.
        memory_source: where `memory_bytes` came from, or why it is unknown.
        memory_low_bytes: the low end of an assumed memory's range (bytes); None when the
            memory is not a range.
        fabric: `nvlink` (NVLink between some GPUs), `pcie` (none) or "" when unknown.
        fabric_source: where `fabric` came from, or why it is unknown.
    """

    gpus: int
    names: tuple[str, ...] = ()
    arch: str = ""
    arch_source: str = "no GPU named in the bundle"
    memory_bytes: float | None = None
    memory_source: str = "no GPU memory in the bundle"
    notes: tuple[str, ...] = field(default_factory=tuple)
    memory_low_bytes: float | None = None
    fabric: str = ""
    fabric_source: str = "no GPU pair in the bundle"

    def target(self) -> LaunchTarget:
        """The box as a launch line's conditions read it (pcieprof.cards.LaunchTarget)."""
        return LaunchTarget(arch=self.arch, arch_source=self.arch_source, fabric=self.fabric,
                            fabric_source=self.fabric_source)

    @property
    def memory_assumed(self) -> bool:
        """True when the memory is not the box's own but assumed (a model card's)."""
        return self.memory_source.startswith("assumed")

    def memory_text(self) -> str:
        """`79.6 GiB`, `95.6-96.0 GiB` (an assumed range) or `memory unknown`."""
        return memory_range_text(self.memory_bytes, self.memory_low_bytes)

    def describe(self) -> str:
        """`4x NVIDIA RTX 6000 Ada Generation (sm89, 48.0 GiB each)`."""
        what = " / ".join(self.names) or "GPU"
        arch = self.arch or "architecture unknown"
        return f"{self.gpus}x {what} ({arch}, {self.memory_text()} each)"


def memory_range_text(high: float | None, low: float | None = None) -> str:
    """`79.6 GiB`, `95.6-96.0 GiB` when `low` differs, `memory unknown` without `high` (bytes)."""
    if not high:
        return "memory unknown"
    if low is not None and round(low / GIB, 1) != round(high / GIB, 1):
        return f"{low / GIB:.1f}-{high / GIB:.1f} GiB"
    return gib(high)


def box_of(bundle: Bundle) -> Box:
    """The box of a bundle (see the module docstring for where each field comes from)."""
    topo = bundle.read_doc(Topology) or Topology()
    return box_from(topo, len(gpu_indices(bundle.read_table("p2p"))))


def box_from(topo: Topology, p2p_gpus: int = 0, where: str = "topology.json") -> Box:
    """The box of a topology document; `p2p_gpus` counts GPUs when it lists none; `where` names
    the NVML answers' origin in the sources (`this machine` for a live NVML's)."""
    gpus = len(topo.gpus) or p2p_gpus
    names = tuple(dict.fromkeys(str(g.name) for g in topo.gpus if g.name))
    ccs = {str(_cc(g.extra)) for g in topo.gpus if _cc(g.extra)}
    arch, arch_src = "", "no GPU named in the bundle"
    if len(ccs) == 1:
        arch, arch_src = arch_of(ccs.pop()), f"NVML compute capability ({where})"
    elif len(ccs) > 1:
        arch_src = f"GPUs of several compute capabilities ({', '.join(sorted(ccs))})"
    elif names:
        rows = {product(n) for n in names}
        if None in rows:
            unknown = [n for n in names if product(n) is None]
            arch_src = f"product {unknown[0]!r} is not in {GPU_TABLE.name}"
        elif len({r.compute_capability for r in rows if r}) > 1:
            arch_src = "GPUs of several architectures: " + ", ".join(names)
        else:
            row = next(r for r in rows if r)
            arch = arch_of(row.compute_capability)
            arch_src = f"product name {names[0]!r} in {GPU_TABLE.name} (NVIDIA's CUDA GPUs page)"
    mems = [float(g.memory_bytes) for g in topo.gpus if g.memory_bytes]
    mem: float | None = None
    mem_src = "no GPU memory in the bundle"
    if mems:
        mem, mem_src = min(mems), f"NVML memory total ({where})"
    elif names:
        rows_of = {n: product(n) for n in names}
        sized = {n: (r, r.memory_bytes()) for n, r in rows_of.items() if r}
        if len(sized) == len(names) and all(b for _, b in sized.values()):
            smallest = min(names, key=lambda n: sized[n][1] or 0.0)
            row, mem = sized[smallest]
            mem_src = f"product name {smallest!r} in {GPU_TABLE.name}: {row.memory_words()}"
        elif unknown := [n for n in names if rows_of[n] is None]:
            mem_src = f"product {unknown[0]!r} is not in {GPU_TABLE.name}"
        else:
            mem_src = f"the product name {names[0]!r} does not tell the memory size"
    fabric, fabric_src = fabric_of(topo, gpus, where)
    return Box(gpus=gpus, names=names, arch=arch, arch_source=arch_src, memory_bytes=mem,
               memory_source=mem_src, fabric=fabric, fabric_source=fabric_src)


def fabric_of(topo: Topology, gpus: int, where: str = "topology.json") -> tuple[str, str]:
    """(`nvlink` | `pcie` | "", where it came from or why it is unknown) of a topology whose
    NVML answers came from `where`."""
    if gpus < 2:
        return "", "one GPU: no fabric between GPUs"
    nv = sorted({(min(p.a, p.b), max(p.a, p.b)) for p in topo.pairs
                 if str(p.level or "").startswith("NV") or p.p2p.get("nvlink") == "OK"})
    every = gpus * (gpus - 1) // 2
    if nv:
        a, b = nv[0]
        if len(nv) < every:
            # SGLang counts a box as NVLink only when every pair is (custom_all_reduce_utils
            # is_full_nvlink, 0.5.23), and NCCL routes the other pairs over PCIe: neither kind
            return "", (f"NVLink between only {len(nv)} of {every} GPU pairs (GPUs {a}-{b} "
                        f"first; {where})")
        return NVLINK, f"NVLink between every GPU pair ({every}; {where})"
    if topo.sim is not None:
        return PCIE, (f"the fabric model {topo.sim.get('profile', '')} (it models PCIe only)")
    pairs = {(min(p.a, p.b), max(p.a, p.b)): p for p in topo.pairs}
    if len(pairs) < gpus * (gpus - 1) // 2:
        return "", f"not every GPU pair is described ({where})"
    if all(p.p2p.get("nvlink") in P2P_NO for p in pairs.values()):
        return PCIE, f"no GPU pair has NVLink P2P (NVML or nvidia-smi topo -p2p n, {where})"
    if all(p.level is not None and p.level_source == "topo -m" for p in pairs.values()):
        return PCIE, "nvidia-smi topo -m: no pair shows NV#"
    if topo.nvlink_hidden():
        return "", "the pair levels come from nvidia-smi topo -mp, which hides NVLink"
    return "", ("the pair levels are PCIe paths (NVML's common ancestor or the PCIe tree), "
                "which do not show NVLink")


def _cc(extra: dict[str, Any]) -> str | None:
    v = extra.get("compute_capability")
    return str(v) if v else None
