"""NVIDIA nvbandwidth: plain-text matrices and the JSON output (`-j` / `--json`).

Text output (NVIDIA/nvbandwidth output.cpp): a version block, `Device N: <name> (<pci>)` lines,
then per test case `Running <testcase>.`, a description line such as
`memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)` or
`Device to Device Latency SM GPU(row) <-> GPU(column) (ns)`, a column header, rows whose cells
are numbers or `N/A`, and `SUM <testcase> <value>`. Bidirectional device-to-device cases print
several matrices (`Read1`, `Read2`, `Total`). A case that does not apply prints
`Waived: ...` (older versions: `Waiving <testcase>.`). A case that fails stops the run with
`ASSERT in expression ...` (or CU_ASSERT's `[<error>] in expression ...`) after its `Running`
line (NVIDIA/nvbandwidth error.h): the case is kept with status `Error` and the lines before the
assertion as its reason, and the GPUs listed before it are still imported.

Pasted into Markdown, a line can keep a quote marker (`> Running host_to_device_memcpy_sm.`,
NVIDIA/nvbandwidth issue #24): the marker is dropped. A matrix whose test case is not named (no
`Running` line, no `SUM` line) takes its kind from its description: `CPU(row) -> GPU(column)`
is host to device, `CPU(row) <- GPU(column)` device to host.

JSON output (json_output.cpp): `{"nvbandwidth": {"version", "CUDA Runtime Version",
"Driver Version", "testcases": [{"name", "status": "Passed|Waived|Error|Not Found",
"bandwidth_description", "bandwidth_matrix": [["N/A", "26.34", ...], ...], "sum", ...}]}}`,
matrix cells as strings.

Mapping to bundle rows (testcase names kept in `detail`):
- `host_to_device_*` -> p2p.csv `h2d` (src=-1, dst=GPU); `device_to_host_*` -> `d2h`;
  `device_to_device_*` and `device_local_copy` -> `p2p`; `*bidirectional*` or `<->` -> `bi`;
  the printed arrow decides src and dst (`row -> column`: src=row; `row <- column`: src=column).
- latency cases (`(ns)`) -> latency rows in microseconds.
- `all_to_host`, `host_to_all`, `all_to_one`, `one_to_all` (several copies at once) ->
  concurrent.csv, one row per cell (flow = column) plus the `SUM` as the aggregate (flow=-1).
- `N/A` cells on the diagonal of a GPU x GPU matrix (a GPU to itself: nvbandwidth measures
  nothing there) -> no row; `N/A` elsewhere -> status `not_supported`; a waived test case -> one
  row with status `waived`.
- bidirectional device-to-device cases print `Read1`/`Read2` (or `Write1`/`Write2`), one per
  direction, and `Total`: the `Total` matrix gives the `bi` rows, the per-direction matrices are
  kept in the facts (`directional`), so one pair never has two different `bi` numbers.
"""

from __future__ import annotations

import json
import re
from pcieprof.importers._text import fail, head_lines, parse_float, split_lines
from pcieprof.importers.records import ConcurrentRecord, GpuRecord, P2PRecord, Parsed

_RUNNING = re.compile(r"^Running (\w+)\.\s*$")
_WAIVING = re.compile(r"^Waiving (\w+)\.\s*$")
_STATUS = re.compile(r"^(Waived|Error|Not Found):(.*)$")
_SUM = re.compile(r"^SUM (\w+) ([-+0-9.eE]+|nan|inf)\s*$")
_DESC = re.compile(r"(CPU|GPU)\(row\)\s*(<->|->|<-)\s*(CPU|GPU)\(column\)\s*(.*)$")
_DEVICE = re.compile(r"^Device (\d+): (.*?)(?: \(([0-9a-fA-F]{8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\))?\s*$")
_VERSION = re.compile(r"^nvbandwidth Version: (\S+)")
_ASSERT = re.compile(r"(?:^ASSERT|\]) in expression ")
_QUOTE = re.compile(r"^\s*>\s?")

_CONCURRENT = ("all_to_host", "host_to_all", "all_to_one", "one_to_all")


def looks_like_text(text: str) -> bool:
    """True for nvbandwidth's plain-text output (or a part of it with one test case)."""
    for line in head_lines(text)[:2000]:
        s = _QUOTE.sub("", line).strip()
        if _VERSION.match(s) or _WAIVING.match(s):
            return True
        if _RUNNING.match(s) and re.search(r"_(ce|sm)\.$|latency|local_copy", s):
            return True
        if ("(row)" in s and "(column)" in s and ("memcpy" in s or "Latency" in s
                                                    or "latency" in s)):
            return True
    return False


