"""IOMMU, hypervisor and NUMA readers on log texts and fake roots; versions()."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.sysfs import write_fake_root
from pcieprof.discover import versions
from pcieprof.discover.nvml import Nvml
from pcieprof.discover.nvml_snapshot import NvmlReplay
from pcieprof.discover.system import cmdline_params, hypervisor_state, iommu_state, numa_nodes

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("cmdline, dmesg, enabled, mode", [
    ("ro iommu=pt", "[1.0] AMD-Vi: Found IOMMU at 0000:00:00.2 cap 0x40\n", True, "passthrough"),
    ("ro intel_iommu=on", "[0.1] DMAR: IOMMU enabled\n[2.5] iommu: Default domain type: Translated\n",
     True, "translated"),
    ("ro iommu.passthrough=1", "[0.1] DMAR: IOMMU enabled\n", True, "passthrough"),
    ("ro intel_iommu=off", "", False, "off"),
    ("ro quiet", "", None, "unknown"),
    # the real ASUS box: the default-domain line appears although the IOMMU is off
    ("ro amd_iommu=off iommu=off", "[2.55] iommu: Default domain type: Translated\n", False, "off"),
])
def test_iommu_from_texts(cmdline, dmesg, enabled, mode):
    s = iommu_state(None, cmdline=cmdline, dmesg=dmesg)
    assert (s["enabled"], s["mode"]) == (enabled, mode)


def test_iommu_live_units_win_over_cmdline(tmp_path):
    root = write_fake_root(tmp_path, [], cmdline="ro iommu=off", iommu_units=["ivhd0"])
    s = iommu_state(root)
    assert s["enabled"] is True and s["mode"] == "translated"
    assert "/sys/class/iommu: ivhd0" in s["evidence"]


def test_cmdline_params_stop_at_double_dash():
    assert cmdline_params("a=1 b -- iommu=off") == {"a": "1", "b": ""}


def test_hypervisor_from_texts(samples):
    d = samples / "rtxpro6000-8x-asus-baremetal"
    bare = hypervisor_state(None, lscpu=(d / "lscpu.log").read_text(),
                            dmesg=(d / "dmesg.log").read_text(errors="replace"))
    assert bare["is_vm"] is False
    vm = hypervisor_state(None, lscpu="Hypervisor vendor:   KVM\nVirtualization type: full\n"
                                      "Flags: fpu hypervisor\n",
                          dmesg="[0.0] Hypervisor detected: KVM\n[0.0] DMI: QEMU Standard PC (Q35 + ICH9, 2009)\n")
    assert vm["is_vm"] is True and vm["hypervisor"] == "KVM"
    assert hypervisor_state(None)["is_vm"] is None


def test_this_machine_is_judged():
    s = hypervisor_state("/")
    assert s["is_vm"] in (True, False)  # /proc/cpuinfo exists on every Linux box


def test_numa_from_texts(samples):
    d = samples / "rtxpro6000-8x-asus-baremetal"
    n = numa_nodes(None, numa=(d / "numa.log").read_text())
    assert n["nodes"] == [{"id": 0, "cpus": "0-63,128-191"},
                          {"id": 1, "cpus": "64-127,192-238,240-255"}]
    assert numa_nodes(None, lscpu=(d / "lscpu.log").read_text()) == n


def test_versions_without_driver_and_with_snapshot():
    v = versions()
    assert v["torch"] and "nccl" in v
    if v["driver"] is None:
        assert "driver" in v["status"]
    r = versions(Nvml(NvmlReplay(DATA / "nvml_snapshot_rtxpro6000_8x" / "snapshot.json")))
    assert (r["driver"], r["cuda"], r["nvml"]) == ("595.58.03", "13.2", None)
    assert r["status"]["nvml"] == "unknown"
