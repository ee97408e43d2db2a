"""Parser of `lspci -t` tree text (`-tv` names the devices, `-tvnn` adds their ids): PciDevice
records with their parents, for the same tree builder as `lspci -vvv` (pcieprof.discover.pcie_tree).

What the tree view holds: every function's address, the bridge it hangs below (the bus it sits
on), each bridge's secondary/subordinate bus range and, with `-v`, the vendor and device names.
What it does not hold: the class code, the PCIe port type, NUMA node, link speed/width, ACS. So
bridges get the bridge class (their kind is inferred from the shape of the tree, marked
`kind_inferred`), and the class of other functions comes from their name: an NVIDIA function that
is not an audio, USB or NVSwitch function is taken for a GPU (pci.ids names NVIDIA GPUs by chip
and product, "GP102 [TITAN X]"), and is marked so in `extra["class_from"]`.

How lspci draws it (pciutils ls-tree.c): a bus opens with `[dddd:bb]` (a root bus) or `[bb]` /
`[bb-ss]` (a bridge's secondary..subordinate range); its one device follows after dashes, or its
devices hang from `+-` ... `\\-` branches, each continuation line carrying a `|` in the branch's
column. A device therefore belongs to the bus whose branch column sits two columns left of it.
"""

from __future__ import annotations

import re

from pcieprof.discover.lspci import assign_parents
from pcieprof.discover.pci import VENDOR_IDS, PciDevice
from pcieprof.errors import BadInput

# A bus opener: `[0000:00]` (root, with its domain), `[02-05]` or `[04]` (behind a bridge).
_BUS = re.compile(r"\[(?:(?P<dom>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2})"
                  r"(?:-(?P<sub>[0-9a-fA-F]{2}))?\]")
# A device `DD.F` after its connector (`+-`, `\-` or the dashes of a bus's only device).
_DEV = re.compile(r"(?<=-)(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])(?![0-9a-fA-F])")
# A tree line: drawing characters then a bus opener or a device; a line of `|` only continues.
_TREE_LINE = re.compile(r"^\s*[-+\\| ]*(?:-\[(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}"
                        r"|[+\\]-[0-9a-fA-F]{2}\.[0-7]|[+\\]-\.\.\.)")
_BARS_ONLY = re.compile(r"^[\s|]*$")
_IDS = re.compile(r"\s*\[(?P<v>[0-9a-fA-F]{4}):(?P<d>[0-9a-fA-F]{4})\]\s*$")
# NVIDIA functions that are not the GPU itself (pci.ids names them so).
_NOT_GPU = re.compile(r"audio|usb|ucsi|nvswitch|bridge", re.I)
_NETWORK = re.compile(r"ethernet|connectx|network|infiniband", re.I)
# A root bus line: `-[0000:00]-+-...` or `+-[0000:80]---...`; used to tell the tree from prose.
_ROOT = re.compile(r"-\[[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}\]-")

# A poster's note after a name (`... [B300 SXM6 AC]   # GPU0`); pci.ids names hold no ` #`.
_PASTE_COMMENT = re.compile(r"\s{2,}#.*$")

#: What the tree view lacks, for messages.
MISSING = "no NUMA node, PCIe link or ACS"


def looks_like_lspci_tree(lines: list[str]) -> bool:
    """True when the lines draw an `lspci -t` tree: a root bus `-[dddd:bb]-` and tree lines."""
    roots = sum(1 for l in lines[:5000] if _ROOT.search(l))
    tree = sum(1 for l in lines[:5000] if _TREE_LINE.match(l))
    return roots >= 1 and tree >= 2


def _classify(dev: PciDevice, name: str | None) -> None:
    """Vendor, ids and class of a non-bridge function from its `-v`/`-nn` name (in place)."""
    if not name:
        return
    ids = _IDS.search(name)
    if ids:
        dev.vendor_id, dev.device_id = ids.group("v").lower(), ids.group("d").lower()
        name = name[:ids.start()].rstrip()
    dev.description = name
    for vendor, vid in sorted(VENDOR_IDS.items(), key=lambda kv: -len(kv[0])):
        if name.startswith(vendor + " "):
            dev.vendor, dev.device = vendor, name[len(vendor):].strip() or None
            dev.vendor_id = dev.vendor_id or vid
            break
    else:
        dev.device = name
    if dev.secondary_bus is not None:
        return
    if dev.vendor_id == "10de" and not _NOT_GPU.search(name):
        dev.class_code, dev.class_name = 0x0302, "3D controller"
        dev.extra["class_from"] = "name (lspci -t prints no class)"
    elif _NETWORK.search(name):
        dev.class_code, dev.class_name = 0x0200, "Ethernet controller"
        dev.extra["class_from"] = "name (lspci -t prints no class)"


