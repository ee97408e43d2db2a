"""Machine state around the PCIe tree: IOMMU, hypervisor, NUMA nodes.

Each reader takes a `root` (the filesystem to read, "/" live; None to read nothing) and optional
texts of the same facts from logs (`/proc/cmdline`, `dmesg`, `lscpu`, `numactl -H`), so one code
path serves discovery and the import of another machine's logs. The result objects are those of
topology.json: every conclusion carries the evidence lines it came from.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_VM_DMI = (  # sys_vendor / product_name substrings that name a hypervisor's virtual hardware
    ("QEMU", "QEMU/KVM"), ("KVM", "KVM"), ("VMware", "VMware"), ("VirtualBox", "VirtualBox"),
    ("innotek", "VirtualBox"), ("Xen", "Xen"), ("Amazon EC2", "AWS Nitro (KVM)"),
    ("Google Compute Engine", "Google (KVM)"), ("OpenStack", "OpenStack (KVM)"),
    ("Virtual Machine", "Hyper-V"), ("Parallels", "Parallels"), ("Nutanix", "Nutanix AHV"),
    ("Bochs", "QEMU/KVM"), ("Cloud Hypervisor", "Cloud Hypervisor"), ("Firecracker", "Firecracker"),
)


def _read(root: Path | None, rel: str) -> str | None:
    if root is None:
        return None
    try:
        return (root / rel).read_text(errors="replace").strip()
    except OSError:
        return None


def _listdir(root: Path | None, rel: str) -> list[str] | None:
    if root is None:
        return None
    try:
        return sorted(os.listdir(root / rel))
    except OSError:
        return None


def cmdline_params(cmdline: str) -> dict[str, str]:
    """Kernel command line -> {param: value} ("" for flags); later occurrences win, as in Linux.
    Stops at a bare `--` (what follows goes to init)."""
    out: dict[str, str] = {}
    for tok in cmdline.split():
        if tok == "--":
            break
        k, _, v = tok.partition("=")
        out[k] = v
    return out


def _acs_params(params: dict[str, str]) -> list[str]:
    """Evidence lines for the kernel parameters that change what ACS means on this host.

    `pcie_acs_override=` is the out-of-tree ACS override patch (Proxmox, Zen and CachyOS kernels
    carry it; lf-edge/eve#790 quotes its commit message): the kernel treats the named ports as if
    they isolated their devices, so IOMMU groups are split, while the ports' ACSCtl bits (and so the
    path peer traffic takes) stay as lspci shows them. `pci=disable_acs_redir=` and
    `pci=config_acs=` (NVIDIA/NV-Kernels#20 "PCI: Extend ACS configurability") do change the bits
    at boot.
    """
    out = []
    if "pcie_acs_override" in params:
        out.append(f"cmdline: pcie_acs_override={params['pcie_acs_override']} (IOMMU groups split "
                   "by the ACS override patch, not by ACS: a group no longer proves isolation; "
                   "ACSCtl bits unchanged)")
    pci = params.get("pci", "")
    for opt in ("disable_acs_redir", "config_acs"):
        if f"{opt}=" in pci:
            out.append(f"cmdline: pci={pci} (the kernel rewrites ACS bits at boot: {opt})")
    return out


def iommu_state(root: str | Path | None = "/", *, cmdline: str | None = None,
                dmesg: str | None = None) -> dict[str, Any]:
    """IOMMU on or off, and its mode, with evidence.

    Precedence: IOMMU units registered in /sys/class/iommu (or IOMMU groups) mean enabled;
    `iommu=off`, `amd_iommu=off`, `intel_iommu=off` on the command line mean off; `iommu=pt` or
    `iommu.passthrough=1` (or dmesg "Default domain type: Passthrough") mean passthrough. dmesg's
    "Default domain type: Translated" alone is not proof: the kernel prints that policy even when
    the IOMMU driver is off (the ASUS server's dmesg shows it with `amd_iommu=off iommu=off`).

    Args:
        root: filesystem to read /proc/cmdline and /sys from; None reads nothing.
        cmdline, dmesg: texts from logs (used in place of / beside the live files).

    Returns:
        {"enabled", "mode" (translated|passthrough|off|unknown), "cmdline", "groups"
         ({bdf: group} filled by the caller), "evidence": [str]}.
    """
    r = Path(root) if root is not None else None
    evidence: list[str] = []
    if cmdline is None:
        cmdline = _read(r, "proc/cmdline")
    if cmdline is None and dmesg:
        # The kernel prints its command line at boot: a dmesg without a /proc/cmdline log has it.
        if m := re.search(r"Kernel command line: (.*)$", dmesg, re.M):
            cmdline = m.group(1)
            evidence.append("cmdline: from dmesg 'Kernel command line:'")
    cmdline = cmdline.strip() if cmdline is not None else None
    params = cmdline_params(cmdline or "")
    units = _listdir(r, "sys/class/iommu")
    groups = _listdir(r, "sys/kernel/iommu_groups")
    dm_default = dm_init = dm_irq_only = None
    for line in (dmesg or "").splitlines():
        if m := re.search(r"iommu: Default domain type: (\w+)", line):
            dm_default = m.group(1)
            evidence.append(f"dmesg: {line.strip()}")
        elif re.search(r"AMD-Vi: (Found IOMMU|Interrupt remapping enabled|IOMMU performance)"
                       r"|DMAR: IOMMU enabled|DMAR: Intel-IOMMU force enabled"
                       r"|Intel\(R\) Virtualization Technology "
                       r"for Directed I/O|iommu: Adding device|: Adding to iommu group \d", line):
            # "Adding to iommu group" (kernels since 5.x, one line per device) means an IOMMU
            # driver made groups; older kernels print "iommu: Adding device ... to group".
            dm_init = line.strip()
        elif "DMAR-IR: Enabled" in line:
            # Intel interrupt remapping works without DMA remapping (it is on with the IOMMU
            # off: a Proxmox host whose cmdline has no intel_iommu, tests/data/host_logs).
            dm_irq_only = line.strip()
    if dm_init:
        evidence.append(f"dmesg: {dm_init}")
    elif dm_irq_only:
        evidence.append(f"dmesg: {dm_irq_only} (interrupt remapping only: not proof of DMA "
                        "remapping)")

    off_by = [f"{k}={params[k]}" for k in ("iommu", "amd_iommu", "intel_iommu")
              if params.get(k) == "off"]
    pt = params.get("iommu") == "pt" or params.get("iommu.passthrough") in ("1", "y", "on")
    strict_translated = (params.get("iommu.passthrough") in ("0", "n", "off")
                         or params.get("iommu") == "nopt")
    for k in ("iommu", "amd_iommu", "intel_iommu", "iommu.passthrough", "iommu.strict"):
        if k in params:
            evidence.append(f"cmdline: {k}={params[k]}")
    evidence.extend(_acs_params(params))

    enabled: bool | None
    if units:
        evidence.append(f"/sys/class/iommu: {', '.join(units)}")
    if groups:
        evidence.append(f"/sys/kernel/iommu_groups: {len(groups)} groups")
    if units or groups:
        enabled = True
    elif off_by:
        enabled = False
    elif units is not None and groups is not None:
        enabled = False
        evidence.append("/sys/class/iommu and /sys/kernel/iommu_groups are empty")
    elif dm_init:
        enabled = True
    else:
        enabled = None

    if enabled is False:
        mode = "off"
        if dm_default == "Translated":
            why = f" ({', '.join(off_by)})" if off_by else ""
            evidence.append("the dmesg default domain type is the policy only: no IOMMU unit "
                            f"is active{why}")
    elif enabled is True:
        if pt or dm_default == "Passthrough":
            mode = "passthrough"
        elif strict_translated or dm_default == "Translated" or units or groups:
            mode = "translated"
        else:
            mode = "unknown"
    else:
        mode = "unknown"
    return {"enabled": enabled, "mode": mode, "cmdline": cmdline, "groups": {},
            "evidence": evidence}


def hypervisor_state(root: str | Path | None = "/", *, lscpu: str | None = None,
                     dmesg: str | None = None) -> dict[str, Any]:
    """Whether this is a VM and which hypervisor, with evidence.

    Sources: the `hypervisor` CPU flag (/proc/cpuinfo or lscpu "Flags"), lscpu "Hypervisor
    vendor", /sys/hypervisor/type, DMI sys_vendor/product_name, dmesg "Hypervisor detected" and
    its "DMI:" line.

    Returns:
        {"is_vm": bool | None (None: nothing to judge by), "hypervisor": str | None,
         "evidence": [str]}; the caller adds `flat_pcie_tree`.
    """
    r = Path(root) if root is not None else None
    evidence: list[str] = []
    hyper: str | None = None
    vm_signs = 0
    judged = False

    flags: set[str] | None = None
    cpuinfo = _read(r, "proc/cpuinfo")
    if cpuinfo:
        m = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)
        flags = set(m.group(1).split()) if m else None
    flags_text: str | None = None
    flags_col = 0
    for line in (lscpu or "").splitlines():
        if flags_text is not None and flags_col and len(line) > flags_col \
                and line[:flags_col].isspace():
            # lscpu in a terminal wraps the Flags value at the screen width, mid-word, and goes
            # on under its column ("... pge m" / "ca cmov ..."): the rest of the same value
            flags_text += line[flags_col:]
            continue
        flags_col = 0
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "Flags" and flags is None and flags_text is None:
            flags_text = value
            flags_col = len(line) - len(line.partition(":")[2].lstrip())
        elif key == "Hypervisor vendor" and value:
            hyper = value
            vm_signs += 1
            evidence.append(f"lscpu: Hypervisor vendor: {value}")
    if flags is None and flags_text is not None:
        flags = set(flags_text.split())
    if flags is not None:
        judged = True
        if "hypervisor" in flags:
            vm_signs += 1
            evidence.append("cpu flag: hypervisor")
        else:
            evidence.append("cpu flags: no 'hypervisor' flag")

    hv_type = _read(r, "sys/hypervisor/type")
    if hv_type:
        vm_signs += 1
        hyper = hyper or hv_type
        evidence.append(f"/sys/hypervisor/type: {hv_type}")
    dmi = " / ".join(filter(None, (_read(r, "sys/class/dmi/id/sys_vendor"),
                                   _read(r, "sys/class/dmi/id/product_name"))))
    if dmi:
        evidence.append(f"DMI: {dmi}")
    for line in (dmesg or "").splitlines():
        if m := re.search(r"Hypervisor detected: (.+)$", line):
            vm_signs += 1
            hyper = hyper or m.group(1).strip()
            evidence.append(f"dmesg: {line.strip()}")
        elif m := re.search(r"\] DMI: (.+)$", line):
            if not dmi:
                dmi = m.group(1).strip()
                evidence.append(f"dmesg: DMI: {dmi}")
    if dmi:
        judged = True
        for needle, name in _VM_DMI:
            if needle.lower() in dmi.lower():
                vm_signs += 1
                hyper = hyper or name
                break
    is_vm = True if vm_signs else (False if judged else None)
    return {"is_vm": is_vm, "hypervisor": hyper, "evidence": evidence}


def _compress(cpus: list[int]) -> str:
    out, start, prev = [], None, None
    for c in sorted(cpus) + [None]:
        if c is not None and prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = c
    return ",".join(out)


def _numactl_cpus(text: str) -> list[int]:
    """CPU ids of a `numactl -H` "node N cpus:" line: "0 1 2 3", or with --cpu-compress
    "0-15 (16)" (ranges, then the count in parentheses, which is skipped)."""
    cpus: list[int] = []
    for tok in text.split():
        if re.fullmatch(r"\(\d+\)", tok):
            continue
        for part in tok.split(","):
            if m := re.fullmatch(r"(\d+)-(\d+)", part):
                cpus.extend(range(int(m.group(1)), int(m.group(2)) + 1))
            elif part.isdigit():
                cpus.append(int(part))
    return cpus


def numa_nodes(root: str | Path | None = "/", *, numa: str | None = None,
               lscpu: str | None = None) -> dict[str, Any]:
    """NUMA nodes and their CPUs from /sys/devices/system/node, `numactl -H` text or lscpu.

    Returns:
        {"nodes": [{"id": int, "cpus": "0-63,128-191"}], "status": "ok" | "unknown"}.
    """
    r = Path(root) if root is not None else None
    nodes: dict[int, str] = {}
    for name in _listdir(r, "sys/devices/system/node") or []:
        if m := re.match(r"^node(\d+)$", name):
            cpus = _read(r, f"sys/devices/system/node/{name}/cpulist")
            nodes[int(m.group(1))] = cpus or ""
    if not nodes and numa:
        for line in numa.splitlines():
            if m := re.match(r"^node (\d+) cpus:\s*(.*)$", line.strip()):
                nodes[int(m.group(1))] = _compress(_numactl_cpus(m.group(2)))
    if not nodes and lscpu:
        for line in lscpu.splitlines():
            if m := re.match(r"^\s*NUMA node(\d+) CPU\(s\):\s*(\S*)", line):
                nodes[int(m.group(1))] = m.group(2)
    return {"nodes": [{"id": i, "cpus": c} for i, c in sorted(nodes.items())],
            "status": "ok" if nodes else "unknown"}
