"""Names and columns of the results bundle: the contract between measuring and reporting.

Every table is a CSV with a fixed column order. Readers (`Bundle.read_table`) accept files from
older schema versions and fill the columns they lack with the defaults given here, so an old
bundle keeps opening.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

#: Bumped when a column or file is added or its meaning changes. Readers accept all older ones.
SCHEMA_VERSION = 1


class Source(str, Enum):
    """Where a number came from; shown next to every figure."""

    MEASURED = "measured"
    SIMULATED = "simulated"
    IMPORTED = "imported"


class Backend(str, Enum):
    """What produced the numbers: real GPUs, this machine's CPU, the fabric model, another tool."""

    CUDA = "cuda"
    CPU = "cpu"
    SIM = "sim"
    IMPORTED = "imported"


class Status(str, Enum):
    """Status of a row, a field or a bundle part (nvbandwidth and NVML vocabulary)."""

    OK = "ok"
    PARTIAL = "partial"
    FAILED = "failed"
    ERROR = "error"  # ran, but the result is wrong (e.g. copied bytes do not match)
    HANG = "hang"  # killed by the watchdog
    WAIVED = "waived"  # does not apply here (e.g. P2P between a GPU and itself)
    NOT_SUPPORTED = "not_supported"
    RUNNING = "running"


def source_of(backend: str) -> str:
    """The provenance label that goes with a backend."""
    return {
        Backend.CUDA.value: Source.MEASURED.value,
        Backend.CPU.value: Source.MEASURED.value,
        Backend.SIM.value: Source.SIMULATED.value,
        Backend.IMPORTED.value: Source.IMPORTED.value,
    }[backend]


# Table name -> ordered columns with their default value (used to fill rows from older schemas).
# Units are in the column names: GB/s is 1e9 bytes/s, times in microseconds, sizes in bytes.
TABLES: dict[str, dict[str, Any]] = {
    # One row per P2P / host copy measurement. path: p2p | host_staged | h2d | d2h;
    # direction: uni | bi. bandwidth_gbps is the median of `trials`; min/max keep the spread.
    "p2p": {
        "backend": "", "src": -1, "dst": -1, "path": "", "direction": "", "size_bytes": 0,
        "bandwidth_gbps": float("nan"), "bandwidth_gbps_min": float("nan"),
        "bandwidth_gbps_max": float("nan"), "latency_us": float("nan"),
        "latency_us_min": float("nan"), "latency_us_max": float("nan"),
        "iters": 0, "trials": 0, "status": "ok", "detail": "",
    },
    # Several copies at once: one row per flow plus one row with flow=-1 for the aggregate.
    # op: write (src pushes to dst) | read (dst pulls from src).
    "concurrent": {
        "backend": "", "pattern": "", "op": "", "flow": -1, "src": -1, "dst": -1,
        "size_bytes": 0, "bandwidth_gbps": float("nan"), "iters": 0, "status": "ok", "detail": "",
    },
    # All-reduce sweep; nccl-tests formulas: algbw = size / time, busbw = algbw * 2(n-1)/n.
    # variant names a set of environment settings (see probes' variant table); env is its JSON.
    "allreduce": {
        "backend": "", "variant": "", "env": "{}", "nranks": 0, "ranks": "", "size_bytes": 0,
        "dtype": "", "time_us": float("nan"), "time_us_min": float("nan"),
        "time_us_max": float("nan"), "algbw_gbps": float("nan"), "busbw_gbps": float("nan"),
        "iters": 0, "status": "ok", "detail": "",
    },
}


def busbw_factor_allreduce(nranks: int) -> float:
    """nccl-tests bus-bandwidth factor for all-reduce: 2(n-1)/n."""
    return 2.0 * (nranks - 1) / nranks if nranks > 0 else float("nan")
