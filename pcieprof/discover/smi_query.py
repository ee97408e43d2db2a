"""Parser of `nvidia-smi -q` text: per GPU the fields discovery needs, driver and CUDA versions.

`nvidia-smi -q` is an indented `Key : Value` tree (4 spaces per level); sections are lines
without a value and a key may carry a value and children at once ("HW Slowdown"). The parser flattens
each GPU's tree to `Section/Sub/Key -> value` and picks fields from it.
"""

from __future__ import annotations

import re
from typing import Any

from pcieprof.discover.pci import normalize_bdf
from pcieprof.errors import BadInput

_GPU_HEADER = re.compile(r"^(\s*)GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_MIB = re.compile(r"^(\d+)\s*MiB$")

#: `GPU Virtualization Mode / Virtualization Mode` strings -> topology.json names. nvidia-smi
#: prints the NVML mode (nvmlGpuVirtualizationMode_t) as text: "None" is in the ASUS log,
#: "Pass-Through" in a public `nvidia-smi -q -x` of a passthrough VM; the vGPU spellings
#: (VGPU, Host VGPU, Host VSGA) are an assumption, and anything else maps to "unknown".
SMI_VIRT_MODES: dict[str, str] = {
    "none": "bare_metal", "pass-through": "passthrough", "passthrough": "passthrough",
    "vgpu": "vgpu", "host vgpu": "host_vgpu", "host vsga": "host_vsga",
}


def _flatten(lines: list[tuple[int, str]], source: str) -> dict[str, str]:
    """Indented `Key : Value` lines -> {"A/B/Key": value}; first occurrence of a path wins."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key)
    for lineno, line in lines:
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        if " : " in body or body.endswith(" :"):
            key, _, value = body.partition(" :")
            key, value = key.strip(), value.strip()
        elif ":" in body and not body.startswith("GPU "):
            raise BadInput(f"{source}:{lineno}: expected 'Key : Value' or a section name, "
                           f"got {body[:60]!r}", hint="pass the output of `nvidia-smi -q`")
        else:
            key, value = body, None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([k for _, k in stack] + [key])
        if value is not None:
            out.setdefault(path, value)
        stack.append((indent, key))
    return out


#: Values that mean "no value". "Not Found" is the CUDA Version of a driver without a CUDA driver
#: (a vGPU host: tests/data/host_logs, the A16 log).
_NO_VALUE = ("N/A", "", "Unknown Error", "[N/A]", "Not Found")


def _none(v: str | None) -> str | None:
    return None if v is None or v in _NO_VALUE else v


def _int(v: str | None) -> int | None:
    v = _none(v)
    if v is None:
        return None
    m = re.match(r"^(\d+)x?$", v)
    return int(m.group(1)) if m else None


def _mib_bytes(v: str | None) -> int | None:
    v = _none(v)
    m = _MIB.match(v) if v else None
    return int(m.group(1)) * 1024 * 1024 if m else None


def _mig(f: dict[str, str], devices: int) -> dict[str, Any]:
    """MIG mode (`MIG Mode/Current`, `/Pending`: Enabled, Disabled; N/A on GPUs without MIG) and
    the number of `MIG Device` sections listed under the GPU."""
    return {"current": _none(f.get("MIG Mode/Current")),
            "pending": _none(f.get("MIG Mode/Pending")), "devices": devices}


def _gpu_record(index: int, bus_header: str, f: dict[str, str],
                mig_devices: int = 0) -> dict[str, Any]:
    link = "PCI/GPU Link Info"
    vmode_raw = _none(f.get("GPU Virtualization Mode/Virtualization Mode"))
    return {
        "index": index,
        "bus_id": normalize_bdf(f.get("PCI/Bus Id", bus_header)),
        "name": _none(f.get("Product Name")),
        "uuid": _none(f.get("GPU UUID")),
        "minor_number": _int(f.get("Minor Number")),
        "pci_device_id": _none(f.get("PCI/Device Id")),
        "pci_subsystem_id": _none(f.get("PCI/Sub System Id")),
        "pcie": {
            "gen_current": _int(f.get(f"{link}/PCIe Generation/Current")),
            "gen_max": _int(f.get(f"{link}/PCIe Generation/Max")),
            "gen_current_device": _int(f.get(f"{link}/PCIe Generation/Device Current")),
            "gen_max_device": _int(f.get(f"{link}/PCIe Generation/Device Max")),
            "gen_max_system": _int(f.get(f"{link}/PCIe Generation/Host Max")),
            "width_current": _int(f.get(f"{link}/Link Width/Current")),
            "width_max": _int(f.get(f"{link}/Link Width/Max")),
        },
        "bar1_bytes": _mib_bytes(f.get("BAR1 Memory Usage/Total")),
        "bar1_used_bytes": _mib_bytes(f.get("BAR1 Memory Usage/Used")),
        "memory_bytes": _mib_bytes(f.get("FB Memory Usage/Total")),
        "memory_used_bytes": _mib_bytes(f.get("FB Memory Usage/Used")),
        "memory_reserved_bytes": _mib_bytes(f.get("FB Memory Usage/Reserved")),
        "virtualization_mode": (SMI_VIRT_MODES.get(vmode_raw.lower(), "unknown")
                                if vmode_raw else None),
        "virtualization_mode_raw": vmode_raw,
        "mig": _mig(f, mig_devices),
    }


def parse_smi_query(text: str, *, source: str = "nvidia-smi -q") -> dict[str, Any]:
    """Parse `nvidia-smi -q` output.

    Args:
        text: the whole output.
        source: file name for error messages.

    Returns:
        {"driver_version", "cuda_version", "attached_gpus", "gpus": [record per GPU in output
        order, i.e. nvidia-smi index order]}; memory sizes in bytes (MiB in the text); per GPU
        "mig": {"current", "pending" (MIG mode as printed, None when N/A), "devices" (MIG Device
        sections listed)}.

    Raises:
        BadInput: when no GPU section is found or a line inside one is not `Key : Value`.
        Lines before the first GPU that are not `Key : Value` (the command that was run, text
        around a paste) are skipped, and a line back at the left margin after the GPUs (the
        next shell prompt) ends the output.
    """
    lines = text.splitlines()
    # Pasted output is often indented as a whole (a Markdown code block, a list item): the GPU
    # headers sit at the output's left margin, so their indentation is the paste's.
    margin = next((len(m.group(1)) for l in lines if (m := _GPU_HEADER.match(l))), 0)
    top: list[tuple[int, str]] = []
    sections: list[tuple[str, list[tuple[int, str]]]] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.strip().startswith("====="):
            continue
        if margin:
            line = line[margin:] if line[:margin].isspace() else line.lstrip()
        m = _GPU_HEADER.match(line)
        if m:
            sections.append((m.group(2), []))
        elif sections:
            if not line[0].isspace():
                break  # back at the margin after the GPUs: a shell prompt or prose ends the output
            sections[-1][1].append((lineno, line))
        elif " : " in line or line.rstrip().endswith(" :"):
            top.append((lineno, line))
        # else: before the first GPU, a line that is no `Key : Value` is the command that was
        # run (`$ nvidia-smi -q`, `user@host:~$ ...`) or text around the paste: not the output.
    if not sections:
        raise BadInput(f"{source}: no 'GPU 00000000:xx:00.0' section found",
                       hint="pass the output of `nvidia-smi -q`")
    head = _flatten(top, source)
    # every MIG device repeats the `MIG Device` section, which the flattened paths keep once
    gpus = [_gpu_record(i, bus, _flatten(lines, source),
                        sum(1 for _, l in lines if l.strip() == "MIG Device"))
            for i, (bus, lines) in enumerate(sections)]
    return {"driver_version": _none(head.get("Driver Version")),
            "cuda_version": _none(head.get("CUDA Version")),
            "attached_gpus": _int(head.get("Attached GPUs")),
            "gpus": gpus}
