from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from builders.bundles import two_switch, write_matrix_bundle

from pcieprof.analysis.infer import infer
from pcieprof.bundle.topology import Topology
from pcieprof.analysis.matrices import gpu_indices, pair_matrix
from pcieprof.tune.nccl_files import graph_xml, topo_xml, write_files
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


def test_emitted_graph_and_topo_parse_as_nccl_files(vm_bundle, tmp_path: Path, samples: Path) -> None:
    ring, inferred = _ring_and_inference(vm_bundle)
    paths = write_files(vm_bundle, ring, inferred, vm_bundle.read_doc(Topology))
    root = ET.parse(paths["graph"]).getroot()
    chans = _check_graph_like_nccl(root, 8)
    assert chans[0] == ring.order
    assert chans[1] == [ring.order[0], *reversed(ring.order[1:])]
    g = root.find("graph")
    assert g.get("pattern") == "4" and g.get("id") == "0"
    # topo: same element vocabulary as the cloud-shipped file, GPUs nested under inferred switches
    topo = ET.parse(paths["topo"]).getroot()
    sample = ET.parse(samples / SAMPLE_TOPO).getroot()
    assert topo.tag == "system" and topo.get("version") == "1"
    assert {e.tag for e in topo.iter()} <= {e.tag for e in sample.iter()}
    switches = [p for p in topo.iter("pci") if p.get("class") == "0x060400"]
    assert len(switches) == 2
    for sw in switches:
        assert len(sw.findall("pci/gpu")) == 4
    busids = [p.get("busid") for p in topo.iter("pci")]
    assert len(busids) == len(set(busids))
    gpu_busids = {p.get("busid") for p in topo.iter("pci") if p.find("gpu") is not None}
    assert gpu_busids == {g["bus_id"] for g in vm_bundle.read_json("topology.json")["gpus"]}


def test_emitted_files_parse_with_the_importer(vm_bundle, tmp_path: Path) -> None:
    nccl_xml = pytest.importorskip("pcieprof.importers.nccl_xml")
    ring, inferred = _ring_and_inference(vm_bundle)
    paths = write_files(vm_bundle, ring, inferred, vm_bundle.read_doc(Topology))
    doc = nccl_xml.parse_graph_xml(paths["graph"].read_text())
    (graph,) = doc["graphs"]
    assert graph["pattern"] == 4 and graph["channels"][0]["gpus"] == ring.order
    topo = nccl_xml.parse_topo_xml(paths["topo"].read_text())
    assert sorted(g["dev"] for g in topo["gpus"]) == list(range(8))
    # every GPU sits under one of two inferred switches
    parents = {g["pci_path"][1] for g in topo["gpus"]}
    assert len(parents) == 2


def test_topo_needs_bus_ids(vm_bundle) -> None:
    ring, inferred = _ring_and_inference(vm_bundle)
    topo = vm_bundle.read_doc(Topology)
    topo.gpus[0].bus_id = None
    with pytest.raises(ValueError):
        topo_xml(inferred, topo)
    assert "<graphs" in graph_xml(ring, inferred=inferred)
