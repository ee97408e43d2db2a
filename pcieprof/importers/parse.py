"""The parsers that join an importer to its records (NCCL logs mixed into nccl-tests output,
the XML files, the machine logs through the discovery parsers); pcieprof.importers.formats
lists which parser each format takes."""

from __future__ import annotations

import re
from typing import Any, Callable

from pcieprof.discover.lspci import parse_lspci
from pcieprof.discover.lspci_tree import MISSING as TREE_MISSING
from pcieprof.discover.lspci_tree import parse_lspci_tree
from pcieprof.discover.smi_query import parse_smi_query
from pcieprof.discover.topo_matrix import PCIE_ONLY_VIEW, parse_topo_matrix
from pcieprof.errors import BadInput
from pcieprof.importers import detect as machine
from pcieprof.importers import nccl_log, nccl_tests, nccl_xml, nvbandwidth
from pcieprof.importers import topo_p2p
from pcieprof.importers._text import fail
from pcieprof.importers.records import GpuRecord, Parsed


def nccl_tests_parsed(text: str, name: str) -> Parsed:
    """nccl-tests output, with what NCCL chose when NCCL_DEBUG=INFO lines are mixed in, and the
    `nvidia-smi topo -m` matrix people paste with it (NVIDIA/nccl-tests issue #37)."""
    parsed = nccl_tests.parse_nccl_tests(text, name)
    if nccl_log.looks_like(text):
        choices = nccl_log.parse_nccl_log(text, name)
        parsed.documents["nccl_choices"] = choices
        parsed.summary += "; " + nccl_log.summarize(choices)
    if machine.is_topo_m(text):
        try:
            t = parse_topo_matrix(text, source=name)
        except BadInput as exc:
            parsed.facts.setdefault("warnings", []).append(
                f"{name}: the nvidia-smi topo -m matrix in it was not read ({exc})")
        else:
            parsed.documents["topo_m"] = t
            parsed.pair_levels = {(p["a"], p["b"]): p["level"] for p in t["pairs"]}
            levels = _level_counts(parsed.pair_levels)
            parsed.facts["topo_m"] = {"gpus": t["gpus"], "levels": levels}
            parsed.summary += (f"; nvidia-smi topo -m: {t['gpus']} GPUs, "
                               + ", ".join(f"{v} pairs {k}" for k, v in sorted(levels.items())))
    return parsed


