"""Reader of a live machine's PCI devices from sysfs (`/sys/bus/pci/devices/*`).

Produces the same PciDevice records as the lspci parser. The parent of a device is the previous
PCI address in the path its sysfs link points to (`/sys/devices/pci0000:00/0000:00:01.1/
0000:01:00.0`). PCIe port type, link capability and ACS bits come from the config space file
when it is readable in full (root); otherwise they stay None and the tree builder infers kinds.
Every function takes a `root` ("/" on a live machine) so tests run on sysfs trees they build.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pcieprof.discover.pci import ACS_BITS, GEN_SPEED_GTS, VENDOR_IDS, PciDevice, normalize_bdf

_BDF_NAME = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SPEED = re.compile(r"([\d.]+)\s*GT/s")
_VENDOR_NAMES = {v: k for k, v in VENDOR_IDS.items()}

# PCIe capability "Device/Port Type" field (PCIe base spec, PCI Express Capabilities register
# bits 7:4) -> our port_type names.
PORT_TYPES = {0: "endpoint", 1: "legacy_endpoint", 4: "root_port", 5: "upstream",
              6: "downstream", 7: "pcie_to_pci", 8: "pci_to_pcie", 9: "rc_endpoint",
              10: "rc_event_collector"}
CAP_ID_EXPRESS = 0x10
EXT_CAP_ID_ACS = 0x000D


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _link_target_name(path: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _speed(text: str | None) -> float | None:
    m = _SPEED.search(text or "")
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _u16(cfg: bytes, off: int) -> int:
    return int.from_bytes(cfg[off:off + 2], "little")


def _u32(cfg: bytes, off: int) -> int:
    return int.from_bytes(cfg[off:off + 4], "little")


def parse_config(cfg: bytes, dev: PciDevice) -> None:
    """Fill port type, LnkCap/LnkSta, bus range and ACS bits from config space bytes (in place).

    Only the first 64 bytes are readable without root; the Express capability lives in the first
    256 and ACS (an extended capability) beyond 256, so what is missing stays None.
    """
    if len(cfg) < 64:
        return
    if (cfg[0x0E] & 0x7F) == 1:  # type 1 header: a bridge
        dev.secondary_bus, dev.subordinate_bus = cfg[0x19], cfg[0x1A]
    if len(cfg) < 256 or not (_u16(cfg, 0x06) & 0x10):  # no capability list
        return
    ptr, seen = cfg[0x34] & 0xFC, set()
    while ptr and ptr not in seen and ptr + 0x14 <= 256:
        seen.add(ptr)
        if cfg[ptr] == CAP_ID_EXPRESS:
            dev.port_type = PORT_TYPES.get((_u16(cfg, ptr + 2) >> 4) & 0xF)
            lnkcap, lnksta = _u32(cfg, ptr + 0x0C), _u16(cfg, ptr + 0x12)
            dev.cap_speed_gts = GEN_SPEED_GTS.get(lnkcap & 0xF)
            dev.cap_width = (lnkcap >> 4) & 0x3F or None
            dev.speed_gts = dev.speed_gts or GEN_SPEED_GTS.get(lnksta & 0xF)
            dev.width = dev.width or ((lnksta >> 4) & 0x3F) or None
            break
        ptr = cfg[ptr + 1] & 0xFC
    off, seen = 0x100, set()
    while off and off not in seen and off + 8 <= len(cfg):
        seen.add(off)
        header = _u32(cfg, off)
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == EXT_CAP_ID_ACS:
            cap, ctl = _u16(cfg, off + 4), _u16(cfg, off + 6)
            dev.acs_cap = {b: bool(cap >> i & 1) for i, b in enumerate(ACS_BITS)}
            dev.acs_ctl = {b: bool(ctl >> i & 1) for i, b in enumerate(ACS_BITS)}
            break
        off = header >> 20


def read_sysfs_pci(root: str | Path = "/") -> tuple[list[PciDevice], str]:
    """PCI devices of the machine whose filesystem is at `root`.

    Returns:
        (devices in address order, status): "ok", "not_supported" (no /sys/bus/pci: not Linux,
        or a container without sysfs) or "error: <why>".
    """
    base = Path(root) / "sys" / "bus" / "pci" / "devices"
    try:
        names = sorted(n for n in os.listdir(base) if _BDF_NAME.match(n))
    except FileNotFoundError:
        return [], "not_supported"
    except OSError as e:
        return [], f"error: {e}"
    devices = []
    for name in names:
        link = base / name
        d = PciDevice(bdf=normalize_bdf(name))
        try:
            target = os.path.normpath(os.path.join(base, os.readlink(link)))
        except OSError:
            target = str(link)
        ups = [p for p in Path(target).parts[:-1] if _BDF_NAME.match(p)]
        d.parent = ups[-1] if ups else None
        cls = _int(_read(link / "class"))
        d.class_code = cls >> 8 if cls is not None else None
        vendor, device = _read(link / "vendor"), _read(link / "device")
        d.vendor_id = vendor[2:].lower() if vendor and vendor.startswith("0x") else vendor
        d.device_id = device[2:].lower() if device and device.startswith("0x") else device
        d.vendor = _VENDOR_NAMES.get(d.vendor_id or "")
        d.description = f"class {cls:06x} [{d.vendor_id}:{d.device_id}]" if cls is not None else ""
        d.speed_gts = _speed(_read(link / "current_link_speed"))
        d.width = _int(_read(link / "current_link_width")) or None
        d.cap_speed_gts = _speed(_read(link / "max_link_speed"))
        d.cap_width = _int(_read(link / "max_link_width")) or None
        numa = _int(_read(link / "numa_node"))
        d.numa_node = numa if numa is not None and numa >= 0 else None
        group = _link_target_name(link / "iommu_group")
        d.iommu_group = int(group) if group and group.isdigit() else None
        d.driver = _link_target_name(link / "driver")
        try:
            parse_config((link / "config").read_bytes(), d)
        except OSError:
            pass
        if d.port_type in ("root_port", "downstream", "pcie_to_pci"):
            # a downstream-facing port's own capability is not what limits the link; lspci
            # marks "(downgraded)" only on the upstream side, and so do we
            d.downgraded = False if d.speed_gts is not None else None
        elif d.speed_gts is not None and d.cap_speed_gts is not None:
            d.downgraded = d.speed_gts < d.cap_speed_gts
        devices.append(d)
    return devices, "ok"


def merge_lspci(sysfs_devices: list[PciDevice], lspci_devices: list[PciDevice]) -> None:
    """Fill what sysfs could not read (ACS, port type without root, names) from lspci (in place)."""
    by_bdf = {d.bdf: d for d in lspci_devices}
    for d in sysfs_devices:
        o = by_bdf.get(d.bdf)
        if o is None:
            continue
        for f in ("class_name", "vendor", "device", "port_type", "secondary_bus", "subordinate_bus",
                  "numa_node", "iommu_group", "driver", "speed_gts", "width", "cap_speed_gts",
                  "cap_width", "downgraded", "acs_cap", "acs_ctl"):
            if getattr(d, f) is None and getattr(o, f) is not None:
                setattr(d, f, getattr(o, f))
        if o.description:
            d.description = o.description
