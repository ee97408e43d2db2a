"""nccl_choices.json: what NCCL chose per all-reduce case (from its NCCL_DEBUG=INFO log, from an
imported log, or what the fabric model assumed it would choose, marked as such).

The file maps a case name (the variant, or `variant@0-1` for a sub-group) to a `NcclCase`; a
case's `parsed` is the NCCL log parser's output (pcieprof.importers.nccl_log, format
`pcieprof.nccl_choices/1`), None where NCCL did not run (cpu backend). Every reader takes
"what NCCL chose by default" from `NcclChoices.default_case()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pcieprof.bundle.document import Document, decode, encode
from pcieprof.errors import BadInput


@dataclass
class NcclParsed(Document):
    """What one NCCL log says NCCL chose (the main communicator's view, plus every communicator).

    Attributes:
        source: the log's name (or the fabric model's).
        nccl_version: e.g. "2.28.9+cuda13.0".
        env: NCCL_* variables as NCCL reports them set.
        nranks, nchannels: of the main communicator.
        rings: {channel: [ranks in ring order]} (rank space).
        peer_transport: {"src->dst": "P2P/CUMEM" | "SHM/direct/direct" | ...} by rank.
        transports, transport_families: unique `via` strings, their families (P2P, SHM, NET).
        comms: every communicator (see importers.nccl_log).
        tuner: [{coll, bytes, algo, proto, channels, time_us}] choices NCCL's tuner printed.
        failures: what its WARN lines name, with the fix ({kind: `shm_too_small`, what, fix, ...}).
        p2p_disabled: [[a, b]] GPU pairs (NVML indexes) NCCL found P2P disabled between.
    """

    FORMAT = "pcieprof.nccl_choices"
    VERSION = 1

    source: str = ""
    nccl_version: str | None = None
    nccl_versions: list[str] = field(default_factory=list)
    cuda_driver_version: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    nranks: int | None = None
    nchannels: int | None = None
    rings: dict[str, list[int]] = field(default_factory=dict)
    peer_transport: dict[str, str] = field(default_factory=dict)
    transports: list[Any] = field(default_factory=list)
    transport_families: list[str] = field(default_factory=list)
    comms: list[dict[str, Any]] = field(default_factory=list)
    tuner: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[Any] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    p2p_disabled: list[list[int]] = field(default_factory=list)
    lines: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class NcclCase:
    """One all-reduce case's entry.

    Attributes:
        variant: the variant (`default`, `proto_ll`, `imported`, ...).
        ranks: the case's devices in ring order.
        env: the variant's environment.
        log: the NCCL log of the timed launch in the bundle, or None.
        parsed: what NCCL chose, or None (NCCL did not run, or its log was unreadable).
        note: why `parsed` is None, or what it is (a model's assumption).
        rank_to_device: {rank: device}: NCCL prints rings in rank space; rank r drove this
            device (the GPUs in PCI order when a ring order goes through NCCL_GRAPH_FILE, else
            `ranks`). Empty where an entry does not say: then `ranks`.
        tuning_log: the untimed launch's log with NCCL's TUNING lines (cuda), or None.
        tuner: NCCL's algorithm/protocol choice per collective from that log (with `dtype`
            where the launch's sequence of all-reduces assigns it: pcieprof.probe_runner
            with_dtypes).
        user_env: the user's NCCL_*/TORCH_NCCL_* variables left out of (or kept in) the launch.
        launch_env: what pcieprof set in every launch of the case besides the variant's `env`:
            the loopback interface NCCL and gloo listen on in a one-node launch
            (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, each unless the user's own value passed).
        ring_graph: the NCCL_GRAPH_FILE written for a ring order, and where its header came from.
        ring_check: whether NCCL's Channel lines show the requested ring (untimed, timed).
        source, backend: provenance when it differs from the bundle's (the fabric model).
        model: the fabric model's reasons and known risks (sim only).
    """

    variant: str
    ranks: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    log: str | None = None
    parsed: NcclParsed | None = None
    note: str = ""
    rank_to_device: dict[str, int] = field(default_factory=dict)
    tuning_log: str | None = None
    tuner: list[dict[str, Any]] = field(default_factory=list)
    user_env: dict[str, Any] | None = None
    launch_env: dict[str, str] = field(default_factory=dict)
    ring_graph: dict[str, Any] | None = None
    ring_check: dict[str, Any] | None = None
    source: str | None = None
    backend: str | None = None
    model: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def device_of(self, rank: int) -> int:
        """The device NCCL's rank `rank` drove."""
        if self.rank_to_device:
            return int(self.rank_to_device[str(rank)])
        return int(self.ranks[rank])

    def ring_devices(self) -> list[int] | None:
        """Channel 0's ring in devices (NCCL prints rings in rank space), or None."""
        rings = self.parsed.rings if self.parsed else {}
        if not rings or not self.ranks:
            return None
        ring = next(iter(rings.values()))
        try:
            return [self.device_of(int(r)) for r in ring]
        except (IndexError, KeyError, TypeError, ValueError):
            return None

    def shm_links(self) -> list[str]:
        """`src->dst via SHM/...` for every peer link NCCL sent through host memory."""
        peers = self.parsed.peer_transport if self.parsed else {}
        return sorted(f"{pair} via {via}" for pair, via in peers.items()
                      if str(via).upper().startswith("SHM"))

    def protocols(self, lo_bytes: int, hi_bytes: int) -> dict[str, list[int]]:
        """Protocol NCCL's tuner picked per all-reduce size in [lo, hi] bytes: {proto: sizes}."""
        out: dict[str, list[int]] = {}
        for t in (self.parsed.tuner if self.parsed else []):
            if str(t.get("coll", "")).lower() != "allreduce":
                continue
            size = int(t.get("bytes") or 0)
            if lo_bytes <= size <= hi_bytes:
                out.setdefault(str(t.get("proto")), []).append(size)
        return out


@dataclass
class NcclChoices:
    """nccl_choices.json: case name -> NcclCase."""

    FILE: ClassVar[str] = "nccl_choices.json"

    cases: dict[str, NcclCase] = field(default_factory=dict)

    def default_case(self) -> NcclCase | None:
        """What NCCL chose with no setting: the case without environment that NCCL ran
        (parsed), over the most ranks, the variant named `default` first."""
        runs = [c for c in self.cases.values() if not c.env and c.parsed is not None]
        return max(runs, key=lambda c: (len(c.ranks), c.variant == "default"), default=None)

    def to_json(self) -> dict[str, Any]:
        return {name: encode(case) for name, case in self.cases.items()}

    @classmethod
    def from_json(cls, data: Any, where: str = FILE) -> "NcclChoices":
        if not isinstance(data, dict):
            raise BadInput(f"{where}: not a JSON object")
        cases = {}
        for name, entry in data.items():
            if not isinstance(entry, dict):
                raise BadInput(f"{where}: {name}: not an object")
            cases[str(name)] = decode(NcclCase, {"variant": name, **entry}, f"{where}: {name}")
        return cls(cases)