def looks_like_json(text: str) -> bool:
    """True for nvbandwidth's JSON output (possibly with warning lines around it)."""
    return bool(re.search(r'"nvbandwidth"\s*:\s*\{', text[:20000]))


def _kind(testcase: str) -> str:
    """`h2d`, `d2h`, `p2p` or `concurrent` from a test case name."""
    if testcase.startswith(_CONCURRENT):
        return "concurrent"
    if testcase.startswith("host_to_device") or testcase.startswith("host_device"):
        return "h2d"
    if testcase.startswith("device_to_host"):
        return "d2h"
    return "p2p"


class _Builder:
    """Turns (testcase, description, matrix) into records; shared by the text and JSON paths."""

    def __init__(self, result: Parsed, size_bytes: int) -> None:
        self.result = result
        self.size = size_bytes
        self.cases: dict[str, str] = {}

    def matrix(self, testcase: str, desc: str, rows: list[list[str]], where: str) -> None:
        m = _DESC.search(desc)
        if not m:
            raise ValueError(f"a matrix description with '(row)' and '(column)' ({where})")
        row_kind, arrow, col_kind, rest = m.groups()
        latency = "(ns)" in rest or "(ns)" in desc
        label = rest.replace("bandwidth", "").replace("(GB/s)", "").replace("(ns)", "").strip()
        kind = _kind(testcase)
        if kind == "p2p" and "CPU" in (row_kind, col_kind):
            # A matrix without a test case name: the host is one end, so it is no GPU pair.
            kind = "d2h" if (arrow == "<-") == (row_kind == "CPU") else "h2d"
        bidir = arrow == "<->" or "bidirectional" in testcase
        detail = f"nvbandwidth {testcase}: {desc.strip()}"
        self.cases.setdefault(testcase, "Passed")
        if kind != "concurrent" and re.fullmatch(r"(Read|Write)[12]", label):
            # One direction of a bidirectional pair; the `Total` matrix is the bi row (as
            # p2pBandwidthLatencyTest's bidirectional numbers are both directions together).
            self.result.facts.setdefault("directional", {})[f"{testcase}:{label}"] = rows
            return
        for r, cells in enumerate(rows):
            for c, cell in enumerate(cells):
                if row_kind == col_kind == "GPU" and r == c and cell.strip().upper() == "N/A":
                    continue  # a GPU to itself: not a pair, not a measurement
                value, status = self._cell(cell, r, c, row_kind, col_kind)
                src, dst = self._ends(row_kind, col_kind, arrow, r, c, kind)
                cell_detail = f"{detail}; row {r} col {c}"
                if kind == "concurrent":
                    self.result.concurrent.append(ConcurrentRecord(
                        pattern=testcase + (f":{label}" if label else ""),
                        op="read" if "read" in testcase else "write", flow=c, src=src, dst=dst,
                        size_bytes=self.size, bandwidth_gbps=None if latency else value,
                        status=status, detail=cell_detail))
                    continue
                path = kind
                if latency:
                    rec = P2PRecord(src=src, dst=dst, path=path, direction="bi" if bidir else "uni",
                                    size_bytes=0, latency_us=None if value is None else value / 1e3,
                                    status=status, detail=cell_detail)
                else:
                    rec = P2PRecord(src=src, dst=dst, path=path, direction="bi" if bidir else "uni",
                                    size_bytes=self.size, bandwidth_gbps=value, status=status,
                                    detail=cell_detail)
                self.result.p2p.append(rec)

    @staticmethod
    def _cell(cell: str, r: int, c: int, row_kind: str, col_kind: str) -> tuple[float | None, str]:
        if cell.strip().upper() == "N/A":
            return None, "not_supported"
        return float(cell), "ok"

    @staticmethod
    def _ends(row_kind: str, col_kind: str, arrow: str, r: int, c: int, kind: str
              ) -> tuple[int, int]:
        row_dev = r if row_kind == "GPU" else -1
        col_dev = c if col_kind == "GPU" else -1
        if kind == "h2d":
            return -1, col_dev if col_kind == "GPU" else row_dev
        if kind == "d2h":
            return col_dev if col_kind == "GPU" else row_dev, -1
        if arrow == "<-":
            return col_dev, row_dev
        return row_dev, col_dev

    def waived(self, testcase: str, status: str, why: str) -> None:
        self.cases[testcase] = status
        row_status = {"Waived": "waived", "Not Found": "not_supported"}.get(status, "error")
        detail = f"nvbandwidth {testcase}: {status}" + (f" ({why.strip()})" if why.strip() else "")
        if _kind(testcase) == "concurrent":
            self.result.concurrent.append(ConcurrentRecord(
                pattern=testcase, op="read" if "read" in testcase else "write", flow=-1, src=-1,
                dst=-1, status=row_status, detail=detail))
        else:
            latency = "latency" in testcase
            self.result.p2p.append(P2PRecord(
                src=-1, dst=-1, path=_kind(testcase),
                direction="bi" if "bidirectional" in testcase else "uni",
                size_bytes=0 if latency else self.size, status=row_status, detail=detail))

    def total(self, key: str, value: float) -> None:
        self.result.facts.setdefault("sums", {})[key] = value
        testcase = next((t for t in self.cases if key == t or key.startswith(t + "_")), key)
        if _kind(testcase) == "concurrent":
            self.result.concurrent.append(ConcurrentRecord(
                pattern=testcase, op="read" if "read" in testcase else "write", flow=-1,
                src=-1, dst=-1, size_bytes=self.size, bandwidth_gbps=value,
                detail=f"nvbandwidth {key}: SUM over all flows"))


