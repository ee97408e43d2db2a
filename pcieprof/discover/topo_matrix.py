"""Parser of `nvidia-smi topo -m`: pairwise levels, CPU and NUMA affinity, NICs.

Real outputs: tab separated, ANSI underline codes around the header, ` X ` on the diagonal, an
empty field before `GPU NUMA ID` in the rows (the header has none), NIC rows and a NIC legend, and
older drivers without the NUMA columns.
"""

from __future__ import annotations

import re
from typing import Any

from pcieprof.errors import BadInput

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEV = re.compile(r"^(GPU|NIC)(\d+)$")
#: Cell values nvidia-smi prints (its legend); SOC is the pre-SYS name of older drivers.
_LEVEL = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|SOC|NV\d+)$")


def _na(v: str) -> str | None:
    v = v.strip()
    return None if v in ("", "N/A") else v


def parse_topo_matrix(text: str, *, source: str = "nvidia-smi topo -m") -> dict[str, Any]:
    """Parse `nvidia-smi topo -m` output.

    Args:
        text: the whole output (ANSI codes allowed).
        source: file name for error messages.

    Returns:
        {"devices": ["GPU0", ..., "NIC0"], "gpus": n, "matrix": {row: {col: level}},
         "pairs": [{"a", "b", "level"}] for ordered GPU pairs a != b,
         "cpu_affinity": {gpu index: "0-63,128-191" | None},
         "numa_affinity": {gpu index: int | None}, "gpu_numa_id": {gpu index: int | None},
         "nics": {"NIC0": "mlx5_0"}}.

    Raises:
        BadInput: no header, a row with too few cells, or a cell that is not a topo level.
    """
    lines = [_ANSI.sub("", ln).rstrip("\r") for ln in text.splitlines()]
    hdr_i = next((i for i, ln in enumerate(lines) if re.search(r"\bGPU0\b", ln)), None)
    if hdr_i is None:
        raise BadInput(f"{source}: no header row with GPU0 found",
                       hint="pass the output of `nvidia-smi topo -m`")
    header = [h.strip() for h in lines[hdr_i].split("\t")]
    if header and header[0] == "":
        header = header[1:]
    devices = [h for h in header if _DEV.match(h)]
    extras = [h for h in header[len(devices):] if h]
    if header[:len(devices)] != devices:
        raise BadInput(f"{source}:{hdr_i + 1}: expected the device columns (GPU0 GPU1 ...) first",
                       hint="pass the output of `nvidia-smi topo -m`")
    matrix: dict[str, dict[str, str]] = {}
    attrs: dict[str, dict[str, str | None]] = {}
    nics: dict[str, str] = {}
    in_legend = False
    for i in range(hdr_i + 1, len(lines)):
        ln = lines[i]
        s = ln.strip()
        if not s:
            continue
        if s.startswith("Legend") or s.startswith("NIC Legend"):
            in_legend = True
            continue
        if in_legend:
            m = re.match(r"^(NIC\d+):\s*(\S+)", s)
            if m:
                nics[m.group(1)] = m.group(2)
            continue
        fields = ln.split("\t")
        name = fields[0].strip()
        if not _DEV.match(name):
            raise BadInput(f"{source}:{i + 1}: expected a row starting with GPUn or NICn, "
                           f"got {s[:40]!r}", hint="pass the output of `nvidia-smi topo -m`")
        cells = [c.strip() for c in fields[1:]]
        if len(cells) < len(devices):
            raise BadInput(f"{source}:{i + 1}: row {name} has {len(cells)} cells, expected at "
                           f"least {len(devices)}", hint="is the file cut short?")
        row = {}
        for col, cell in zip(devices, cells):
            if not _LEVEL.match(cell):
                raise BadInput(f"{source}:{i + 1}: {name}/{col} is {cell!r}, expected one of "
                               "X, PIX, PXB, PHB, NODE, SYS, NV#")
            row[col] = "SYS" if cell == "SOC" else cell
        matrix[name] = row
        # The rows carry an empty field before GPU NUMA ID that the header lacks: drop empties.
        rest = [c for c in cells[len(devices):] if c != ""]
        attrs[name] = {k: _na(v) for k, v in zip(extras, rest)}
    gpu_names = [d for d in devices if d.startswith("GPU")]
    missing = [g for g in gpu_names if g not in matrix]
    if missing:
        raise BadInput(f"{source}: rows missing for {', '.join(missing)}",
                       hint="is the file cut short?")
    idx = {g: int(g[3:]) for g in gpu_names}
    pairs = [{"a": idx[a], "b": idx[b], "level": matrix[a][b]}
             for a in gpu_names for b in gpu_names if a != b]

    def attr(g: str, key: str) -> str | None:
        return attrs.get(g, {}).get(key)

    def as_int(v: str | None) -> int | None:
        return int(v) if v is not None and v.lstrip("-").isdigit() else None

    return {
        "devices": devices,
        "gpus": len(gpu_names),
        "matrix": matrix,
        "pairs": pairs,
        "cpu_affinity": {idx[g]: attr(g, "CPU Affinity") for g in gpu_names},
        "numa_affinity": {idx[g]: as_int(attr(g, "NUMA Affinity")) for g in gpu_names},
        "gpu_numa_id": {idx[g]: as_int(attr(g, "GPU NUMA ID")) for g in gpu_names},
        "nics": nics,
    }
