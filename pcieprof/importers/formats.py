"""The formats `pcieprof import` knows: one registry, in the order their content tests are tried.

The order matters where one output can hold another's lines (nccl-tests output often carries NCCL
INFO lines, so it is tried before the NCCL log; a `topo -m` paste may carry a `topo -p2p` matrix
after it, so `topo -m` is tried first and its importer reads both). A new format is an importer
module with a `looks_like` test and a parser, and one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pcieprof.importers import detect as machine
from pcieprof.importers import (nccl_log, nccl_tests, nccl_xml, nvbandwidth, p2p_bandwidth_latency,
                                parse, simple_p2p, topo_p2p)
from pcieprof.importers._text import fail
from pcieprof.importers.records import Parsed


@dataclass(frozen=True)
class Format:
    """One importable format.

    Attributes:
        name: its key (`--format` and the import record say it).
        what: what it is, for messages (`nvidia-smi topo -m`).
        looks_like: the content test (bounded, linear).
        parse: text, file name -> Parsed (raises BadInput with one line).
        machine_log: True for the logs that describe the machine (discovery parsers).
    """

    name: str
    what: str
    looks_like: Callable[[str], bool]
    parse: Callable[[str, str], Parsed]
    machine_log: bool = False


def _machine(name: str, what: str, looks_like: Callable[[str], bool]) -> Format:
    return Format(name, what, looks_like, parse.machine_log(name, what), machine_log=True)


#: name -> format, in the order the content tests are tried.
FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("nccl-graph-xml", "NCCL graph XML (NCCL_GRAPH_FILE)", nccl_xml.looks_like_graph,
           parse.graph_xml_parsed),
    Format("nccl-topo-xml", "NCCL topology XML (NCCL_TOPO_FILE)", nccl_xml.looks_like_topo,
           parse.topo_xml_parsed),
    Format("nvbandwidth-json", "nvbandwidth -j", nvbandwidth.looks_like_json,
           nvbandwidth.parse_nvbandwidth_json),
    Format("p2pBandwidthLatencyTest", "cuda-samples p2pBandwidthLatencyTest",
           p2p_bandwidth_latency.looks_like, p2p_bandwidth_latency.parse_p2p_bandwidth_latency),
    Format("simpleP2P", "cuda-samples simpleP2P", simple_p2p.looks_like,
           simple_p2p.parse_simple_p2p),
    Format("nccl-tests", "nccl-tests *_perf", nccl_tests.looks_like, parse.nccl_tests_parsed),
    Format("nvbandwidth", "nvbandwidth", nvbandwidth.looks_like_text,
           nvbandwidth.parse_nvbandwidth_text),
    _machine("nvidia-smi-topo-m", "nvidia-smi topo -m", machine.is_topo_m),
    Format("nvidia-smi-topo-p2p", "nvidia-smi topo -p2p", topo_p2p.looks_like,
           topo_p2p.parse_topo_p2p),
    _machine("nvidia-smi-q", "nvidia-smi -q", machine.is_smi_q),
    _machine("lspci", "lspci -vvv", machine.is_lspci),
    _machine("lspci-tree", "lspci -tv (tree view)", machine.is_lspci_tree),
    Format("nccl-log", "NCCL_DEBUG=INFO log", nccl_log.looks_like, parse.nccl_log_parsed),
    _machine("numactl", "numactl -H", machine.is_numactl),
    _machine("lscpu", "lscpu", machine.is_lscpu),
    _machine("cmdline", "/proc/cmdline", machine.is_cmdline),
    _machine("dmesg", "dmesg", machine.is_dmesg),
)}

#: Formats that describe the machine and go through the discovery parsers together.
MACHINE_LOGS = tuple(f.name for f in FORMATS.values() if f.machine_log)


def detect(text: str) -> str | None:
    """The format name of `text` (a key of FORMATS), or None when no importer knows it."""
    return next((f.name for f in FORMATS.values() if f.looks_like(text)), None)


def parse_text(text: str, name: str, fmt: str | None = None) -> Parsed:
    """Detect the format of `text` (unless `fmt` is given) and parse it.

    Args:
        text: the file's content.
        name: the file name, for messages (and, for topo -p2p, the capability letter).
        fmt: force a format (a key of FORMATS).

    Returns:
        Parsed; NCCL logs and XML files carry their dict in `documents`.

    Raises:
        BadInput: an unknown format, or the parser's one-line error.
    """
    fmt = fmt or detect(text)
    if fmt is None:
        fail(name, None, "the output of one of: " + ", ".join(f.what for f in FORMATS.values()))
    if fmt not in FORMATS:
        fail(name, None, f"a format with an importer (got {fmt!r})")
    return FORMATS[fmt].parse(text, name)
