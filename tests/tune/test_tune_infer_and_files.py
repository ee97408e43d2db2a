from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from builders.bundles import two_switch, write_matrix_bundle

from pcieprof.analysis.infer import infer
from pcieprof.bundle import Bundle
from pcieprof.bundle.topology import Topology
from pcieprof.analysis.matrices import gpu_indices, pair_matrix
from pcieprof.tune.nccl_files import seen_tree, topo_xml, write_files
from pcieprof.tune.ring import best_ring

SAMPLE_GRAPH = "tool-outputs/nccl_graph_azure_ncv4_4xA100pcie_vm.xml"
SAMPLE_TOPO = "tool-outputs/nccl_topo_azure_ncv4_4xA100pcie_vm.xml"


def _ring_and_inference(b):
    p2p = b.read_table("p2p")
    gpus = gpu_indices(p2p)
    bw = pair_matrix(p2p, path="p2p", metric="bandwidth_gbps", gpus=gpus)
    lat = pair_matrix(p2p, path="p2p", metric="latency_us", gpus=gpus)
    return best_ring(bw, lat, gpus), infer(p2p, b.read_table("allreduce"), b.read_doc(Topology))


def test_infers_hidden_switches_in_a_flat_vm(tmp_path: Path) -> None:
    groups = ([0, 3, 5, 6], [1, 2, 4, 7])
    bw, lat = two_switch(groups, seed=11)
    b = write_matrix_bundle(tmp_path / "vm", bw, lat, flat_vm=True)
    t = infer(b.read_table("p2p"), b.read_table("allreduce"), b.read_doc(Topology))
    assert t is not None
    assert t.switch_groups() == [sorted(g) for g in groups]
    assert t.hidden_structure
    assert any("hidden" in e for e in t.evidence)


def test_no_structure_when_all_pairs_alike(tmp_path: Path) -> None:
    bw, lat = two_switch(([0, 1, 2, 3],), seed=2)
    b = write_matrix_bundle(tmp_path / "one", bw, lat)
    t = infer(b.read_table("p2p"))
    assert len(t.levels) == 1 and not t.hidden_structure


def _check_graph_like_nccl(root: ET.Element, ngpus: int) -> list[list[int]]:
    # the attributes ncclTopoGetGraphFromXmlSub reads (NVIDIA/nccl src/graph/search.cc)
    assert root.tag == "graphs" and root.get("version") == "1"
    channels = []
    for g in root.findall("graph"):
        for attr in ("id", "pattern", "crossnic", "nchannels", "speedintra", "speedinter",
                     "typeintra", "typeinter", "samechannels"):
            assert g.get(attr) is not None, attr
        assert g.get("typeintra") in {"LOC", "NVL", "NVB", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"}
        float(g.get("speedintra"))
        for ch in g.findall("channel"):
            devs = [int(x.get("dev"), 16) for x in ch.findall("gpu")]
            assert sorted(devs) == list(range(ngpus))
            channels.append(devs)
        assert int(g.get("nchannels")) == len(g.findall("channel"))
    return channels


def test_sample_graph_passes_our_nccl_check(samples: Path) -> None:
    root = ET.parse(samples / SAMPLE_GRAPH).getroot()
    assert len(_check_graph_like_nccl(root, 4)) == 10


def test_emitted_graph_parses_as_nccl_files_and_no_topo_is_invented(vm_bundle) -> None:
    ring, inferred = _ring_and_inference(vm_bundle)
    paths = write_files(vm_bundle, ring, inferred, vm_bundle.read_doc(Topology))
    root = ET.parse(paths["graph"]).getroot()
    chans = _check_graph_like_nccl(root, 8)
    assert chans[0] == ring.order
    assert chans[1] == [ring.order[0], *reversed(ring.order[1:])]
    g = root.find("graph")
    assert g.get("pattern") == "4" and g.get("id") == "0"
    nccl_xml = pytest.importorskip("pcieprof.importers.nccl_xml")
    (graph,) = nccl_xml.parse_graph_xml(paths["graph"].read_text()).graphs
    assert graph.pattern == 4 and graph.channels[0].gpus == ring.order
    # the switches of this VM are only inferred from bandwidth: no NCCL_TOPO_FILE (issue 22 pt 5)
    assert "topo" not in paths and not vm_bundle.has("tune/nccl_topo.xml")


def test_topo_of_the_seen_tree_parses_as_nccl_files(sim_vm_bundle: Path, tmp_path: Path,
                                                    samples: Path) -> None:
    """The simulated VM's host tree (its profile, read from the real box's lspci): two sockets,
    four switches of two GPUs, every GPU under its guest bus id."""
    box = tmp_path / "vm"
    shutil.copytree(sim_vm_bundle, box)
    b = Bundle.open(box)
    ring, inferred = _ring_and_inference(b)
    paths = write_files(b, ring, inferred, b.read_doc(Topology))
    topo = ET.parse(paths["topo"]).getroot()
    sample = ET.parse(samples / SAMPLE_TOPO).getroot()
    assert topo.tag == "system" and topo.get("version") == "1"
    assert {e.tag for e in topo.iter()} <= {e.tag for e in sample.iter()}
    assert [c.get("numaid") for c in topo.findall("cpu")] == ["0", "1"]
    switches = [p for p in topo.iter("pci") if p.get("class") == "0x060400"]
    assert [[int(x.get("dev")) for x in sw.findall("pci/gpu")] for sw in switches] == \
        [[0, 1], [2, 3], [4, 5], [6, 7]]
    busids = [p.get("busid") for p in topo.iter("pci")]
    assert len(busids) == len(set(busids))
    gpu_busids = {p.get("busid") for p in topo.iter("pci") if p.find("gpu") is not None}
    assert gpu_busids == {g["bus_id"] for g in b.read_json("topology.json")["gpus"]}
    nccl_xml = pytest.importorskip("pcieprof.importers.nccl_xml")
    parsed = nccl_xml.parse_topo_xml(paths["topo"].read_text())
    assert sorted(g.dev for g in parsed.gpus) == list(range(8))
    topology = b.read_doc(Topology)
    topology.gpus[0].bus_id = None
    tree = seen_tree(topology)
    assert tree is not None and tree.source.startswith("the host's PCIe tree")
    with pytest.raises(ValueError):
        topo_xml(tree, topology)


def test_a_vm_topo_file_does_not_state_the_virtual_ports_link_generation(
        sim_vm_bundle: Path, tmp_path: Path) -> None:
    """Issue 23 pt 8: in a KVM guest NVML's maximum link generation can be the virtual root
    port's; it was written into NCCL_TOPO_FILE as the link's speed. In a VM it is left out (NCCL
    reads it itself); on bare metal it stays."""
    box = tmp_path / "vm"
    shutil.copytree(sim_vm_bundle, box)
    b = Bundle.open(box)
    topology = b.read_doc(Topology)
    for g in topology.gpus:
        g.pcie = {**(g.pcie or {}), "gen_max": 3, "gen_current": 1, "width_max": 16}
    tree = seen_tree(topology)
    assert tree is not None
    topology.virtualization.is_vm = True
    vm_nodes = list(ET.fromstring(topo_xml(tree, topology)).iter("pci"))
    assert vm_nodes and all(p.get("link_speed") is None for p in vm_nodes)
    assert all(p.get("link_width") == "16" for p in vm_nodes)
    topology.virtualization.is_vm = False
    metal = list(ET.fromstring(topo_xml(tree, topology)).iter("pci"))
    assert {p.get("link_speed") for p in metal} == {"8.0 GT/s PCIe"}
