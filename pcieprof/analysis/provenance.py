"""Provenance wording: where a number came from, said the same way everywhere.

`measured, backend cuda`, `simulated, backend sim (fabric model)`, `measured, backend cpu (this
machine's CPUs and host memory, not GPUs)`, `imported, backend imported`: the report's figure
titles, the tuner's evidence lines, the console summary and the verify blocks all use these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pcieprof.schema import source_of

if TYPE_CHECKING:  # pandas costs ~0.3 s to import
    import pandas as pd

#: What each backend's numbers are, in a few words after the backend.
BACKEND_NOTES = {"cpu": "this machine's CPUs and host memory, not GPUs", "sim": "fabric model"}

#: One line on stdout above a console summary whose numbers are not from GPUs.
CONSOLE_NOTES = {
    "cpu": "backend=cpu: processes on this machine and host memory copies; these numbers measure "
           "this machine and the harness, not a GPU fabric",
    "sim": "backend=sim: numbers from the fabric model (simulated), not measured",
}


def provenance_text(source: str, backends: list[str]) -> str:
    """`measured, backend cpu (this machine's CPUs and host memory, not GPUs)` and the like; the
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


def part_provenance(manifest: dict[str, Any], part: str | None = None,
                    rows: "pd.DataFrame | None" = None) -> str:
    """Provenance of a bundle part's numbers, or of the rows drawn.

    Args:
        manifest: the bundle's manifest.
        part: the manifest part the numbers come from (e.g. "p2p").
        rows: a table whose `backend` column says which backend produced each row.
    """
    p = manifest.get("parts", {}).get(part, {}) if part else {}
    source = p.get("source") or manifest.get("source") or "unknown"
    backends: list[str] = []
    if rows is not None and "backend" in getattr(rows, "columns", []):
        backends = sorted({str(b) for b in rows["backend"].dropna() if str(b)})
    if not backends:
        backends = [str(p.get("backend") or manifest.get("backend") or "unknown")]
    return provenance_text(source, backends)
