"""Provenance wording: where a number came from, said the same way everywhere.

`measured, backend cuda`, `simulated, backend sim (fabric model)`, `measured, backend cpu (CPUs
and host memory, not GPUs)`, `imported, backend imported`: the report's figure titles and
bundle labels, the tuner's evidence lines, the console summary and the verify blocks use these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from pcieprof.bundle.manifest import Manifest
from pcieprof.schema import source_of

if TYPE_CHECKING:  # pandas costs ~0.3 s to import
    import pandas as pd

#: What each backend's numbers are, in a few words after the backend.
BACKEND_NOTES = {"cpu": "CPUs and host memory, not GPUs", "sim": "fabric model"}

#: One line on stdout above a console summary whose numbers are not from GPUs.
CONSOLE_NOTES = {
    "cpu": "backend=cpu: processes on this machine and host memory copies; these numbers measure "
           "this machine and the harness, not a GPU fabric",
    "sim": "backend=sim: numbers from the fabric model (simulated), not measured",
}


def obtained(backend: str) -> str:
    """How a number of `backend` was obtained, as a sentence says it: `simulated` (sim: the
    fabric model), else `measured` (cuda, cpu, and imported: another tool measured it). Every
    rule, verdict and verify line that says where its numbers came from in words uses this, so
    that no simulated number is ever called measured."""
    return "simulated" if backend == "sim" else "measured"


def provenance_text(source: str, backends: list[str]) -> str:
    """`measured, backend cpu (CPUs and host memory, not GPUs)` and the like; the
    source of a known backend is the backend's own (a sim row is simulated in any bundle)."""
    parts = []
    for b in backends:
        try:
            src = source_of(b)
        except KeyError:
            src = source
        note = f" ({BACKEND_NOTES[b]})" if b in BACKEND_NOTES else ""
        parts.append(f"{src}, backend {b}{note}")
    return "; ".join(parts) if parts else source


def part_provenance(manifest: Manifest, part: str | None = None,
                    rows: "pd.DataFrame | None" = None) -> str:
    """Provenance of a bundle part's numbers, or of the rows drawn.

    Args:
        manifest: the bundle's manifest.
        part: the manifest part the numbers come from (e.g. "p2p").
        rows: a table whose `backend` column says which backend produced each row.
    """
    p = manifest.parts.get(part) if part else None
    source = (p and p.source) or manifest.source or "unknown"
    backends: list[str] = []
    if rows is not None and "backend" in getattr(rows, "columns", []):
        backends = sorted({str(b) for b in rows["backend"].dropna() if str(b)})
    if not backends:
        backends = [str((p and p.backend) or manifest.backend or "unknown")]
    return provenance_text(source, backends)


def measured_host(manifest: Manifest) -> str | None:
    """The host a bundle's numbers were taken on; None when simulated (a simulated bundle ran
    on some machine but measured none; older ones recorded it anyway), imported (the manifest's
    host is the machine that ran the import, not the box: `imported_on`) or not recorded."""
    if manifest.source in ("simulated", "imported"):
        return None
    return _host(manifest)


def imported_on(manifest: Manifest) -> str | None:
    """The machine that ran `pcieprof import` (an imported bundle's manifest host), or None."""
    return _host(manifest) if manifest.source == "imported" else None


def _host(manifest: Manifest) -> str | None:
    host = manifest.host
    return str(host) if host and host != "unknown" else None


def origin(manifest: Manifest, box_hosts: Sequence[str] = ()) -> str:
    """One line saying where a bundle's numbers come from: `simulated: fabric model
    rtxpro6000-8x-vm (not hardware)`, `measured on host gpu-01, backend cuda`, `imported: tool
    outputs of box gpu-01 (as its NCCL log names it); imported on host laptop (not the box),
    backend imported`.

    Args:
        manifest: the bundle's manifest.
        box_hosts: for an imported bundle, the host names its files give for the box (the
            NCCL log's line prefixes); none: the line says the files do not name it.
    """
    backend = str(manifest.backend or "unknown")
    source = str(manifest.source or "unknown")
    if source == "simulated":
        discovery = manifest.parts.get("discovery")
        profile = (manifest.versions.get("sim_profile")
                   or (discovery.extra.get("profile") if discovery else None))
        return f"simulated: fabric model {profile or '(profile not recorded)'} (not hardware)"
    if source == "imported":
        box = ("a box the files do not name" if not box_hosts else
               f"box {box_hosts[0]} (as its NCCL log names it)" if len(box_hosts) == 1 else
               f"boxes {', '.join(box_hosts)} (as their NCCL log names them)")
        by = imported_on(manifest)
        return (f"imported: tool outputs of {box}; "
                + (f"imported on host {by} (not the box)" if by else "importing host not recorded")
                + f", backend {backend}")
    host = measured_host(manifest)
    where = f" on host {host}" if host else " (host not recorded)"
    note = f" ({BACKEND_NOTES[backend]})" if backend in BACKEND_NOTES else ""
    return f"{source}{where}, backend {backend}{note}"
