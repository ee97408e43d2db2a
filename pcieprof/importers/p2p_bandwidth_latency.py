"""cuda-samples `p2pBandwidthLatencyTest`: device list, P2P connectivity, bandwidth and latency.

What the sample prints (NVIDIA/cuda-samples, Samples/5_Domain_Specific/p2pBandwidthLatencyTest/
p2pBandwidthLatencyTest.cu @ca37378c):
- `Device: 0, <name>, pciBusID: 4, pciDeviceID: 0, pciDomainID:0` per GPU (hex numbers);
- `Device=0 CAN|CANNOT Access Peer Device=1` and a `P2P Connectivity Matrix` (1 = peer access);
- bandwidth matrices `Unidirectional|Bidirectional P2P=Disabled|Enabled Bandwidth [(P2P Writes|
  P2P Reads)] Matrix (GB/s)`: row i copies to column j (`P2P Reads`: row i reads from column j),
  `%6.02f ` per cell, so wide values overflow their column but stay space separated;
- latency matrices `P2P=Disabled|Enabled Latency [(P2P Writes|Reads)] Matrix (us)`: a `GPU`
  block (CUDA-event time per 16-byte copy, 100 repeats) and, in current versions, a `CPU` block
  (host-side time per copy). Older versions head every matrix with `D\\D` and have no CPU block.
Where peer access is impossible the sample silently falls back to a staged copy; those cells of
the `P2P=Enabled` matrices are kept with `status=not_supported`.

What goes where: every off-diagonal cell of the bandwidth matrices and of the `GPU` latency
blocks is a p2p.csv row. The diagonal (a copy inside one GPU, counted read + write) and the `CPU`
latency blocks (host time to enqueue a copy, not a transfer latency) are not peer transfers:
they are kept, cell for cell, in the file's facts (`device_local`, `cpu_latency_us`, keyed by the
matrix title) so that no heatmap mixes them with P2P numbers.

Copy mode: `--sm_copy` makes the sample copy with an SM kernel instead of the copy engine
(`cudaMemcpyPeerAsync`, its default: `P2PEngine p2p_mechanism = CE`); the output says nothing of
it, so the mode is read from a pasted command line (`./p2pBandwidthLatencyTest --sm_copy`,
`# Without --sm_copy`) and is `unknown` otherwise. The two modes measure different things, so one
file's rows come from one mode: a paste holding runs of both (a README's "Compare" block) keeps
the first run's and names the other in a warning; `facts["copy_mode"]` says which, and the
import refuses two files of different modes in one bundle.

Sizes: the bandwidth copies are numElems ints (not printed; 40,000,000 by default in current
cuda-samples), so bandwidth rows carry size_bytes=0 (unknown); latency copies are 4 ints = 16 B.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from pcieprof.importers._text import clean_lines, fail, head_lines, parse_float, parse_int
from pcieprof.importers.records import GpuRecord, P2PRecord, Parsed
from pcieprof.importers.topology import flat_tree_evidence

TITLE = "[P2P (Peer-to-Peer) GPU Bandwidth Latency Test]"
LATENCY_COPY_BYTES = 16  # outputLatencyMatrix: numElems = 4 ints

_DEVICE = re.compile(r"^Device: (\d+), (.*), pciBusID: ([0-9a-fA-F]+), pciDeviceID: ([0-9a-fA-F]+),"
                     r" pciDomainID:\s*([0-9a-fA-F]+)\s*$")
_ACCESS = re.compile(r"^Device=(\d+) (CAN|CANNOT) Access Peer Device=(\d+)\s*$")
_BW = re.compile(r"^(Unidirectional|Bidirectional) P2P=(Enabled|Disabled) Bandwidth"
                 r"(?: \(P2P (Writes|Reads)\))? Matrix \(GB/s\)\s*$")
_LAT = re.compile(r"^P2P=(Enabled|Disabled) Latency(?: \(P2P (Writes|Reads)\))? Matrix \(us\)\s*$")
_CONN = re.compile(r"^P2P Connectivity Matrix\s*$")
_WITHOUT_SM = re.compile(r"\bwithout\s+-{1,2}sm_copy\b", re.I)
_SM_FLAG = re.compile(r"(?:^|\s)-{1,2}sm_copy\b")
#: Copy mode -> how rows and messages name it.
COPY_MODES = {"ce": "copy engine", "sm": "SM copy, --sm_copy", "unknown": "copy mode not shown"}


def _copy_mode_of(line: str) -> str | None:
    """The copy mode a pasted line states: a command line running the sample (with or without
    `--sm_copy`) or a note `Without --sm_copy`; None for any other line."""
    if _WITHOUT_SM.search(line):
        return "ce"
    if "p2pBandwidthLatencyTest" in line and not line.lstrip().startswith("["):
        return "sm" if _SM_FLAG.search(line) else "ce"
    return None


def looks_like(text: str) -> bool:
    """True for a full run or any one of its sections on its own."""
    for line in head_lines(text)[:400]:
        s = line.strip()
        if s == TITLE or _BW.match(s) or _LAT.match(s) or _CONN.match(s):
            return True
    return False


@dataclass
class _Matrix:
    values: list[list[float]]
    first_line: int


def _read_block(lines: list[str], i: int, name: str, title: str, heads: tuple[str, ...]
                ) -> tuple[_Matrix, int]:
    """Read a header line (`D\\D 0 1 ...`, `GPU 0 1 ...`) at/after i and its rows. Returns the
    matrix and the index of the first line after it."""
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        fail(name, i + 1, f"the column header of '{title}' (the file ends here)")
    head = lines[i].split()
    if not head or head[0] not in heads or not all(t.isdigit() for t in head[1:]) or len(head) < 2:
        fail(name, i + 1, f"the column header of '{title}' ({' or '.join(heads)} 0 1 ...)",
             got=lines[i])
    cols = [int(t) for t in head[1:]]
    if cols != list(range(len(cols))):
        fail(name, i + 1, f"columns 0..{len(cols) - 1} in the header of '{title}'", got=lines[i])
    n = len(cols)
    values: list[list[float]] = []
    first = i + 1
    for r in range(n):
        k = i + 1 + r
        if k >= len(lines) or not lines[k].strip():
            fail(name, k + 1, f"row {r} of '{title}' ({n} values; the matrix is cut short)",
                 got=lines[k] if k < len(lines) else "")
        cells = lines[k].split()
        row = parse_int(cells[0], name, k + 1, f"row number {r} of '{title}'")
        if row != r:
            fail(name, k + 1, f"row {r} of '{title}'", got=lines[k])
        if len(cells) - 1 != n:
            fail(name, k + 1, f"{n} values in row {r} of '{title}'", got=lines[k])
        values.append([parse_float(c, name, k + 1, f"a number in row {r} of '{title}'")
                       for c in cells[1:]])
    return _Matrix(values, first), i + 1 + n


def parse_p2p_bandwidth_latency(text: str, name: str = "<p2pBandwidthLatencyTest>") -> Parsed:
    """Parse p2pBandwidthLatencyTest output (a whole run or a single section).

    Args:
        text: the output.
        name: file name for messages.

    Returns:
        Parsed with one P2PRecord per matrix cell (path `host_staged` for P2P=Disabled, `p2p`
        for P2P=Enabled; direction `uni`/`bi`; detail names the matrix), the GPUs, and the
        connectivity matrix in `facts["connectivity"]`.

    Raises:
        BadInput: no matrix at all, or a matrix whose header or rows are malformed or cut short.
    """
    lines = clean_lines(text)
    result = Parsed(format="p2pBandwidthLatencyTest", name=name)
    access: dict[tuple[int, int], bool] = {}
    matrices: list[str] = []
    cpu_latency: dict[str, list[list[float]]] = {}
    device_local: dict[str, list[float]] = {}
    mode = "unknown"  # of the run being read
    kept_mode: str | None = None  # of the rows kept: the first run's
    skipped: dict[str, int] = {}
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if (said := _copy_mode_of(s)) is not None:
            mode = said
        if kept_mode is not None and mode != kept_mode and (_BW.match(s) or _LAT.match(s)):
            # A second run in the other copy mode: its numbers must not join the first's.
            mat, i = _read_block(lines, i + 1, name, s, ("D\\D", "GPU"))
            skipped[mode] = skipped.get(mode, 0) + 1
            continue
        if m := _DEVICE.match(s):
            idx, dev_name, bus, dev, dom = m.groups()
            bus_id = f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.0"
            if all(g.index != int(idx) for g in result.gpus):  # a second run lists them again
                result.gpus.append(GpuRecord(int(idx), dev_name.strip(), bus_id))
        elif m := _ACCESS.match(s):
            access[(int(m.group(1)), int(m.group(3)))] = m.group(2) == "CAN"
        elif _CONN.match(s):
            mat, i = _read_block(lines, i + 1, name, s, ("D\\D",))
            for a, row in enumerate(mat.values):
                for b, v in enumerate(row):
                    if a != b:
                        access.setdefault((a, b), v >= 1)
            if s not in matrices:
                matrices.append(s)
            continue
        elif m := _BW.match(s):
            kept_mode = mode
            kind, state, rw = m.groups()
            mat, i = _read_block(lines, i + 1, name, s, ("D\\D",))
            _add_bandwidth(result, mat, s, kind == "Bidirectional", state == "Enabled",
                           rw == "Reads", access, device_local)
            matrices.append(s)
            continue
        elif m := _LAT.match(s):
            kept_mode = mode
            state, rw = m.groups()
            mat, i = _read_block(lines, i + 1, name, s, ("GPU", "D\\D"))
            _add_latency(result, mat, s, state == "Enabled", rw == "Reads", access, device_local)
            j = i
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines) and lines[j].split()[:1] == ["CPU"]:
                mat, i = _read_block(lines, j, name, s + " [CPU]", ("CPU",))
                cpu_latency[s] = mat.values
            matrices.append(s)
            continue
        i += 1
    if not matrices:
        fail(name, None, "a p2pBandwidthLatencyTest matrix (e.g. 'Unidirectional P2P=Disabled "
             "Bandwidth Matrix (GB/s)')")
    copy_mode = kept_mode or mode
    result.facts = {"matrices": matrices, "gpus": len(result.gpus),
                    "connectivity": {f"{a}->{b}": ok for (a, b), ok in sorted(access.items())},
                    "device_local": device_local, "cpu_latency_us": cpu_latency,
                    "copy_mode": copy_mode}
    if copy_mode != "unknown":
        result.p2p = [replace(r, detail=r.detail.replace(
            "p2pBandwidthLatencyTest:", f"p2pBandwidthLatencyTest [{COPY_MODES[copy_mode]}]:", 1))
            for r in result.p2p]
    if skipped:
        result.facts["warnings"] = [
            f"{name}: runs in two copy modes; rows kept from the first "
            f"({COPY_MODES[copy_mode]}), {sum(skipped.values())} matrices of "
            + ", ".join(COPY_MODES[k] for k in sorted(skipped))
            + " left out: import that run on its own to see it"]
    flat = flat_tree_evidence([g.bus_id for g in result.gpus], name)
    if flat:
        result.facts["flat_pcie_tree"] = flat
    result.summary = (f"p2pBandwidthLatencyTest ({COPY_MODES[copy_mode]}): {len(matrices)} matrices, "
                      f"{len(result.p2p)} p2p rows, {len(result.gpus)} GPUs listed")
    return result


def _direction(a: int, b: int, reads: bool) -> tuple[int, int]:
    # For P2P Reads the row GPU pulls from the column GPU: data moves column -> row.
    return (b, a) if reads else (a, b)


def _cells(mat: _Matrix, title: str, enabled: bool, reads: bool,
           access: dict[tuple[int, int], bool], device_local: dict[str, list[float]]
           ) -> Iterator[tuple[int, int, float, str, str]]:
    """(src, dst, value, status, where) of every off-diagonal cell; the diagonal (copies inside
    one GPU) goes to `device_local`, not to p2p rows."""
    device_local[title] = [row[a] for a, row in enumerate(mat.values)]
    for a, row in enumerate(mat.values):
        for b, v in enumerate(row):
            if a == b:
                continue
            src, dst = _direction(a, b, reads)
            status, note = _cell_status(a, b, enabled, access)
            yield src, dst, v, status, f"row {a} col {b}{note}"


def _add_bandwidth(result: Parsed, mat: _Matrix, title: str, bidir: bool, enabled: bool,
                   reads: bool, access: dict[tuple[int, int], bool],
                   device_local: dict[str, list[float]]) -> None:
    path = "p2p" if enabled else "host_staged"
    for src, dst, v, status, where in _cells(mat, title, enabled, reads, access, device_local):
        result.p2p.append(P2PRecord(
            src=src, dst=dst, path=path, direction="bi" if bidir else "uni",
            bandwidth_gbps=v, status=status, detail=f"p2pBandwidthLatencyTest: {title}; {where}"))


def _add_latency(result: Parsed, mat: _Matrix, title: str, enabled: bool,
                 reads: bool, access: dict[tuple[int, int], bool],
                 device_local: dict[str, list[float]]) -> None:
    path = "p2p" if enabled else "host_staged"
    for src, dst, v, status, where in _cells(mat, title, enabled, reads, access, device_local):
        result.p2p.append(P2PRecord(
            src=src, dst=dst, path=path, direction="uni", size_bytes=LATENCY_COPY_BYTES,
            latency_us=v, status=status,
            detail=f"p2pBandwidthLatencyTest: {title} GPU latency; {where}"))


def _cell_status(a: int, b: int, enabled: bool, access: dict[tuple[int, int], bool]
                 ) -> tuple[str, str]:
    if enabled and access.get((a, b)) is False:
        return "not_supported", "; no peer access: the sample fell back to a staged copy"
    return "ok", ""
