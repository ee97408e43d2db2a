"""The fabric model's VM table: what a VM costs against its bare-metal twin, priced, as
topology.json's `sim.vm` stores it.

One definition for both sides of the bundle: the sim (measure, pcieprof.sim.vm_cost) prices a VM
profile and builds it; analysis (pcieprof.analysis.virtualization) reads it back. Neither may
import the other, so the shape lives here, next to the mechanisms it names (vm_mechanism.py).
Times in microseconds, bandwidths in GB/s; everything in it is simulated, never measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pcieprof.bundle.document import Document
from pcieprof.bundle.vm_mechanism import KnownIssue, Mechanism

_NAN_PAIR = (math.nan, math.nan)


@dataclass(frozen=True)
class VmRow:
    """The VM and its twin at one message size on one basis, flat (a DataFrame row).

    Attributes:
        basis: `default`, `best`, `best_safe` or `same_choices` (pcieprof.sim.vm_cost).
        size_bytes: the all-reduce message; `count` of them (1, or the decode step's).
        batch: the decode batch this size is.
        vm_time_us, bare_time_us: the two sides' predicted time.
        vm_minus_bare_us, vm_over_bare: what the VM costs (negative: it is faster), and the ratio.
        vm_env, bare_env: the NCCL variables each side set (`default` for none).
        vm_choice, bare_choice: what NCCL chose (`LL, 4 channels, 8 SHM edges`).
        vm_risks: ids of the profile's known issues the VM's setting runs into.
        why: ids of the mechanisms behind the difference, most telling first.
        table: `per_size` (one all-reduce) or `step` (the card's decode step).
    """

    basis: str
    size_bytes: int
    batch: int
    vm_time_us: float
    bare_time_us: float
    count: int = 1
    vm_minus_bare_us: float = math.nan
    vm_over_bare: float = math.nan
    vm_env: str = "default"
    bare_env: str = "default"
    vm_choice: str = ""
    bare_choice: str = ""
    vm_risks: tuple[str, ...] = ()
    why: tuple[str, ...] = ()
    table: str = "per_size"


@dataclass(frozen=True)
class HostChange:
    """A change only the hypervisor host can make for a VM, priced by the fabric model.

    Attributes:
        id, title, how, effect, risk: the profile's words (`[[host_change]]`).
        blocked_by: why it cannot be made safely on this box, or None.
        feasible: False when `blocked_by` says so.
        apply: what the change does to the profile (dotted profile keys).
        sources: where the facts come from.
        step_default_us, step_best_safe_us: (before, after) the card's decode-step all-reduces
            at batch 1, with NCCL defaults and with the fastest setting free of known issues.
        p2p_same_switch_gbps: (before, after) GPU0 -> GPU1 P2P, 256 MiB, unidirectional.
        gain_default_us, gain_best_safe_us: what the step saves (before - after); derived,
            stored for other tools.
    """

    id: str
    title: str = ""
    how: str = ""
    effect: str = ""
    risk: str = ""
    blocked_by: str | None = None
    feasible: bool = True
    apply: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    step_default_us: tuple[float, float] = _NAN_PAIR
    step_best_safe_us: tuple[float, float] = _NAN_PAIR
    p2p_same_switch_gbps: tuple[float, float] = _NAN_PAIR
    gain_default_us: float = field(init=False)
    gain_best_safe_us: float = field(init=False)
    source: str = "simulated"

    def __post_init__(self) -> None:
        object.__setattr__(self, "gain_default_us",
                           self.step_default_us[0] - self.step_default_us[1])
        object.__setattr__(self, "gain_best_safe_us",
                           self.step_best_safe_us[0] - self.step_best_safe_us[1])

    @property
    def changes_anything(self) -> bool:
        """False when the model prices it to no change at all (e.g. iommu=pt for VFIO GPUs)."""
        return any(abs(a - b) > 1e-6 for a, b in (self.step_default_us, self.step_best_safe_us,
                                                   self.p2p_same_switch_gbps))


@dataclass
class VmTable(Document):
    """topology.json `sim.vm`: the like-for-like table of a VM profile and its twin.

    Attributes:
        vm_profile, bare_profile: the two profiles' names.
        ranks: the GPUs of the all-reduce, in ring order.
        model: the card whose decode is priced ("" in tables written before it was stored:
            the default card's).
        step_allreduces: all-reduces per decode step (the card's at TP over `ranks`).
        hidden: the card's hidden size.
        bases: the bases of comparison, in the sim's order.
        rows: every row, per size then per step.
        mechanisms: the VM profile's mechanisms, by id.
        host_changes: the profile's host-side changes, priced.
        known_issues: the profile's known issues (id, when, title, text, check, sources).
        sensitivity: per assumed model parameter: {param, value, kind, low, high}, each end
            {value, basis, size_bytes, vm_us, bare_us, step_vm_us, step_bare_us}.
    """

    source: str = "simulated"
    vm_profile: str = "?"
    bare_profile: str = "?"
    ranks: list[int] = field(default_factory=list)
    model: str = ""
    step_allreduces: int = 0
    hidden: int = 0
    bases: list[str] = field(default_factory=list)
    rows: list[VmRow] = field(default_factory=list)
    mechanisms: dict[str, Mechanism] = field(default_factory=dict)
    host_changes: list[HostChange] = field(default_factory=list)
    known_issues: list[KnownIssue] = field(default_factory=list)
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
