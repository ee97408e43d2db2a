"""Parser of `lspci -vvv` text (with or without `-nn`, `-D`; `-v` too): one PciDevice per function.

What it reads per device: the header (address, class, vendor, device), `NUMA node`,
`IOMMU group`, the bridge bus range (`Bus: primary=, secondary=, subordinate=`), the PCIe port
type from the Express capability, `LnkCap`/`LnkSta` speed and width, the `ACSCap`/`ACSCtl` bits
and the kernel driver. Parents come from the bus ranges: a device on bus B hangs below the bridge
whose secondary bus is B.
"""

from __future__ import annotations

import quopri
import re
import shutil
import subprocess

from pcieprof.discover.pci import ACS_BITS, CLASS_CODES, VENDOR_IDS, PciDevice, bus_of, normalize_bdf
from pcieprof.errors import BadInput

_HEADER = re.compile(
    r"^(?P<bdf>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<cls>[^:\[]+?)(?:\s+\[(?P<code>[0-9a-fA-F]{4})\])?:\s*(?P<rest>.*)$"
)
_IDS = re.compile(r"\[(?P<v>[0-9a-fA-F]{4}):(?P<d>[0-9a-fA-F]{4})\]")
_TRAILER = re.compile(r"\s*\((?:rev [0-9a-fA-F]+|prog-if [^)]*\]?)\)\s*")
_DEVICE_HEX = re.compile(r"\bDevice ([0-9a-fA-F]{4})\b")
_SPEED = re.compile(r"Speed\s+([\d.]+)GT/s")
_WIDTH = re.compile(r"Width\s+x(\d+)")
_BUS = re.compile(r"primary=([0-9a-fA-F]+),\s*secondary=([0-9a-fA-F]+),\s*subordinate=([0-9a-fA-F]+)")
_ACS = re.compile(r"(\w+)([+-])")
# A shell prompt pasted with the output: "$ lspci -vvv", "[root@host ~]# lspci -v",
# "user@host:~$" (tests/data/host_logs).
_PROMPT = re.compile(r"^(?:\S*@\S*?[$#]|\[[^\]]*\][$#]|[$#])")
# `lspci -v` (one v) puts NUMA node and IOMMU group in its Flags line.
_FLAG_NUMA = re.compile(r"\bNUMA node (-?\d+)")
_FLAG_GROUP = re.compile(r"\bIOMMU group (\d+)")

# "Express (v2) Root Port (Slot+), MSI 00" -> port type; longest names first.
_PORT_TYPES: tuple[tuple[str, str], ...] = (
    ("Root Complex Integrated Endpoint", "rc_endpoint"),
    ("Root Complex Event Collector", "rc_event_collector"),
    ("PCI-Express to PCI/PCI-X Bridge", "pcie_to_pci"),
    ("PCI/PCI-X to PCI-Express Bridge", "pci_to_pcie"),
    ("Legacy Endpoint", "legacy_endpoint"),
    ("Root Port", "root_port"),
    ("Upstream Port", "upstream"),
    ("Downstream Port", "downstream"),
    ("Endpoint", "endpoint"),
)


def _split_vendor(rest: str) -> tuple[str | None, str | None, str]:
    """(vendor name, device name, vendor id) from the header text after the class."""
    for name, vid in sorted(VENDOR_IDS.items(), key=lambda kv: -len(kv[0])):
        if rest.startswith(name + " ") or rest == name:
            return name, rest[len(name):].strip() or None, vid
    return None, rest or None, ""