def _level_counts(pair_levels: dict[tuple[int, int], str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for lvl in pair_levels.values():
        counts[lvl] = counts.get(lvl, 0) + 1
    return counts


def nccl_log_parsed(text: str, name: str) -> Parsed:
    """An NCCL_DEBUG=INFO log: its nccl_choices document."""
    choices = nccl_log.parse_nccl_log(text, name)
    return Parsed(format="nccl-log", name=name, documents={"nccl_choices": choices},
                  facts={"nccl_version": choices.nccl_version},
                  summary=nccl_log.summarize(choices))


def graph_xml_parsed(text: str, name: str) -> Parsed:
    """An NCCL_GRAPH_FILE."""
    doc = nccl_xml.parse_graph_xml(text, name)
    return Parsed(format="nccl-graph-xml", name=name, documents={"nccl_graph": doc},
                  summary=nccl_xml.summarize_graph(doc))


def topo_xml_parsed(text: str, name: str) -> Parsed:
    """An NCCL_TOPO_FILE."""
    doc = nccl_xml.parse_topo_xml(text, name)
    return Parsed(format="nccl-topo-xml", name=name, documents={"nccl_topo": doc},
                  summary=nccl_xml.summarize_topo(doc))


def machine_log(fmt: str, what: str) -> Callable[[str, str], Parsed]:
    """The parser of one machine log (`fmt`, described as `what`): the discovery parser, its
    errors naming file and line."""

    def parse(text: str, name: str) -> Parsed:
        try:
            return _machine_log(text, name, fmt, what)
        except BadInput as exc:
            raise _with_line(exc, name, text) from None

    return parse


def _with_line(exc: BadInput, name: str, text: str) -> BadInput:
    """Discovery parsers name the file; where a whole-file problem (rows missing, no section)
    has no line, point at the end of the file, where the missing part should have been."""
    msg = exc.message
    if re.match(re.escape(name) + r":\d+:", msg) or not msg.startswith(name + ":"):
        return exc
    end = max(1, len(text.splitlines()))
    return BadInput(f"{name}:{end}:{msg[len(name) + 1:]}", hint=exc.hint)


def _check_complete(text: str, name: str, what: str) -> None:
    """A tool's output ends with a newline; text cut in the middle of a line does not."""
    if text and not text.endswith("\n"):
        fail(name, len(text.splitlines()), f"{what} (the file ends mid-line: cut short?)",
             got=text.splitlines()[-1])


def _machine_log(text: str, name: str, fmt: str, what: str) -> Parsed:
    """Check one machine log with the discovery parser (errors name file and line)."""
    facts: dict[str, Any] = {}
    parsed = Parsed(format=fmt, name=name)
    if fmt == "lspci":
        _check_complete(text, name, "a complete last line")
        if not text.endswith("\n\n"):
            # lspci -vvv ends every device with a blank line: the last one may be cut short.
            facts.setdefault("warnings", []).append(
                f"{name}: no blank line after the last device; it may be cut short")
        devices = parse_lspci(text, source=name)
        first = next((l for l in text.splitlines() if l.strip()), "")
        if first[:1].isspace() and not re.match(r"\s+(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:", first):
            facts.setdefault("warnings", []).append(
                f"{name}: starts inside a device (its header is not in the file); the lines "
                "before the first header are left out")
        facts["pci_devices"] = len(devices)
        parsed.summary = f"lspci -vvv: {len(devices)} PCI devices"
    elif fmt == "lspci-tree":
        _check_complete(text, name, "a complete last line")
        devices = parse_lspci_tree(text, source=name)
        if not any(d.description for d in devices if d.secondary_bus is None):
            # plain `lspci -t` draws addresses only: which function is a GPU is not in it
            raise BadInput(f"{name}: `lspci -t` without -v names no device, so its GPUs "
                           "cannot be found", hint="run `lspci -tv` (or `sudo lspci -vvv`, "
                           "which adds NUMA node, links and ACS)")
        gpus = sum(1 for d in devices if d.is_nvidia_gpu)
        facts.update(pci_devices=len(devices), gpus_by_name=gpus)
        facts.setdefault("warnings", []).append(
            f"{name}: lspci -tv draws the tree only ({TREE_MISSING}); switch ports are inferred "
            "from its shape and GPUs from their NVIDIA names; `sudo lspci -vvv` has it all")
        parsed.summary = f"lspci -tv: {len(devices)} PCI functions, {gpus} NVIDIA GPUs by name"
    elif fmt == "nvidia-smi-q":
        _check_complete(text, name, "a complete last line")
        q = parse_smi_query(text, source=name)
        if q["attached_gpus"] and len(q["gpus"]) < q["attached_gpus"]:
            # `nvidia-smi -q -i N` prints 'Attached GPUs : 8' and one GPU: its place in the
            # index order is not in the text, so a partial log is refused like a cut one.
            fail(name, len(text.splitlines()), f"{q['attached_gpus']} GPU sections ('Attached "
                 f"GPUs : {q['attached_gpus']}'), found {len(q['gpus'])}: the file is cut short "
                 f"or nvidia-smi was run with -i/--id; pass the whole output of `nvidia-smi -q`")
        facts.update(driver_version=q["driver_version"], cuda_version=q["cuda_version"],
                     gpus=len(q["gpus"]))
        bare = [g["bus_id"] for g in q["gpus"] if g["pci_device_id"] is None
                and all(v is None for v in g["pcie"].values())]
        if bare:
            # `nvidia-smi -q -d CLOCK` (a display filter) or `-q | head` keep only some sections
            facts.setdefault("warnings", []).append(
                f"{name}: GPU {', '.join(bare)} has no PCI section (made with -d, or cut "
                f"short?): its PCIe link is unknown")
        mig = {g["bus_id"]: g["mig"] for g in q["gpus"] if g["mig"]["current"] == "Enabled"}
        if mig:
            facts["mig"] = mig
            facts.setdefault("warnings", []).append(f"{name}: {_mig_note(mig)}")
        parsed.gpus = [GpuRecord(g["index"], g.get("name"), g.get("bus_id")) for g in q["gpus"]]
        parsed.summary = (f"nvidia-smi -q: {len(q['gpus'])} GPUs, driver {q['driver_version']}, "
                          f"CUDA {q['cuda_version']}"
                          + (f"; MIG enabled on {len(mig)} of them" if mig else ""))
    elif fmt == "nvidia-smi-topo-m":
        t = parse_topo_matrix(text, source=name)
        parsed.pair_levels = {(p["a"], p["b"]): p["level"] for p in t["pairs"]}
        p2p_summary = ""
        if topo_p2p.looks_like(text):
            # A paste of `topo -m` followed by `topo -p2p X` (one terminal session): keep both.
            p2p = topo_p2p.parse_topo_p2p(text, name)
            parsed.pair_p2p = p2p.pair_p2p
            facts["topo_p2p"] = p2p.facts
            facts.setdefault("warnings", []).extend(p2p.facts.get("warnings", []))
            p2p_summary = p2p.summary
        counts = _level_counts(parsed.pair_levels)
        # sglang.check_env prints the product above its matrix ("GPU 0,1,...,7: NVIDIA H100
        # 80GB HBM3"): keep the names, so the box's architecture and memory are known
        parsed.gpus = [GpuRecord(i, n) for i, n in _env_gpu_names(text).items()
                       if i < t["gpus"]] or parsed.gpus
        facts.update(gpus=t["gpus"], levels=counts, topo_view=t["view"])
        parsed.documents["topo_m"] = t
        what = ("nvidia-smi topo -mp (PCIe-only view: NVLink not shown)"
                if t["view"] == "pcie_only" else "nvidia-smi topo -m")
        if t["view"] == "pcie_only":
            facts.setdefault("warnings", []).append(f"{name}: {PCIE_ONLY_VIEW}")
        # One GPU (a 1-GPU VM, sglang.check_env of a small box) has no pair to count.
        pairs = (", ".join(f"{v} pairs {k}" for k, v in sorted(counts.items()))
                 or "no GPU pairs")
        parsed.summary = (f"{what}: {t['gpus']} GPU{'s' if t['gpus'] != 1 else ''}, " + pairs
                          + (f"; {p2p_summary}" if parsed.pair_p2p and p2p_summary else ""))
    else:
        parsed.summary = f"{what}: {len(text.splitlines())} lines (machine log)"
    parsed.facts = facts
    return parsed


def _mig_note(mig: dict[str, dict[str, Any]]) -> str:
    """What MIG mode changes for P2P and NCCL, for the GPUs that have it on. NVIDIA's MIG User
    Guide (Deployment Considerations): "No GPU to GPU P2P (either PCIe or NVLink) is supported"
    and "CUDA applications treat a Compute Instance and its parent GPU Instance as a single CUDA
    device"; `nvidia-smi mig -lgip` prints P2P "No" for every profile (tests/data/host_logs, the
    H100 NVL MIG log's source)."""
    gpus = ", ".join(f"{bus} ({m['devices']} MIG device{'s' if m['devices'] != 1 else ''} listed)"
                     for bus, m in mig.items())
    return (f"MIG mode is enabled on GPU {gpus}: there is no GPU-to-GPU P2P (PCIe or NVLink) under "
            "MIG and each MIG device is a CUDA device of its own, so P2P and NCCL measured there "
            "are not those of whole GPUs (nvidia-smi -i N -mig 0 turns it off)")


#: sglang.check_env's GPU line: `GPU 0,1,2,3: NVIDIA H100 80GB HBM3` (one line per product).
_ENV_GPU = re.compile(r"^GPU ((?:\d+,)*\d+): (\S.*?)\s*$", re.M)


def _env_gpu_names(text: str) -> dict[int, str]:
    """GPU index -> product name from an environment report's `GPU i,j: NAME` lines."""
    return {int(i): m[2] for m in _ENV_GPU.finditer(text) for i in m[1].split(",")}
