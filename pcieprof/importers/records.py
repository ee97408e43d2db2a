"""Typed records the importers return, and how each becomes a bundle row.

Parsers never write files: they turn one tool output into these records, and
`pcieprof.importers.bundle_writer` puts them into a bundle (docs/bundle.md). Every row they
produce carries `backend=imported`, and its `detail` names the tool and the matrix or test case
the number came from, so a figure drawn from it can say where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcieprof.bundle.rows import AllReduceRow
from pcieprof.schema import Backend

IMPORTED = Backend.IMPORTED.value


def _num(v: float | None) -> float:
    return float("nan") if v is None else float(v)


@dataclass(frozen=True)
class P2PRecord:
    """One p2p.csv row: a copy bandwidth or latency between two GPUs (or a GPU and the host).

    Attributes:
        src: source GPU index (-1 for the host in h2d rows).
        dst: destination GPU index (-1 for the host in d2h rows).
        path: `p2p | host_staged | h2d | d2h`.
        direction: `uni | bi`.
        size_bytes: bytes per copy when the tool says (0 when it does not).
        bandwidth_gbps: GB/s (1e9 bytes/s), None for a latency row.
        latency_us: microseconds, None for a bandwidth row.
        status: `ok`, `waived`, `not_supported`, `error`.
        detail: tool and matrix or test case name.
    """

    src: int
    dst: int
    path: str
    direction: str
    size_bytes: int = 0
    bandwidth_gbps: float | None = None
    latency_us: float | None = None
    status: str = "ok"
    detail: str = ""

    def to_row(self) -> dict[str, Any]:
        """The p2p.csv row (columns of pcieprof.bundle.rows.P2PRow)."""
        return {"backend": IMPORTED, "src": self.src, "dst": self.dst, "path": self.path,
                "direction": self.direction, "size_bytes": self.size_bytes,
                "bandwidth_gbps": _num(self.bandwidth_gbps), "latency_us": _num(self.latency_us),
                "iters": 0, "trials": 0, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class ConcurrentRecord:
    """One concurrent.csv row: a flow of a many-copies-at-once test (flow=-1 is the aggregate).

    Attributes:
        pattern: the tool's test case name (e.g. nvbandwidth `all_to_one_write_ce`).
        op: `write` or `read`.
        flow: flow number within the pattern, -1 for the aggregate row.
        src: source GPU (-1 for the host, or for the aggregate).
        dst: destination GPU (-1 for the host, or for the aggregate).
        bandwidth_gbps: GB/s, None when not measured.
        status: `ok`, `waived`, `not_supported`.
        detail: tool and matrix description.
    """

    pattern: str
    op: str
    flow: int
    src: int
    dst: int
    size_bytes: int = 0
    bandwidth_gbps: float | None = None
    status: str = "ok"
    detail: str = ""

    def to_row(self) -> dict[str, Any]:
        """The concurrent.csv row."""
        return {"backend": IMPORTED, "pattern": self.pattern, "op": self.op, "flow": self.flow,
                "src": self.src, "dst": self.dst, "size_bytes": self.size_bytes,
                "bandwidth_gbps": _num(self.bandwidth_gbps), "iters": 0, "status": self.status,
                "detail": self.detail}


@dataclass(frozen=True)
class CollectiveRecord:
    """One allreduce.csv row from a nccl-tests table line (out-of-place or in-place half).

    Attributes:
        variant: e.g. `imported:out_of_place`; other collectives than all-reduce are named in it
            (`imported:all_gather:in_place`).
        collective: `all_reduce`, `all_gather`, ... (`unknown` when the output does not say).
        nranks: number of ranks from the device lines.
        size_bytes: the `size` column.
        dtype: `fp32`, `bf16`, ... (nccl-tests type names mapped; unknown ones kept).
        time_us: the `time` column.
        algbw_gbps, busbw_gbps: the `algbw` and `busbw` columns (GB/s as nccl-tests prints).
        wrong: the `#wrong` count (None where the column is `N/A`; the old `error` column gives
            None too, its value is kept in detail).
        iters: timed iterations from the header line (0 when not given).
        status: `ok`, or `error` when #wrong > 0.
        detail: tool, collective and the row's place in the file.
    """

    variant: str
    collective: str
    nranks: int
    size_bytes: int
    dtype: str
    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None = None
    iters: int = 0
    status: str = "ok"
    detail: str = ""

    def to_row(self) -> AllReduceRow:
        """The allreduce.csv row (ranks 0..n-1: nccl-tests prints no ring order)."""
        return AllReduceRow(backend=IMPORTED, variant=self.variant, env={},
                            nranks=self.nranks, ranks=tuple(range(self.nranks)),
                            size_bytes=self.size_bytes, dtype=self.dtype,
                            time_us=_num(self.time_us), algbw_gbps=_num(self.algbw_gbps),
                            busbw_gbps=_num(self.busbw_gbps), iters=self.iters,
                            status=self.status, detail=self.detail)


@dataclass(frozen=True)
class GpuRecord:
    """What a tool output says about one GPU (index as the tool numbers it)."""

    index: int
    name: str | None = None
    bus_id: str | None = None  # normalised "0000:04:00.0" where the tool gives enough of it


@dataclass
class Parsed:
    """Everything one file gave: the records, plus facts kept as JSON.

    Attributes:
        format: the detected format name (see pcieprof.importers.formats.FORMATS).
        name: the file name, as given.
        p2p, concurrent, collectives: table records.
        gpus: GPUs the output lists.
        pair_levels: {(a, b): level} from `nvidia-smi topo -m`.
        pair_p2p: {(a, b): {capability: status}} from `nvidia-smi topo -p2p`.
        documents: JSON documents for the bundle ({file name in the bundle: object}).
        facts: small JSON-able facts shown in the summary and kept in the manifest.
        summary: one line saying what was recognised.
    """

    format: str
    name: str
    p2p: list[P2PRecord] = field(default_factory=list)
    concurrent: list[ConcurrentRecord] = field(default_factory=list)
    collectives: list[CollectiveRecord] = field(default_factory=list)
    gpus: list[GpuRecord] = field(default_factory=list)
    pair_levels: dict[tuple[int, int], str] = field(default_factory=dict)
    pair_p2p: dict[tuple[int, int], dict[str, str]] = field(default_factory=dict)
    documents: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
