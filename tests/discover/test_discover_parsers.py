"""nvidia-smi -q and nvidia-smi topo -m parsers on the real outputs in ../shared/samples."""

from __future__ import annotations

import pytest

from pcieprof.discover.smi_query import parse_smi_query
from pcieprof.discover.topo_matrix import parse_topo_matrix
from pcieprof.errors import BadInput


def test_smi_query_asus(samples):
    q = parse_smi_query((samples / "rtxpro6000-8x-asus-baremetal" / "nvidia_smi_full.log").read_text())
    assert (q["driver_version"], q["cuda_version"], q["attached_gpus"]) == ("595.58.03", "13.2", 8)
    g = q["gpus"][4]
    assert g["bus_id"] == "0000:84:00.0" and g["index"] == 4
    assert g["uuid"] == "GPU-82383b2b-58e3-1ca5-d958-f53d1752f4f6"
    assert g["pcie"] == {"gen_current": 1, "gen_max": 5, "gen_current_device": 1,
                         "gen_max_device": 5, "gen_max_system": 5, "width_current": 16,
                         "width_max": 16}
    assert g["memory_bytes"] == 97887 * 2**20 and g["memory_reserved_bytes"] == 636 * 2**20
    assert g["pci_device_id"] == "0x2BB510DE"
    assert [x["minor_number"] for x in q["gpus"]][:3] == [2, 3, 0]


def test_smi_query_malformed():
    with pytest.raises(BadInput, match=r"x\.log: no 'GPU"):
        parse_smi_query("Driver Version : 1\n", source="x.log")
    with pytest.raises(BadInput, match=r"x\.log:3: expected 'Key : Value'"):
        parse_smi_query("GPU 00000000:06:00.0\n    Product Name : A\n    weird:thing\n",
                        source="x.log")


def test_topo_asus_and_shared_copy_agree(samples):
    a = parse_topo_matrix((samples / "rtxpro6000-8x-asus-baremetal" / "nvidia_topo.log").read_text())
    b = parse_topo_matrix((samples / "tool-outputs" /
                           "topo_m_8x_rtxpro6000_server_baremetal_broadcom.txt").read_text())
    assert a == b
    assert a["gpus"] == 8 and a["devices"][-1] == "GPU7"
    m = a["matrix"]
    assert m["GPU0"]["GPU0"] == "X" and m["GPU0"]["GPU1"] == "PIX" and m["GPU0"]["GPU3"] == "NODE"
    assert m["GPU4"]["GPU7"] == "NODE" and m["GPU6"]["GPU7"] == "PIX" and m["GPU3"]["GPU4"] == "SYS"
    # the rows' empty field before "GPU NUMA ID" must not shift the columns
    assert a["cpu_affinity"][0] == "0-63,128-191" and a["numa_affinity"][5] == 1
    assert a["gpu_numa_id"] == {i: None for i in range(8)}
    assert len(a["pairs"]) == 56


def test_topo_proxmox_all_phb(samples):
    t = parse_topo_matrix((samples / "tool-outputs" / "topo_m_5gpu_5060ti_5070_proxmox_host.txt").read_text())
    assert t["gpus"] == 5 and {p["level"] for p in t["pairs"]} == {"PHB"}
    assert t["cpu_affinity"] == {i: "0-23" for i in range(5)} and t["numa_affinity"][4] == 0


def test_topo_nic_rows_and_old_driver_layout():
    # Hand-written in the layout of older drivers (no NUMA columns) with a NIC and its legend.
    text = ("\t\x1b[4mGPU0\tGPU1\tNIC0\tCPU Affinity\x1b[0m\n"
            "GPU0\t X \tNV4\tSYS\t0-11\n"
            "GPU1\tNV4\t X \tPHB\t12-23\n"
            "NIC0\tSYS\tPHB\t X \t\n\n"
            "Legend:\n\n  X    = Self\n  PIX  = Connection traversing at most a single PCIe bridge\n\n"
            "NIC Legend:\n\n  NIC0: mlx5_0\n")
    t = parse_topo_matrix(text)
    assert t["devices"] == ["GPU0", "GPU1", "NIC0"] and t["gpus"] == 2
    assert t["matrix"]["GPU0"]["GPU1"] == "NV4" and t["matrix"]["NIC0"]["GPU1"] == "PHB"
    assert t["cpu_affinity"] == {0: "0-11", 1: "12-23"} and t["numa_affinity"] == {0: None, 1: None}
    assert t["nics"] == {"NIC0": "mlx5_0"}


@pytest.mark.parametrize("text, what", [
    ("nothing here\n", "no header row"),
    ("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\n", "has 1 cells"),
    ("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tPIX\t X \n", "'FOO'"),
    ("\tGPU0\tGPU1\nGPU0\t X \tPIX\n", "rows missing for GPU1"),
])
def test_topo_malformed(text, what):
    with pytest.raises(BadInput, match=what) as e:
        parse_topo_matrix(text, source="t.txt")
    assert "t.txt" in str(e.value)
