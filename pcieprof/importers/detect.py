"""The content tests of the machine logs (the other formats' tests live with their importers).

Every test reads the bounded head of the text (`_text.head_lines`: 256 kB, lines cut to 4 kB)
and uses only patterns that are linear in their input, so detection takes milliseconds on any
file, a single 200 kB line or an XML document with a DOCTYPE included. The order they are tried
in is pcieprof.importers.formats.FORMATS.
"""

from __future__ import annotations

import re

from pcieprof.discover.lspci_tree import looks_like_lspci_tree
from pcieprof.discover.topo_matrix import find_matrix
from pcieprof.importers._text import head_lines


def is_topo_m(text: str) -> bool:
    lines = head_lines(text)
    return find_matrix(lines) is not None


def is_smi_q(text: str) -> bool:
    for line in head_lines(text)[:200]:
        if "NVSMI LOG" in line or re.match(r"Attached GPUs\s*:", line):
            return True
    return False


# A device header; a paste may indent the whole output a little (a list item, a quoted mail).
_LSPCI_DEV = re.compile(r"^ {0,4}(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] \S")
# A device's first indented lines; pasted output often has spaces where lspci prints tabs.
_LSPCI_FIELD = re.compile(r"^\s+(?:Subsystem|Physical Slot|Control|Flags|Status|Latency|NUMA node"
                          r"|IOMMU group|Kernel driver in use|Capabilities):")


def is_lspci(text: str) -> bool:
    lines = head_lines(text)
    devs = sum(1 for l in lines[:5000] if _LSPCI_DEV.match(l))
    return devs >= 1 and any(_LSPCI_FIELD.match(l) for l in lines[:200])


def is_lspci_tree(text: str) -> bool:
    return looks_like_lspci_tree(head_lines(text))


def is_cmdline(text: str) -> bool:
    lines = [l for l in head_lines(text)[:4] if l.strip()]
    return (len(lines) == 1 and ("BOOT_IMAGE=" in lines[0] or re.search(r"(^|\s)root=", lines[0])
                                 is not None) and not lines[0].startswith("["))


def is_numactl(text: str) -> bool:
    return any(re.match(r"available: \d+ nodes", l) for l in head_lines(text)[:50])


def is_lscpu(text: str) -> bool:
    lines = head_lines(text)[:100]
    return (any(re.match(r"Architecture:\s+\S", l) for l in lines)
            and any(l.startswith("CPU(s):") for l in lines))


# The kernel log as the tools print it: `dmesg` ("[    4.507087] "), `dmesg -T`
# ("[Sat Oct 16 18:15:30 2021] "), `journalctl -k` ("Jul 19 23:11:56 host kernel: ").
_KERNEL_LOG_LINE = re.compile(
    r"\[\s*\d+\.\d+\] "
    r"|\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] "
    r"|[A-Z][a-z]{2,8} [ \d]?\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ kernel: ")


def is_dmesg(text: str) -> bool:
    lines = [l for l in head_lines(text)[:200] if l.strip()]
    stamped = sum(1 for l in lines if _KERNEL_LOG_LINE.match(l))
    return bool(lines) and stamped >= max(1, len(lines) // 2)
