"""The PCI device record that both OS-side readers (`lspci -vvv` text and sysfs) produce.

One record type so that one tree builder (`pcie_tree.build_tree`) serves a live machine and an
imported log alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: ACS capability/control bits in register order (PCIe spec, ACS Extended Capability; lspci prints
#: them with these names and a trailing +/-).
ACS_BITS: tuple[str, ...] = (
    "SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans",
)

#: Link speed in GT/s per PCIe generation.
GEN_SPEED_GTS: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0, 7: 128.0}

#: PCI vendor ids of vendors that matter here (pci.ids), used to map lspci names to ids.
VENDOR_IDS: dict[str, str] = {
    "NVIDIA Corporation": "10de",
    "Advanced Micro Devices, Inc. [AMD]": "1022",
    "Advanced Micro Devices, Inc. [AMD/ATI]": "1002",
    "Broadcom / LSI": "1000",
    "PLX Technology, Inc.": "10b5",
    "Intel Corporation": "8086",
    "ASPEED Technology, Inc.": "1a03",
    "Red Hat, Inc.": "1af4",
    "Mellanox Technologies": "15b3",
    "Microsoft Corporation": "1414",
    "VMware": "15ad",
    "Microchip Technology": "11f8",
}
NVIDIA_VENDOR_ID = "10de"

#: lspci class names -> base/sub class code, for output without `-nn`.
CLASS_CODES: dict[str, int] = {
    "Host bridge": 0x0600,
    "ISA bridge": 0x0601,
    "PCI bridge": 0x0604,
    "VGA compatible controller": 0x0300,
    "3D controller": 0x0302,
    "Display controller": 0x0380,
    "Ethernet controller": 0x0200,
    "Network controller": 0x0280,
    "Infiniband controller": 0x0207,
    "Non-Volatile memory controller": 0x0108,
    "Serial Attached SCSI controller": 0x0107,
    "System peripheral": 0x0880,
    "IOMMU": 0x0806,
}


def gen_of_speed(speed_gts: float | None) -> int | None:
    """PCIe generation of a link speed in GT/s (32.0 -> 5), None when unknown."""
    if speed_gts is None:
        return None
    for gen, s in GEN_SPEED_GTS.items():
        if abs(s - speed_gts) < 0.01:
            return gen
    return None


_BDF = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_bdf(text: str) -> str:
    """A PCI address in the canonical sysfs form `dddd:bb:dd.f`, lower case.

    Accepts lspci's `06:00.0` (domain 0 implied), sysfs's `0000:06:00.0` and NVML's
    `00000000:06:00.0` (8-digit domain).

    Raises:
        ValueError: when `text` is not a PCI address.
    """
    m = _BDF.match(text.strip())
    if not m:
        raise ValueError(f"not a PCI address: {text!r}")
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def bus_of(bdf: str) -> tuple[int, int]:
    """(domain, bus) of a canonical bdf."""
    d, b, _ = bdf.split(":")
    return int(d, 16), int(b, 16)


@dataclass
class PciDevice:
    """One PCI function as an OS-side reader saw it. Unknown values are None.

    Attributes:
        bdf: canonical address `dddd:bb:dd.f`.
        class_code: base class << 8 | subclass (0x0302 = 3D controller), None if unknown.
        class_name: the class as lspci names it ("PCI bridge").
        vendor: vendor name (lspci) or None; vendor_id/device_id are 4-digit hex without 0x.
        port_type: PCIe port type from the Express capability: root_port, upstream, downstream,
            endpoint, legacy_endpoint, pcie_to_pci, pci_to_pcie, rc_endpoint, rc_event_collector.
        secondary_bus, subordinate_bus: bus range behind a bridge.
        parent: bdf of the upstream bridge (sysfs knows it; for lspci it is derived from bus ranges).
        speed_gts, width: LnkSta (current link); cap_speed_gts, cap_width: LnkCap.
        acs_cap, acs_ctl: ACS bits by name (ACS_BITS), None when the function has no ACS capability.
    """

    bdf: str
    class_code: int | None = None
    class_name: str | None = None
    vendor: str | None = None
    vendor_id: str | None = None
    device: str | None = None
    device_id: str | None = None
    description: str = ""
    port_type: str | None = None
    secondary_bus: int | None = None
    subordinate_bus: int | None = None
    parent: str | None = None
    numa_node: int | None = None
    iommu_group: int | None = None
    driver: str | None = None
    speed_gts: float | None = None
    width: int | None = None
    cap_speed_gts: float | None = None
    cap_width: int | None = None
    downgraded: bool | None = None
    acs_cap: dict[str, bool] | None = None
    acs_ctl: dict[str, bool] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_bridge(self) -> bool:
        """A PCI-to-PCI bridge (every PCIe root port and switch port is one)."""
        return (self.class_code == 0x0604 or self.secondary_bus is not None
                or self.port_type in ("root_port", "upstream", "downstream", "pcie_to_pci",
                                      "pci_to_pcie"))

    @property
    def is_nvidia_gpu(self) -> bool:
        """An NVIDIA display/3D controller (class 03xx)."""
        nvidia = self.vendor_id == NVIDIA_VENDOR_ID or (self.vendor or "").startswith("NVIDIA")
        return nvidia and self.class_code is not None and (self.class_code >> 8) == 0x03