def _parse_header(m: re.Match[str]) -> PciDevice:
    rest = m.group("rest")
    ids = _IDS.search(rest)
    text = _IDS.sub("", rest)
    text = _TRAILER.sub(" ", text).strip()
    text = re.sub(r"\s{2,}", " ", text)
    vendor, device, vid = _split_vendor(text)
    cls = m.group("cls").strip()
    code = int(m.group("code"), 16) if m.group("code") else CLASS_CODES.get(cls)
    dev = PciDevice(bdf=normalize_bdf(m.group("bdf")), class_code=code, class_name=cls,
                    vendor=vendor, device=device, description=f"{cls}: {text}")
    if ids:
        dev.vendor_id, dev.device_id = ids.group("v").lower(), ids.group("d").lower()
    else:
        dev.vendor_id = vid or None
        hexm = _DEVICE_HEX.search(device or "")
        dev.device_id = hexm.group(1).lower() if hexm else None
    return dev


def _acs_bits(text: str, where: str) -> dict[str, bool]:
    bits = {name: sign == "+" for name, sign in _ACS.findall(text)}
    missing = [b for b in ACS_BITS if b not in bits]
    if missing:
        raise BadInput(f"{where}: ACS line lacks {', '.join(missing)}",
                       hint="expected 'ACSCtl: SrcValid+ TransBlk- ...' as lspci -vvv prints it")
    return {b: bits[b] for b in ACS_BITS}


_QP_SOFT_BREAK = re.compile(r"=\r?\n")
# Shortest line a terminal or a mailer wraps (mail wraps at 72-78 columns, terminals at 80).
_WRAP_WIDTH = 60


