"""tune/host_pcie_tree.json: the PCIe tree of the user's `lspci -vvv` of the machine the GPUs sit
in (`recommend --host-lspci`; for a VM, the hypervisor host's), so that NCCL_TOPO_FILE describes a
tree pcieprof has seen rather than one it inferred (pcieprof.tune.nccl_files.host_tree)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pcieprof.bundle.document import Document


@dataclass
class HostPcieTree(Document):
    """Attributes:
        source: where the tree was seen, in words (the lspci file's name).
        tree: the tree in topology.json's `pcie_tree` shape (pcieprof.discover.pcie_tree
            .build_tree: nodes, gpu_paths), kept the same way Topology keeps it.
    """

    FILE: ClassVar[str] = "tune/host_pcie_tree.json"

    source: str = ""
    tree: dict[str, Any] = field(default_factory=lambda: {"nodes": [], "gpu_paths": {}})
