"""What virtualization costs, like for like: a VM bundle against bare metal, in numbers.

One table answers "how much slower (or faster) is the all-reduce of decode in this VM than on the
same box without the hypervisor", per decode message size and per decode step, on the same
basis on both sides:
- `default`: no NCCL variable set on either side;
- `same_choices`: bare metal made to choose what NCCL in the guest chose (transport, protocol,
  channels), so that only the data path differs (fabric model only);
- `best`: each side's fastest setting;
- `best_safe`: the VM's fastest setting that keeps peer DMA off the translating IOMMU (where
  NCCL can hang) against bare metal's fastest (fabric model only).

Where the numbers come from, first that applies:
1. A simulated VM bundle carries the fabric model's table in topology.json `sim.vm` (written by
   pcieprof.sim.vm_cost, with the mechanisms, the host-side changes priced and the known issues):
   used as it is, alone or next to its bare-metal twin's bundle (the twin's curves give the same
   numbers at the decode sizes, which the sweep measures directly).
2. A VM bundle and a bare-metal bundle of the same GPU count (measured, imported or simulated):
   `default` and `best` from their all-reduce curves (pcieprof.analysis.curves), the best among
   the settings each bundle ran.
3. A VM bundle alone without the model's table: no numbers (`unknown_cost` says what is known and
   what to measure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pcieprof.analysis.curves import Curve, Curves
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.provenance import obtained
from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclChoices
from pcieprof.bundle.topology import Topology
from pcieprof.bundle.vm_cost import HostChange, VmRow, VmTable
from pcieprof.bundle.vm_mechanism import KnownIssue, Mechanism
from pcieprof.cards import DEFAULT_CARD, load_card
from pcieprof.cards.step import step_allreduces

#: The bases of comparison, in the order tables show them.
BASES = ("default", "same_choices", "best", "best_safe")
#: Column heads.
BASIS_HEADS = {"default": "default vs default", "same_choices": "same NCCL choices",
               "best": "best vs best", "best_safe": "best without the hang risk"}
#: The known issue of NCCL's P2P transport through a translating IOMMU (the VM profile's id).
P2P_HANG = "nccl_p2p_hang_translated_iommu"


@dataclass(frozen=True)
class Side:
    """One side of a row: the time, the NCCL setting that gave it and what NCCL chose.

    Attributes:
        time_us: one all-reduce (or the decode step's all-reduces), us.
        setting: the NCCL variables set (`default` for none).
        choice: what NCCL chose (`LL, 4 channels, 8 SHM edges`), or "" when unknown.
        risks: ids of known issues the setting runs into (P2P_HANG).
    """

    time_us: float
    setting: str = "default"
    choice: str = ""
    risks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    """The VM and bare metal at one message size on one basis.

    Attributes:
        basis: one of BASES.
        batch: the decode batch of the size (size / (hidden x activation bytes)).
        size_bytes: all-reduce message, bytes.
        count: all-reduces priced together (1; the decode step's count for step rows).
        vm, bare: the two sides.
        why: ids of the mechanisms behind the difference, most telling first (model only).
    """

    basis: str
    batch: int
    size_bytes: int
    count: int
    vm: Side
    bare: Side
    why: tuple[str, ...] = ()

    @property
    def vm_minus_bare_us(self) -> float:
        """What the VM costs over bare metal, us (negative: the VM is faster)."""
        return self.vm.time_us - self.bare.time_us

    @property
    def vm_over_bare(self) -> float:
        """VM time / bare-metal time."""
        return self.vm.time_us / self.bare.time_us if self.bare.time_us else float("nan")

    @property
    def bare_faster(self) -> bool:
        """True when bare metal is faster on this row (by more than 0.05 us)."""
        return self.vm_minus_bare_us > 0.05


@dataclass
class VmCost:
    """The like-for-like comparison of a VM and bare metal.

    Attributes:
        vm_label, bare_label: what the two sides are (profile names or bundle directories).
        source: `simulated` (the fabric model, or two simulated bundles) or `measured`.
        provenance: one line saying where the numbers come from.
        nranks: GPUs in the all-reduce.
        step_allreduces: all-reduces per decode step at the smallest batch (the card's model).
        model: the model card whose decode sizes these are.
        per_size: one row per size and basis (count 1).
        step: one row per size and basis for the decode step (count = step_allreduces).
        mechanisms: by id (the fabric model's; empty for measured pairs).
        host_changes: the fabric model's host-side changes, priced (empty for measured pairs).
        known_issues: the VM profile's known issues as stored (id, title, text, check, sources).
        notes: what the reader should know about how the table was made.
        sensitivity: per assumed model parameter the table rests on: {param, value, kind, low,
            high}, each end {value, basis, size_bytes, vm_us, bare_us, step_vm_us, step_bare_us}
            (the fabric model's table re-made at that value; empty for measured pairs).
    """

    vm_label: str
    bare_label: str
    source: str
    provenance: str
    nranks: int
    step_allreduces: int
    model: str
    per_size: list[Row] = field(default_factory=list)
    step: list[Row] = field(default_factory=list)
    mechanisms: dict[str, Mechanism] = field(default_factory=dict)
    host_changes: list[HostChange] = field(default_factory=list)
    known_issues: list[KnownIssue] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sensitivity: list[dict[str, Any]] = field(default_factory=list)

    @property
    def bases(self) -> tuple[str, ...]:
        have = {r.basis for r in self.per_size}
        return tuple(b for b in BASES if b in have)

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(sorted({r.batch for r in self.per_size}))

    def rows(self, basis: str, *, step: bool = False) -> list[Row]:
        """The rows of one basis by size (the decode step's with `step`)."""
        return sorted((r for r in (self.step if step else self.per_size) if r.basis == basis),
                      key=lambda r: r.size_bytes)

    def at(self, basis: str, batch: int | None = None, *, step: bool = False) -> Row | None:
        """The row of a basis at a batch (the smallest batch when None)."""
        rows = self.rows(basis, step=step)
        if batch is None:
            return rows[0] if rows else None
        return next((r for r in rows if r.batch == batch), None)

    def known_issue(self, issue_id: str) -> KnownIssue | None:
        return next((k for k in self.known_issues if k.id == issue_id), None)


def from_topology(topo: Topology | None) -> VmCost | None:
    """The fabric model's table carried by a simulated VM bundle (topology.json `sim.vm`), or
    None when the bundle has none.

    Raises:
        BadInput: a `sim.vm` that is not the table's shape (one line naming the key).
    """
    data = (topo.sim or {}).get("vm") if topo is not None else None
    if not isinstance(data, dict) or not data.get("rows"):
        return None
    vm = VmTable.from_json(data, "topology.json: sim.vm")
    per_size = [_row(r) for r in vm.rows if r.table != "step"]
    step = [_row(r) for r in vm.rows if r.table == "step"]
    # Tables written before they named their card priced the default card's decode.
    model = vm.model or DEFAULT_CARD
    return VmCost(
        vm_label=vm.vm_profile, bare_label=vm.bare_profile, source="simulated",
        provenance=(f"simulated: fabric model {vm.vm_profile} (VM) against its bare-metal twin "
                    f"{vm.bare_profile}, {model} TP{len(vm.ranks)} decode sizes"),
        nranks=len(vm.ranks), step_allreduces=vm.step_allreduces, model=model,
        per_size=per_size, step=step, mechanisms=vm.mechanisms, host_changes=vm.host_changes,
        known_issues=vm.known_issues, sensitivity=vm.sensitivity,
        notes=["best: each side's fastest of the model's candidate settings (P2P level x "
               "protocol x channels x graph file), not only the variants the bundle ran"])


def _row(r: VmRow) -> Row:
    return Row(basis=r.basis, batch=r.batch, size_bytes=r.size_bytes, count=r.count,
               vm=Side(r.vm_time_us, r.vm_env or "default", r.vm_choice, r.vm_risks),
               bare=Side(r.bare_time_us, r.bare_env or "default", r.bare_choice), why=r.why)


def profile_of(bundle: Bundle) -> str | None:
    """The fabric profile a simulated bundle was made with, else None."""
    if bundle.backend != "sim":
        return None
    return bundle.manifest.versions.get("sim_profile")


def is_vm(bundle: Bundle) -> bool:
    """True when the bundle's topology says it ran in a VM."""
    topo = bundle.read_doc(Topology)
    return bool(topo is not None and topo.virtualization.is_vm)


def bare_for(vm: Bundle, others: list[Bundle]) -> Bundle | None:
    """The bare-metal bundle to price a VM bundle against among `others`: its bare-metal twin
    when one is there (the profile the model's table names), else, without that table, the first
    bare-metal bundle whose all-reduce runs over as many GPUs; None when there is none."""
    bare = [b for b in others if b is not vm and not is_vm(b)]
    table = from_topology(vm.read_doc(Topology))
    if table is not None:
        return next((b for b in bare if profile_of(b) == table.bare_label), None)
    n = Curves(vm.read_table("allreduce")).max_nranks
    return next((b for b in bare if n >= 2 and Curves(b.read_table("allreduce")).max_nranks == n),
                None)


def pick_pair(a: Bundle, b: Bundle) -> tuple[Bundle, Bundle] | None:
    """(VM, bare metal) when exactly one of two bundles ran in a VM, else None."""
    va, vb = is_vm(a), is_vm(b)
    if va == vb:
        return None
    return (a, b) if va else (b, a)


def like_for_like(vm: Bundle, bare: Bundle | None, band: DecodeBand) -> VmCost | None:
    """What the VM costs against bare metal (see the module docstring for the sources).

    Args:
        vm: a VM bundle.
        bare: a bare-metal bundle, or None.
        band: the decode band (sizes of the curve-based table; the fabric model's table has the
            decode sizes of the card the VM bundle was simulated for, named in its `model`).

    Returns:
        The table, or None when neither the model's table nor a bare-metal bundle is there.
    """
    table = from_topology(vm.read_doc(Topology))
    if table is not None and (bare is None or profile_of(bare) == table.bare_label):
        return table
    if bare is None:
        return None
    return from_bundles(vm, bare, band)


def _fastest(curves: Curves, nranks: int, size: int) -> Curve | None:
    pool = [c for c in curves if c.nranks == nranks and c.plain_order and c.covers(size)
            and math.isfinite(c.at(size))]
    return min(pool, key=lambda c: (c.at(size), len(c.env), c.variant)) if pool else None


def _setting(c: Curve) -> str:
    return " ".join(f"{k}={c.env[k]}" for k in sorted(c.env)) or "default"


def _risks(topo: Topology | None, choices: NcclChoices, c: Curve) -> tuple[str, ...]:
    """P2P_HANG when the setting puts NCCL's P2P transport through a translating IOMMU: the
    case's NCCL log (or the model's assumption) shows P2P edges, or, without one, the setting
    raises NCCL_P2P_LEVEL."""
    if topo is None or not topo.iommu.translating:
        return ()
    case = choices.cases.get(c.variant)
    model_risks = [r.get("id") for r in ((case.model or {}).get("known_risks") or [])] if case else []
    if model_risks:
        return tuple(str(r) for r in model_risks)
    peers = case.parsed.peer_transport if case is not None and case.parsed else {}
    if peers:
        p2p = any(str(v).upper().startswith("P2P") for v in peers.values())
    else:
        p2p = "NCCL_P2P_LEVEL" in c.env and c.env.get("NCCL_P2P_DISABLE") != "1"
    return (P2P_HANG,) if p2p else ()


def from_bundles(vm: Bundle, bare: Bundle, band: DecodeBand) -> VmCost | None:
    """`default` and `best` from the two bundles' all-reduce curves at the band's sizes; None
    when either has no default curve or they run over different GPU counts."""
    cv, cb = Curves(vm.read_table("allreduce")), Curves(bare.read_table("allreduce"))
    dv, db = cv.default(), cb.default()
    if dv is None or db is None or dv.nranks != db.nranks:
        return None
    topo = vm.read_doc(Topology)
    choices = vm.read_doc(NcclChoices) or NcclChoices()
    n = dv.nranks
    count = step_allreduces(band.card or load_card(band.model), n, band.batch_min)
    per_size: list[Row] = []
    step: list[Row] = []
    for size in band.sizes():
        if not (dv.covers(size) and db.covers(size)):
            continue
        batch = size // (band.hidden * band.bytes_per_elem)
        pairs = {"default": (dv, db), "best": (_fastest(cv, n, size), _fastest(cb, n, size))}
        for basis, (a, b) in pairs.items():
            if a is None or b is None:
                continue
            va = Side(a.at(size), _setting(a), "", _risks(topo, choices, a))
            vb = Side(b.at(size), _setting(b))
            per_size.append(Row(basis, batch, size, 1, va, vb))
            if count:
                step.append(Row(basis, batch, size, count,
                                Side(va.time_us * count, va.setting, "", va.risks),
                                Side(vb.time_us * count, vb.setting)))
    if not per_size:
        return None
    src = "simulated" if {vm.backend, bare.backend} == {"sim"} else "measured"
    words = " and ".join(sorted({obtained(vm.backend), obtained(bare.backend)}))
    return VmCost(
        vm_label=vm.path.name, bare_label=bare.path.name, source=src,
        provenance=(f"{words}: all-reduce curves of {vm.path.name} (VM, backend {vm.backend}) "
                    f"and {bare.path.name} (bare metal, backend {bare.backend}), {band.model} "
                    f"decode sizes"),
        nranks=n, step_allreduces=count, model=band.model, per_size=per_size, step=step,
        notes=["best: each side's fastest among the settings its bundle ran"
               + ("" if profile_of(vm) is None else "; the fabric model's own table needs the "
                  "VM bundle's topology.json sim.vm")])


@dataclass(frozen=True)
class KnownState:
    """What a VM bundle without the model's table says about its virtualization.

    Attributes:
        hypervisor: as detected, or None.
        iommu: the IOMMU mode (`translated`, ...).
        acs_bridges: bridges with ACS P2P redirect set.
        flat_tree: the guest sees a flat PCIe tree (None: unknown).
        shm_links: NCCL's default peer links through host memory.
    """

    hypervisor: str | None
    iommu: str
    acs_bridges: tuple[str, ...]
    flat_tree: bool | None
    shm_links: tuple[str, ...]


def known_state(bundle: Bundle) -> KnownState:
    """The virtualization facts of a bundle (topology.json, nccl_choices.json)."""
    topo = bundle.read_doc(Topology) or Topology()
    case = (bundle.read_doc(NcclChoices) or NcclChoices()).default_case()
    return KnownState(hypervisor=topo.virtualization.hypervisor, iommu=topo.iommu.mode,
                      acs_bridges=tuple(topo.acs_redirect_bridges()),
                      flat_tree=topo.virtualization.flat_pcie_tree,
                      shm_links=tuple(case.shm_links()) if case else ())
