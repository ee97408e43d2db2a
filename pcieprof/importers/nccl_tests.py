"""nccl-tests (`all_reduce_perf` and the other `*_perf` collectives): devices and result rows.

Layouts handled (NVIDIA/nccl-tests src/common.cu over the years):
- the header `# nThread 1 nGpus 6 minBytes ... warmup iters: 5 iters: 20 ...`; newer versions
  add `# nccl-tests version 2.18.3 ...` and `# Collective test starting: all_reduce_perf`;
- device lines, old `#   Rank  0 Pid  71327 on host device  0 [0x1a] Tesla V100-SXM3-32GB`
  and new `#  Rank  0 Group  0 Pid  14010 on host device  0 [0000:06:00] NVIDIA ...`, possibly
  prefixed by mpirun's `[1,0]<stdout>:` or Slurm's `srun --label` `0: `;
- the column header with `redop` and `root` (or older without `root`), and `#wrong` (or the old
  floating-point `error` column), out-of-place then in-place;
- the oldest header `#  bytes  N  type  op  [root]  time  algbw  busbw  res` (nccl-tests of the
  NCCL 2.0-2.4 years and NCCL 1's `*_test`): its time column is in milliseconds (the code printed
  `deltaSec * 1.0E3`; NVIDIA/nccl issue #25, a maintainer: "10M should be done in 1.6
  milliseconds (not microseconds)"), turned into microseconds here; its device lines are
  `#   Rank  0 on host device  0 [0x05] ...` (no Pid), `#   Rank  0 uses device  0 [0x05] ...`
  or NCCL 1's `#   Device  0 ->  0 [0x0a] ...`;
- `# Avg bus bandwidth    : 24.5413` closing each run.

The collective is named by `# Collective test starting: X_perf`, else by the command line pasted
before the output (`./build/alltoall_perf -b 8 ...`, `mpirun ... broadcast_perf ...`), else
inferred from the rows (all-reduce: a reduction, root -1, count x type size == size, and the
in-place half checked like the out-of-place one: sendrecv and alltoall print `N/A` there).
Rows of one run with other reductions than sum (`-o all`) carry the reduction in their variant,
so a curve never mixes sum with prod/max/min.

As people paste it, a block often lacks its header, its device lines, its column header or its
trailer. The complete rows are kept and one warning line says what was missing: rows are known
by their shape alone (size, count, an nccl-tests type name, then numbers), the layout is then
read from the rows, and a missing rank count is worked out from busbw/algbw where the
collective's bus factor allows (all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n).
Only a row cut short at the very end of the file is dropped (with the warning); a malformed row
anywhere else is an error naming its line.
NCCL INFO lines mixed into the output are ignored here (the importer hands them to nccl_log).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from pcieprof.importers._text import clean_lines, fail, head_lines, parse_float, parse_int
from pcieprof.importers.records import CollectiveRecord, GpuRecord, Parsed
from pcieprof.importers.topology import flat_tree_evidence

_LINE_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d+: )")
_HEADER = re.compile(r"^#?\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\b(.*)$")
_ITERS = re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\w+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
_NCCL_VERSION = re.compile(r"^NCCL version\s+(\S+)")
_DEVICE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+(\d+)\s+)?on\s+(\S+)\s+"
                     r"device\s+(\d+)\s+\[([^\]]*)\]\s*(.*)$")
#: Device lines without a host: `Rank 0 uses device 0 [0x05] name` and NCCL 1's
#: `Device 0 -> 0 [0x0a] name` (rank, then CUDA device).
_DEVICE_NO_HOST = re.compile(r"^#?\s*(?:Rank\s+(\d+)\s+uses device|Device\s+(\d+)\s+->)\s+(\d+)\s+"
                             r"\[([^\]]*)\]\s*(.*)$")
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(\S+)")
#: How a test stops (src/common.h NCCLCHECK/CUDACHECK/TESTCHECK; NCCL 1's `NCCL failure`):
#: `host: Test NCCL failure common.cu:1204 'unhandled cuda error ...'`, ` .. host pid N: Test
#: failure common.cu:915`, `Test CUDA failure common.cu:730 'unknown error'`.
_FAILURE = re.compile(r"(?:^|\s|:)(?:Test (?:NCCL |CUDA )?failure|NCCL failure) \S+:\d+")
#: The end-of-run count of values written outside the result buffers (`OK` or `FAILED`).
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")
#: The column header; versions of 2019-2020 printed it (and the trailer) without the `#`.
_COLUMNS = re.compile(r"^#?\s+(?:size\s+count|bytes\s+N)\s+type\b")
#: The old header's names -> today's (`op` was the reduction, `res` the max error).
_OLD_NAMES = {"bytes": "size", "N": "count", "op": "redop", "res": "error"}
#: A command line that starts a test: the binary (`*_perf` of nccl-tests, `*_test` of NCCL 1)
#: with a path, options or nothing after it; compiler and make lines naming the binary are not.
_COMMAND = re.compile(r"(?:^|[\s/=])(all_reduce|all_gather|broadcast|reduce_scatter|reduce|alltoall|"
                      r"alltoallv|sendrecv|scatter|gather|hypercube)_(?:perf|test)(?:_mpi)?(?=\s|$)")
_NOT_COMMAND = re.compile(r"^\s*(?:Linking|Compiling|make\b|gcc\b|nvcc\b)|\s>\s")

#: nccl-tests type names (test_typenames in src/common.cu: NCCL 2 names, bfloat16 from NCCL
#: 2.10, the fp8 names of recent versions; `char`/`int` of NCCL 1) -> pcieprof dtype names.
DTYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64",
          "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
          "int64": "int64", "uint64": "uint64", "int": "int32", "char": "int8",
          "f8e4m3": "fp8_e4m3", "f8e5m2": "fp8_e5m2"}
_TYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "uint8": 1,
               "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "int": 4, "char": 1,
               "f8e4m3": 1, "f8e5m2": 1}
#: The largest `error` (max deviation) nccl-tests accepted per type before it counted #wrong
#: (DeltaMaxValue in src/common.cu of those versions: half 1e-2 or 5e-2, bfloat16 1e-2, float
#: 1e-5, double 1e-12, integers 1e-200 i.e. none); the lenient value is kept.
_ERROR_BOUND = {"fp16": 5e-2, "bf16": 1e-2, "fp32": 1e-5, "fp64": 1e-12}
#: Reduction names (test_opnames) and `none` of the collectives that do not reduce.
REDOPS = ("sum", "prod", "max", "min", "avg", "mulsum", "premulsum", "none")
#: busbw = algbw * factor(n) (nccl-tests doc/PERFORMANCE.md) for the collectives whose factor
#: depends on n: solve for n.
_BUS_FACTOR = {"all_reduce": lambda r: 2 / (2 - r), "all_gather": lambda r: 1 / (1 - r),
               "reduce_scatter": lambda r: 1 / (1 - r)}


def _strip(line: str) -> str:
    return _LINE_PREFIX.sub("", line, count=1)


def looks_like(text: str) -> bool:
    """True for nccl-tests output: its header, column header or average line, or two result
    rows of its shape (a block pasted without header and trailer)."""
    for line in head_lines(text)[:3000]:
        s = _strip(line)
        if _HEADER.match(s) or _COLUMNS.match(s) or _AVG.match(s) or _STARTING.match(s):
            return True
        if _row_layout(s.split()) is not None:
            return True
    return False


@dataclass
class _Run:
    collective: str | None = None
    iters: int = 0
    has_header: bool = False
    ranks: dict[int, tuple[str, int, str, str]] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)
    column_line: int = 0
    rows: list[tuple[int, list[str]]] = field(default_factory=list)
    #: microseconds per unit of the time column (1000 for the old milliseconds layout)
    time_scale: float = 1.0
    out_of_bounds: int | None = None
    command_ranks: int = 0
    avg_busbw: float | None = None
    header_line: int = 0
    dropped: list[int] = field(default_factory=list)


def _row_layout(tokens: list[str]) -> tuple[bool, bool, str] | None:
    """(has redop, has root, name of the 4th field of a half) read from a row's own tokens, for
    a block without its column header; None when the tokens are no nccl-tests result row (size,
    count, a type name, [redop], [root], then 2 x time algbw busbw #wrong|error)."""
    lead = len(tokens) - 8
    if (lead not in (3, 4, 5) or not tokens[0].isdigit() or not tokens[1].isdigit()
            or tokens[2] not in DTYPES):
        return None
    has_redop = lead >= 4 and tokens[3] in REDOPS
    has_root = lead == 5 or (lead == 4 and not has_redop)
    if lead == 5 and not has_redop:
        return None
    wrong = tokens[lead + 3]
    name = "#wrong" if wrong.isdigit() or wrong.upper() == "N/A" else "error"
    return has_redop, has_root, name


def parse_nccl_tests(text: str, name: str = "<nccl-tests>") -> Parsed:
    """Parse nccl-tests output (one or several runs, complete or as pasted).

    Args:
        text: the output.
        name: file name for messages.

    Returns:
        Parsed with two CollectiveRecords per complete table row (out-of-place, in-place), the
        GPUs of the first host, facts per run (collective, nranks, avg busbw, nccl-tests/NCCL
        versions), and in `facts["warnings"]` one line saying what the block lacked.

    Raises:
        BadInput: no result row at all, a row with the wrong number of fields or a non-number
            where one belongs (anywhere but a row cut off at the end of the file), a column
            header without rows.
    """
    lines = [_strip(l) for l in clean_lines(text)]
    last_content = max((i for i, l in enumerate(lines, start=1) if l.strip()), default=0)
    scan = _Scan(name)
    for i, line in enumerate(lines, start=1):
        scan.line(i, line.rstrip(), last_content)
    failures, facts = scan.failures, scan.facts
    devices = next((r for r in scan.runs if r.ranks), None)
    # A test that stopped with an error may leave a column header without rows (nothing was
    # cut: the failure line says why); only the runs with rows are kept then.
    runs = [r for r in scan.runs if r.rows or (r.columns and not failures)]
    if not runs and not failures:
        fail(name, None, "an nccl-tests result table (the '#  size  count  type ...' header or "
             "rows like '1024  256  float  sum  -1  61.09  0.02 ...')")
    result = Parsed(format="nccl-tests", name=name)
    run_facts = []
    missing: list[str] = []
    for n, r in enumerate(runs, start=1):
        _rows_of(r, n, len(runs), name, result, last_content, missing)
        run_facts.append({"collective": r.collective or "unknown", "nranks": _nranks(r),
                          "rows": len(r.rows), "avg_busbw_gbps": r.avg_busbw, "iters": r.iters}
                         | ({"out_of_bounds": r.out_of_bounds}
                            if r.out_of_bounds is not None else {}))
    first = next((r for r in runs if r.ranks), devices)
    if first is not None and first.ranks:
        _gpus_of(first, name, result, facts)
    facts["runs"] = run_facts
    if failures:
        facts["failures"] = failures[:20]
    warnings = _warnings(name, runs, missing, failures)
    if warnings:
        facts["warnings"] = warnings
    result.facts = facts
    result.summary = _summary(run_facts, failures)
    return result


class _Scan:
    """One pass over the lines: a handler per kind of line, each saying whether it took it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.runs: list[_Run] = []
        self.run: _Run | None = None
        self.facts: dict[str, Any] = {}
        self.failures: list[dict[str, Any]] = []
        self.pending: str | None = None  # the collective of a command line, for the next run
        self.pending_ranks = 0  # the ranks that command line starts (0: it does not say)

    def line(self, i: int, s: str, last_content: int) -> None:
        """Take line `i` (stripped of its launcher prefix and trailing blanks)."""
        for handler in (self.failure, self.out_of_bounds, self.command, self.version,
                        self.starting, self.header, self.device, self.columns, self.average):
            if handler(i, s):
                return
        self.row(i, s, last_content)

    def start(self, **kw: Any) -> _Run:
        new = _Run(**kw)
        new.collective = new.collective or self.pending
        new.command_ranks = self.pending_ranks
        self.pending, self.pending_ranks = None, 0
        self.runs.append(new)
        self.run = new
        return new

    def failure(self, i: int, s: str) -> bool:
        if not _FAILURE.search(s):
            return False
        self.failures.append({"line": i, "text": s.strip()[:200]})
        return True

    def out_of_bounds(self, _i: int, s: str) -> bool:
        if not (m := _OOB.match(s)) or self.run is None:
            return False
        self.run.out_of_bounds = int(m.group(1))
        return True

    def command(self, _i: int, s: str) -> bool:
        if s.lstrip().startswith("#") or not (m := _COMMAND.search(s)) or _NOT_COMMAND.search(s):
            return False
        self.pending = m.group(1)
        self.pending_ranks = _command_ranks(s[:m.start()].split(), s[m.end():].split())
        return True

    def version(self, _i: int, s: str) -> bool:
        if m := _VERSION.match(s):
            self.facts.setdefault("nccl_tests_version", m.group(1))
            return True
        if m := _NCCL_VERSION.match(s.strip()):
            self.facts.setdefault("nccl_version", m.group(1))
            return True
        return False

    def starting(self, i: int, s: str) -> bool:
        if not (m := _STARTING.match(s)):
            return False
        self.pending = None
        self.start(collective=_strip_perf(m.group(1)), header_line=i)
        return True

    def header(self, i: int, s: str) -> bool:
        if not (m := _HEADER.match(s)):
            return False
        run = self.run
        if run is None or run.columns or run.iters or run.rows:
            run = self.start(header_line=i, collective=None)
        run.has_header = True
        it = _ITERS.search(m.group(3))
        run.iters = int(it.group(1)) if it else 0
        return True

    def device(self, i: int, s: str) -> bool:
        device = _DEVICE.match(s.strip())
        no_host = None if device else _DEVICE_NO_HOST.match(s.strip())
        if not device and not no_host:
            return False
        run = self.run
        if run is None or run.rows:
            run = self.start(header_line=i)
        if device:
            rank, _pid, host, dev, bus, gpu = device.groups()
        else:
            assert no_host is not None
            rank_a, rank_b, dev, bus, gpu = no_host.groups()
            rank, host = rank_a or rank_b, ""
        run.ranks.setdefault(int(rank), (host, int(dev), bus, gpu.strip()))
        return True

    def columns(self, i: int, s: str) -> bool:
        if not _COLUMNS.match(s):
            return False
        run = self.run
        if run is None or run.columns or run.rows:
            # another table: the header and device lines above it still apply
            run = self.start(header_line=i, collective=run.collective if run else None,
                             iters=run.iters if run else 0,
                             has_header=bool(run and run.has_header),
                             ranks=dict(run.ranks) if run else {})
        names = s.lstrip("#").split()
        run.columns = [_OLD_NAMES.get(c, c) for c in names]
        run.time_scale = 1000.0 if names[0] == "bytes" else 1.0
        run.column_line = i
        return True

    def average(self, i: int, s: str) -> bool:
        if not (m := _AVG.match(s)):
            return False
        if self.run is None or not self.run.rows:
            fail(self.name, i, "result rows before '# Avg bus bandwidth'", got=s)
        self.run.avg_busbw = parse_float(m.group(1), self.name, i,
                                         "the average bus bandwidth (GB/s)")
        return True

    def row(self, i: int, s: str, last_content: int) -> None:
        tokens = s.split()
        if not tokens or not tokens[0].isdigit():
            return
        run = self.run
        if run is not None and run.columns:
            run.rows.append((i, tokens))
        elif _row_layout(tokens) is not None:
            if run is None or run.avg_busbw is not None:
                run = self.start(header_line=i)
            run.rows.append((i, tokens))
        elif run is not None and run.rows and i == last_content:
            run.dropped.append(i)  # the start of a row, cut where the file ends


def _gpus_of(first: _Run, name: str, result: Parsed, facts: dict[str, Any]) -> None:
    """The GPUs of the first host of a run with device lines, into `result.gpus`; the hosts and
    a flat (VM) PCIe tree into `facts`."""
    host0 = first.ranks[min(first.ranks)][0]
    seen: set[int] = set()
    for rank in sorted(first.ranks):
        host, dev, bus, gpu = first.ranks[rank]
        if host == host0 and dev not in seen:
            seen.add(dev)
            result.gpus.append(GpuRecord(dev, gpu or None, _bus_id(bus)))
    ids = [g.bus_id for g in result.gpus]
    flat = flat_tree_evidence(ids, name)
    if flat:
        facts["flat_pcie_tree"] = flat
    # `[0x00]` is the bus number alone: GPUs of one host sharing it sit on one bus (a VM's
    # root bus) at device numbers the line does not give, so no bus id is known for them.
    shared = {b for b in ids if b and ids.count(b) > 1}
    result.gpus = [replace(g, bus_id=None) if g.bus_id in shared else g for g in result.gpus]
    hosts = sorted({v[0] for v in first.ranks.values() if v[0]})
    if hosts:
        facts["hosts"] = hosts


def _warnings(name: str, runs: list[_Run], missing: list[str],
              failures: list[dict[str, Any]]) -> list[str]:
    """One line each: what the block lacked, the error that stopped the test, values written
    out of bounds."""
    warnings: list[str] = []
    if missing:
        kept = sum(len(r.rows) for r in runs)
        warnings.append(f"{name}: {kept} complete rows kept; not in the file: "
                        + "; ".join(dict.fromkeys(missing)))
    if failures:
        after = "sizes after the last row were not run" if runs else "no size was run"
        warnings.append(f"{name}:{failures[0]['line']}: the test stopped with an error "
                        f"({failures[0]['text'][:120]}); {after}")
    for r in runs:
        if r.out_of_bounds:
            warnings.append(f"{name}: nccl-tests counted {r.out_of_bounds} values written outside "
                            f"the result buffers (Out of bounds values: FAILED) in the "
                            f"{r.collective or 'unknown'} run")
    return warnings


def _summary(run_facts: list[dict[str, Any]], failures: list[dict[str, Any]]) -> str:
    return "nccl-tests: " + ("; ".join(
        f"{f['collective']} x{f['nranks'] or '?'} ranks, {f['rows']} sizes"
        + (f", avg busbw {f['avg_busbw_gbps']} GB/s" if f["avg_busbw_gbps"] is not None else "")
        for f in run_facts) or "no result rows") + (
        f"; failed: {failures[0]['text'][:80]}" if failures else "")


def _strip_perf(s: str) -> str:
    s = re.sub(r"_perf(_mpi)?$", "", s)
    return s


def _layout(run: _Run, name: str) -> tuple[bool, bool, str]:
    """(has redop, has root, #wrong|error) of a run, from its column header or its first row."""
    if run.columns:
        cols = run.columns
        return "redop" in cols, "root" in cols, "#wrong" if "#wrong" in cols else "error"
    lineno, tokens = run.rows[0]
    layout = _row_layout(tokens)
    if layout is None:
        fail(name, lineno, "an nccl-tests result row (size count type [redop] [root] time algbw "
             "busbw #wrong, out-of-place and in-place)", got=" ".join(tokens))
    return layout


def _rows_of(run: _Run, n: int, nruns: int, name: str, result: Parsed, last_content: int,
             missing: list[str]) -> None:
    if not run.rows:
        fail(name, run.column_line + 2, "result rows under the column header (the file is cut "
             "short)")
    has_redop, has_root, wrong_name = _layout(run, name)
    lead = 3 + has_redop + has_root  # size count type [redop] [root]
    half = 4  # time algbw busbw #wrong|error
    want = lead + 2 * half
    if len(run.rows[-1][1]) < want and run.rows[-1][0] == last_content and len(run.rows) > 1:
        run.dropped.append(run.rows.pop()[0])  # the file ends inside its last row
    if not run.has_header:
        missing.append("the '# nThread ... iters: N' header (timed iterations unknown)")
    if not run.ranks:
        missing.append("the '#  Rank ... device ...' lines (GPUs unknown)")
    if not run.columns:
        missing.append("the column header (layout read from the rows)")
    if run.avg_busbw is None:
        missing.append("the '# Avg bus bandwidth' trailer")
    for lineno in run.dropped:
        missing.append(f"the end of the row at line {lineno} (cut short, dropped)")
    parsed_rows = []
    # sendrecv and alltoall do not check their in-place half (`args->reportErrors = in_place ? 0
    # : 1` in nccl-tests src/sendrecv.cu): N/A there under a checked out-of-place half is no
    # all-reduce, whatever its redop column says.
    inplace_unchecked = bool(run.rows) and all(
        len(tok) == want and tok[lead + 3].upper() != "N/A" and tok[lead + 7].upper() == "N/A"
        for _lineno, tok in run.rows)
    for lineno, tok in run.rows:
        if len(tok) != want:
            fail(name, lineno, f"{want} fields (size count type"
                 f"{' redop' if has_redop else ''}{' root' if has_root else ''} then time algbw "
                 f"busbw {wrong_name}, out-of-place and in-place)", got=" ".join(tok))
        size = parse_int(tok[0], name, lineno, "the size in bytes")
        count = parse_int(tok[1], name, lineno, "the element count")
        redop = tok[3] if has_redop else None
        root = parse_int(tok[3 + has_redop], name, lineno, "the root rank") if has_root else None
        run.collective = run.collective or _infer(size, count, tok[2], redop, root,
                                                  inplace_unchecked)
        parsed_rows.append((lineno, tok, size, redop))
    nranks = _nranks(run)
    note = ("" if run.ranks or not nranks
            else f"; {nranks} ranks from the command line" if run.command_ranks
            else f"; {nranks} ranks worked out from busbw/algbw")
    collective = run.collective or "unknown"
    for lineno, tok, size, redop in parsed_rows:
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
                if wrong_tok.upper() != "N/A":
                    dtype = DTYPES.get(tok[2], tok[2])
                    bound = _ERROR_BOUND.get(dtype, 0.0)
                    if parse_float(wrong_tok, name, lineno, "the max error") > bound:
                        status = "error"
                        extra += f", above nccl-tests' bound {bound:g} for {dtype}: wrong data"
            variant = ("imported:" + (f"{collective}:" if collective != "all_reduce" else "")
                       + place + (f":{redop}" if redop not in (None, "sum", "none") else "")
                       + (f":run{n}" if nruns > 1 else ""))
            result.collectives.append(CollectiveRecord(
                variant=variant, collective=collective, nranks=nranks, size_bytes=size,
                dtype=DTYPES.get(tok[2], tok[2]),
                time_us=_scaled(_opt_float(t, name, lineno, "the time"), run.time_scale),
                algbw_gbps=_opt_float(alg, name, lineno, "algbw in GB/s"),
                busbw_gbps=_opt_float(bus, name, lineno, "busbw in GB/s"),
                wrong=wrong, iters=run.iters, status=status,
                detail=f"nccl-tests {collective}_perf, {place.replace('_', '-')}, line {lineno}"
                       + (f", redop {redop}" if redop else "") + extra + note
                       + ("; time printed in ms (old layout), stored in us"
                          if run.time_scale != 1.0 else "")))


def _nranks(run: _Run) -> int:
    """Ranks of a run: its device lines, else busbw/algbw of its largest row (0: unknown)."""
    if run.ranks:
        return len(run.ranks)
    if run.command_ranks:
        return run.command_ranks
    solve = _BUS_FACTOR.get(run.collective or "")
    if solve is None or not run.rows:
        return 0
    best: tuple[float, float] | None = None
    for _lineno, tok in run.rows:
        lead = len(tok) - 8
        try:
            alg, bus = float(tok[lead + 1]), float(tok[lead + 2])
        except (ValueError, IndexError):
            continue
        if alg > 0 and (best is None or alg > best[0]):
            best = (alg, bus)
    if best is None or best[0] < 1.0:  # two decimals of a small figure cannot tell n
        return 0
    ratio = best[1] / best[0]
    try:
        n = solve(ratio)
    except ZeroDivisionError:
        return 0
    return round(n) if n >= 2 and abs(n - round(n)) < 0.15 else 0


def _command_ranks(before: list[str], after: list[str]) -> int:
    """Ranks a pasted command line starts: processes (mpirun/mpiexec/srun `-np N`, 1 without a
    launcher) x threads (`-t`) x GPUs per thread (`-g`, 1 when not given); 0 when a launcher's
    process count is not on the line (a hostfile, `-N` nodes with tasks per node)."""
    def value(tokens: list[str], names: tuple[str, ...]) -> int | None:
        for k, t in enumerate(tokens):
            for n in names:
                if t == n and k + 1 < len(tokens) and tokens[k + 1].isdigit():
                    return int(tokens[k + 1])
                if t.startswith(n + "=") and t[len(n) + 1:].isdigit():
                    return int(t[len(n) + 1:])
        return None
    launcher = any(re.search(r"(?:^|/)(?:mpirun|mpiexec|srun)$", t) for t in before)
    procs = value(before, ("-np", "-n", "--np", "--n", "--ntasks")) if launcher else 1
    if procs is None:
        return 0
    if launcher and value(before, ("-N", "--nodes", "-npernode", "--npernode",
                                   "--ntasks-per-node")) is not None:
        return 0  # nodes x tasks per node: not worked out here
    return procs * (value(after, ("-t", "--nthreads")) or 1) * (value(after, ("-g", "--ngpus")) or 1)


def _opt_float(tok: str, name: str, lineno: int, what: str) -> float | None:
    if tok.upper() == "N/A":
        return None
    return parse_float(tok, name, lineno, what)


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else round(value * scale, 6)


def _infer(size: int, count: int, ctype: str, redop: str | None, root: int | None,
           inplace_unchecked: bool = False) -> str:
    """The collective of an old output that does not name it (an assumption, said in detail)."""
    ts = _TYPE_BYTES.get(ctype)
    if (redop not in (None, "none") and root in (None, -1) and ts and count * ts == size
            and not inplace_unchecked):
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