def parse_nvbandwidth_text(text: str, name: str = "<nvbandwidth>") -> Parsed:
    """Parse nvbandwidth's plain-text output.

    Args:
        text: the output (one or many test cases; several runs concatenated are fine).
        name: file name for messages.

    Returns:
        Parsed with p2p and concurrent records, the GPUs listed, and facts (version, driver,
        per-testcase status, SUM values).

    Raises:
        BadInput: no test case at all, or a matrix that is malformed or cut short.
    """
    lines = [_QUOTE.sub("", line) for line in split_lines(text)]
    result = Parsed(format="nvbandwidth", name=name)
    builder = _Builder(result, size_bytes=0)
    current: str | None = None
    since_running: list[str] = []  # what the current case printed before any matrix
    seen_gpus: set[int] = set()
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if m := _VERSION.match(s):
            result.facts.setdefault("version", m.group(1))
        elif s.startswith("Driver Version:"):
            result.facts.setdefault("driver_version", s.split(":", 1)[1].strip())
        elif s.startswith("CUDA Runtime Version:"):
            result.facts.setdefault("cuda_runtime_version", s.split(":", 1)[1].strip())
        elif (m := _DEVICE.match(s)) and current is None:
            idx = int(m.group(1))
            if idx not in seen_gpus:
                seen_gpus.add(idx)
                bus = (f"{int(m.group(3), 16):04x}:{m.group(4).lower()}:{m.group(5).lower()}.0"
                       if m.group(3) else None)
                result.gpus.append(GpuRecord(idx, m.group(2).strip(), bus))
        elif m := _RUNNING.match(s):
            current = m.group(1)
            since_running = []
        elif _ASSERT.search(s) and current:
            # The run stopped inside this case (nvbandwidth exits after an assertion).
            shown = s if len(s) <= 120 else s[:117] + "..."
            builder.waived(current, "Error", "; ".join(since_running[:2] + [shown]))
            current = None
        elif m := _WAIVING.match(s):
            builder.waived(m.group(1), "Waived", "")
            current = None
        elif (m := _STATUS.match(s)) and current:
            builder.waived(current, m.group(1), m.group(2))
            current = None
        elif m := _SUM.match(s):
            builder.total(m.group(1), parse_float(m.group(2), name, i + 1, "a SUM value"))
        elif current and s and not _DESC.search(s) and not _SUM.match(s):
            since_running.append(s)
        elif _DESC.search(s):
            if current is None:
                # A matrix pasted without its 'Running' line: the SUM line after it names it.
                current = _name_from_sum(lines, i + 1) or "unnamed_testcase"
            rows, i = _read_rows(lines, i + 1, name, s)
            try:
                builder.matrix(current, s, rows, f"line {i}")
            except ValueError as exc:
                fail(name, i, str(exc))
            continue
        i += 1
    if not builder.cases:
        fail(name, None, "an nvbandwidth test case ('Running <testcase>.' and its matrix)")
    _finish(result, builder)
    return result


def _name_from_sum(lines: list[str], i: int) -> str | None:
    for line in lines[i:]:
        s = line.strip()
        if _RUNNING.match(s) or _DESC.search(s):
            return None
        if m := _SUM.match(s):
            return m.group(1)
    return None


