"""Parser of `nvidia-smi topo -m`: pairwise levels, CPU and NUMA affinity, NICs.

The variants that exist (driver output and how people paste it):
- tab separated with ANSI underline codes around the header (a terminal), or runs of spaces
  (pasted into Markdown, READMEs, issue threads), CRLF line ends;
- ` X ` on the diagonal; an empty field before `GPU NUMA ID` in the rows that the header lacks;
- device columns `GPU0..`, `NIC0..` (with a `NIC Legend`), or the NIC's own name on older
  drivers (`mlx5_0`); attribute columns `CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID` (older
  drivers: the first one only, or the first two); NIC rows without attributes;
- levels X, PIX, PXB, PHB, NODE, SYS, NV# (a bonded set of # NVLinks), and SOC (the pre-SYS name);
- the matrix inside other text: a shell prompt (`$ nvidia-smi topo -m`, even on the header line
  itself), prose, other tables, Markdown fences; the legend present, cut or missing.

The matrix is the header line holding `GPU0` that is followed by a row of levels; it ends at the
first line that is not a row of a device in the header.

`nvidia-smi topo -mp` (`--matrix_pci`) prints the same matrix with PCIe paths only: an NVLink pair
shows its PCIe level (NODE, SYS, ...) and the legend has no `NV#` line. Real case: DeepEP issue #60
(https://github.com/deepseek-ai/DeepEP/issues/60), `topo -mp` of an 8-GPU NVLink box showing only
NODE/SYS between GPUs. Such a matrix says nothing about NVLink: `view` tells which one was read.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

from pcieprof.errors import BadInput

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_DEV = re.compile(r"^(GPU|NIC)(\d+)$")
#: Cell values nvidia-smi prints (its legend); SOC is the pre-SYS name of older drivers.
_LEVEL = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|SOC|NV\d+)$")
#: Attribute columns after the devices, longest first (header words, as nvidia-smi prints them).
ATTRIBUTES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_LEGEND = re.compile(r"^\s*(NIC\s+)?Legend\s*:?\s*$")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)")
_HINT = "pass the output of `nvidia-smi topo -m`"
#: What a `topo -mp` matrix leaves out, said wherever its levels are used.
PCIE_ONLY_VIEW = ("nvidia-smi topo -mp shows PCIe paths only (NVLink hidden); "
                  "`nvidia-smi topo -m` shows the NV# pairs")
#: The command line of a PCIe-only view (`topo -mp`, `topo --matrix_pci`), or of the full matrix.
_CMD_MP = re.compile(r"\btopo\s+(?:-mp|--matrix_pci)\b")
_CMD_M = re.compile(r"\btopo\s+(?:-m|--matrix)(?:\s|$)")
_LEGEND_NV = re.compile(r"^\s*NV#\s*=")
_LEGEND_PIX = re.compile(r"^\s*PIX\s*=")


def _na(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip()
    return None if v in ("", "N/A") else v


def _header_devices(tokens: list[str]) -> tuple[list[str], list[str]] | None:
    """(device columns, attribute names) of a header line's tokens, or None when it is not one.

    Tokens before `GPU0` are a prompt or a command pasted on the same line. Devices are the
    tokens from `GPU0` up to the first attribute word; the attribute words are regrouped into
    nvidia-smi's column names.
    """
    if "GPU0" not in tokens:
        return None
    tokens = tokens[tokens.index("GPU0"):]
    devices: list[str] = []
    k = 0
    while k < len(tokens):
        t = tokens[k]
        if t in ("CPU", "NUMA") or (t == "GPU" and k + 1 < len(tokens) and tokens[k + 1] == "NUMA"):
            break
        devices.append(t)
        k += 1
    rest = " ".join(tokens[k:])
    attrs: list[str] = []
    while rest:
        for a in ATTRIBUTES:
            if rest.startswith(a):
                attrs.append(a)
                rest = rest[len(a):].lstrip()
                break
        else:
            word, _, rest = rest.partition(" ")
            attrs.append(word)
    return devices, attrs


def _is_row(tokens: list[str], devices: list[str]) -> bool:
    """A matrix row: a device name, then a level in every device column (a `topo -p2p` row has
    status codes there instead)."""
    cells = tokens[1:1 + len(devices)]
    return (tokens[:1] != [] and tokens[0] in devices and len(cells) == len(devices)
            and all(_LEVEL.match(c) for c in cells))


def find_matrix(lines: list[str]) -> tuple[int, list[str], list[str]] | None:
    """(header line index, devices, attributes) of the first topo -m matrix in cleaned lines."""
    for i, ln in enumerate(lines):
        if "GPU0" not in ln:
            continue
        parsed = _header_devices(ln.split())
        if parsed is None or not parsed[0]:
            continue
        nxt = next((ln2 for ln2 in lines[i + 1:i + 3] if ln2.strip()), "")
        if _is_row(nxt.split(), parsed[0]):
            return i, parsed[0], parsed[1]
    return None


def _view(lines: list[str], hdr_i: int, end: int, cells: set[str]) -> tuple[str, str]:
    """(view, why): `full` (`topo -m`, NVLink shown), `pcie_only` (`topo -mp`, NVLink hidden) or
    `unknown` (neither the command nor a complete legend says, and no pair shows NV#).

    The command line wins where it is pasted (the nearest one above the header); else an NV#
    cell means the full view; else the legend: `-mp`'s ends at `PIX` with no `NV#` line.
    """
    for ln in reversed(lines[max(0, hdr_i - 5):hdr_i + 1]):
        if _CMD_MP.search(ln):
            return "pcie_only", f"the command line says `{ln.strip()[:60]}`"
        if _CMD_M.search(ln):
            return "full", f"the command line says `{ln.strip()[:60]}`"
    if any(c.startswith("NV") for c in cells):
        return "full", "NV# pairs in the matrix"
    tail = lines[end:end + 40]
    if any(_LEGEND_NV.match(ln) for ln in tail):
        return "full", "the legend has the NV# line"
    pix = next((k for k, ln in enumerate(tail) if _LEGEND_PIX.match(ln)), None)
    if pix is not None and not any(ln.strip() for ln in tail[pix + 1:pix + 2]):
        return "pcie_only", "the legend ends at PIX without the NV# line (nvidia-smi topo -mp)"
    return "unknown", "no command line, no NV# pair and no complete legend"


def _no_matrix(lines: list[str], source: str) -> NoReturn:
    """Raise the error for a text without a matrix, naming the line where it went wrong."""
    head = next((i for i, ln in enumerate(lines) if re.search(r"\bGPU0\b", ln)), None)
    if head is None:
        raise BadInput(f"{source}: no header row with GPU0 found", hint=_HINT)
    parsed = _header_devices(lines[head].split())
    devices = parsed[0] if parsed else []
    nxt = next((j for j in range(head + 1, len(lines)) if lines[j].strip()), None)
    if nxt is None:
        raise BadInput(f"{source}:{head + 1}: expected rows 'GPU0 X <level> ...' under this "
                       "header, got the end of the file", hint=_HINT)
    tokens = lines[nxt].split()
    if devices and tokens[0] in devices:
        cells = tokens[1:]
        if len(cells) < len(devices):
            raise BadInput(f"{source}:{nxt + 1}: row {tokens[0]} has {len(cells)} cells, "
                           f"expected at least {len(devices)} (one per device column)",
                           hint="is the file cut short?")
        col, cell = next((c, v) for c, v in zip(devices, cells) if not _LEVEL.match(v))
        raise BadInput(f"{source}:{nxt + 1}: {tokens[0]}/{col} is {cell!r}, expected one of "
                       "X, PIX, PXB, PHB, NODE, SYS, SOC, NV#", hint=_HINT)
    raise BadInput(f"{source}:{nxt + 1}: expected a row 'GPU0 X <level> ...' under the header "
                   f"of line {head + 1}, got {lines[nxt].strip()[:60]!r}", hint=_HINT)


def parse_topo_matrix(text: str, *, source: str = "nvidia-smi topo -m") -> dict[str, Any]:
    """Parse `nvidia-smi topo -m` output (see the module docstring for the variants).

    Args:
        text: the output, or a text holding it.
        source: file name for error messages.

    Returns:
        {"devices": ["GPU0", ..., "NIC0"], "gpus": n, "matrix": {row: {col: level}},
         "pairs": [{"a", "b", "level", "nvlinks"}] for ordered GPU pairs a != b (`nvlinks`: the
         bonded NVLink count of an NV# level, else None),
         "cpu_affinity": {gpu index: "0-63,128-191" | None},
         "numa_affinity": {gpu index: int | None}, "gpu_numa_id": {gpu index: int | None},
         "nics": {"NIC0": "mlx5_0"}, "header_line": 1-based line of the header,
         "legend": whether the level legend is present,
         "view": `full` (topo -m), `pcie_only` (topo -mp: NVLink not shown) or `unknown`,
         "view_evidence": why,
         "flat_evidence": a sentence when no GPU pair is below a PCIe switch or bridge (all
         PHB/NODE/SYS, NV# pairs aside, as in a VM's flat virtual tree; bare metal with one root
         port per GPU looks the same, so this alone does not decide), else None}.

    Raises:
        BadInput: no matrix, a row with too few cells, a cell that is not a topo level, or a GPU
            row missing (the line and what was expected there).
    """
    lines = [_ANSI.sub("", ln).rstrip("\r") for ln in text.replace("\r\n", "\n").split("\n")]
    found = find_matrix(lines)
    if found is None:
        _no_matrix(lines, source)
    hdr_i, devices, extras = found
    matrix: dict[str, dict[str, str]] = {}
    attrs: dict[str, dict[str, str | None]] = {}
    end = len(lines)
    i = hdr_i + 1
    while i < len(lines):
        ln = lines[i]
        tokens = ln.split()
        if not tokens:
            if matrix:  # the blank line after the matrix (before the legend)
                end = i
                break
            i += 1
            continue
        if tokens[0] not in devices:
            end = i
            break
        name = tokens[0]
        cells = tokens[1:]
        if len(cells) < len(devices):
            raise BadInput(f"{source}:{i + 1}: row {name} has {len(cells)} cells, expected at "
                           f"least {len(devices)} (one per device column)",
                           hint="is the file cut short?")
        row = {}
        for col, cell in zip(devices, cells):
            if not _LEVEL.match(cell):
                raise BadInput(f"{source}:{i + 1}: {name}/{col} is {cell!r}, expected one of "
                               "X, PIX, PXB, PHB, NODE, SYS, SOC, NV#", hint=_HINT)
            row[col] = "SYS" if cell == "SOC" else cell
        matrix[name] = row
        # Tab output has an empty field before GPU NUMA ID that the header lacks; split() drops it.
        attrs[name] = {k: _na(v) for k, v in zip(extras, cells[len(devices):])}
        i += 1
    gpu_names = [d for d in devices if d.startswith("GPU") and _DEV.match(d)]
    missing = [g for g in gpu_names if g not in matrix]
    if missing:
        want = f"the row '{missing[0]} <{len(devices)} levels>'"
        nxt = next((j for j in range(end, len(lines)) if lines[j].strip()), None)
        if nxt is None:  # the file ends with the matrix: point at its last line
            last = max(j for j in range(hdr_i, end) if lines[j].strip())
            raise BadInput(f"{source}:{last + 1}: rows missing for {', '.join(missing)}: "
                           f"expected {want} after this line, got the end of the file",
                           hint="is the file cut short?")
        raise BadInput(f"{source}:{nxt + 1}: rows missing for {', '.join(missing)}: expected "
                       f"{want} here, got {lines[nxt].strip()[:60]!r}",
                       hint="is the file cut short?")
    nics: dict[str, str] = {}
    legend = False
    for ln in lines[end:]:
        if _LEGEND.match(ln):
            legend = legend or not ln.strip().startswith("NIC")
            continue
        if m := _NIC_LEGEND.match(ln):
            nics[m.group(1)] = m.group(2)
    for d in devices:  # older drivers name the NIC column after the device itself
        if not _DEV.match(d):
            nics.setdefault(d, d)
    idx = {g: int(g[3:]) for g in gpu_names}
    pairs = [{"a": idx[a], "b": idx[b], "level": matrix[a][b],
              "nvlinks": int(matrix[a][b][2:]) if matrix[a][b].startswith("NV") else None}
             for a in gpu_names for b in gpu_names if a != b]
    levels = {matrix[a][b] for a in gpu_names for b in gpu_names if a != b}
    flat = None
    if pairs and not levels & {"PIX", "PXB"} and any(not lv.startswith("NV") for lv in levels):
        flat = ("nvidia-smi topo -m: no GPU pair below a PCIe switch or bridge (levels "
                + ", ".join(sorted(levels)) + ")")

    view, why = _view(lines, hdr_i, end, levels)

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
        "header_line": hdr_i + 1,
        "legend": legend,
        "flat_evidence": flat,
        "view": view,
        "view_evidence": why,
    }
