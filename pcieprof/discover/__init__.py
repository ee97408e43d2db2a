"""Discovery: what the machine is (GPUs through NVML, the PCIe tree, IOMMU/ACS, virtualization).

Entry points: `pcieprof.discover.topology.discover()` for this machine,
`pcieprof.discover.from_logs.topology_from_logs()` for logs of another one, and `versions()`
for the manifest.
"""

from pcieprof.discover.software import versions

__all__ = ["versions"]