def parse_lspci_tree(text: str, *, source: str = "lspci -tv") -> list[PciDevice]:
    """Parse `lspci -t`/`-tv`/`-tvnn` output.

    Args:
        text: the whole output (a shell prompt or a title line before the tree is skipped, and
            so are the `...` rows and `   # notes` a poster used to leave devices out or to
            label them).
        source: file name (or command) for error messages.

    Returns:
        The devices in output order, `parent` set to the bridge each sits behind.

    Raises:
        BadInput: when a line inside the tree cannot be read or no device is found, naming source
            and line.
    """
    devices: list[PciDevice] = []
    branch: dict[int, tuple[int, int]] = {}  # column of a `+`/`\` branch -> (domain, bus)
    started = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not started:
            if not _ROOT.search(line):
                continue  # the prompt, or a title the poster put above the tree
            started = True
        if _BARS_ONLY.match(line) or line.lstrip(" |").startswith(("...", "…")):
            continue  # a continuation, or the poster's `...` where devices were left out
        if not _TREE_LINE.match(line):
            raise BadInput(f"{source}:{lineno}: expected a line of the lspci -t tree, got "
                           f"{line.strip()[:60]!r}", hint="pass the output of `lspci -tv`, whole")
        bus: tuple[int, int] | None = None
        bridge: PciDevice | None = None
        pos = 0
        while pos < len(line):
            bm = _BUS.match(line, pos) if line[pos] == "[" else None
            if bm:
                if bm.group("dom") is not None:
                    bus = (int(bm.group("dom"), 16), int(bm.group("bus"), 16))
                elif bridge is not None:
                    bridge.secondary_bus = int(bm.group("bus"), 16)
                    bridge.subordinate_bus = int(bm.group("sub") or bm.group("bus"), 16)
                    bus = (bus[0] if bus else 0, bridge.secondary_bus)
                else:
                    raise BadInput(f"{source}:{lineno}: a bus range {bm.group(0)} without the "
                                   "bridge before it", hint="pass the output of `lspci -tv`")
                pos = bm.end()
                continue
            if line.startswith(("+-", "\\-"), pos) and bus is not None:
                branch[pos] = bus
                pos += 2
                continue
            dm = _DEV.match(line, pos) if line[pos:pos + 1] not in "-+\\| " else None
            if dm:
                # after a branch, the bus that drew it; after dashes, the bus just opened
                here = (branch.get(pos - 2) if line[pos - 2:pos] in ("+-", "\\-") else None) or bus
                if here is None:
                    raise BadInput(f"{source}:{lineno}: device {dm.group(0)} below no bus",
                                   hint="pass the output of `lspci -tv`, whole")
                dom, b = here
                dev = PciDevice(bdf=f"{dom:04x}:{b:02x}:{dm.group('dev').lower()}.{dm.group('fn')}")
                devices.append(dev)
                bridge, bus = dev, here
                pos = dm.end()
                if _BUS.match(line, pos + 1) and line[pos:pos + 1] == "-":
                    dev.class_code, dev.class_name = 0x0604, "PCI bridge"
                    continue
                _classify(dev, _PASTE_COMMENT.sub("", line[pos:]).strip() or None)
                break  # a device that is no bridge ends the line (its name follows)
            if line.startswith("...", pos):
                break  # the poster's `+-...`: devices left out
            pos += 1
    if not devices:
        raise BadInput(f"{source}: no PCI device found in the lspci -t tree",
                       hint="pass the output of `lspci -tv`")
    for d in devices:
        if d.class_code == 0x0604:
            d.description = "PCI bridge"
    assign_parents(devices)
    return devices
