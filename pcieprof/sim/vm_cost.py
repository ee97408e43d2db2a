"""What virtualization costs, like for like: a VM profile against its bare-metal twin.

The same box is priced twice, in the VM (`rtxpro6000-8x-vm`) and bare (its
`virtualization.bare_metal_twin`), for the all-reduces of decode, under the same NCCL settings:
- `default`: no NCCL variable set on either side;
- `best`: on each side the fastest of the candidate settings (`CANDIDATES`) at that size;
- `best_safe`: the VM's fastest setting that does not send peer DMA through the translating IOMMU
  (`known_risks`: NCCL can hang on its first collective there);
- `same_choices`: the bare box made to choose exactly what NCCL in the guest chose (transport,
  protocol, channels), so that only the data path differs.
Each row says which of the VM profile's mechanisms (`[[mechanism]]`: IOMMU translation, ACS
redirect, the flat guest tree) explain the difference. A VM that is faster than its twin under
the same settings is so only through what NCCL in the guest decides from the flat tree it sees,
never through its data path; `same_choices` shows that.

Message sizes are those of the card's decode at TP over the ranks: one all-reduce of batch x
hidden x the activation's bytes after attention and after the MLP/MoE of each layer, plus the
embedding's (pcieprof.cards.step: 157 per step for a 78-layer model, 161 for an 80-layer dense
one). Everything here is simulated by the fabric model, never measured.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from pcieprof.bundle.vm_cost import HostChange, VmRow, VmTable
from pcieprof.bundle.vm_mechanism import KnownIssue, Mechanism
from pcieprof.cards import DEFAULT_CARD, ModelCard, load_card
from pcieprof.cards.step import message_bytes, step_allreduces
from pcieprof.errors import BadInput
from pcieprof.sim import collectives, model
from pcieprof.sim.fabric import DEFAULT_PROFILE, Fabric, apply_changes, load_profile

#: Decode batches priced (the message of each is the card's, `decode_sizes`).
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
BASES = ("default", "best", "best_safe", "same_choices")
#: What a graph file stands for in the candidates (the model only needs to know one is given).
GRAPH_FILE = "nccl_graph.xml"


def _candidates() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    p2p: tuple[dict[str, str], ...] = ({}, {"NCCL_P2P_LEVEL": "SYS"}, {"NCCL_P2P_DISABLE": "1"})
    proto: tuple[dict[str, str], ...] = ({}, {"NCCL_PROTO": "LL"}, {"NCCL_PROTO": "Simple"})
    chans: tuple[dict[str, str], ...] = ({}, {"NCCL_MIN_NCHANNELS": "8"})
    graph: tuple[dict[str, str], ...] = ({}, {"NCCL_GRAPH_FILE": GRAPH_FILE})
    for parts in itertools.product(p2p, proto, chans, graph):
        env: dict[str, str] = {}
        for part in parts:
            env.update(part)
        out[env_label(env)] = env
    return out


def decode_sizes(card: ModelCard) -> tuple[int, ...]:
    """The card's decode all-reduce message at each of DECODE_BATCHES, bytes (hidden 6144 in
    bf16: 12 KiB .. 768 KiB)."""
    return tuple(message_bytes(card, b) for b in DECODE_BATCHES)


def _card(card: ModelCard | None) -> ModelCard:
    return card if card is not None else load_card(DEFAULT_CARD)


def env_label(env: Mapping[str, str]) -> str:
    """`default` for no variable, else `K=V K=V` in a fixed order."""
    return " ".join(f"{k}={env[k]}" for k in sorted(env)) or "default"


#: The NCCL settings `best` searches, on both sides alike: P2P level (default, SYS, off) x protocol
#: (default, LL, Simple) x NCCL_MIN_NCHANNELS (default, 8) x graph file (none, given).
CANDIDATES: dict[str, dict[str, str]] = _candidates()


@dataclass(frozen=True)
class Run:
    """One side of a comparison: the setting, the predicted time and what NCCL chose.

    Attributes:
        env: the NCCL variables set.
        time_us: predicted time of one all-reduce (or of the decode step's all-reduces), us.
        proto: protocol the model assumes NCCL chose.
        channels: channels.
        p2p_edges: ring edges on the P2P transport (the rest go through host memory, SHM).
        shm_edges: ring edges through host memory.
        risks: ids of the profile's known issues this setting runs into (`known_risks`).
    """

    env: dict[str, str]
    time_us: float
    proto: str
    channels: int
    p2p_edges: int
    shm_edges: int
    risks: tuple[str, ...]

    @property
    def choice(self) -> str:
        """`LL, 4 channels, 8 SHM edges` and the like."""
        edges = ", ".join(f"{n} {what} edges" for n, what in ((self.p2p_edges, "P2P"),
                                                              (self.shm_edges, "SHM")) if n)
        return f"{self.proto}, {self.channels} channels, {edges}"


@dataclass(frozen=True)
class Comparison:
    """The VM and its twin at one message size under one basis of comparison.

    Attributes:
        basis: `default`, `best`, `best_safe` or `same_choices` (see the module docstring).
        size_bytes: all-reduce message size; `count` of them (1, or the decode step's).
        batch: decode batch this size is (size / (hidden x activation bytes)).
        count: all-reduces priced together (the card's decode step at this batch, or 1).
        vm: the VM's run; bare: the bare-metal twin's.
        why: ids of the VM profile's mechanisms behind the difference, most telling first.
    """

    basis: str
    size_bytes: int
    batch: int
    count: int
    vm: Run
    bare: Run
    why: tuple[str, ...]

    @property
    def vm_minus_bare_us(self) -> float:
        """What the VM costs over bare metal, us (negative: the VM is faster)."""
        return self.vm.time_us - self.bare.time_us

    @property
    def vm_over_bare(self) -> float:
        """VM time / bare-metal time."""
        return self.vm.time_us / self.bare.time_us

    def row(self, table: str) -> VmRow:
        """The stored row (topology.json `sim.vm.rows`) of the `per_size` or `step` table."""
        return VmRow(basis=self.basis, size_bytes=self.size_bytes, batch=self.batch,
                     count=self.count, vm_time_us=self.vm.time_us,
                     bare_time_us=self.bare.time_us, vm_minus_bare_us=self.vm_minus_bare_us,
                     vm_over_bare=self.vm_over_bare, vm_env=env_label(self.vm.env),
                     bare_env=env_label(self.bare.env), vm_choice=self.vm.choice,
                     bare_choice=self.bare.choice, vm_risks=self.vm.risks, why=self.why,
                     table=table)


@dataclass(frozen=True)
class LikeForLike:
    """The like-for-like comparison of a VM profile and its twin, as the model computes it
    (what it stores is `document()`, pcieprof.bundle.vm_cost.VmTable).

    Attributes:
        vm_profile, bare_profile: the two profiles' names.
        ranks: the GPUs of the all-reduce, in ring order.
        per_size: one Comparison per size and basis (count 1).
        step: the card's decode step at each batch: step_allreduces of that batch's size, per basis.
        mechanisms: the VM profile's mechanisms, by id, with their sources.
        source: always `simulated`.
    """

    vm_profile: str
    bare_profile: str
    ranks: tuple[int, ...]
    per_size: list[Comparison]
    step: list[Comparison]
    mechanisms: dict[str, Mechanism]
    model: str = ""
    hidden: int = 0
    step_allreduces: int = 0
    source: str = "simulated"

    def rows(self) -> list[VmRow]:
        """Every row, per size then per step, flat: `pandas.DataFrame(map(asdict, rows()))`."""
        return [c.row("per_size") for c in self.per_size] + [c.row("step") for c in self.step]

    def document(self) -> VmTable:
        """What the sim backend stores in topology.json `sim.vm` (without the host-side
        changes, known issues and sensitivity: `bundle_section` adds them)."""
        return VmTable(vm_profile=self.vm_profile, bare_profile=self.bare_profile,
                       ranks=list(self.ranks), model=self.model,
                       step_allreduces=self.step_allreduces, hidden=self.hidden,
                       bases=list(BASES), rows=self.rows(), mechanisms=dict(self.mechanisms),
                       source=self.source)


def _fabric(profile: str | Fabric) -> Fabric:
    return profile if isinstance(profile, Fabric) else load_profile(profile)


def twin_of(vm: Fabric) -> Fabric:
    """The bare-metal twin of a VM profile.

    Raises:
        BadInput: the profile is not a VM or names no twin.
    """
    if not vm.virtualization.is_vm or not vm.virtualization.bare_metal_twin:
        raise BadInput(f"{vm.name}: not a VM profile with a bare-metal twin",
                       hint="set [virtualization] is_vm = true and bare_metal_twin = \"PROFILE\"")
    return load_profile(vm.virtualization.bare_metal_twin)


def known_risks(fabric: Fabric, env: Mapping[str, str], ranks: Sequence[int] | None = None) -> list[KnownIssue]:
    """The profile's known issues that a setting runs into.

    `p2p_through_translating_iommu`: NCCL would put some ring edge on the P2P transport while the
    IOMMU translates peer DMA.
    """
    ranks = list(ranks) if ranks is not None else [g.index for g in fabric.gpus]
    out = []
    for issue in fabric.known_issues:
        if issue.when == "p2p_through_translating_iommu" and fabric.translated and len(ranks) > 1:
            if any(collectives.choices(fabric, ranks, env)["p2p_edges"]):
                out.append(issue)
    return out


def _run(fabric: Fabric, ranks: list[int], size: int, env: Mapping[str, str], count: int) -> Run:
    t, c = collectives.predict_allreduce(fabric, ranks, size, "bf16", env)
    p2p = sum(1 for v in c["transport"].values() if not v.startswith("SHM"))
    return Run(dict(env), t * count, c["proto"], c["channels"], p2p, len(c["transport"]) - p2p,
               tuple(i.id for i in known_risks(fabric, env, ranks)))


def _best(runs: Sequence[Run], safe: bool) -> Run:
    """The fastest run (the one with fewer variables on a tie); `safe`: among those free of
    known issues."""
    pool = [r for r in runs if not (safe and r.risks)]
    return min(pool, key=lambda r: (r.time_us, len(r.env)))


def _times(run: Run, count: int) -> Run:
    return replace(run, time_us=run.time_us * count)


def same_choices_env(run: Run) -> dict[str, str]:
    """NCCL variables that make a box choose what `run` chose: the transport of every edge, the
    protocol, the channel count (Ring is the only algorithm the model picks by itself)."""
    env = {"NCCL_PROTO": run.proto, "NCCL_MIN_NCHANNELS": str(run.channels),
           "NCCL_MAX_NCHANNELS": str(run.channels)}
    if run.p2p_edges == 0:
        env["NCCL_P2P_DISABLE"] = "1"
    elif run.shm_edges == 0:
        env["NCCL_P2P_LEVEL"] = "SYS"
    else:  # mixed: the guest's own level decided which edges; keep it
        env.update({k: v for k, v in run.env.items() if k in ("NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE")})
    return env


def _why(vm: Fabric, basis: str, v: Run, b: Run) -> tuple[str, ...]:
    """Mechanism ids behind a row: the flat tree when NCCL chose differently in the guest (the
    only way the VM can come out ahead), then what the VM's data path pays."""
    ids = {m.id for m in vm.mechanisms}
    out = []
    differs = (v.proto, v.channels, v.p2p_edges) != (b.proto, b.channels, b.p2p_edges)
    if differs and vm.virtualization.guest_view == "flat" and basis != "same_choices":
        out.append("flat_guest_tree")
    if vm.translated:
        out.append("iommu_translation")
    if v.p2p_edges and any(sw.acs_redirect for sw in vm.switches.values()):
        out.append("acs_redirect")
    return tuple(i for i in out if i in ids)


def like_for_like(vm: str | Fabric = DEFAULT_PROFILE, *, card: ModelCard | None = None,
                  ranks: Sequence[int] | None = None,
                  sizes: Sequence[int] | None = None) -> LikeForLike:
    """The VM against its bare-metal twin under the same NCCL settings, per size and per decode step.

    Args:
        vm: a VM profile (name, path or Fabric) with `virtualization.bare_metal_twin`.
        card: the model whose decode is priced (DEFAULT_CARD when None).
        ranks: GPUs of the all-reduce in ring order (default: all, in index order).
        sizes: message sizes in bytes (default: the card's decode sizes, batch 1..64).

    Returns:
        A LikeForLike: rows for every size and basis (`default`, `best`, `best_safe`,
        `same_choices`), and the same for the card's decode step at TP over the ranks.

    Raises:
        BadInput: not a VM profile with a twin, or ranks the box does not have.
    """
    vf = _fabric(vm)
    bf = twin_of(vf)
    rk = list(ranks) if ranks is not None else [g.index for g in vf.gpus]
    c = _card(card)
    n = step_allreduces(c, len(rk))
    per_size: list[Comparison] = []
    step: list[Comparison] = []
    for size in (sizes if sizes is not None else decode_sizes(c)):
        batch = max(1, size // message_bytes(c, 1))
        v_all = [_run(vf, rk, size, env, 1) for env in CANDIDATES.values()]
        b_all = [_run(bf, rk, size, env, 1) for env in CANDIDATES.values()]
        v_def, b_def = v_all[0], b_all[0]  # CANDIDATES starts with the empty setting
        rows = {"default": (v_def, b_def),
                "best": (_best(v_all, False), _best(b_all, False)),
                "best_safe": (_best(v_all, True), _best(b_all, True)),
                "same_choices": (v_def, _run(bf, rk, size, same_choices_env(v_def), 1))}
        for basis in BASES:
            v, b = rows[basis]
            why = _why(vf, basis, v, b)
            per_size.append(Comparison(basis, size, batch, 1, v, b, why))
            step.append(Comparison(basis, size, batch, n, _times(v, n), _times(b, n), why))
    return LikeForLike(vf.name, bf.name, tuple(rk), per_size, step,
                       {m.id: m for m in vf.mechanisms}, model=c.name, hidden=c.hidden_size,
                       step_allreduces=n)


def host_changes(vm: str | Fabric = DEFAULT_PROFILE, *, card: ModelCard | None = None,
                 ranks: Sequence[int] | None = None) -> list[HostChange]:
    """The VM profile's host-side changes (`[[host_change]]`), each priced by the model: the
    card's decode step at batch 1 (DEFAULT_CARD when None) before and after, with NCCL defaults and with the best setting free of
    known issues, and a same-switch P2P copy. A change whose `apply` is empty leaves the guest's
    GPUs as they are (its `effect` says why) and prices to no gain."""
    vf = _fabric(vm)
    rk = list(ranks) if ranks is not None else [g.index for g in vf.gpus]
    c = _card(card)
    size, n = message_bytes(c, 1), step_allreduces(c, len(rk))

    def price(f: Fabric) -> tuple[float, float, float]:
        runs = [_run(f, rk, size, env, n) for env in CANDIDATES.values()]
        return (runs[0].time_us, _best(runs, True).time_us,
                model.predict_p2p(f, rk[0], rk[1], "p2p", "uni", 256 << 20)[0])

    before = price(vf)
    out = []
    for ch in vf.host_changes:
        after = price(apply_changes(vf, ch.apply)) if ch.apply else before
        out.append(HostChange(
            id=ch.id, title=ch.title, how=ch.how, effect=ch.effect, risk=ch.risk,
            blocked_by=ch.blocked_by, feasible=ch.blocked_by is None, apply=dict(ch.apply),
            sources=ch.sources, step_default_us=(before[0], after[0]),
            step_best_safe_us=(before[1], after[1]), p2p_same_switch_gbps=(before[2], after[2])))
    return out


#: Assumed parameters (calibration/params.toml kind "assumed") the VM's extra cost rests on, and
#: the range each is tried at: (section, key, low, high). latency.iommu_us: 0 (translation
#: costs nothing beyond the fixed bandwidth factor) to 1 us per access (assumed: an IOTLB miss
#: walks a multi-level I/O page table, a few DRAM reads).
SENSITIVITY = (("latency", "iommu_us", 0.0, 1.0),)


def sensitivity(vm: Fabric, card: ModelCard | None = None) -> list[dict[str, Any]]:
    """The like-for-like verdict at the low and high end of each assumed parameter: per end, the
    VM and bare-metal time at the smallest decode size on the `same_choices` basis (else `best`)
    and the all-reduce time of the decode step."""
    out = []
    for section, key, low, high in SENSITIVITY:
        ends = {}
        for end, value in (("low", low), ("high", high)):
            with model.params_with(section, key, value):
                table = like_for_like(vm, card=card)
            basis = "same_choices" if any(c.basis == "same_choices" for c in table.per_size) \
                else "best"
            row = min((c for c in table.per_size if c.basis == basis), key=lambda c: c.size_bytes)
            st = next(c for c in table.step if c.basis == basis and c.size_bytes == row.size_bytes)
            ends[end] = {"value": value, "basis": basis, "size_bytes": row.size_bytes,
                         "vm_us": row.vm.time_us, "bare_us": row.bare.time_us,
                         "step_vm_us": st.vm.time_us, "step_bare_us": st.bare.time_us}
        out.append({"param": f"{section}.{key}", "value": model.params()[section][key],
                    "kind": "assumed", **ends})
    return out


def bundle_section(vm: Fabric, card: ModelCard | None = None) -> VmTable | None:
    """What a VM bundle carries about virtualization (topology.json `sim.vm`): the like-for-like
    table at the card's decode sizes (DEFAULT_CARD when None), the mechanisms, the host-side
    changes priced, the known issues. None for a profile that is not a VM with a twin."""
    if not vm.virtualization.is_vm or not vm.virtualization.bare_metal_twin:
        return None
    return replace(like_for_like(vm, card=card).document(),
                   host_changes=host_changes(vm, card=card),
                   known_issues=list(vm.known_issues),
                   sensitivity=sensitivity(vm, card))


TABLE_BEGIN = "<!-- vm table: generated by python -m pcieprof.sim.vm_cost -->"
TABLE_END = "<!-- end of vm table -->"
_HEADS = {"default": "default", "same_choices": "same NCCL choices", "best": "best",
          "best_safe": "best without the hang risk"}


def markdown(table: LikeForLike | None = None) -> str:
    """The like-for-like table as markdown: VM / bare-metal time per decode batch and basis, the
    card's decode step at batch 1, and what each VM column ran."""
    t = table if table is not None else like_for_like()
    order = ("default", "same_choices", "best", "best_safe")
    lines = [f"Simulated: `{t.vm_profile}` (VM) against `{t.bare_profile}` (its bare-metal twin), "
             f"8-GPU all-reduce, VM / bare metal in us:", "",
             "| batch | message | " + " | ".join(_HEADS[b] for b in order) + " |",
             "|---|---|" + "---|" * len(order)]
    by = {(c.basis, c.size_bytes): c for c in t.per_size}
    sizes = sorted({c.size_bytes for c in t.per_size})
    batches = {c.size_bytes: c.batch for c in t.per_size}
    for size in sizes:
        batch = batches[size]
        cells = []
        for b in order:
            c = by[(b, size)]
            cells.append(f"{c.vm.time_us:.1f} / {c.bare.time_us:.1f}")
        lines.append(f"| {batch} | {size // 1024} KiB | " + " | ".join(cells) + " |")
    first_size = sizes[0] if sizes else 0
    step = {c.basis: c for c in t.step if c.size_bytes == first_size}
    if step:
        lines.append(f"| {t.model} step, batch {batches[first_size]} ({t.step_allreduces} "
                     f"all-reduces), ms | | " + " | ".join(
            f"{step[b].vm.time_us / 1e3:.2f} / {step[b].bare.time_us / 1e3:.2f}" for b in order) + " |")
    first = {b: by[(b, first_size)] for b in order if (b, first_size) in by}
    lines += ["", f"At {first_size // 1024} KiB, what each side ran:", ""]
    for b, c in first.items():
        risk = f"; VM runs into {', '.join(c.vm.risks)}" if c.vm.risks else ""
        lines.append(f"- {_HEADS[b]}: VM `{env_label(c.vm.env)}` ({c.vm.choice}); bare metal "
                     f"`{env_label(c.bare.env)}` ({c.bare.choice}); why: {', '.join(c.why)}{risk}.")
    return "\n".join(lines) + "\n"


def update_readme(path: Path) -> bool:
    """Replace the generated VM table of a README (between TABLE_BEGIN and TABLE_END). Returns
    True when the file changed."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    start, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"{p}: no generated VM table ({TABLE_BEGIN} ... {TABLE_END})")
    new = text[:start + len(TABLE_BEGIN)] + "\n" + markdown().strip() + "\n" + text[end:]
    if new != text:
        p.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":  # python -m pcieprof.sim.vm_cost [--readme docs/fabric-model.md]
    import sys

    if "--readme" in sys.argv:
        update_readme(Path(sys.argv[sys.argv.index("--readme") + 1]))
    print(markdown(), end="")
