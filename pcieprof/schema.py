"""The vocabulary every layer shares: schema version, provenance (source, backend), statuses.

The tables' columns are in pcieprof.bundle.rows; every file of a bundle in
pcieprof.bundle.contract.
"""

from __future__ import annotations

from enum import Enum

#: Bumped when a column or file is added or its meaning changes. Readers accept all older ones
#: (docs/bundle.md says what each version changed).
SCHEMA_VERSION = 3


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
    NOT_RUN = "not_run"  # left out after cases of its class hung (pcieprof.probe_runner)
    NOT_SUPPORTED = "not_supported"
    RUNNING = "running"
    INTERRUPTED = "interrupted"  # left running by a writer that is gone (pcieprof.bundle.writer)


def source_of(backend: str) -> str:
    """The provenance label that goes with a backend."""
    return {
        Backend.CUDA.value: Source.MEASURED.value,
        Backend.CPU.value: Source.MEASURED.value,
        Backend.SIM.value: Source.SIMULATED.value,
        Backend.IMPORTED.value: Source.IMPORTED.value,
    }[backend]


def busbw_factor_allreduce(nranks: int) -> float:
    """nccl-tests bus-bandwidth factor for all-reduce: 2(n-1)/n."""
    return 2.0 * (nranks - 1) / nranks if nranks > 0 else float("nan")


#: NCCL's path types, nearest first: the order NCCL itself ranks them by (NVIDIA/nccl
#: src/graph/topo.cc `topoPathTypeStr`, PATH_LOC .. PATH_DIS in src/graph/topo.h, NCCL 2.23+
#: where P2C joined). Graph files (typeintra/typeinter) and topology dumps use these names.
NCCL_PATH_TYPES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS")


def nccl_dev(dev: int) -> str:
    """A `dev` of an NCCL graph file as NCCL 2.2x writes it (xml.h xmlSetAttrLong, `%#lx`: "0",
    "0x1", "0xa"), which the releases that read it as hex (strtol base 16) and the older ones
    (strtol base 0) read alike (pcieprof.importers.nccl_xml says which release does what)."""
    return format(dev, "#x") if dev else "0"
