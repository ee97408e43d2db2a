"""A declarative description of a PCIe fabric, loaded from TOML, and the topology it implies.

A fabric file names the sockets and their inter-socket link, the CPU root ports (each in a root
complex), the PCIe switches (several virtual switches may share one physical chip), the GPUs and
the link generation and width of every hop, whether ACS redirects peer traffic up to the root
complex, whether the IOMMU translates DMA, and what a VM guest sees. A VM profile also names its
bare-metal twin and carries, with sources, the mechanisms of what virtualization costs, the
changes only the host can make, and the known issues of its settings (`[[mechanism]]`,
`[[host_change]]`, `[[known_issue]]`; priced by `pcieprof.sim.vm_cost`). `profiles/*.toml` are
the shipped examples; each is commented so that a user can copy one and edit it for their own box.

The model (`pcieprof.sim.model`, `pcieprof.sim.collectives`) reads only the `Fabric` object built
here; `topology()` turns it into the bundle's topology.json (docs/bundle.md), source "simulated".
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from pcieprof.bundle.vm_mechanism import KnownIssue, Mechanism
from pcieprof.errors import BadInput

PROFILE_DIR = "profiles"
#: The profile `--backend sim`, the demo and the VM pricing use unless told otherwise.
DEFAULT_PROFILE = "rtxpro6000-8x-vm"

#: PCIe signalling per generation: (GT/s per lane, line-code efficiency).
PCIE_GEN: dict[int, tuple[float, float]] = {
    1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
    5: (32.0, 128 / 130), 6: (64.0, 242 / 256),  # Gen6 FLIT mode: 242 data bytes per 256
}

IOMMU_MODES = ("off", "passthrough", "translated")
GUEST_VIEWS = ("real", "flat")
#: Profile keys a host change may set, with the values each takes.
CHANGEABLE: dict[str, Any] = {"iommu.mode": IOMMU_MODES, "acs.redirect": bool,
                              "virtualization.guest_view": GUEST_VIEWS, "virtualization.is_vm": bool}
#: Conditions a known issue may name (evaluated by pcieprof.sim.vm_cost.known_risks).
ISSUE_CONDITIONS = ("p2p_through_translating_iommu",)


def raw_link_gbps(gen: int, width: int) -> float:
    """Raw data rate of a PCIe link per direction after line coding, GB/s (1e9 B/s).

    Gen5 x16: 32 GT/s x 16 lanes x 128/130 / 8 = 63.0 GB/s, before TLP/DLLP overhead.
    """
    rate, code = PCIE_GEN[gen]
    return rate * width * code / 8.0


@dataclass(frozen=True)
class Socket:
    id: int
    numa_node: int
    cpus: str


@dataclass(frozen=True)
class InterSocket:
    """The CPU-to-CPU link (AMD xGMI / Intel UPI) as GPU peer traffic sees it."""

    kind: str
    p2p_gbps: float  # ceiling of one GPU-to-GPU stream across sockets, per direction
    aggregate_gbps: float  # all GPU peer reads (and host-memory traffic) across the link, per direction
    latency_us: float | None  # extra latency of the crossing; None: the calibrated default
    posted_window_kib: float | None = None  # posted writes in flight per source root complex
    # for peer writes that cross; None: the calibrated default (calibration/params.toml)
    posted_write_gbps: float | None = None  # all peer write streams together, per direction;
    # None: aggregate_gbps

    @property
    def write_gbps(self) -> float:
        """All posted peer-write streams across the link together, per direction, GB/s."""
        return self.posted_write_gbps if self.posted_write_gbps is not None else self.aggregate_gbps


@dataclass(frozen=True)
class RootPort:
    id: str
    bdf: str
    socket: int
    root_complex: str
    gen: int
    width: int
    acs_redirect: bool


@dataclass(frozen=True)
class Chip:
    """A physical switch chip that may hold several virtual switches (partitions)."""

    id: str
    name: str
    internal_p2p: bool  # peer traffic between its partitions stays on the chip (ACS off)
    fabric_gbps: float  # capacity of the chip's internal fabric, per direction


@dataclass(frozen=True)
class Switch:
    """One (virtual) switch: an upstream port on a root port, downstream ports to GPUs."""

    id: str
    chip: str | None
    upstream: str  # root port id
    bdf: str  # upstream port
    gen: int
    width: int
    acs_redirect: bool
    vendor: str
    device: str
    latency_us: float | None = None  # one traversal of the switch; None: the calibrated default


@dataclass(frozen=True)
class Gpu:
    index: int
    bdf: str
    parent: str  # switch id or root port id
    port_bdf: str | None  # the switch downstream port above it (None when on a root port)
    gen: int
    width: int
    name: str
    memory_bytes: int
    bar1_bytes: int


@dataclass(frozen=True)
class PostedWriteCollapse:
    """AMD I/O-die posted-write arbitration collapse (see profiles/rtxpro6000-8x-switch.toml).

    Two or more GPUs behind one switch uplink writing at once to peers behind two or more
    different root complexes: each such write stream drops to `flow_gbps`; reads stay healthy.
    """

    enabled: bool
    flow_gbps: float
    source: str


@dataclass(frozen=True)
class Virtualization:
    is_vm: bool
    hypervisor: str | None
    guest_view: str  # "real": the guest sees the real tree; "flat": every GPU on one root bus
    bare_metal_twin: str | None = None  # the profile of the same box without the hypervisor


@dataclass(frozen=True)
class HostChange:
    """A change only the host (hypervisor, firmware, host kernel) can make for a VM.

    `apply` is what the change does to this profile, as dotted profile keys (`iommu.mode`,
    `acs.redirect`, `virtualization.guest_view`, `virtualization.is_vm`); the model prices the
    changed profile (`pcieprof.sim.vm_cost.host_changes`). An empty `apply` means the change does
    not touch what the guest's GPUs do (said in `effect`). `blocked_by` is set when the change
    cannot be made safely on this box, with the reason.
    """

    id: str
    title: str
    how: str
    apply: dict[str, Any]
    effect: str
    risk: str
    blocked_by: str | None
    sources: tuple[str, ...]


@dataclass
class Fabric:
    """A whole box: what the model and topology() read. Build it with `load_profile`."""

    name: str
    description: str
    path: str
    sources: list[str]
    cpu: str
    cpu_vendor: str
    sockets: list[Socket]
    inter_socket: InterSocket | None
    root_ports: dict[str, RootPort]
    chips: dict[str, Chip]
    switches: dict[str, Switch]
    gpus: list[Gpu]
    iommu_mode: str
    virtualization: Virtualization
    collapse: PostedWriteCollapse | None
    nccl_version: str
    driver_version: str | None
    cuda_driver_version: str | None
    notes: list[str] = field(default_factory=list)
    mechanisms: list[Mechanism] = field(default_factory=list)
    host_changes: list[HostChange] = field(default_factory=list)
    known_issues: list[KnownIssue] = field(default_factory=list)

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise BadInput(f"{self.name}: no GPU {index} (this fabric has "
                       f"{', '.join(str(g.index) for g in self.gpus)})")

    def switch_of(self, index: int) -> Switch | None:
        return self.switches.get(self.gpu(index).parent)

    def root_port_of(self, index: int) -> RootPort:
        g = self.gpu(index)
        sw = self.switches.get(g.parent)
        return self.root_ports[sw.upstream if sw else g.parent]

    def socket_of(self, index: int) -> int:
        return self.root_port_of(index).socket

    def numa_of(self, index: int) -> int:
        sock = self.socket_of(index)
        return next(s.numa_node for s in self.sockets if s.id == sock)

    @property
    def translated(self) -> bool:
        return self.iommu_mode == "translated"


# -- loading ---------------------------------------------------------------------------------------

def list_profiles() -> list[str]:
    """Names of the profiles shipped with pcieprof (pcieprof/sim/profiles/*.toml)."""
    folder = resources.files("pcieprof.sim") / PROFILE_DIR
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def profile_path(name_or_path: str | Path) -> Path:
    """The file behind a profile name or a path to a user's TOML file."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text or Path(text).is_file():
        p = Path(text)
        if not p.is_file():
            raise BadInput(f"fabric file {p} not found")
        return p
    p = Path(str(resources.files("pcieprof.sim") / PROFILE_DIR / f"{text}.toml"))
    if not p.is_file():
        raise BadInput(f"unknown sim profile {text!r}",
                       hint=f"one of: {', '.join(list_profiles())}, or a path to a .toml file")
    return p


def load_profile(name_or_path: str | Path) -> Fabric:
    """Load and validate a fabric description.

    Args:
        name_or_path: a shipped profile name (see `list_profiles()`) or a path to a TOML file.

    Returns:
        The validated `Fabric`.

    Raises:
        BadInput: the file is missing, is not TOML, or a key is wrong (one line naming file and key).
    """
    path = profile_path(name_or_path)
    return _Reader(path).fabric(_read_doc(path, seen=()))


def apply_changes(fabric: Fabric, changes: dict[str, Any]) -> Fabric:
    """The fabric with host-side changes made (keys of `CHANGEABLE`), for pricing them.

    `acs.redirect` sets ReqRedir/CmpltRedir on every root and switch port; `virtualization.is_vm =
    false` also drops the flat guest view (there is no guest) and the twin.

    Raises:
        BadInput: a key that is not in `CHANGEABLE`, or a value it does not take.
    """
    for key, value in changes.items():
        ok = CHANGEABLE.get(key)
        if ok is None or (isinstance(ok, tuple) and value not in ok) or (ok is bool and not isinstance(value, bool)):
            raise BadInput(f"{fabric.name}: cannot apply {key} = {value!r}")
    f = replace(fabric)
    if "iommu.mode" in changes:
        f.iommu_mode = changes["iommu.mode"]
    if "acs.redirect" in changes:
        on = changes["acs.redirect"]
        f.root_ports = {k: replace(v, acs_redirect=on) for k, v in f.root_ports.items()}
        f.switches = {k: replace(v, acs_redirect=on) for k, v in f.switches.items()}
    v = f.virtualization
    if "virtualization.guest_view" in changes:
        v = replace(v, guest_view=changes["virtualization.guest_view"])
    if changes.get("virtualization.is_vm") is False:
        v = Virtualization(False, None, "real", None)
    elif changes.get("virtualization.is_vm") is True:
        v = replace(v, is_vm=True)
    f.virtualization = v
    return f


def _read_doc(path: Path, seen: tuple[str, ...]) -> dict[str, Any]:
    """The TOML document, with `extends = "other-profile"` merged under it (tables key by key,
    arrays of tables replaced whole)."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc})") from None
    base_name = doc.pop("extends", None)
    if base_name is None:
        return doc
    if not isinstance(base_name, str):
        raise BadInput(f"{path}: extends: must be a profile name or path")
    if base_name in seen:
        raise BadInput(f"{path}: extends: circular ({' -> '.join(seen + (base_name,))})")
    # A file name is relative to the file that extends it; anything else is a profile name.
    base_path = profile_path(path.parent / base_name if base_name.endswith(".toml") else base_name)
    base = _read_doc(base_path, seen + (base_name,))
    for key, value in doc.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


#: The top-level keys of a fabric file.
_TOP_KEYS = {"name", "description", "sources", "notes", "host", "inter_socket", "iommu", "acs",
             "virtualization", "posted_write_collapse", "gpu_defaults", "software", "socket",
             "root_port", "chip", "switch", "gpu", "mechanism", "host_change", "known_issue"}


class _Reader:
    """Turns the TOML document into a Fabric, naming file and key in every error."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, why: str) -> BadInput:
        return BadInput(f"{self.path}: {key}: {why}")

    def table(self, doc: dict[str, Any], key: str, allowed: set[str],
              required: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
        value = doc if key == "" else doc.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, "must be a table")
        self.check_keys(value, key, allowed, required)
        return value

    def check_keys(self, value: dict[str, Any], key: str, allowed: set[str],
                   required: frozenset[str] | set[str] = frozenset()) -> None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(f"{key}.{unknown[0]}" if key else unknown[0],
                            f"unknown key (allowed: {', '.join(sorted(allowed))})")
        missing = sorted(required - set(value))
        if missing:
            raise self.fail(f"{key}.{missing[0]}" if key else missing[0], "missing")

    def get(self, t: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...],
            default: Any = ...) -> Any:
        if key not in t:
            if default is ...:
                raise self.fail(f"{where}.{key}", "missing")
            return default
        v = t[key]
        ok = isinstance(v, kind) and not (kind in (int, float, (int, float)) and isinstance(v, bool))
        if not ok:
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.fail(f"{where}.{key}", f"must be {names}, got {v!r}")
        return v

    def gen_width(self, t: dict[str, Any], where: str, gen: int, width: int) -> tuple[int, int]:
        g = self.get(t, "gen", where, int, gen)
        w = self.get(t, "width", where, int, width)
        if g not in PCIE_GEN:
            raise self.fail(f"{where}.gen", f"PCIe generation must be 1-6, got {g}")
        if w not in (1, 2, 4, 8, 16):
            raise self.fail(f"{where}.width", f"link width must be 1, 2, 4, 8 or 16, got {w}")
        return g, w

    def fabric(self, doc: dict[str, Any]) -> Fabric:
        # Components in dependency order (sockets, root ports on them, switches on those, GPUs
        # on either); the order also fixes which error a file with several reports first.
        self.check_keys(doc, "", _TOP_KEYS, {"name", "socket", "root_port", "gpu"})
        name = self.get(doc, "name", "", str)
        host = self.table(doc, "host", {"cpu", "cpu_vendor"})
        acs = self.table(doc, "acs", {"redirect"})
        acs_default = self.get(acs, "redirect", "acs", bool, False)
        defaults = self.table(doc, "gpu_defaults", {"name", "memory_gib", "bar1_gib", "gen", "width"})
        link_default = self.gen_width(defaults, "gpu_defaults", 5, 16)
        sockets = self.sockets(doc)
        inter = self.inter_socket(doc, len(sockets))
        root_ports = self.root_ports(doc, {s.id for s in sockets}, acs_default)
        chips = self.chips(doc)
        switches = self.switches(doc, root_ports, chips, acs_default)
        gpus = self.gpus(doc, defaults, link_default, set(switches) | set(root_ports))
        mode = self.iommu_mode(doc)
        virt = self.virtualization_table(doc)
        collapse = self.collapse(doc)
        sw = self.table(doc, "software", {"nccl_version", "driver_version", "cuda_driver_version"})
        return Fabric(
            name=name, description=self.get(doc, "description", "", str, ""), path=str(self.path),
            sources=list(self.get(doc, "sources", "", list, [])),
            cpu=self.get(host, "cpu", "host", str, "unknown CPU"),
            cpu_vendor=self.get(host, "cpu_vendor", "host", str, "amd").lower(),
            sockets=sockets, inter_socket=inter, root_ports=root_ports, chips=chips,
            switches=switches, gpus=gpus, iommu_mode=mode,
            virtualization=self.virtualization(virt),
            collapse=collapse,
            nccl_version=self.get(sw, "nccl_version", "software", str, "2.27.5"),
            driver_version=self.get(sw, "driver_version", "software", str, None),
            cuda_driver_version=self.get(sw, "cuda_driver_version", "software", str, None),
            notes=list(self.get(doc, "notes", "", list, [])),
            mechanisms=[self.mechanism(m, f"mechanism[{i}]")
                        for i, m in enumerate(self.array(doc, "mechanism"))],
            host_changes=[self.host_change(h, f"host_change[{i}]")
                          for i, h in enumerate(self.array(doc, "host_change"))],
            known_issues=[self.known_issue(k, f"known_issue[{i}]")
                          for i, k in enumerate(self.array(doc, "known_issue"))])

    def sockets(self, doc: dict[str, Any]) -> list[Socket]:
        sockets = []
        for i, s in enumerate(self.array(doc, "socket")):
            where = f"socket[{i}]"
            self.check_keys(s, where, {"id", "numa_node", "cpus"}, {"id"})
            sid = self.get(s, "id", where, int)
            sockets.append(Socket(sid, self.get(s, "numa_node", where, int, sid),
                                  self.get(s, "cpus", where, str, "")))
        if len({s.id for s in sockets}) != len(sockets):
            raise self.fail("socket", "duplicate socket id")
        return sockets

    def inter_socket(self, doc: dict[str, Any], n_sockets: int) -> InterSocket | None:
        if "inter_socket" not in doc:
            if n_sockets > 1:
                raise self.fail("inter_socket", "missing (the fabric has more than one socket)")
            return None
        t = self.table(doc, "inter_socket", {"kind", "p2p_gbps", "aggregate_gbps", "latency_us",
                                             "posted_window_kib", "posted_write_gbps"},
                       {"p2p_gbps"})
        per_stream = self.positive(t, "p2p_gbps", "inter_socket")
        total = self.positive(t, "aggregate_gbps", "inter_socket") if "aggregate_gbps" in t \
            else 2 * per_stream
        if total < per_stream:
            raise self.fail("inter_socket.aggregate_gbps", "must be >= p2p_gbps")
        window = self.opt_float(t, "posted_window_kib", "inter_socket")
        if window is not None and window <= 0:
            raise self.fail("inter_socket.posted_window_kib", f"must be > 0, got {window:g}")
        writes = self.positive(t, "posted_write_gbps", "inter_socket") \
            if "posted_write_gbps" in t else None
        return InterSocket(self.get(t, "kind", "inter_socket", str, "xgmi"), per_stream, total,
                           self.opt_float(t, "latency_us", "inter_socket"), window, writes)

    def root_ports(self, doc: dict[str, Any], socket_ids: set[int],
                   acs_default: bool) -> dict[str, RootPort]:
        root_ports: dict[str, RootPort] = {}
        for i, r in enumerate(self.array(doc, "root_port")):
            where = f"root_port[{i}]"
            self.check_keys(r, where, {"id", "bdf", "socket", "root_complex", "gen", "width",
                                       "acs_redirect"}, {"id", "socket"})
            rid = self.get(r, "id", where, str)
            if rid in root_ports:
                raise self.fail(f"{where}.id", f"duplicate root port id {rid!r}")
            sock = self.get(r, "socket", where, int)
            if sock not in socket_ids:
                raise self.fail(f"{where}.socket", f"no socket with id {sock}")
            r_gen, r_width = self.gen_width(r, where, 5, 16)
            root_ports[rid] = RootPort(rid, self.get(r, "bdf", where, str, f"0000:{0x10 * i:02x}:01.1"),
                                       sock, self.get(r, "root_complex", where, str, rid), r_gen, r_width,
                                       self.get(r, "acs_redirect", where, bool, acs_default))
        return root_ports

    def chips(self, doc: dict[str, Any]) -> dict[str, Chip]:
        chips: dict[str, Chip] = {}
        for i, c in enumerate(self.array(doc, "chip")):
            where = f"chip[{i}]"
            self.check_keys(c, where, {"id", "name", "internal_p2p", "fabric_gbps"}, {"id"})
            cid = self.get(c, "id", where, str)
            chips[cid] = Chip(cid, self.get(c, "name", where, str, cid),
                              self.get(c, "internal_p2p", where, bool, False),
                              float(self.get(c, "fabric_gbps", where, (int, float), 1000.0)))
        return chips

    def switches(self, doc: dict[str, Any], root_ports: dict[str, RootPort],
                 chips: dict[str, Chip], acs_default: bool) -> dict[str, Switch]:
        switches: dict[str, Switch] = {}
        for i, s in enumerate(self.array(doc, "switch")):
            where = f"switch[{i}]"
            self.check_keys(s, where, {"id", "chip", "upstream", "bdf", "gen", "width",
                                       "acs_redirect", "vendor", "device", "latency_us"},
                            {"id", "upstream"})
            sid = self.get(s, "id", where, str)
            if sid in switches or sid in root_ports:
                raise self.fail(f"{where}.id", f"duplicate id {sid!r}")
            up = self.get(s, "upstream", where, str)
            if up not in root_ports:
                raise self.fail(f"{where}.upstream", f"no root port with id {up!r}")
            chip = self.get(s, "chip", where, str, None)
            if chip is not None and chip not in chips:
                raise self.fail(f"{where}.chip", f"no chip with id {chip!r}")
            s_gen, s_width = self.gen_width(s, where, 5, 16)
            hop = self.opt_float(s, "latency_us", where)
            if hop is not None and hop < 0:
                raise self.fail(f"{where}.latency_us", f"must be >= 0, got {hop:g}")
            switches[sid] = Switch(sid, chip, up, self.get(s, "bdf", where, str, ""), s_gen, s_width,
                                   self.get(s, "acs_redirect", where, bool, acs_default),
                                   self.get(s, "vendor", where, str, ""),
                                   self.get(s, "device", where, str, ""), hop)
        return switches

    def gpus(self, doc: dict[str, Any], defaults: dict[str, Any], link_default: tuple[int, int],
             parents: set[str]) -> list[Gpu]:
        """The GPUs, sorted by index; `link_default`: [gpu_defaults] (gen, width); `parents`: the
        ids of the switches and root ports."""
        gpus = [self.gpu(g, f"gpu[{i}]", defaults, link_default, parents)
                for i, g in enumerate(self.array(doc, "gpu"))]
        indices = [g.index for g in gpus]
        if sorted(indices) != list(range(len(gpus))):
            raise self.fail("gpu", f"GPU indices must be 0..{len(gpus) - 1} once each, got {indices}")
        gpus.sort(key=lambda g: g.index)
        return gpus

    def gpu(self, g: dict[str, Any], where: str, defaults: dict[str, Any],
            link_default: tuple[int, int], parents: set[str]) -> Gpu:
        gib = 1024 ** 3
        self.check_keys(g, where, {"index", "bdf", "parent", "port_bdf", "gen", "width",
                                   "name", "memory_gib", "bar1_gib"}, {"index", "parent", "bdf"})
        parent = self.get(g, "parent", where, str)
        if parent not in parents:
            raise self.fail(f"{where}.parent", f"no switch or root port with id {parent!r}")
        gen, width = self.gen_width(g, where, *link_default)
        return Gpu(
            index=self.get(g, "index", where, int), bdf=self.get(g, "bdf", where, str),
            parent=parent, port_bdf=self.get(g, "port_bdf", where, str, None), gen=gen,
            width=width,
            name=self.get(g, "name", where, str, self.get(defaults, "name", "gpu_defaults",
                                                             str, "NVIDIA GPU")),
            memory_bytes=int(gib * self.get(g, "memory_gib", where, (int, float),
                                            self.get(defaults, "memory_gib", "gpu_defaults",
                                                     (int, float), 96))),
            bar1_bytes=int(gib * self.get(g, "bar1_gib", where, (int, float),
                                          self.get(defaults, "bar1_gib", "gpu_defaults",
                                                   (int, float), 128))))

    def iommu_mode(self, doc: dict[str, Any]) -> str:
        iommu = self.table(doc, "iommu", {"mode"})
        mode: str = self.get(iommu, "mode", "iommu", str, "off")
        if mode not in IOMMU_MODES:
            raise self.fail("iommu.mode", f"must be one of {', '.join(IOMMU_MODES)}, got {mode!r}")
        return mode

    def virtualization_table(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The [virtualization] table, its guest view, VM flag and twin checked together."""
        virt = self.table(doc, "virtualization", {"is_vm", "hypervisor", "guest_view",
                                                  "bare_metal_twin"})
        view = self.get(virt, "guest_view", "virtualization", str, "real")
        if view not in GUEST_VIEWS:
            raise self.fail("virtualization.guest_view",
                            f"must be one of {', '.join(GUEST_VIEWS)}, got {view!r}")
        is_vm = self.get(virt, "is_vm", "virtualization", bool, False)
        if view == "flat" and not is_vm:
            raise self.fail("virtualization.guest_view", "a flat guest view needs is_vm = true")
        twin = self.get(virt, "bare_metal_twin", "virtualization", str, None)
        if twin is not None and not is_vm:
            raise self.fail("virtualization.bare_metal_twin", "only a VM profile has a bare-metal twin")
        return virt

    def virtualization(self, virt: dict[str, Any]) -> Virtualization:
        """A checked [virtualization] table (`virtualization_table`) with its hypervisor."""
        return Virtualization(self.get(virt, "is_vm", "virtualization", bool, False),
                              self.get(virt, "hypervisor", "virtualization", str, None),
                              self.get(virt, "guest_view", "virtualization", str, "real"),
                              self.get(virt, "bare_metal_twin", "virtualization", str, None))

    def collapse(self, doc: dict[str, Any]) -> PostedWriteCollapse | None:
        if "posted_write_collapse" not in doc:
            return None
        t = self.table(doc, "posted_write_collapse", {"enabled", "flow_gbps", "source"},
                       {"flow_gbps"})
        return PostedWriteCollapse(self.get(t, "enabled", "posted_write_collapse", bool, True),
                                   float(self.positive(t, "flow_gbps", "posted_write_collapse")),
                                   self.get(t, "source", "posted_write_collapse", str, ""))

    def sources(self, t: dict[str, Any], where: str) -> tuple[str, ...]:
        v = self.get(t, "sources", where, list)
        if not v or not all(isinstance(x, str) and x.strip() for x in v):
            raise self.fail(f"{where}.sources", "must be a non-empty list of strings (cite each fact)")
        return tuple(v)

    def mechanism(self, t: dict[str, Any], where: str) -> Mechanism:
        self.check_keys(t, where, {"id", "title", "text", "model", "sources"},
                        {"id", "title", "text", "sources"})
        return Mechanism(self.get(t, "id", where, str), self.get(t, "title", where, str),
                         self.get(t, "text", where, str), self.get(t, "model", where, str, ""),
                         self.sources(t, where))

    def host_change(self, t: dict[str, Any], where: str) -> HostChange:
        self.check_keys(t, where, {"id", "title", "how", "apply", "effect", "risk", "blocked_by",
                                   "sources"}, {"id", "title", "how", "apply", "risk", "sources"})
        apply = self.get(t, "apply", where, dict)
        for key, value in apply.items():
            if key not in CHANGEABLE:
                raise self.fail(f"{where}.apply.{key}",
                                f"not a key a host change can set (one of {', '.join(CHANGEABLE)})")
            ok = CHANGEABLE[key]
            if isinstance(ok, tuple) and value not in ok:
                raise self.fail(f"{where}.apply.{key}", f"must be one of {', '.join(ok)}, got {value!r}")
            if ok is bool and not isinstance(value, bool):
                raise self.fail(f"{where}.apply.{key}", f"must be true or false, got {value!r}")
        return HostChange(self.get(t, "id", where, str), self.get(t, "title", where, str),
                          self.get(t, "how", where, str), dict(apply),
                          self.get(t, "effect", where, str, ""), self.get(t, "risk", where, str),
                          self.get(t, "blocked_by", where, str, None), self.sources(t, where))

    def known_issue(self, t: dict[str, Any], where: str) -> KnownIssue:
        self.check_keys(t, where, {"id", "when", "title", "text", "check", "sources"},
                        {"id", "when", "title", "text", "sources"})
        when = self.get(t, "when", where, str)
        if when not in ISSUE_CONDITIONS:
            raise self.fail(f"{where}.when", f"must be one of {', '.join(ISSUE_CONDITIONS)}, got {when!r}")
        return KnownIssue(self.get(t, "id", where, str), when, self.get(t, "title", where, str),
                          self.get(t, "text", where, str), self.get(t, "check", where, str, ""),
                          self.sources(t, where))

    def array(self, doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
        v = doc.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            raise self.fail(key, f"must be an array of tables ([[{key}]])")
        return v

    def positive(self, t: dict[str, Any], key: str, where: str) -> float:
        v = self.get(t, key, where, (int, float))
        if v <= 0:
            raise self.fail(f"{where}.{key}", f"must be > 0, got {v}")
        return float(v)

    def opt_float(self, t: dict[str, Any], key: str, where: str) -> float | None:
        v = self.get(t, key, where, (int, float), None)
        return None if v is None else float(v)


# -- topology.json ---------------------------------------------------------------------------------

def pair_level(fabric: Fabric, a: int, b: int, *, guest: bool = False) -> str:
    """The `nvidia-smi topo -m` level between two GPUs, on the real tree or as the guest sees it.

    A flat guest tree puts every GPU behind its own virtual root port of one host bridge: PHB.
    """
    if a == b:
        return "X"
    if guest and fabric.virtualization.guest_view == "flat":
        return "PHB"
    sa, sb = fabric.switch_of(a), fabric.switch_of(b)
    if sa is not None and sa is sb:
        return "PIX"
    ra, rb = fabric.root_port_of(a), fabric.root_port_of(b)
    if ra is rb:
        return "PXB" if (sa or sb) else "PIX"
    if ra.socket != rb.socket:
        return "SYS"
    return "PHB" if ra.root_complex == rb.root_complex else "NODE"


def _link(gen: int, width: int) -> dict[str, Any]:
    speed = PCIE_GEN[gen][0]
    return {"speed_gts": speed, "width": width, "cap_speed_gts": speed, "cap_width": width, "gen": gen}


def _acs(redirect: bool) -> dict[str, Any]:
    cap = {"SrcValid": True, "TransBlk": True, "ReqRedir": True, "CmpltRedir": True,
           "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": True}
    ctl = {"SrcValid": True, "TransBlk": False, "ReqRedir": redirect, "CmpltRedir": redirect,
           "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False}
    return {"cap": cap, "ctl": ctl}


def _real_tree(fabric: Fabric) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    paths: dict[str, list[str]] = {}
    numa = {s.id: s.numa_node for s in fabric.sockets}
    for rp in fabric.root_ports.values():
        nodes.append({"bdf": rp.bdf, "parent": None, "kind": "root_port", "vendor": fabric.cpu_vendor.upper(),
                      "device": "root port", "description": f"{fabric.cpu} root port ({rp.root_complex})",
                      "numa_node": numa[rp.socket], "iommu_group": None, "link": _link(rp.gen, rp.width),
                      "acs": _acs(rp.acs_redirect)})
    for sw in fabric.switches.values():
        rp = fabric.root_ports[sw.upstream]
        chip = f" chip {sw.chip}" if sw.chip else ""
        nodes.append({"bdf": sw.bdf or f"{sw.id}-up", "parent": rp.bdf, "kind": "switch_upstream",
                      "vendor": sw.vendor, "device": sw.device,
                      "description": f"{sw.vendor} {sw.device} virtual switch {sw.id}{chip}".strip(),
                      "numa_node": numa[rp.socket], "iommu_group": None,
                      "link": _link(sw.gen, sw.width), "acs": None})
    for g in fabric.gpus:
        gsw = fabric.switches.get(g.parent)
        rp = fabric.root_port_of(g.index)
        chain = [g.bdf]
        parent = rp.bdf
        if gsw is not None:
            port = g.port_bdf or f"{gsw.id}-dsp{g.index}"
            nodes.append({"bdf": port, "parent": gsw.bdf or f"{gsw.id}-up", "kind": "switch_downstream",
                          "vendor": gsw.vendor, "device": gsw.device,
                          "description": f"{gsw.vendor} {gsw.device} downstream port".strip(),
                          "numa_node": numa[rp.socket], "iommu_group": None,
                          "link": _link(g.gen, g.width), "acs": _acs(gsw.acs_redirect)})
            parent = port
            chain += [port, gsw.bdf or f"{gsw.id}-up"]
        chain.append(rp.bdf)
        nodes.append({"bdf": g.bdf, "parent": parent, "kind": "gpu", "vendor": "NVIDIA",
                      "device": g.name, "description": g.name, "numa_node": numa[rp.socket],
                      "iommu_group": None, "link": _link(g.gen, g.width), "acs": None})
        paths[str(g.index)] = chain
    return {"nodes": nodes, "gpu_paths": paths}


def guest_bdf(index: int) -> str:
    """Bus id of GPU `index` in a flat guest tree (one virtual root port per GPU on bus 00)."""
    return f"0000:{index + 1:02x}:00.0"


def _flat_tree(fabric: Fabric) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    paths: dict[str, list[str]] = {}
    for g in fabric.gpus:
        port = f"0000:00:{(g.index // 8) + 2:02x}.{g.index % 8}"
        nodes.append({"bdf": port, "parent": None, "kind": "root_port", "vendor": "QEMU/KVM",
                      "device": "pcie-root-port", "description": "virtual PCIe root port",
                      "numa_node": 0, "iommu_group": g.index, "link": _link(g.gen, g.width),
                      "acs": None})
        nodes.append({"bdf": guest_bdf(g.index), "parent": port, "kind": "gpu", "vendor": "NVIDIA",
                      "device": g.name, "description": g.name, "numa_node": 0,
                      "iommu_group": g.index, "link": _link(g.gen, g.width), "acs": None})
        paths[str(g.index)] = [guest_bdf(g.index), port]
    return {"nodes": nodes, "gpu_paths": paths}


def _p2p_status(fabric: Fabric) -> dict[str, str]:
    # The driver reports P2P as supported on these boxes (topo -p2p shows OK on the real server);
    # a VM guest sees "OK" too even though the traffic goes through the IOMMU.
    return {"read": "OK", "write": "OK", "atomics": "NS"}


def topology(fabric: Fabric) -> dict[str, Any]:
    """topology.json (docs/bundle.md) for the fabric, with `source: "simulated"`.

    For a VM profile with a flat guest view the top-level tree, bus ids and pair levels are what
    the guest would discover; the real tree is kept under `sim.real_pcie_tree` and
    `sim.real_pairs`, so that tuning can be checked against the truth.
    """
    flat = fabric.virtualization.guest_view == "flat"
    real_tree = _real_tree(fabric)
    cpus = {s.id: s.cpus for s in fabric.sockets}
    gpus = []
    for g in fabric.gpus:
        sock = fabric.socket_of(g.index)
        gpus.append({
            "index": g.index, "name": g.name, "uuid": f"GPU-sim-{fabric.name}-{g.index:02d}",
            "bus_id": guest_bdf(g.index) if flat else g.bdf,
            "pcie": {"gen_current": g.gen, "gen_max": g.gen, "gen_max_device": g.gen,
                     "gen_max_system": g.gen, "width_current": g.width, "width_max": g.width},
            "bar1_bytes": g.bar1_bytes, "memory_bytes": g.memory_bytes,
            "numa_node": 0 if flat else fabric.numa_of(g.index),
            "cpu_affinity": None if flat else cpus.get(sock) or None,
            "virtualization_mode": "passthrough" if fabric.virtualization.is_vm else "bare_metal",
            "status": {"cpu_affinity": "unknown"} if flat or not cpus.get(sock) else {},
        })
    n = len(fabric.gpus)

    def pairs(guest: bool) -> list[dict[str, Any]]:
        return [{"a": a, "b": b, "level": pair_level(fabric, a, b, guest=guest),
                 "p2p": _p2p_status(fabric)} for a in range(n) for b in range(n) if a != b]

    # translated: the kernel's own spelling of it (iommu=nopt; AMD's IOMMU is on when the BIOS
    # enables it and amd_iommu= has no "on" value, kernel-parameters.txt)
    cmdline = {"off": "amd_iommu=off iommu=off", "passthrough": "iommu=pt",
               "translated": "iommu=nopt"}[fabric.iommu_mode]
    if fabric.virtualization.is_vm:
        # The IOMMU that translates is the host's (VFIO passthrough); the guest's own command
        # line is not part of the model.
        host = "intel_iommu=on iommu=nopt" if fabric.cpu_vendor == "intel" else "iommu=nopt"
        cmdline = f"(host) {host}" if fabric.translated else f"(host) {cmdline}"
    doc: dict[str, Any] = {
        "source": "simulated",
        "driver": {"driver_version": fabric.driver_version,
                   "cuda_driver_version": fabric.cuda_driver_version, "nvml_version": None,
                   "status": {"nvml_version": "unknown"}},
        "gpus": gpus,
        "pairs": pairs(guest=True),
        "pcie_tree": _flat_tree(fabric) if flat else real_tree,
        "iommu": {"enabled": fabric.iommu_mode != "off", "mode": fabric.iommu_mode,
                  "cmdline": cmdline.strip(),
                  "groups": {guest_bdf(g.index) if flat else g.bdf: g.index for g in fabric.gpus}
                  if fabric.iommu_mode != "off" else {},
                  "evidence": [f"fabric model {fabric.name}: iommu.mode = {fabric.iommu_mode}"]
                  + (["the host IOMMU translates every DMA of the guest (VFIO passthrough)"]
                     if fabric.virtualization.is_vm and fabric.translated else [])},
        "virtualization": {"is_vm": fabric.virtualization.is_vm,
                           "hypervisor": fabric.virtualization.hypervisor,
                           "flat_pcie_tree": flat,
                           "evidence": [f"fabric model {fabric.name}: virtualization.guest_view = "
                                        f"{fabric.virtualization.guest_view}"]},
        "numa": {"nodes": [{"id": 0, "cpus": ",".join(s.cpus for s in fabric.sockets)}] if flat
                 else [{"id": s.numa_node, "cpus": s.cpus} for s in fabric.sockets]},
        "status": {"nvml": "simulated", "sysfs": "simulated", "lspci": "simulated"},
        "sim": {"profile": fabric.name, "file": fabric.path, "description": fabric.description,
                "sources": fabric.sources, "cpu": fabric.cpu, "iommu_mode": fabric.iommu_mode,
                "acs_redirect": {sw.id: sw.acs_redirect for sw in fabric.switches.values()}
                | {rp.id: rp.acs_redirect for rp in fabric.root_ports.values()},
                "real_pcie_tree": real_tree, "real_pairs": pairs(guest=False),
                "real_bus_ids": {str(g.index): g.bdf for g in fabric.gpus},
                "posted_write_collapse": None if fabric.collapse is None else
                {"enabled": fabric.collapse.enabled, "flow_gbps": fabric.collapse.flow_gbps,
                 "source": fabric.collapse.source}},
    }
    return doc
