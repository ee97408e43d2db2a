"""topology_from_logs on all logs of the ASUS server (what `pcieprof import` calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.discover.from_logs import topology_from_logs
from pcieprof.errors import BadInput


def _logs(samples: Path) -> dict[str, str]:
    d = samples / "rtxpro6000-8x-asus-baremetal"
    files = {"lspci": "lspci_full.log", "smi_q": "nvidia_smi_full.log", "topo_m": "nvidia_topo.log",
             "cmdline": "cmdline.log", "numa": "numa.log", "lscpu": "lscpu.log", "dmesg": "dmesg.log"}
    return {k: (d / f).read_text(errors="replace") for k, f in files.items()}


@pytest.fixture(scope="module")
def topo(samples):
    return topology_from_logs(**_logs(samples))


def test_gpus(topo):
    assert topo["source"] == "imported"
    assert topo["driver"]["driver_version"] == "595.58.03"
    assert topo["driver"]["cuda_driver_version"] == "13.2"
    gpus = topo["gpus"]
    assert len(gpus) == 8
    assert [g["bus_id"][5:7] for g in gpus] == ["06", "07", "75", "76", "84", "85", "f4", "f5"]
    for g in gpus:
        assert g["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
        assert (g["pcie"]["gen_max"], g["pcie"]["width_max"], g["pcie"]["gen_max_system"]) == (5, 16, 5)
        assert g["bar1_bytes"] == 128 * 2**30 and g["virtualization_mode"] == "bare_metal"
    assert [g["numa_node"] for g in gpus] == [0] * 4 + [1] * 4
    assert gpus[7]["cpu_affinity"] == "64-127,192-238"


def test_switch_uplinks_root_ports_and_links(topo):
    tree = topo["pcie_tree"]
    nodes = {n["bdf"]: n for n in tree["nodes"]}
    uplinks = {tree["gpu_paths"][str(i)][2] for i in range(8)}
    roots = {tree["gpu_paths"][str(i)][3] for i in range(8)}
    assert uplinks == {"0000:01:00.0", "0000:71:00.0", "0000:81:00.0", "0000:f1:00.0"}
    assert roots == {"0000:00:01.1", "0000:70:01.1", "0000:80:01.1", "0000:f0:01.1"}
    for b in uplinks | roots:
        link = nodes[b]["link"]
        assert (link["gen"], link["width"], link["cap_gen"], link["cap_width"]) == (5, 16, 5, 16)
    assert all(nodes[b]["description"].startswith("PCI bridge: Broadcom / LSI PEX890xx")
               for b in uplinks)


def test_acs_bits_of_every_bridge(topo):
    bridges = [n for n in topo["pcie_tree"]["nodes"]
               if n["kind"] in ("root_port", "switch_downstream")]
    assert len(bridges) >= 12
    # 38 bridges print "ACSCtl: SrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd+ ..." in
    # lspci_full.log; the tree keeps all of them
    enabled = [n for n in topo["pcie_tree"]["nodes"] if n["acs"] and n["acs"]["ctl"]["SrcValid"]]
    assert len(enabled) == 38
    assert not any(n["acs"]["ctl"]["ReqRedir"] or n["acs"]["ctl"]["CmpltRedir"]
                   for n in topo["pcie_tree"]["nodes"] if n["acs"])


def test_iommu_off_bare_metal_numa(topo):
    i = topo["iommu"]
    assert i["enabled"] is False and i["mode"] == "off"
    assert "cmdline: iommu=off" in i["evidence"] and "cmdline: amd_iommu=off" in i["evidence"]
    assert i["groups"] == {}
    v = topo["virtualization"]
    assert v["is_vm"] is False and v["hypervisor"] is None and v["flat_pcie_tree"] is False
    assert any("ASUSTeK" in e for e in v["evidence"])
    assert [n["id"] for n in topo["numa"]["nodes"]] == [0, 1]


def test_levels_from_topo_m_and_from_the_tree_agree(samples, topo):
    from_topo = {(p["a"], p["b"]): p["level"] for p in topo["pairs"]}
    assert {p["level_source"] for p in topo["pairs"]} == {"topo -m"}
    assert from_topo[(0, 1)] == "PIX" and from_topo[(1, 3)] == "NODE" and from_topo[(2, 6)] == "SYS"
    # lspci alone: the levels worked out from the PCIe tree and NUMA nodes are those NVML printed
    only = topology_from_logs(lspci=_logs(samples)["lspci"])
    derived = {(p["a"], p["b"]): p["level"] for p in only["pairs"]}
    assert {p["level_source"] for p in only["pairs"]} == {"pcie_tree"}
    assert derived == from_topo
    assert only["gpus"][0]["name"] == "Device 2bb5" and only["gpus"][0]["uuid"] is None
    assert only["gpus"][0]["status"]["uuid"] == "unknown"


def test_no_logs_at_all_is_empty_with_statuses():
    t = topology_from_logs()
    assert t["gpus"] == [] and t["iommu"]["mode"] == "unknown"
    assert t["status"]["lspci"].startswith("unknown") and t["status"]["smi_q"].startswith("unknown")


def test_logs_of_two_machines_are_refused(samples):
    logs = _logs(samples)
    other = (samples / "tool-outputs" / "topo_m_5gpu_5060ti_5070_proxmox_host.txt").read_text()
    with pytest.raises(BadInput, match="5 GPUs"):
        topology_from_logs(smi_q=logs["smi_q"], topo_m=other,
                           names={"topo_m": "topo_m_5gpu.txt"})


def test_bad_log_names_file(samples):
    with pytest.raises(BadInput, match="nvidia_smi_full.log"):
        topology_from_logs(smi_q="hello\n", names={"smi_q": "nvidia_smi_full.log"})