def _read_rows(lines: list[str], i: int, name: str, desc: str) -> tuple[list[list[str]], int]:
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        fail(name, i, f"the column header after '{desc}' (the file ends here)")
    head = lines[i].split()
    if not head or not all(t.isdigit() for t in head):
        fail(name, i + 1, f"a column header '0 1 ...' after '{desc}'", got=lines[i])
    n = len(head)
    rows: list[list[str]] = []
    k = i + 1
    while k < len(lines) and lines[k].strip():
        cells = lines[k].split()
        if not cells[0].isdigit() or int(cells[0]) != len(rows):
            if rows:
                break
            fail(name, k + 1, f"row 0 of the matrix '{desc}'", got=lines[k])
        if len(cells) - 1 != n:
            fail(name, k + 1, f"{n} values in row {cells[0]} of '{desc}'", got=lines[k])
        for c in cells[1:]:
            if c.upper() != "N/A":
                parse_float(c, name, k + 1, f"a number or N/A in row {cells[0]} of '{desc}'")
        rows.append(cells[1:])
        k += 1
    if not rows:
        fail(name, k + 1, f"row 0 of the matrix '{desc}' (the matrix is cut short)",
             got=lines[k] if k < len(lines) else "")
    return rows, k


def parse_nvbandwidth_json(text: str, name: str = "<nvbandwidth.json>") -> Parsed:
    """Parse nvbandwidth's JSON output (`-j`); warning lines before or after it are skipped.

    Args:
        text: the output.
        name: file name for messages.

    Returns:
        Parsed as for the text output.

    Raises:
        BadInput: invalid or truncated JSON (with the line of the problem), or a JSON document
            that is not nvbandwidth's (no `nvbandwidth.testcases`).
    """
    start = _json_start(text)
    if start is None:
        fail(name, None, "a JSON object starting with '{' on its own line")
    try:
        doc, _end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        fail(name, exc.lineno, f"valid JSON ({exc.msg})")
    root = doc.get("nvbandwidth") if isinstance(doc, dict) else None
    line_of_start = text.count("\n", 0, start) + 1
    if not isinstance(root, dict) or not isinstance(root.get("testcases"), list):
        fail(name, line_of_start, "an object {\"nvbandwidth\": {\"testcases\": [...]}}")
    result = Parsed(format="nvbandwidth-json", name=name)
    for key, fact in (("version", "version"), ("Driver Version", "driver_version"),
                      ("CUDA Runtime Version", "cuda_runtime_version"), ("error", "error"),
                      ("warning", "warning")):
        if key in root:
            result.facts[fact] = root[key]
    size = root.get("bufferSize")
    builder = _Builder(result, size_bytes=int(size) if isinstance(size, (int, float)) else 0)
    for n, case in enumerate(root["testcases"]):
        if not isinstance(case, dict) or "name" not in case:
            fail(name, line_of_start, f"testcase {n} to be an object with a 'name'")
        status = str(case.get("status", ""))
        testcase = str(case["name"])
        if status != "Passed":
            builder.waived(testcase, status or "Error", str(case.get("error", "")))
            continue
        matrix = case.get("bandwidth_matrix")
        desc = str(case.get("bandwidth_description", ""))
        if not isinstance(matrix, list) or not matrix or not all(isinstance(r, list) for r in matrix):
            fail(name, line_of_start, f"a bandwidth_matrix (list of rows) in testcase '{testcase}'")
        try:
            rows = [[str(c) for c in r] for r in matrix]
            for r in rows:
                for c in r:
                    if c.upper() != "N/A":
                        float(c)
            builder.matrix(testcase, desc, rows, f"testcase '{testcase}'")
        except ValueError as exc:
            fail(name, line_of_start, f"numbers or N/A and {exc}" if "description" in str(exc)
                 else f"numbers or N/A in the bandwidth_matrix of '{testcase}'", got=str(exc))
        if "sum" in case:
            result.facts.setdefault("sums", {})[testcase] = case["sum"]
            if _kind(testcase) == "concurrent":
                builder.total(testcase, float(case["sum"]))
    _finish(result, builder)
    return result


def _json_start(text: str) -> int | None:
    m = re.search(r"^\s*\{", text, re.M)
    return None if m is None else m.start() + m.group(0).index("{")


def _finish(result: Parsed, builder: _Builder) -> None:
    result.facts["testcases"] = dict(builder.cases)
    passed = sum(1 for s in builder.cases.values() if s == "Passed")
    others = {s for s in builder.cases.values() if s != "Passed"}
    result.summary = (f"nvbandwidth: {len(builder.cases)} test cases ({passed} passed"
                      + (", " + ", ".join(f"{sum(1 for v in builder.cases.values() if v == s)} "
                                          f"{s.lower()}" for s in sorted(others)) if others else "")
                      + f"), {len(result.p2p)} p2p rows, {len(result.concurrent)} concurrent rows")
