"""Write one bundle from several imported files (`pcieprof import`).

Every file is read and parsed first, so a bad file stops the import with its one-line error
before anything is written. The bundle then holds (docs/bundle.md):
- `imported/<file>`: the original bytes of every file;
- `topology.json`: from the machine logs (discovery parsers) when given, else a skeleton;
  both merged with topo -m levels, topo -p2p statuses, device lists and NCCL topology XML;
- `p2p.csv`, `concurrent.csv`, `allreduce.csv`: the imported rows, `backend=imported`;
- `nccl_choices.json`: {"imported:<file>": {variant, ranks, env, log, parsed}} as the topology
  probes write it, `parsed` being `parse_nccl_log`'s NcclParsed;
- `nccl_topo.json` / `nccl_graph.json` (one file each; `-<stem>` suffixed when several);
- manifest `source=imported`, `backend=imported`, part `import` listing what each file gave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pcieprof import progress
from pcieprof.bundle import Bundle, outdir
from pcieprof.bundle.nccl_choices import NcclCase, NcclChoices, NcclParsed
from pcieprof.bundle.nccl_graph import NcclGraph
from pcieprof.bundle.nccl_topo import NcclTopo
from pcieprof.bundle.topology import Topology
from pcieprof.errors import BadInput
from pcieprof.importers import topology as topo_mod
from pcieprof.importers.formats import FORMATS, MACHINE_LOGS, parse_text
from pcieprof.importers.reading import read_input
from pcieprof.importers.records import Parsed
from pcieprof.schema import Backend, Source, Status


@dataclass
class ImportedFile:
    """One input file: where it is kept in the bundle and what it gave."""

    path: Path
    raw: bytes
    text: str
    parsed: Parsed
    stored_as: str = ""


def parse_files(paths: list[Path]) -> list[ImportedFile]:
    """Read and parse every file; the first bad one raises its one-line BadInput."""
    if not paths:
        raise BadInput("no files to import", hint="pcieprof import FILE...")
    files = []
    for p in paths:
        raw, text = read_input(p)
        files.append(ImportedFile(p, raw, text, parse_text(text, str(p))))
        progress.info(f"{p}: {FORMATS[files[-1].parsed.format].what}")
    seen: dict[str, Path] = {}
    for f in files:
        fmt = f.parsed.format
        if fmt in MACHINE_LOGS:
            if fmt in seen:
                raise BadInput(f"{f.path}: a second {FORMATS[fmt].what} log (the first is "
                               f"{seen[fmt]}); one bundle holds one machine",
                               hint="import the machines separately")
            seen[fmt] = f.path
    _one_copy_mode(files)
    return files


def _one_copy_mode(files: list[ImportedFile]) -> None:
    """p2pBandwidthLatencyTest's SM-copy rows (`--sm_copy`) and copy-engine rows measure
    different copies of the same pairs: one bundle holds one mode (compare two bundles)."""
    modes = {str(f.path): f.parsed.facts.get("copy_mode") for f in files
             if f.parsed.format == "p2pBandwidthLatencyTest"}
    sm = [p for p, m in modes.items() if m == "sm"]
    other = [p for p, m in modes.items() if m != "sm"]
    if sm and other:
        raise BadInput(f"{sm[0]} is a --sm_copy run, {other[0]} is not: their rows would mix "
                       "two copy modes in one bundle",
                       hint="import each into its own bundle, then pcieprof compare A B")


def _stored_name(path: Path, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", path.name) or "file"
    name, k = base, 2
    while name in taken:
        stem, dot, ext = base.partition(".")
        name = f"{stem}-{k}{dot}{ext}"
        k += 1
    taken.add(name)
    return name


def build_topology(files: list[ImportedFile]) -> tuple[dict[str, Any], list[str]]:
    """topology.json from the files, and the disagreements between files (for warnings)."""
    logs = {f.parsed.format: (str(f.path), f.text) for f in files
            if f.parsed.format in MACHINE_LOGS}
    topo = topo_mod.from_machine_logs(logs) if logs else topo_mod.skeleton()
    topo["source"] = Source.IMPORTED.value
    problems: list[str] = []
    for f in files:
        p = f.parsed
        if "topo_m" in p.documents:
            # Fills only what discovery left unknown (topo -m alone gives no GPU list to it).
            topo_mod.merge_topo_m(topo, p.documents["topo_m"])
        if p.pair_p2p:
            topo_mod.merge_p2p_status(topo, p.pair_p2p)
        if p.gpus and p.format not in MACHINE_LOGS:
            if logs:
                problems += _cuda_to_nvml(topo, p, str(f.path))
            problems += topo_mod.add_gpus(topo, p.gpus, str(f.path))
        elif p.gpus and "topo_m" in p.documents:
            # product names an environment report prints above its matrix (sglang.check_env),
            # numbered as the matrix is: they only fill names nothing else gave
            problems += topo_mod.add_gpus(topo, p.gpus, str(f.path))
        if "nccl_topo" in p.documents:
            topo_mod.merge_nccl_topo(topo, p.documents["nccl_topo"], str(f.path))
    topo_mod.merge_virtualization(topo, [f.parsed for f in files])
    problems += topo_mod.merge_driver(topo, [(str(f.path), f.parsed.facts) for f in files])
    for f in files:
        problems += f.parsed.facts.get("warnings", [])
    counts = {str(f.path): len(f.parsed.gpus) for f in files if f.parsed.gpus}
    if len(set(counts.values())) > 1:
        problems.append("the files list different GPU counts ("
                        + ", ".join(f"{k}: {v}" for k, v in counts.items())
                        + "): are they from one machine?")
    return topo, problems


def _cuda_to_nvml(topo: dict[str, Any], p: Parsed, source: str) -> list[str]:
    """Renumber a CUDA tool's GPUs to nvidia-smi (NVML, PCI bus order) indices by bus id.

    CUDA numbers devices fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so device 0 of
    p2pBandwidthLatencyTest may be nvidia-smi's GPU 3; the bundle uses NVML indices throughout.
    Done only when the machine logs give the bus ids, and only when every GPU matches.
    """
    by_bus = {str(g.get("bus_id") or "").lower(): g["index"] for g in topo["gpus"] if g.get("bus_id")}
    if not by_bus or not all(g.bus_id for g in p.gpus):
        return []
    bus = {g.index: str(g.bus_id).lower() for g in p.gpus}  # every one set (checked above)
    missing = [b for b in bus.values() if b not in by_bus]
    if missing:
        return [f"{source}: GPUs {', '.join(missing)} are not in the machine logs; "
                "kept with the tool's own numbering"]
    mapping = {i: by_bus[b] for i, b in bus.items()}
    if all(k == v for k, v in mapping.items()):
        return []
    note = "; CUDA device -> nvidia-smi index by bus id: " + ", ".join(
        f"{k}->{v}" for k, v in sorted(mapping.items()))

    def m(i: int) -> int:
        return mapping.get(i, i) if i >= 0 else i

    p.p2p = [replace(r, src=m(r.src), dst=m(r.dst), detail=r.detail + note) for r in p.p2p]
    p.concurrent = [replace(r, src=m(r.src), dst=m(r.dst), detail=r.detail + note)
                    for r in p.concurrent]
    p.gpus = [replace(g, index=mapping[g.index]) for g in p.gpus]
    p.facts["cuda_to_nvml"] = {str(k): v for k, v in sorted(mapping.items())}
    return []


def import_files(paths: list[Path], out: Path, *, force: bool = False,
                 argv: list[str] | None = None) -> tuple[Bundle, list[ImportedFile]]:
    """Parse `paths` and write them as one imported bundle at `out`.

    Args:
        paths: the tool outputs and machine logs of one machine.
        out: the bundle directory (must be new or empty unless `force`).
        force: overwrite a non-empty `out`.
        argv: the command line to record.

    Returns:
        The finished bundle and the parsed files.

    Raises:
        BadInput: an unreadable, unknown, malformed or truncated file (one line), two logs of
            the same kind, or a non-empty `out` without `force`.
    """
    outdir.refuse_inputs_inside(Path(out), paths)  # before the files are read and named
    files = parse_files(paths)
    topo, problems = build_topology(files)
    bundle = Bundle.create(out, command="import", source=Source.IMPORTED.value,
                           backend=Backend.IMPORTED.value, force=force, argv=argv, inputs=paths)
    bundle.set_part("import", Status.RUNNING.value)
    taken: set[str] = set()
    for f in files:
        f.stored_as = "imported/" + _stored_name(f.path, taken)
        bundle.file(f.stored_as).write_bytes(f.raw)
        bundle.register(f.stored_as)  # the manifest lists every file, as write_json does
    bundle.write_doc(Topology.from_json(topo))
    bundle.set_part("discovery", Status.OK.value, files=[str(f.path) for f in files
                                                         if f.parsed.format in MACHINE_LOGS])
    counts = _write_tables(bundle, files)
    _write_documents(bundle, files)
    _record_versions(bundle, files, topo)
    for msg in problems:
        progress.warn(msg)
    bundle.set_part("import", Status.OK.value, files=[
        {"file": str(f.path), "stored_as": f.stored_as, "format": f.parsed.format,
         "tool": FORMATS[f.parsed.format].what, "summary": f.parsed.summary,
         "rows": {"p2p": len(f.parsed.p2p), "concurrent": len(f.parsed.concurrent),
                  "allreduce": len(f.parsed.collectives)},
         "facts": f.parsed.facts} for f in files], rows=counts, warnings=problems)
    bundle.finish()
    return bundle, files


def _write_tables(bundle: Bundle, files: list[ImportedFile]) -> dict[str, int]:
    counts = {"p2p": 0, "concurrent": 0, "allreduce": 0}
    for f in files:
        p = f.parsed
        if p.p2p:
            counts["p2p"] += bundle.append_rows("p2p", (r.to_row() for r in p.p2p))
        if p.concurrent:
            counts["concurrent"] += bundle.append_rows("concurrent",
                                                       (r.to_row() for r in p.concurrent))
        if p.collectives:
            counts["allreduce"] += bundle.append_rows("allreduce",
                                                      (r.to_row() for r in p.collectives))
    for table, n in counts.items():
        if n:
            bundle.set_part(table, Status.OK.value, rows=n)
    return counts


def _write_documents(bundle: Bundle, files: list[ImportedFile]) -> None:
    choices = NcclChoices()
    by_kind: dict[str, list[tuple[ImportedFile, NcclTopo | NcclGraph]]] = {
        "nccl_topo": [], "nccl_graph": []}
    for f in files:
        docs = f.parsed.documents
        if "nccl_choices" in docs:
            parsed: NcclParsed = docs["nccl_choices"]
            main = max(parsed.comms, key=lambda c: c.nranks, default=None)
            choices.cases[f"imported:{Path(f.stored_as).name}"] = NcclCase(
                # Ranks 0..n-1 as nccl-tests rows take them: an excerpt may lack some ranks'
                # Init lines, and `ranks` is indexed by rank (NcclCase.device_of).
                variant="imported", ranks=tuple(range(main.nranks)) if main else (),
                env=dict(parsed.env), log=f.stored_as, parsed=parsed)
        for kind in by_kind:
            if kind in docs:
                by_kind[kind].append((f, docs[kind]))
    if choices.cases:
        bundle.write_doc(choices)
    for kind, found in by_kind.items():
        for f, doc in found:
            name = (f"{kind}.json" if len(found) == 1
                    else f"{kind}-{Path(f.stored_as).name.split('.')[0]}.json")
            doc.source_file = f.stored_as
            bundle.write_doc(doc, name)


def _record_versions(bundle: Bundle, files: list[ImportedFile], topo: dict[str, Any]) -> None:
    v: dict[str, str | None] = {}
    driver = (topo.get("driver") or {}).get("driver_version")
    for f in files:
        facts = f.parsed.facts
        driver = driver or facts.get("driver_version")
        if facts.get("nccl_version"):
            v.setdefault("nccl", facts["nccl_version"])
        if facts.get("nccl_tests_version"):
            v.setdefault("nccl_tests", facts["nccl_tests_version"])
        if f.parsed.format.startswith("nvbandwidth") and facts.get("version"):
            v.setdefault("nvbandwidth", facts["version"])
        ch = f.parsed.documents.get("nccl_choices")
        if ch is not None and ch.nccl_version:
            v.setdefault("nccl", ch.nccl_version)
    if driver:
        v["driver"] = driver
    cuda = (topo.get("driver") or {}).get("cuda_driver_version")
    if cuda:
        v["cuda"] = cuda
    if v:
        bundle.set_versions(**v)
