"""Which tool wrote a file: decided from its content, never from its name.

`detect(text)` tries the formats in FORMATS order; the order matters where one output can hold
another's lines (nccl-tests output often carries NCCL INFO lines, so it is tried before the NCCL
log; a `topo -m` paste may carry a `topo -p2p` matrix after it, so `topo -m` is tried first and
its importer reads both).

Every test reads the bounded head of the text (`_text.head_lines`: 256 kB, lines cut to 4 kB)
and uses only patterns that are linear in their input, so detection takes milliseconds on any
file, a single 200 kB line or an XML document with a DOCTYPE included.
"""

from __future__ import annotations

import re
from typing import Callable

from pcieprof.discover.topo_matrix import find_matrix
from pcieprof.importers import nccl_log, nccl_tests, nccl_xml, nvbandwidth
from pcieprof.importers import p2p_bandwidth_latency, simple_p2p, topo_p2p
from pcieprof.importers._text import head_lines


def _is_topo_m(text: str) -> bool:
    lines = head_lines(text)
    return find_matrix(lines) is not None


def _is_smi_q(text: str) -> bool:
    for line in head_lines(text)[:200]:
        if "NVSMI LOG" in line or re.match(r"Attached GPUs\s*:", line):
            return True
    return False


_LSPCI_DEV = re.compile(r"^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] \S")


def _is_lspci(text: str) -> bool:
    lines = head_lines(text)
    devs = sum(1 for l in lines[:5000] if _LSPCI_DEV.match(l))
    return devs >= 1 and any(l.startswith("\t") for l in lines[:200])


def _is_cmdline(text: str) -> bool:
    lines = [l for l in head_lines(text)[:4] if l.strip()]
    return (len(lines) == 1 and ("BOOT_IMAGE=" in lines[0] or re.search(r"(^|\s)root=", lines[0])
                                 is not None) and not lines[0].startswith("["))


def _is_numactl(text: str) -> bool:
    return any(re.match(r"available: \d+ nodes", l) for l in head_lines(text)[:50])


def _is_lscpu(text: str) -> bool:
    lines = head_lines(text)[:100]
    return (any(re.match(r"Architecture:\s+\S", l) for l in lines)
            and any(l.startswith("CPU(s):") for l in lines))


def _is_dmesg(text: str) -> bool:
    lines = [l for l in head_lines(text)[:200] if l.strip()]
    stamped = sum(1 for l in lines if re.match(r"\[\s*\d+\.\d+\] ", l))
    return bool(lines) and stamped >= max(1, len(lines) // 2)


#: format name -> (content test, what it is). Tried in this order.
FORMATS: dict[str, tuple[Callable[[str], bool], str]] = {
    "nccl-graph-xml": (nccl_xml.looks_like_graph, "NCCL graph XML (NCCL_GRAPH_FILE)"),
    "nccl-topo-xml": (nccl_xml.looks_like_topo, "NCCL topology XML (NCCL_TOPO_FILE)"),
    "nvbandwidth-json": (nvbandwidth.looks_like_json, "nvbandwidth -j"),
    "p2pBandwidthLatencyTest": (p2p_bandwidth_latency.looks_like,
                                "cuda-samples p2pBandwidthLatencyTest"),
    "simpleP2P": (simple_p2p.looks_like, "cuda-samples simpleP2P"),
    "nccl-tests": (nccl_tests.looks_like, "nccl-tests *_perf"),
    "nvbandwidth": (nvbandwidth.looks_like_text, "nvbandwidth"),
    "nvidia-smi-topo-m": (_is_topo_m, "nvidia-smi topo -m"),
    "nvidia-smi-topo-p2p": (topo_p2p.looks_like, "nvidia-smi topo -p2p"),
    "nvidia-smi-q": (_is_smi_q, "nvidia-smi -q"),
    "lspci": (_is_lspci, "lspci -vvv"),
    "nccl-log": (nccl_log.looks_like, "NCCL_DEBUG=INFO log"),
    "numactl": (_is_numactl, "numactl -H"),
    "lscpu": (_is_lscpu, "lscpu"),
    "cmdline": (_is_cmdline, "/proc/cmdline"),
    "dmesg": (_is_dmesg, "dmesg"),
}

#: Formats that describe the machine and go through the discovery parsers together.
MACHINE_LOGS = ("nvidia-smi-q", "lspci", "nvidia-smi-topo-m", "numactl", "lscpu", "cmdline",
                "dmesg")


def detect(text: str) -> str | None:
    """The format name of `text` (a key of FORMATS), or None when no importer knows it."""
    for fmt, (test, _what) in FORMATS.items():
        if test(text):
            return fmt
    return None
