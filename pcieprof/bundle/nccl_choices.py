"""nccl_choices.json: what NCCL chose per all-reduce case (from its NCCL_DEBUG=INFO log, from an
imported log, or what the fabric model assumed it would choose, marked as such).

The file maps a case name (the variant, or `variant@0-1` for a sub-group) to a `NcclCase`; a
case's `parsed` is the NCCL log parser's output (pcieprof.importers.nccl_log, format
`pcieprof.nccl_choices/2`), None where NCCL did not run (cpu backend). Every reader takes
"what NCCL chose by default" from `NcclChoices.default_case()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pcieprof.bundle.document import Document, decode, encode
from pcieprof.errors import BadInput


@dataclass
class CommRank:
    """One rank of a communicator, as its Init (or `comm ... rank`) line names it.

    Attributes:
        pid, host: the process that printed it (None for lines without a prefix).
        cuda_dev, nvml_dev: its device, as CUDA and NVML number it.
        bus_id: the device's PCI bus id.
        comm: the communicator's pointer in that process.
        local_rank: its rank on its node (`localRank`), when printed.
        init: `START` | `COMPLETE` (the Init line's phase), or None.
    """

    pid: int | None = None
    host: str | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    comm: str = ""
    local_rank: int | None = None
    init: str | None = None


@dataclass
class CommTransport:
    """One channel's connection as a transport line prints it (`Channel 00/0 : 0[0] -> 1[1]
    via P2P/CUMEM`).

    Attributes:
        channel: the channel; src, dst: the ranks; src_dev, dst_dev: their devices as printed.
        via: NCCL's words (`P2P/CUMEM`, `SHM/direct/direct`, `NET/IB/0/GDRDMA`); family: the
            transport (P2P, SHM, NET, ...).
        direction: `send` | `receive`, or None (older releases print none).
        reported_by: the rank whose line it is, when known.
        pxn_rank: the rank whose NIC a PXN hop goes out through, else None.
    """

    channel: int
    src: int
    dst: int
    src_dev: str | None = None
    dst_dev: str | None = None
    via: str = ""
    family: str = ""
    direction: str | None = None
    reported_by: int | None = None
    pxn_rank: int | None = None


@dataclass
class CommGraph:
    """One graph the search chose, from its `Pattern` line and the channel lines after it.

    Attributes:
        pattern: NCCL's pattern number (or its word); pattern_name: what it is (`ring`, ...).
        crossnic, nchannels, same_channels: as printed.
        bw_intra, bw_inter: the bandwidths it searched at, GB/s.
        type_intra, type_inter: the path types (`NVL`, `PIX`, `SYS`, `NET`, ...).
        channels: each channel's path ([`NET/0`, `GPU/6`, ...]).
        host, reported_by: who printed it.
    """

    pattern: int | str
    pattern_name: str = ""
    crossnic: int = 0
    nchannels: int = 0
    bw_intra: float = 0.0
    bw_inter: float = 0.0
    type_intra: str = ""
    type_inter: str = ""
    same_channels: int = 0
    channels: list[list[str]] = field(default_factory=list)
    host: str | None = None
    reported_by: int | None = None


@dataclass
class TunerChoice:
    """One choice NCCL's tuner printed (a TUNING line).

    Attributes:
        coll: the collective (None in the older line, which names none).
        bytes: the message size; algo, proto: what it chose.
        channels: [min, max] channels, or None; time_us: its predicted time, or None.
    """

    coll: str | None = None
    bytes: int = 0
    algo: str = ""
    proto: str = ""
    channels: list[int] | None = None
    time_us: float | None = None


@dataclass
class NcclComm:
    """One communicator of an NCCL log (pcieprof.importers.nccl_log documents each field).

    Attributes:
        comm_id: NCCL's commId, `split:<color>:<splitCount>` for an ncclCommSplit one whose
            lines name no commId, or None (old logs' joined per-process entries, or lines no
            Init line names).
        nranks, nnodes: its size.
        ranks: rank -> CommRank.
        rings: channel -> ranks in ring order; nchannels: its channel count.
        ring_neighbours: rank -> channel -> [previous, next].
        trees: rank -> channel -> `up/.../->r->down`.
        transports: every connection; peer_transport: {"src->dst": via}.
        coll_channels, p2p_channels, nvls_channels, collnet_channels: `N coll channels, ...`.
        nvls_multicast: `NVLS multicast support is [not] available`, else None.
        graphs: the graph search's choices (per host, one process's).
        ring_pxn, ring_gdr: `Connected all rings, use ring PXN x GDR y`, else None.
        thread_thresholds, p2p_type, network: as printed, else None.
        tuner: its tuner choices.
        connected_rings, connected_trees: whether it connected them.
        attribution: how lines were tied to it (`prefix`, `order`, `none`).
        failures: the kinds of failure (NcclParsed.failures) that hit it (format 2; version 1
            wrote the key only when there was one).
    """

    comm_id: str | None = None
    nranks: int = 0
    nnodes: int | None = None
    ranks: dict[str, CommRank] = field(default_factory=dict)
    rings: dict[str, list[int]] = field(default_factory=dict)
    nchannels: int | None = None
    ring_neighbours: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    trees: dict[str, dict[str, str]] = field(default_factory=dict)
    transports: list[CommTransport] = field(default_factory=list)
    peer_transport: dict[str, str] = field(default_factory=dict)
    coll_channels: int | None = None
    p2p_channels: int | None = None
    nvls_channels: int | None = None
    collnet_channels: int | None = None
    nvls_multicast: bool | None = None
    graphs: list[CommGraph] = field(default_factory=list)
    ring_pxn: bool | None = None
    ring_gdr: bool | None = None
    thread_thresholds: str | None = None
    p2p_type: str | None = None
    network: str | None = None
    tuner: list[TunerChoice] = field(default_factory=list)
    connected_rings: bool = False
    connected_trees: bool = False
    attribution: str = "prefix"
    failures: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


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
        comms: every communicator.
        tuner: [{coll, bytes, algo, proto, channels, time_us}] choices NCCL's tuner printed.
        failures: what its WARN lines name, with the fix ({kind: `shm_too_small`, what, fix, ...}).
        p2p_disabled: [[a, b]] GPU pairs (NVML indexes) NCCL found P2P disabled between.
    """

    FORMAT = "pcieprof.nccl_choices"
    #: 2: every communicator has `failures` (version 1 wrote it only when one hit it)
    VERSION = 2

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
    comms: list[NcclComm] = field(default_factory=list)
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
