"""The bundle's tables: one row class per table, its fields the columns in order, with defaults.

The CSV encoding of a cell is done here and only here: `encode` when a row is appended (a JSON
object for `env`, `0,1,2` for `ranks`, an empty cell for a missing number) and `decode_frame`
when a table is read (`env` back to a dict, `ranks` to a tuple of ints). Everything above the
bundle layer sees typed values. Units are in the column names: GB/s is 1e9 bytes/s, times in
microseconds (`_us`) or milliseconds (`_ms`), sizes in bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, TypeVar

if TYPE_CHECKING:  # pandas costs ~0.3 s to import; only readers of tables pay for it
    import pandas as pd

NAN = float("nan")


@dataclass
class P2PRow:
    """One P2P / host copy measurement (`p2p.csv`).

    `path` is p2p | host_staged | h2d | d2h and `direction` uni | bi; for h2d/d2h the host end
    is -1. `bandwidth_gbps` is the median of `trials` (min/max keep the spread); a latency row
    has an empty bandwidth and the other way round. Copied data that did not match is
    `status=error`.
    """

    FILE: ClassVar[str] = "p2p.csv"
    backend: str = ""
    src: int = -1
    dst: int = -1
    path: str = ""
    direction: str = ""
    size_bytes: int = 0
    bandwidth_gbps: float = NAN
    bandwidth_gbps_min: float = NAN
    bandwidth_gbps_max: float = NAN
    latency_us: float = NAN
    latency_us_min: float = NAN
    latency_us_max: float = NAN
    iters: int = 0
    trials: int = 0
    status: str = "ok"
    detail: str = ""


@dataclass
class ConcurrentRow:
    """Several copies at once (`concurrent.csv`): one row per flow plus the aggregate, flow=-1.

    `op` is write (src pushes to dst) | read (dst pulls from src). On cuda `release` says what
    released the flows at once: `host_flag` (every stream waited on one word of pinned host
    memory the host wrote after queueing them all) or `gate_event` (a spin kernel and an event
    the other streams waited for). Each flow is timed from its device's anchor, the moment the
    device was released; `release_to_anchor_us_max` bounds (host flag only) how long after the
    host's write that anchor fired, per flow for its device and on the aggregate row the largest
    of its devices: how far apart the anchors it compares can be. Empty with the gate event,
    whose anchors of different devices are assumed simultaneous (the `detail` says so). The cpu
    backend writes `barrier`: no hold, each process starts its flows' threads after one gloo
    barrier. `held` (cuda) is `yes` where the streams were still held when the host had queued
    every copy, `no` where the hold ended first (the times then include host queueing).
    `start_skew_us` is how long after the round's earliest flow this flow's first copy started
    (cuda: from its device's anchor, as the total's span takes it; cpu: CLOCK_MONOTONIC), the
    aggregate row the largest. Empty cells: not recorded (older bundles, imports, sim).
    """

    FILE: ClassVar[str] = "concurrent.csv"
    backend: str = ""
    pattern: str = ""
    op: str = ""
    flow: int = -1
    src: int = -1
    dst: int = -1
    size_bytes: int = 0
    bandwidth_gbps: float = NAN
    iters: int = 0
    status: str = "ok"
    detail: str = ""
    release: str = ""  # cuda: host_flag | gate_event; cpu: barrier
    release_to_anchor_us_max: float = NAN
    held: str = ""  # cuda: yes | no
    start_skew_us: float = NAN


@dataclass
class AllReduceRow:
    """One all-reduce size of one variant over one group (`allreduce.csv`).

    nccl-tests formulas: algbw = size / time, busbw = algbw * 2(n-1)/n. `env` is the variant's
    environment (stored as a JSON object); `ranks` the devices in ring order (stored `0,1,2`).
    On cuda `time_us` (and algbw, busbw) is the timed loop replayed as a CUDA graph and
    `time_us_eager` the same loop called from Python (probes.allreduce_worker); elsewhere
    `time_us_eager` is empty.
    """

    FILE: ClassVar[str] = "allreduce.csv"
    backend: str = ""
    variant: str = ""
    env: dict[str, str] = field(default_factory=dict)
    nranks: int = 0
    ranks: tuple[int, ...] = ()
    size_bytes: int = 0
    dtype: str = ""
    time_us: float = NAN
    time_us_min: float = NAN
    time_us_max: float = NAN
    algbw_gbps: float = NAN
    busbw_gbps: float = NAN
    iters: int = 0
    status: str = "ok"
    detail: str = ""
    time_us_eager: float = NAN  # cuda: the loop called from Python; time_us is its CUDA graph


@dataclass
class DecodeCurveRow:
    """The fixed-batch decode step time at one batch size (`serve/decode_curve.csv`).

    `step_time_ms` is the median per-token gap while the whole batch decodes (p10/p90 its
    spread); `window` says which tokens were used (`all_decoding`, `middle_half`, `none`).
    """

    FILE: ClassVar[str] = "serve/decode_curve.csv"
    backend: str = ""
    batch_size: int = 0
    step_time_ms: float = NAN
    step_time_ms_p10: float = NAN
    step_time_ms_p90: float = NAN
    tokens_per_s: float = NAN
    n_samples: int = 0
    window: str = ""
    input_len: int = 0
    output_len: int = 0
    status: str = "ok"
    detail: str = ""


Row = P2PRow | ConcurrentRow | AllReduceRow | DecodeCurveRow
RowT = TypeVar("RowT", P2PRow, ConcurrentRow, AllReduceRow, DecodeCurveRow)

#: Table name -> its row class (the file is the class's FILE).
TABLES: dict[str, type[Row]] = {"p2p": P2PRow, "concurrent": ConcurrentRow,
                                "allreduce": AllReduceRow, "decode_curve": DecodeCurveRow}


#: Table -> the columns without which its rows mean nothing (in every schema version): a file
#: whose header lacks one is not that table (a wrong or hand-made header), and is refused.
KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    "p2p": ("src", "dst", "path", "size_bytes"),
    "concurrent": ("pattern", "flow", "bandwidth_gbps"),
    "allreduce": ("nranks", "size_bytes", "time_us"),
    "decode_curve": ("batch_size", "step_time_ms"),
}


def columns(table: str) -> list[str]:
    """The columns of `table`, in file order."""
    return [f.name for f in fields(TABLES[table])]


def defaults(table: str) -> dict[str, Any]:
    """Column -> the value an older file without that column reads as."""
    return asdict(TABLES[table]())


# -- cells ---------------------------------------------------------------------------------------

def format_ranks(ranks: tuple[int, ...] | list[int]) -> str:
    """Ranks as stored and shown: `0,1,2,3` (ring order)."""
    return ",".join(str(int(r)) for r in ranks)


def parse_ranks(text: Any) -> tuple[int, ...]:
    """`0,1,2,3` -> (0, 1, 2, 3); an empty cell -> ()."""
    if isinstance(text, (tuple, list)):
        return tuple(int(r) for r in text)
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    return tuple(int(x) for x in s.split(",") if x.strip())


def format_env(env: Mapping[str, str]) -> str:
    """An environment as stored: a JSON object with sorted keys."""
    return json.dumps({str(k): str(v) for k, v in env.items()}, sort_keys=True)


def parse_env(text: Any) -> dict[str, str]:
    """A stored environment back to a dict ({} for an empty cell)."""
    if isinstance(text, Mapping):
        return {str(k): str(v) for k, v in text.items()}
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    if not s.strip():
        return {}
    try:
        env = json.loads(s)
    except ValueError:
        raise ValueError(f"env cell is not a JSON object: {s[:80]!r}") from None
    if not isinstance(env, dict):
        raise ValueError(f"env cell is not a JSON object: {s[:80]!r}")
    return {str(k): str(v) for k, v in env.items()}


def _cell(column: str, value: Any) -> Any:
    if column == "env":
        return format_env(parse_env(value))
    if column == "ranks":
        return format_ranks(parse_ranks(value))
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if hasattr(value, "value"):  # enums
        return value.value
    return value


def encode(table: str, row: Row | Mapping[str, Any]) -> dict[str, Any]:
    """One row as CSV cells, every column present (missing ones get their default).

    Raises:
        ValueError: a key that is not a column of `table` (the schema is the contract).
    """
    d = asdict(row) if not isinstance(row, Mapping) else dict(row)
    cols = columns(table)
    extra = set(d) - set(cols)
    if extra:
        raise ValueError(f"{TABLES[table].FILE} has no column(s) {sorted(extra)}")
    base = defaults(table)
    return {c: _cell(c, d.get(c, base[c])) for c in cols}


def decode_frame(table: str, df: "pd.DataFrame") -> "pd.DataFrame":
    """A table as read from CSV with every column (older files get defaults) and typed cells.

    Raises:
        ValueError: a key column (KEY_COLUMNS) missing from the header, or a cell of a number
            column that is not a number (the message names the row and the column).
    """
    import pandas as pd  # heavy: pandas

    missing = [c for c in KEY_COLUMNS[table] if c not in df.columns]
    if missing:
        header = ",".join(str(c) for c in df.columns)
        raise ValueError(f"expected a header with the columns {', '.join(KEY_COLUMNS[table])}, "
                         f"got {header[:60]!r} (no {', '.join(missing)})")
    base = defaults(table)
    for col, default in base.items():
        if (col in df.columns and isinstance(default, (int, float))
                and not isinstance(default, bool)
                and not pd.api.types.is_numeric_dtype(df[col])):
            numbers = pd.to_numeric(df[col], errors="coerce")
            bad = numbers.isna() & df[col].notna() & (df[col].astype(str).str.strip() != "")
            if bad.any():
                k = int(bad.to_numpy().nonzero()[0][0])
                raise ValueError(f"row {k + 1}, column {col}: expected a number, got "
                                 f"{str(df[col].iloc[k])[:40]!r}")
            df[col] = numbers
        if col == "env":
            df[col] = [parse_env(v) for v in df[col]] if col in df.columns else [{}] * len(df)
        elif col == "ranks":
            df[col] = [parse_ranks(v) for v in df[col]] if col in df.columns else [()] * len(df)
        elif col not in df.columns:
            df[col] = default
        elif isinstance(default, str):
            df[col] = df[col].astype(object).where(df[col].notna(), default).astype(str)
    return df[list(base) + [c for c in df.columns if c not in base]]


def table_of(cls: type[RowT]) -> str:
    """The table name of a row class."""
    return next(name for name, c in TABLES.items() if c is cls)


def row_of(cls: type[RowT], record: Mapping[str, Any]) -> RowT:
    """A typed row from one decoded record (extra columns of newer files are dropped)."""
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in record.items() if k in known})
