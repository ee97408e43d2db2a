"""sysfs reader and discover() on fake roots built from the ASUS server's real values, and on
this machine's real /sys."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from builders.sysfs import write_fake_root
from pcieprof.discover.lspci import parse_lspci
from pcieprof.discover.pcie_tree import build_tree
from pcieprof.discover.sysfs import read_sysfs_pci
from pcieprof.discover.topology import discover

DATA = Path(__file__).resolve().parents[1] / "data"

SNAP = DATA / "nvml_snapshot_rtxpro6000_8x" / "snapshot.json"


@pytest.fixture(scope="module")
def asus(samples: Path):
    return parse_lspci((samples / "rtxpro6000-8x-asus-baremetal" / "lspci_full.log").read_text())


@pytest.fixture(scope="module")
def asus_root(tmp_path_factory, asus):
    return write_fake_root(tmp_path_factory.mktemp("asus"), asus, cmdline="ro amd_iommu=off iommu=off",
                           cpu_flags="fpu sse2 svm",
                           dmi=("ASUSTeK COMPUTER INC.", "ESC8000A-E13P"),
                           numa={0: "0-63,128-191", 1: "64-127,192-238,240-255"})


def test_sysfs_reader_gives_the_lspci_tree(asus_root, asus):
    devices, status = read_sysfs_pci(asus_root)
    assert status == "ok" and len(devices) == len(asus)
    a, b = build_tree(asus), build_tree(devices)
    assert b["gpu_paths"] == a["gpu_paths"]
    assert b["summary"] == a["summary"]
    na = {n["bdf"]: n for n in a["nodes"]}
    for n in b["nodes"]:
        assert n["kind"] == na[n["bdf"]]["kind"], n["bdf"]
        assert n["acs"] == na[n["bdf"]]["acs"], n["bdf"]
        assert n["link"] == na[n["bdf"]]["link"], n["bdf"]
        assert n["numa_node"] == na[n["bdf"]]["numa_node"]
    gpu = next(d for d in devices if d.bdf == "0000:06:00.0")
    assert gpu.driver == "nvidia" and gpu.port_type == "legacy_endpoint"
    assert gpu.parent == "0000:02:03.0"


def test_kinds_inferred_without_config_space(tmp_path, asus):
    root = write_fake_root(tmp_path / "noconf", asus, with_config=False)
    devices, _ = read_sysfs_pci(root)
    tree = build_tree(devices)
    assert tree["summary"]["switch_upstream"] == ["0000:01:00.0", "0000:71:00.0",
                                                  "0000:81:00.0", "0000:f1:00.0"]
    assert tree["summary"]["root_ports"] == ["0000:00:01.1", "0000:70:01.1",
                                             "0000:80:01.1", "0000:f0:01.1"]
    assert all(n.get("kind_inferred") for n in tree["nodes"] if n["kind"] == "switch_upstream")


def test_discover_with_replayed_nvml_on_fake_root(asus_root):
    topo = discover(nvml=SNAP, root=asus_root)
    assert topo["source"] == "measured" and topo["status"]["nvml"] == "ok"
    assert topo["status"]["sysfs"] == "ok" and topo["status"]["lspci"].startswith("not_supported")
    assert len(topo["gpus"]) == 8 and len(topo["pairs"]) == 56
    g4 = topo["gpus"][4]
    assert g4["bus_id"] == "0000:84:00.0" and g4["numa_node"] == 1
    assert g4["pcie"]["gen_max_system"] == 5 and "gen_max_system" not in g4["pcie"]["status"]
    assert topo["pcie_tree"]["gpu_paths"]["4"][-1] == "0000:80:01.1"
    lv = {(p["a"], p["b"]): (p["level"], p["level_source"]) for p in topo["pairs"]}
    assert lv[(0, 1)] == ("PIX", "nvml") and lv[(3, 5)] == ("SYS", "nvml")
    assert topo["iommu"]["enabled"] is False and topo["iommu"]["mode"] == "off"
    v = topo["virtualization"]
    assert v["is_vm"] is False and v["flat_pcie_tree"] is False
    assert topo["numa"]["nodes"][1]["cpus"] == "64-127,192-238,240-255"


def test_flat_vm_tree_with_iommu(tmp_path, asus):
    # The same GPUs as a QEMU guest might see them: each directly on root bus 0, IOMMU groups,
    # a vIOMMU unit, iommu=pt.
    gpus = [copy.deepcopy(d) for d in asus if d.is_nvidia_gpu]
    for n, d in enumerate(gpus):
        d.bdf, d.parent, d.iommu_group = f"0000:00:{n + 3:02x}.0", None, 10 + n
    root = write_fake_root(tmp_path / "vm", gpus, cmdline="ro iommu=pt intel_iommu=on",
                           cpu_flags="fpu sse2 hypervisor", dmi=("QEMU", "Standard PC (Q35 + ICH9, 2009)"),
                           iommu_units=["dmar0"])
    topo = discover(nvml=None, root=root)
    assert topo["status"]["nvml"].startswith("not_supported")
    assert len(topo["gpus"]) == 8 and topo["gpus"][0]["bus_id"] == "0000:00:03.0"
    assert topo["gpus"][0]["pcie"]["gen_max_device"] == 5
    v = topo["virtualization"]
    assert v["is_vm"] is True and v["hypervisor"] == "QEMU/KVM" and v["flat_pcie_tree"] is True
    i = topo["iommu"]
    assert i["enabled"] is True and i["mode"] == "passthrough"
    assert i["groups"]["0000:00:03.0"] == 10
    # no NVML: levels come from the tree; one root bus -> PHB
    assert {p["level"] for p in topo["pairs"]} == {"PHB"}
    assert {p["level_source"] for p in topo["pairs"]} == {"pcie_tree"}


def test_discover_on_this_machine_does_not_crash():
    topo = discover()
    assert set(topo) >= {"source", "driver", "gpus", "pairs", "pcie_tree", "iommu",
                         "virtualization", "numa", "status"}
    if topo["status"]["nvml"] != "ok":
        assert "use --backend cpu" in topo["status"]["nvml"]
        assert topo["driver"]["driver_version"] is None
    assert topo["status"]["sysfs"] in ("ok", "not_supported")
    assert topo["iommu"]["mode"] in ("translated", "passthrough", "off", "unknown")
    assert topo["numa"]["nodes"], "every Linux machine has at least node 0"


def test_missing_sysfs_is_a_status(tmp_path):
    devices, status = read_sysfs_pci(tmp_path)
    assert devices == [] and status == "not_supported"
    topo = discover(root=tmp_path)
    assert topo["gpus"] == [] and topo["status"]["sysfs"] == "not_supported"
    assert topo["iommu"]["mode"] == "unknown" and topo["virtualization"]["is_vm"] is None


def test_acs_redirect_enabled_host(tmp_path, asus):
    # The ASUS devices with ReqRedir+/CmpltRedir+ on the switch downstream ports, as a host that
    # forces P2P up to the root complex shows them; the bits travel through config space.
    devices = copy.deepcopy(asus)
    for d in devices:
        if d.port_type == "downstream" and d.acs_ctl:
            d.acs_ctl = dict(d.acs_ctl, ReqRedir=True, CmpltRedir=True)
    root = write_fake_root(tmp_path / "acs", devices)
    got, _ = read_sysfs_pci(root)
    s = build_tree(got)["summary"]
    assert s["acs_redirect_on_gpu_paths"] == s["switch_downstream"]
    assert len(s["acs_redirect_on_gpu_paths"]) == 8


def test_nvml_index_maps_to_pci_by_bus_id(asus_root):
    # NVML indices need not follow bus order: the tree follows each index's bus id.
    import json

    snap = json.loads(SNAP.read_text())
    c = snap["calls"]
    c["nvmlDeviceGetPciInfo_v3(gpu0)"], c["nvmlDeviceGetPciInfo_v3(gpu7)"] = (
        c["nvmlDeviceGetPciInfo_v3(gpu7)"], c["nvmlDeviceGetPciInfo_v3(gpu0)"])
    topo = discover(nvml=snap, root=asus_root)
    paths = topo["pcie_tree"]["gpu_paths"]
    assert paths["0"][0] == "0000:f5:00.0" and paths["7"][0] == "0000:06:00.0"
    assert topo["gpus"][0]["numa_node"] == 1 and topo["gpus"][7]["numa_node"] == 0
