"""What the VM costs, like for like, read from bundles (pcieprof.analysis.virtualization): the
fabric model's table a simulated VM bundle carries, the same numbers in the two bundles' own
all-reduce curves at every decode size, and the curve-based table of two bundles without it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from builders.bundles import DEMO_PROFILES

from pcieprof.analysis.curves import Curves
from pcieprof.analysis.decode_band import band_for
from pcieprof.analysis.virtualization import (BASES, P2P_HANG, bare_for, known_state,
                                              like_for_like, pick_pair)
from pcieprof.bundle import Bundle
from pcieprof.sim import vm_cost



def _without_model_table(src: Path, dst: Path) -> Bundle:
    """A copy of a VM bundle whose topology.json lacks the model's table (as an imported or
    measured VM bundle would)."""
    shutil.copytree(src, dst)
    topo = json.loads((dst / "topology.json").read_text())
    topo["sim"].pop("vm")
    (dst / "topology.json").write_text(json.dumps(topo))
    return Bundle.open(dst)


def test_the_vm_bundle_carries_the_models_table(demo_bundles: dict[str, Path]) -> None:
    vm = Bundle.open(demo_bundles["rtxpro6000-8x-vm"])
    cost = like_for_like(vm, None, band_for())
    assert cost is not None and cost.source == "simulated"
    assert cost.bases == BASES and cost.nranks == 8 and cost.step_allreduces == 157
    model = vm_cost.like_for_like("rtxpro6000-8x-vm")
    assert len(cost.per_size) == len(model.per_size) and len(cost.step) == len(model.step)
    for m in model.per_size:
        r = cost.at(m.basis, m.batch)
        assert r is not None and r.size_bytes == m.size_bytes
        assert r.vm.time_us == pytest.approx(m.vm.time_us) and r.bare.time_us == pytest.approx(m.bare.time_us)
        assert r.why == m.why and set(r.vm.risks) == set(m.vm.risks)
    assert {h.id for h in cost.host_changes} >= {"serve_on_host", "host_iommu_pt", "acs_off_switch_ports"}
    pt = next(h for h in cost.host_changes if h.id == "host_iommu_pt")
    assert pt.feasible and not pt.changes_anything  # VFIO keeps translating
    assert not next(h for h in cost.host_changes if h.id == "acs_off_switch_ports").feasible
    assert cost.known_issue(P2P_HANG) is not None and set(cost.mechanisms) == {
        "iommu_translation", "acs_redirect", "flat_guest_tree"}


def test_the_bundles_curves_give_the_tables_numbers_at_every_decode_size(
        demo_bundles: dict[str, Path]) -> None:
    # the sweep measures the decode sizes themselves: what compare's metrics and the summary read
    # from the curves is the model table's default row, not an interpolation next to it
    vm, bare = (Bundle.open(demo_bundles[p]) for p in DEMO_PROFILES)
    band = band_for()
    cost = like_for_like(vm, bare, band)
    assert cost is not None and cost.source == "simulated" and cost.at("same_choices") is not None
    dv = Curves(vm.read_table("allreduce")).default()
    db = Curves(bare.read_table("allreduce")).default()
    assert dv is not None and db is not None
    for size in band.sizes():
        assert dv.extent(size) == "measured" and db.extent(size) == "measured"
        row = next(r for r in cost.rows("default") if r.size_bytes == size)
        assert dv.at(size) == pytest.approx(row.vm.time_us, abs=1e-6)
        assert db.at(size) == pytest.approx(row.bare.time_us, abs=1e-6)


def test_two_bundles_without_the_model_table_compare_their_curves(demo_bundles: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    vm = _without_model_table(demo_bundles["rtxpro6000-8x-vm"], tmp_path / "vm")
    bare = Bundle.open(demo_bundles["rtxpro6000-8x-switch"])
    band = band_for()
    assert like_for_like(vm, None, band) is None  # nothing to compare with: no numbers
    assert bare_for(vm, [bare]) is bare and pick_pair(bare, vm) == (vm, bare)
    cost = like_for_like(vm, bare, band)
    assert cost is not None and cost.bases == ("default", "best")
    assert not cost.host_changes and not cost.mechanisms and "curves" in cost.provenance
    cv, cb = Curves(vm.read_table("allreduce")), Curves(bare.read_table("allreduce"))
    for size in band.sizes():
        d = next(r for r in cost.rows("default") if r.size_bytes == size)
        assert d.vm.time_us == cv.default().at(size) and d.bare.time_us == cb.default().at(size)
        best = next(r for r in cost.rows("best") if r.size_bytes == size)
        assert best.vm.time_us == min(c.at(size) for c in cv.full_group() if c.plain_order)
        assert best.bare.time_us == min(c.at(size) for c in cb.full_group() if c.plain_order)
    b1 = cost.at("best")
    assert b1 is not None and b1.vm.setting == "NCCL_P2P_LEVEL=SYS"
    assert b1.vm.risks == (P2P_HANG,)  # P2P through the translating IOMMU
    assert b1.bare.setting == "NCCL_P2P_LEVEL=SYS" and b1.bare.risks == ()  # no IOMMU there
    # best among what the bundles ran: the model's best (a graph file and SYS) is not among them
    model_best = vm_cost.like_for_like("rtxpro6000-8x-vm").per_size
    assert b1.bare.time_us > next(c.bare.time_us for c in model_best
                                  if c.basis == "best" and c.size_bytes == b1.size_bytes)
    assert "among the settings its bundle ran" in cost.notes[0]
    assert cost.step and cost.at("default", 1, step=True).vm.time_us == pytest.approx(
        157 * cost.at("default").vm.time_us)
    assert pick_pair(vm, vm) is None and pick_pair(bare, bare) is None  # one VM, one bare box


def test_known_state_of_a_vm_bundle(demo_bundles: dict[str, Path]) -> None:
    s = known_state(Bundle.open(demo_bundles["rtxpro6000-8x-vm"]))
    assert s.hypervisor == "KVM" and s.iommu == "translated" and s.flat_tree
    assert len(s.shm_links) == 8  # NCCL's default ring through host memory, every edge
