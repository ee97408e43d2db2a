"""Build fake Linux filesystem roots (sysfs, /proc) for discovery tests.

The device values come from real records (the ASUS server's lspci -vvv parsed by the project's
parser); config space bytes are encoded the way the PCIe spec lays them out, so the sysfs reader's
decoding is checked against an independent encoding.
"""

from __future__ import annotations

import os
from pathlib import Path

from pcieprof.discover.pci import ACS_BITS, GEN_SPEED_GTS, PciDevice, bus_of

_PORT_CODES = {"endpoint": 0, "legacy_endpoint": 1, "root_port": 4, "upstream": 5,
               "downstream": 6, "pcie_to_pci": 7, "pci_to_pcie": 8, "rc_endpoint": 9,
               "rc_event_collector": 10}
_SPEED_CODES = {v: k for k, v in GEN_SPEED_GTS.items()}


def config_space(d: PciDevice) -> bytes:
    cfg = bytearray(4096)
    cfg[0:2] = int(d.vendor_id or "ffff", 16).to_bytes(2, "little")
    cfg[2:4] = int(d.device_id or "ffff", 16).to_bytes(2, "little")
    cfg[0x0A] = (d.class_code or 0) & 0xFF
    cfg[0x0B] = ((d.class_code or 0) >> 8) & 0xFF
    if d.secondary_bus is not None:
        cfg[0x0E] = 1
        cfg[0x18], cfg[0x19], cfg[0x1A] = bus_of(d.bdf)[1], d.secondary_bus, d.subordinate_bus or 0
    if d.port_type is not None:
        cfg[0x06] = 0x10  # capability list present
        cfg[0x34] = 0x40
        cfg[0x40], cfg[0x41] = 0x10, 0x00  # PCI Express capability, last in list
        cfg[0x42:0x44] = (_PORT_CODES[d.port_type] << 4 | 2).to_bytes(2, "little")
        lnkcap = _SPEED_CODES.get(d.cap_speed_gts or 0, 0) | (d.cap_width or 0) << 4
        lnksta = _SPEED_CODES.get(d.speed_gts or 0, 0) | (d.width or 0) << 4
        cfg[0x4C:0x50] = lnkcap.to_bytes(4, "little")
        cfg[0x52:0x54] = lnksta.to_bytes(2, "little")
    if d.acs_cap is not None:
        cfg[0x100:0x104] = (0x000D | 1 << 16).to_bytes(4, "little")  # ACS v1, no next
        cap = sum(1 << i for i, b in enumerate(ACS_BITS) if d.acs_cap[b])
        ctl = sum(1 << i for i, b in enumerate(ACS_BITS) if (d.acs_ctl or {}).get(b))
        cfg[0x104:0x106] = cap.to_bytes(2, "little")
        cfg[0x106:0x108] = ctl.to_bytes(2, "little")
    return bytes(cfg)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_fake_root(root: Path, devices: list[PciDevice], *, cmdline: str = "ro quiet",
                    cpu_flags: str = "fpu vme sse2", dmi: tuple[str, str] | None = None,
                    iommu_units: list[str] | None = None, numa: dict[int, str] | None = None,
                    with_config: bool = True, sysfs_link_files: bool = True) -> Path:
    """A filesystem root holding sys/bus/pci/devices for `devices` (parents must be set)."""
    by = {d.bdf: d for d in devices}

    def chain(d: PciDevice) -> list[str]:
        out = [d.bdf]
        while by[out[-1]].parent in by:
            out.append(by[out[-1]].parent)
        return out[::-1]

    links = root / "sys" / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    for d in devices:
        top = chain(d)
        dom, bus = bus_of(top[0])
        rel = Path("devices") / f"pci{dom:04x}:{bus:02x}" / Path(*top)
        ddir = root / "sys" / rel
        ddir.mkdir(parents=True, exist_ok=True)
        os.symlink(Path("..", "..", "..", rel), links / d.bdf)
        _write(ddir / "class", f"0x{(d.class_code or 0):04x}00")
        _write(ddir / "vendor", f"0x{d.vendor_id or 'ffff'}")
        _write(ddir / "device", f"0x{d.device_id or 'ffff'}")
        _write(ddir / "numa_node", str(d.numa_node if d.numa_node is not None else -1))
        if sysfs_link_files and d.speed_gts is not None:
            _write(ddir / "current_link_speed", f"{d.speed_gts:g} GT/s PCIe")
            _write(ddir / "current_link_width", str(d.width))
        if sysfs_link_files and d.cap_speed_gts is not None:
            _write(ddir / "max_link_speed", f"{d.cap_speed_gts:g} GT/s PCIe")
            _write(ddir / "max_link_width", str(d.cap_width))
        if d.driver:
            os.symlink(Path("..", "..", "..", "bus", "pci", "drivers", d.driver), ddir / "driver")
        if d.iommu_group is not None:
            g = root / "sys" / "kernel" / "iommu_groups" / str(d.iommu_group) / "devices"
            g.mkdir(parents=True, exist_ok=True)
            os.symlink(ddir, g / d.bdf)
            os.symlink(root / "sys" / "kernel" / "iommu_groups" / str(d.iommu_group),
                       ddir / "iommu_group")
        if with_config:
            (ddir / "config").write_bytes(config_space(d))
    (root / "sys" / "kernel" / "iommu_groups").mkdir(parents=True, exist_ok=True)
    (root / "sys" / "class" / "iommu").mkdir(parents=True, exist_ok=True)
    for u in iommu_units or []:
        (root / "sys" / "class" / "iommu" / u).mkdir()
    _write(root / "proc" / "cmdline", cmdline)
    _write(root / "proc" / "cpuinfo", f"processor\t: 0\nflags\t\t: {cpu_flags}\n")
    if dmi:
        _write(root / "sys" / "class" / "dmi" / "id" / "sys_vendor", dmi[0])
        _write(root / "sys" / "class" / "dmi" / "id" / "product_name", dmi[1])
    for node, cpus in (numa or {0: "0-3"}).items():
        _write(root / "sys" / "devices" / "system" / "node" / f"node{node}" / "cpulist", cpus)
    return root
