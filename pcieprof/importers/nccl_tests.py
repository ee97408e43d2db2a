"""nccl-tests (`all_reduce_perf` and the other `*_perf` collectives): devices and result rows.

Layouts handled (NVIDIA/nccl-tests src/common.cu over the years):
- the header `# nThread 1 nGpus 6 minBytes ... warmup iters: 5 iters: 20 ...`; newer versions
  add `# nccl-tests version 2.18.3 ...` and `# Collective test starting: all_reduce_perf`;
- device lines, old `#   Rank  0 Pid  71327 on host device  0 [0x1a] Tesla V100-SXM3-32GB`
  and new `#  Rank  0 Group  0 Pid  14010 on host device  0 [0000:06:00] NVIDIA ...`, possibly
  prefixed by mpirun's `[1,0]<stdout>:`;
- the column header with `redop` and `root` (or older without `root`), and `#wrong` (or the old
  floating-point `error` column), out-of-place then in-place;
- `# Avg bus bandwidth    : 24.5413` closing each run (its absence means a truncated file).
NCCL INFO lines mixed into the output are ignored here (the importer hands them to nccl_log).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pcieprof.importers._text import fail, parse_float, parse_int, split_lines
from pcieprof.importers.records import CollectiveRecord, GpuRecord, Parsed

_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_HEADER = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\b(.*)$")
_ITERS = re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\w+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
_NCCL_VERSION = re.compile(r"^NCCL version\s+(\S+)")
_DEVICE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+"
                     r"device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_COLUMNS = re.compile(r"^#\s+size\s+count\s+type\b")

#: nccl-tests type names -> the dtype names pcieprof rows use.
DTYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64",
          "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
          "int64": "int64", "uint64": "uint64", "int": "int32"}
_TYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "uint8": 1,
               "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "int": 4}


def looks_like(text: str) -> bool:
    """True for nccl-tests output: its header, device lines, column header or average line."""
    for line in split_lines(text)[:3000]:
        s = _MPI_PREFIX.sub("", line)
        if _HEADER.match(s) or _COLUMNS.match(s) or _AVG.match(s) or _STARTING.match(s):
            return True
    return False


@dataclass
class _Run:
    collective: str | None = None
    iters: int = 0
    ranks: dict[int, tuple[str, int, str, str]] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)
    column_line: int = 0
    rows: list[tuple[int, list[str]]] = field(default_factory=list)
    avg_busbw: float | None = None
    header_line: int = 0


def parse_nccl_tests(text: str, name: str = "<nccl-tests>", *, require_complete: bool = True
                     ) -> Parsed:
    """Parse nccl-tests output (one or several runs).

    Args:
        text: the output.
        name: file name for messages.
        require_complete: refuse a run without its closing `# Avg bus bandwidth` line (a
            truncated file); False accepts an excerpt cut at a row boundary.

    Returns:
        Parsed with two CollectiveRecords per table row (out-of-place, in-place), the GPUs of the
        first host, and facts per run (collective, nranks, avg busbw, nccl-tests/NCCL versions).

    Raises:
        BadInput: a row with the wrong number of fields or a non-number where one belongs, a
            column header without rows, or (require_complete) a run cut before its average line.
    """
    lines = [_MPI_PREFIX.sub("", l) for l in split_lines(text)]
    runs: list[_Run] = []
    run: _Run | None = None
    facts: dict[str, Any] = {}
    for i, line in enumerate(lines, start=1):
        s = line.rstrip()
        if m := _VERSION.match(s):
            facts.setdefault("nccl_tests_version", m.group(1))
            continue
        if m := _NCCL_VERSION.match(s.strip()):
            facts.setdefault("nccl_version", m.group(1))
            continue
        if m := _STARTING.match(s):
            run = _Run(collective=_strip_perf(m.group(1)), header_line=i)
            runs.append(run)
            continue
        if m := _HEADER.match(s):
            if run is None or run.columns or run.iters:
                run = _Run(header_line=i, collective=None)
                runs.append(run)
            it = _ITERS.search(m.group(3))
            run.iters = int(it.group(1)) if it else 0
            continue
        if m := _DEVICE.match(s.strip()):
            if run is None:
                run = _Run(header_line=i)
                runs.append(run)
            rank, _pid, host, dev, bus, gpu = m.groups()
            run.ranks.setdefault(int(rank), (host, int(dev), bus, gpu))
            continue
        if _COLUMNS.match(s):
            if run is None or run.columns:
                run = _Run(header_line=i, collective=run.collective if run else None,
                           iters=run.iters if run else 0, ranks=dict(run.ranks) if run else {})
                runs.append(run)
            run.columns = s.lstrip("#").split()
            run.column_line = i
            continue
        if m := _AVG.match(s):
            if run is None or not run.columns:
                fail(name, i, "a column header and rows before '# Avg bus bandwidth'", got=s)
            run.avg_busbw = parse_float(m.group(1), name, i, "the average bus bandwidth (GB/s)")
            continue
        tokens = s.split()
        if tokens and tokens[0].isdigit() and run is not None and run.columns:
            run.rows.append((i, tokens))
    runs = [r for r in runs if r.columns or r.rows]
    if not runs:
        fail(name, None, "an nccl-tests result table (the '#  size  count  type ...' header)")
    result = Parsed(format="nccl-tests", name=name)
    run_facts = []
    for n, r in enumerate(runs, start=1):
        _rows_of(r, n, len(runs), name, result, require_complete)
        run_facts.append({"collective": r.collective or "unknown", "nranks": len(r.ranks),
                          "rows": len(r.rows), "avg_busbw_gbps": r.avg_busbw, "iters": r.iters})
    first = runs[0]
    if first.ranks:
        host0 = first.ranks[min(first.ranks)][0]
        seen: set[int] = set()
        for rank in sorted(first.ranks):
            host, dev, bus, gpu = first.ranks[rank]
            if host == host0 and dev not in seen:
                seen.add(dev)
                result.gpus.append(GpuRecord(dev, gpu or None, _bus_id(bus)))
        facts["hosts"] = sorted({v[0] for v in first.ranks.values()})
    facts["runs"] = run_facts
    result.facts = facts
    result.summary = "nccl-tests: " + "; ".join(
        f"{f['collective']} x{f['nranks']} ranks, {f['rows']} sizes"
        + (f", avg busbw {f['avg_busbw_gbps']} GB/s" if f["avg_busbw_gbps"] is not None else "")
        for f in run_facts)
    return result


def _strip_perf(s: str) -> str:
    s = re.sub(r"_perf(_mpi)?$", "", s)
    return s


def _rows_of(run: _Run, n: int, nruns: int, name: str, result: Parsed, require_complete: bool
             ) -> None:
    cols = run.columns
    if not run.rows:
        fail(name, run.column_line + 2, "result rows under the column header (the file is cut "
             "short)")
    has_redop = "redop" in cols
    has_root = "root" in cols
    lead = 3 + has_redop + has_root  # size count type [redop] [root]
    wrong_name = "#wrong" if "#wrong" in cols else "error"
    half = 4  # time algbw busbw #wrong|error
    nranks = len(run.ranks)
    for lineno, tok in run.rows:
        if len(tok) != lead + 2 * half:
            fail(name, lineno, f"{lead + 2 * half} fields (size count type"
                 f"{' redop' if has_redop else ''}{' root' if has_root else ''} then time algbw "
                 f"busbw {wrong_name}, out-of-place and in-place)", got=" ".join(tok))
        size = parse_int(tok[0], name, lineno, "the size in bytes")
        count = parse_int(tok[1], name, lineno, "the element count")
        ctype = tok[2]
        redop = tok[3] if has_redop else None
        root = parse_int(tok[3 + has_redop], name, lineno, "the root rank") if has_root else None
        collective = run.collective or _infer(size, count, ctype, redop, root)
        run.collective = collective
        for k, place in enumerate(("out_of_place", "in_place")):
            base = lead + k * half
            t, alg, bus, wrong_tok = tok[base:base + half]
            wrong: int | None = None
            status = "ok"
            extra = ""
            if wrong_name == "#wrong":
                if wrong_tok.upper() != "N/A":
                    wrong = parse_int(wrong_tok, name, lineno, "the #wrong count")
                    status = "error" if wrong > 0 else "ok"
            else:
                extra = f"; max error {wrong_tok}"
            variant = ("imported:" + (f"{collective}:" if collective != "all_reduce" else "")
                       + place + (f":run{n}" if nruns > 1 else ""))
            result.collectives.append(CollectiveRecord(
                variant=variant, collective=collective, nranks=nranks, size_bytes=size,
                dtype=DTYPES.get(ctype, ctype),
                time_us=_opt_float(t, name, lineno, "the time in us"),
                algbw_gbps=_opt_float(alg, name, lineno, "algbw in GB/s"),
                busbw_gbps=_opt_float(bus, name, lineno, "busbw in GB/s"),
                wrong=wrong, iters=run.iters, status=status,
                detail=f"nccl-tests {collective}_perf, {place.replace('_', '-')}, line {lineno}"
                       + (f", redop {redop}" if redop else "") + extra))
    if require_complete and run.avg_busbw is None:
        fail(name, run.rows[-1][0] + 1, "the '# Avg bus bandwidth' line after the last row "
             "(the file looks truncated)")


def _opt_float(tok: str, name: str, lineno: int, what: str) -> float | None:
    if tok.upper() == "N/A":
        return None
    return parse_float(tok, name, lineno, what)


def _infer(size: int, count: int, ctype: str, redop: str | None, root: int | None) -> str:
    """The collective of an old output that does not name it (an assumption, said in detail)."""
    ts = _TYPE_BYTES.get(ctype)
    if redop not in (None, "none") and root in (None, -1) and ts and count * ts == size:
        return "all_reduce"
    return "unknown"


def _bus_id(raw: str) -> str | None:
    """nccl-tests bus ids (`0x1a`, `0000:06:00`, `0002:00:01`, `0000:c1:00.0`) as 0000:bb:dd.f."""
    raw = raw.strip().lower()
    if m := re.fullmatch(r"0x([0-9a-f]+)", raw):
        return f"0000:{int(m.group(1), 16):02x}:00.0"
    if m := re.fullmatch(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?", raw):
        return f"{int(m.group(1), 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4) or 0}"
    return None
