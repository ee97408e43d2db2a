"""Guest and host views apart, and the host-side enablers a VM's GPUs need (issue 22 pt 8)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.bundle.topology import Topology
from pcieprof.cards import load_card
from pcieprof.tune.nccl_defaults import two_rank_note
from pcieprof.tune.recommend import recommend
from pcieprof.tune.rules import vm_enablers
from pcieprof.tune.rules.iommu_acs import evaluate as iommu_acs

GLM5 = load_card("glm5-nvfp4")


@pytest.fixture
def vm(demo_bundles: dict[str, Path]) -> Bundle:
    """The demo's simulated VM box (made once per session; read only here)."""
    return Bundle.open(demo_bundles["rtxpro6000-8x-vm"])


def _rec(vm: Bundle, rule: str):  # type: ignore[no-untyped-def]
    doc = recommend(vm, GLM5, layouts=False, write_files=False)
    return next((r for r in doc.recommendations if r.rule == rule), None), doc


def test_a_vm_whose_checks_pass_in_the_guest_is_told_nothing(vm: Bundle) -> None:
    """The sim VM's guest sees P2P OK on every pair and the full 128 GiB BAR1s."""
    rec, _ = _rec(vm, "vm_enablers")
    assert rec is None


def test_a_small_bar1_in_the_guest_gets_the_mmio_window_and_the_clique(vm: Bundle) -> None:
    topo = vm.read_doc(Topology)
    assert topo is not None
    for g in topo.gpus:
        g.bar1_bytes = 256 << 20  # what a guest with a small 64-bit window gets
    rec, = vm_enablers.evaluate(dataclasses.replace(_ctx(vm), topology=topo))
    assert rec.kind == "host" and "host view, not visible from this guest" in rec.gain_text
    assert "x-nv-gpudirect-clique=0" in rec.action and "nvidia-smi topo -p2p r" in rec.action
    assert "8 x 0.2 GiB BAR1" in rec.action and "host-phys-bits=on" in rec.action
    assert "X-PciMmio64Mb,string=4096" in rec.action  # the next power of two above 2 GiB


def test_a_guest_whose_driver_reports_no_p2p_is_told_to_set_the_clique(vm: Bundle) -> None:
    topo = vm.read_doc(Topology)
    assert topo is not None
    for p in topo.pairs:
        p.p2p = {"read": "NS", "write": "NS"}
    rec, = vm_enablers.evaluate(dataclasses.replace(_ctx(vm), topology=topo))
    assert rec.priority > 100 and "reports P2P unsupported on 28 pair(s)" in rec.gain_text
    # 8 x 128 GiB BAR1 = 1 TiB: the window is the next power of two in MiB
    assert "8 x 128.0 GiB BAR1 = 1024.0 GiB" in rec.action
    assert "X-PciMmio64Mb,string=2097152" in rec.action


def _ctx(vm: Bundle):  # type: ignore[no-untyped-def]
    from pcieprof.analysis.decode_band import DecodeBand
    from pcieprof.tune.recommend import build_context
    return build_context(vm, GLM5, DecodeBand.of_card(GLM5))


def test_no_kernel_line_says_amd_iommu_on(vm: Bundle) -> None:
    """amd_iommu= has no `on` value (kernel-parameters.txt): passthrough is iommu=pt."""
    doc = recommend(vm, GLM5, layouts=False, write_files=False)
    text = " ".join(r.action + r.gain_text + " ".join(r.evidence) for r in doc.recommendations)
    assert "amd_iommu=on" not in text
    topo = vm.read_doc(Topology)
    assert topo is not None and topo.iommu.cmdline == "(host) iommu=nopt"
    bare = dataclasses.replace(topo, virtualization=dataclasses.replace(
        topo.virtualization, is_vm=False))
    for rec in iommu_acs(dataclasses.replace(_ctx(vm), topology=bare)):
        assert "amd_iommu=on" not in rec.action


def test_tp2_groups_name_nccls_two_rank_p2p_default(vm: Bundle) -> None:
    topo = vm.read_doc(Topology)
    assert topo is not None
    note = two_rank_note(topo)
    assert note is not None and "paths.cc" in note and "through the translating IOMMU" in note
    intel = dataclasses.replace(topo, pcie_tree={"nodes": [{"bdf": "0000:00:01.0", "kind":
                                                             "root_port", "vendor": "Intel"}]})
    assert two_rank_note(intel) is None


def test_the_report_labels_guest_and_host_views(vm: Bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    box = tmp_path / vm.path.name  # a copy: the report writes recommend's result into it
    shutil.copytree(vm.path, box)
    r = cli("report", str(box), "-o", str(tmp_path / "r.html"), "-q")
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "the host&#39;s ACS is not visible from a guest" in html or \
        "the host's ACS is not visible from a guest" in html
    assert "off on every bridge</td>" not in html
