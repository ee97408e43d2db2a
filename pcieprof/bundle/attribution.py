"""attribution.json: where decode time goes, per rank and per step (pcieprof.analysis.attribution
writes it from Kineto traces; `pcieprof attribute` and serve-bench call that).

Times in microseconds. Definitions (also stored in the file's `definitions`): `comm_us`,
`compute_us`, `memory_us` are unions over all streams; `exposed_comm_us` is communication with
no compute running; `idle_us` the window minus busy time; `transfer_us` / `wait_us` split
communication into moving data and waiting for slower ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcieprof.bundle.document import Document


@dataclass(frozen=True)
class ClassRule:
    """One row of the kernel classification table (pcieprof/analysis/kernel_classes.toml, or the
    user's `--classes` file), as attribution.json `classes` stores it and the classifier uses it.

    Attributes:
        pattern: a regular expression searched in the event name.
        family: the kernel family it names (`nccl`, `gemm`, ...).
        applies_to: `gpu`, `cpu` or `any` timeline.
        source: where the name comes from.
        origin: `builtin` or the user's file.
        class_: communication | memory | compute | ignore (stored as `class`, last).
    """

    pattern: str
    family: str
    applies_to: str
    source: str
    origin: str
    class_: str


@dataclass
class RankSkew:
    """One rank's communication over the collectives every rank ran, split into moving data and
    waiting for slower ranks (attribution.json `cross_rank.per_rank[]` and `ranks[].skew`).

    Attributes:
        rank: the rank.
        matched_comm_us: its time in those collectives.
        transfer_us: the collectives' time on the fastest rank (each the minimum over ranks).
        wait_us: the rest: matched_comm_us - transfer_us.
        wait_pct: wait_us as a % of matched_comm_us, None when that is 0.
    """

    rank: int
    matched_comm_us: float = 0.0
    transfer_us: float = 0.0
    wait_us: float = 0.0
    wait_pct: float | None = None


@dataclass
class CrossRank:
    """The comparison across ranks (attribution.json `cross_rank`): the n-th call of a
    collective (same kernel and process group) on every rank is one collective.

    Attributes:
        status: `ok`, `waived` (one rank) or `not_supported` (no collective on every rank); ""
            in files written before it was stored.
        why: why not `ok` ("" when ok).
        n_collectives: collectives found on every rank.
        transfer_us: their time on the fastest rank, summed; None unless ok.
        per_rank: each rank's split.
        unmatched: rank -> its collectives not found on every rank.
    """

    status: str = ""
    why: str = ""
    n_collectives: int = 0
    transfer_us: float | None = None
    per_rank: list[RankSkew] = field(default_factory=list)
    unmatched: dict[int, int] = field(default_factory=dict)


@dataclass
class RankAttribution:
    """One rank (one trace file): totals over the traced window and its decode steps.

    Attributes:
        rank: the rank; rank_source: where it came from (the trace's distributedInfo, the file
            name, or `order`: the file's position).
        path: the trace file; file_bytes: its size.
        mode: `gpu` or `cpu` timeline.
        n_events, n_gpu_events, n_cpu_ops, n_counted: events read, on each timeline, counted
            in the window; n_dropped_bad_duration: with a negative or non-finite duration.
        window: which events count (all, or HTA's); steps_from: what the steps were found by
            (`none`: no steps, steps_note says what that means).
        n_steps: steps found.
        totals: {span_us, busy_us, idle_us, comm_us, compute_us, memory_us, exposed_comm_us, ...}.
        decode_steps: {n, mean_span_us, median_span_us, mean_comm_us, mean_exposed_comm_us,
            mean_compute_us, mean_idle_us, ...} over DECODE steps, or None.
        step_kinds: the same summary per step kind.
        skew: its communication split into transfer and wait across ranks, or None (one rank,
            or no collective on every rank).
        families: per kernel family {family, class, count, sum_us}.
        collective_args: the collectives' record_param_comms arguments as the trace gives them.
        parse_s: seconds spent reading the file; peak_rss_bytes: the reader's peak memory.
    """

    rank: int
    rank_source: str = ""
    path: str = ""
    mode: str = ""
    file_bytes: int | None = None
    n_events: int | None = None
    n_dropped_bad_duration: int = 0
    n_gpu_events: int | None = None
    n_cpu_ops: int | None = None
    n_counted: int | None = None
    window: str = ""
    steps_from: str = ""
    n_steps: int = 0
    totals: dict[str, float | None] = field(default_factory=dict)
    decode_steps: dict[str, float | None] | None = None
    step_kinds: dict[str, dict[str, float | None]] = field(default_factory=dict)
    steps_note: str | None = None
    skew: RankSkew | None = None
    families: list[dict[str, Any]] = field(default_factory=list)
    collective_args: list[dict[str, Any]] = field(default_factory=list)
    parse_s: float | None = None
    peak_rss_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepAttribution:
    """One step of one rank (a row of attribution/per_step.csv, in this order).

    Attributes:
        rank, step: which.
        name: the annotation (`step[...]`, `ProfilerStep#N`).
        kind: DECODE | EXTEND | ProfilerStep | graph.
        bs: batch size when the annotation says it, else None.
        n_events: kernels (or CPU ops) in it; gpu_start_us: its first one's start;
            cpu_span_us: the annotation's own span on the CPU timeline, when it is one.
        span_us, busy_us, idle_us, comm_us, compute_us, memory_us, comm_overlap_compute_us,
            exposed_comm_us, comm_overlap_pct: the split (pcieprof.analysis.intervals); the
            exclusive `only_*_us` of each class mix are in `extra`.
    """

    rank: int
    step: int = 0
    name: str = ""
    kind: str = ""
    bs: int | None = None
    n_events: int | None = None
    gpu_start_us: float | None = None
    cpu_span_us: float | None = None
    span_us: float | None = None
    busy_us: float | None = None
    idle_us: float | None = None
    comm_us: float | None = None
    compute_us: float | None = None
    memory_us: float | None = None
    comm_overlap_compute_us: float | None = None
    exposed_comm_us: float | None = None
    comm_overlap_pct: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class DecodeShare:
    """What share of a decode step is communication, as traced: the one answer (computed by
    pcieprof.analysis.decode_share, saved in attribution.json, read by the report and the
    analytic model's comparison).

    Attributes:
        batch: the batch size it covers, or None for every DECODE step of the trace.
        steps: DECODE steps counted (over all ranks).
        ranks: ranks they come from.
        span_us: a step's mean span (per rank the mean over its steps, then the mean over ranks).
        comm_us: its communication, the same way (union over streams).
        exposed_comm_us: communication with no compute running, the same way.
        idle_us: idle time, the same way.
    """

    batch: int | None = None
    steps: int = 0
    ranks: int = 0
    span_us: float = 0.0
    comm_us: float = 0.0
    exposed_comm_us: float = 0.0
    idle_us: float = 0.0

    def pct(self, us: float) -> float:
        """`us` as a percentage of the mean step span (0 when the span is 0)."""
        return 100.0 * us / self.span_us if self.span_us else 0.0

    @property
    def comm_pct(self) -> float:
        """Communication, % of the step."""
        return self.pct(self.comm_us)


@dataclass
class Attribution(Document):
    """attribution.json (its version tag is `attribution_version`).

    Version 2 writes every key of `cross_rank` (version 1 wrote only those of its status, in
    an order that varied with it); version 1 files read the same, the absent keys as defaults.
    """

    FILE = "attribution.json"
    FORMAT = "pcieprof.attribution"
    VERSION = 2
    TAG_KEY = "attribution_version"

    time_unit: str = "us"
    timeline: str = ""
    window: str = ""
    parser: dict[str, Any] = field(default_factory=dict)
    definitions: dict[str, str] = field(default_factory=dict)
    classes: list[ClassRule] = field(default_factory=list)
    ranks: list[RankAttribution] = field(default_factory=list)
    steps: list[StepAttribution] = field(default_factory=list)
    top_kernels: list[dict[str, Any]] = field(default_factory=list)
    cross_rank: CrossRank = field(default_factory=CrossRank)
    #: every DECODE step, then one per batch size the annotations name (older files lack them)
    decode_share: DecodeShare | None = None
    decode_share_by_batch: list[DecodeShare] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def decode_steps(self) -> list[StepAttribution]:
        """Steps of kind DECODE with a span."""
        return [s for s in self.steps if s.kind == "DECODE" and s.span_us]