def _unwrapped(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the output as lspci printed it, undoing what pasting did to it.

    - Mail sent quoted-printable (a raw linux-pci message: `=3D` for `=`, a line ending in `=`
      continued on the next) is decoded first; line numbers are then those of the decoded text.
    - A paste indented as a whole (a Markdown list item, a quoted mail) loses the indentation
      of its first device header.
    - Output pasted from a terminal or sent by mail arrives wrapped: the rest of a long line
      starts at column 0 ("Packet Switch (rev 01) ...", "EgressCtrl- DirectTrans-"). Such a line
      is no device header, follows a long line and is appended to it as it is: a mailer keeps
      the space it broke at on the first part, a terminal breaks mid-word, so plain
      concatenation restores both (tests/data/host_logs, the Pericom switch mail).
    """
    if _QP_SOFT_BREAK.search(text) or "=3D" in text:  # lspci itself never prints either
        text = quopri.decodestring(text.encode()).decode("utf-8", errors="replace")
    lines = text.splitlines()
    margin = next((len(l) - len(l.lstrip()) for l in lines if l[:1].isspace()
                   and _HEADER.match(l.strip())), 0)
    out: list[tuple[int, str]] = []
    for lineno, raw in enumerate(lines, 1):
        if margin and raw[:margin].isspace():
            raw = raw[margin:]
        if (out and raw and not raw[0].isspace() and len(out[-1][1]) >= _WRAP_WIDTH
                and out[-1][1].strip() and not _HEADER.match(raw.rstrip())
                and not _PROMPT.match(raw)):
            out[-1] = (out[-1][0], out[-1][1] + raw)
        else:
            out.append((lineno, raw))
    return out


def parse_lspci(text: str, *, source: str = "lspci -vvv") -> list[PciDevice]:
    """Parse `lspci -vvv` output.

    Args:
        text: the whole output.
        source: file name (or command) for error messages.

    Returns:
        The devices in output order, with `parent` set from the bridges' bus ranges.

    Raises:
        BadInput: when the text holds no device or a line cannot be read, naming source and line.
    """
    devices: list[PciDevice] = []
    cur: PciDevice | None = None
    lines = _unwrapped(text)
    has_header = any(_HEADER.match(raw.rstrip()) for _, raw in lines)
    for lineno, raw in lines:
        line = raw.rstrip()
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        if not raw[0].isspace():
            m = _HEADER.match(line)
            if m:
                cur = _parse_header(m)
                devices.append(cur)
                continue
            if (line.startswith(("lspci:", "pcilib:", "Warning", "WARNING")) or _PROMPT.match(line)
                    or line.strip() in ("...", "…")):
                # lspci's own warnings (e.g. "Unable to load libkmod resources"), the prompt of a
                # paste, or the "..." with which its poster left devices out
                continue
            raise BadInput(f"{where}: expected an lspci device header like "
                           f"'06:00.0 3D controller: ...', got {line[:60]!r}",
                           hint="pass the output of `lspci -vvv`")
        if cur is None:
            if has_header:
                continue  # a paste that begins inside a device: its owner is not known
            raise BadInput(f"{where}: indented line before any device header",
                           hint="pass the output of `lspci -vvv`")
        s = line.strip()
        key, _, value = s.partition(":")
        value = value.strip()
        if key == "NUMA node":
            cur.numa_node = int(value) if value.lstrip("-").isdigit() else None
        elif key == "IOMMU group":
            cur.iommu_group = int(value) if value.isdigit() else None
        elif key == "Flags" and (value.startswith(("bus master", "fast devsel", "medium devsel",
                                                   "slow devsel", "66MHz"))):
            if fm := _FLAG_NUMA.search(value):
                cur.numa_node = int(fm.group(1)) if int(fm.group(1)) >= 0 else None
            if fm := _FLAG_GROUP.search(value):
                cur.iommu_group = int(fm.group(1))
        elif key == "Bus" and "secondary=" in value:
            bm = _BUS.search(value)
            if not bm:
                raise BadInput(f"{where}: cannot read the bus range {value!r}",
                               hint="expected 'Bus: primary=00, secondary=01, subordinate=08'")
            cur.secondary_bus, cur.subordinate_bus = int(bm.group(2), 16), int(bm.group(3), 16)
        elif key.startswith("Capabilities") and "Express" in value:
            for name, kind in _PORT_TYPES:
                if name in value:
                    cur.port_type = kind
                    break
        elif key == "LnkCap":
            sm, wm = _SPEED.search(value), _WIDTH.search(value)
            cur.cap_speed_gts = float(sm.group(1)) if sm else None
            cur.cap_width = int(wm.group(1)) if wm else None
        elif key == "LnkSta":
            sm, wm = _SPEED.search(value), _WIDTH.search(value)
            cur.speed_gts = float(sm.group(1)) if sm else None
            cur.width = int(wm.group(1)) if wm else None
            cur.downgraded = "downgraded" in value
        elif key == "ACSCap":
            cur.acs_cap = _acs_bits(value, where)
        elif key == "ACSCtl":
            cur.acs_ctl = _acs_bits(value, where)
        elif key == "Kernel driver in use":
            cur.driver = value or None
    if not devices:
        raise BadInput(f"{source}: no PCI device found",
                       hint="pass the output of `lspci -vvv` (one header line per device)")
    assign_parents(devices)
    return devices


def assign_parents(devices: list[PciDevice]) -> None:
    """Set `parent` of every device from the bridges' secondary bus numbers (in place).

    Devices whose parent is already known (sysfs) are left alone; a device on a bus that no bridge
    leads to sits on a root bus and keeps parent None.
    """
    behind: dict[tuple[int, int], str] = {}
    for d in devices:
        if d.secondary_bus is not None:
            behind[(bus_of(d.bdf)[0], d.secondary_bus)] = d.bdf
    for d in devices:
        if d.parent is None:
            p = behind.get(bus_of(d.bdf))
            d.parent = p if p != d.bdf else None


def run_lspci(timeout_s: float = 20.0) -> tuple[str | None, str]:
    """Run `lspci -vvv -D` on this machine.

    Returns:
        (output text or None, status): "ok", "not_supported" (no lspci) or "error: <why>".
    """
    exe = shutil.which("lspci")
    if not exe:
        return None, "not_supported"
    try:
        p = subprocess.run([exe, "-vvv", "-D"], capture_output=True, text=True, timeout=timeout_s,
                           check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"error: {e}"
    if p.returncode != 0 or not p.stdout.strip():
        return None, f"error: lspci exited {p.returncode}: {p.stderr.strip()[:200]}"
    return p.stdout, "ok"
