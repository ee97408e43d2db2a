"""lspci -vvv parser and PCIe tree on the real logs of the 8x RTX PRO 6000 ASUS server."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.discover.lspci import parse_lspci
from pcieprof.discover.pci import ACS_BITS, normalize_bdf
from pcieprof.discover.pcie_tree import build_tree, is_flat
from pcieprof.errors import BadInput


@pytest.fixture(scope="module")
def asus_devices(samples: Path):
    return parse_lspci((samples / "rtxpro6000-8x-asus-baremetal" / "lspci_full.log").read_text(),
                       source="lspci_full.log")


def test_headers_and_classes(asus_devices):
    assert len(asus_devices) == 202  # grep -c '^[0-9a-f]' lspci_full.log
    gpu = next(d for d in asus_devices if d.bdf == "0000:06:00.0")
    assert gpu.is_nvidia_gpu and gpu.class_code == 0x0302
    assert (gpu.vendor, gpu.vendor_id, gpu.device_id) == ("NVIDIA Corporation", "10de", "2bb5")
    assert gpu.driver == "nvidia" and gpu.numa_node == 0 and gpu.port_type == "legacy_endpoint"
    # an idle GPU retrains down to 2.5 GT/s; its capability is Gen5 x16
    assert (gpu.speed_gts, gpu.width, gpu.downgraded) == (2.5, 16, True)
    assert (gpu.cap_speed_gts, gpu.cap_width) == (32.0, 16)
    up = next(d for d in asus_devices if d.bdf == "0000:01:00.0")
    assert up.vendor == "Broadcom / LSI" and up.port_type == "upstream"
    assert (up.secondary_bus, up.subordinate_bus, up.parent) == (0x02, 0x08, "0000:00:01.1")
    assert up.acs_cap is None  # switch upstream ports carry no ACS capability here


def test_tree_finds_gpus_switches_root_ports(asus_devices):
    tree = build_tree(asus_devices)
    s = tree["summary"]
    assert s["gpus"] == 8
    assert s["switch_upstream"] == ["0000:01:00.0", "0000:71:00.0", "0000:81:00.0", "0000:f1:00.0"]
    assert s["root_ports"] == ["0000:00:01.1", "0000:70:01.1", "0000:80:01.1", "0000:f0:01.1"]
    assert len(s["switch_downstream"]) == 8
    assert s["acs_redirect_on_gpu_paths"] == []  # bare metal, ACS redirect off
    assert tree["gpu_paths"]["0"] == ["0000:06:00.0", "0000:02:03.0", "0000:01:00.0", "0000:00:01.1"]
    assert tree["gpu_paths"]["7"] == ["0000:f5:00.0", "0000:f2:02.0", "0000:f1:00.0", "0000:f0:01.1"]
    nodes = {n["bdf"]: n for n in tree["nodes"]}
    for path in tree["gpu_paths"].values():
        gpu, _down, up, root = (nodes[b] for b in path)
        assert gpu["kind"] == "gpu" and gpu["link"]["cap_gen"] == 5 and gpu["link"]["cap_width"] == 16
        # the uplink from each switch to its CPU root port runs at Gen5 x16
        for hop in (up, root):
            assert (hop["link"]["gen"], hop["link"]["width"]) == (5, 16)
        assert up["kind"] == "switch_upstream" and root["kind"] == "root_port"
        # two virtual switches per socket: GPUs 0-3 on NUMA node 0, 4-7 on node 1
    assert [nodes[p[0]]["numa_node"] for p in tree["gpu_paths"].values()] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert is_flat(tree) is False


def test_acs_bits_of_every_bridge_on_gpu_paths(asus_devices):
    tree = build_tree(asus_devices)
    nodes = {n["bdf"]: n for n in tree["nodes"]}
    bridges = {b for p in tree["gpu_paths"].values() for b in p[1:]}
    with_acs = [nodes[b] for b in bridges if nodes[b]["acs"]]
    # root ports and downstream ports have ACS; upstream ports do not
    assert len(with_acs) == 4 + 8
    for n in with_acs:
        assert list(n["acs"]["ctl"]) == list(ACS_BITS)
        ctl, cap = n["acs"]["ctl"], n["acs"]["cap"]
        # this box does not redirect P2P to the root complex: ReqRedir-/CmpltRedir- everywhere
        assert ctl == {"SrcValid": True, "TransBlk": False, "ReqRedir": False, "CmpltRedir": False,
                       "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False}
        assert cap["ReqRedir"] and cap["CmpltRedir"] and not cap["EgressCtrl"]


def test_nn_and_domain_forms():
    text = ("0001:c1:00.0 3D controller [0302]: NVIDIA Corporation GB202GL [RTX PRO 6000] "
            "[10de:2bb5] (rev a1)\n\tNUMA node: 1\n\tIOMMU group: 42\n"
            "\t\tLnkSta:\tSpeed 32GT/s, Width x16\n")
    (d,) = parse_lspci(text)
    assert d.bdf == "0001:c1:00.0" and d.vendor_id == "10de" and d.device_id == "2bb5"
    assert d.class_code == 0x0302 and d.iommu_group == 42 and d.numa_node == 1
    assert d.device == "GB202GL [RTX PRO 6000]" and d.speed_gts == 32.0 and d.downgraded is False


@pytest.mark.parametrize("text, what", [
    ("", "no PCI device"),
    ("hello world\n", "expected an lspci device header"),
    ("\tNUMA node: 0\n", "before any device header"),
    ("00:01.1 PCI bridge: X\n\t\tACSCtl:\tSrcValid+ TransBlk-\n", "ACS line lacks"),
])
def test_malformed_names_file_and_line(text, what):
    with pytest.raises(BadInput, match=what) as e:
        parse_lspci(text, source="bad.log")
    assert "bad.log" in str(e.value)


def test_normalize_bdf():
    assert normalize_bdf("00000000:06:00.0") == "0000:06:00.0"
    assert normalize_bdf("F4:00.0") == "0000:f4:00.0"
    with pytest.raises(ValueError):
        normalize_bdf("GPU0")


def test_non_root_lspci_without_capabilities():
    # lspci -vvv run as a normal user prints "<access denied>" instead of the capability list
    text = ("06:00.0 3D controller: NVIDIA Corporation Device 2bb5 (rev a1)\n"
            "\tSubsystem: NVIDIA Corporation Device 204e\n\tNUMA node: 0\n"
            "\tCapabilities: <access denied>\n\tKernel driver in use: nvidia\n")
    (d,) = parse_lspci(text)
    assert d.is_nvidia_gpu and d.speed_gts is None and d.acs_ctl is None and d.driver == "nvidia"


def test_this_machines_lspci_parses():
    from pcieprof.discover.lspci import run_lspci

    text, status = run_lspci()
    if text is None:
        pytest.skip(f"lspci: {status}")
    devices = parse_lspci(text, source="lspci -vvv -D")
    assert devices and all(d.bdf.count(":") == 2 for d in devices)
