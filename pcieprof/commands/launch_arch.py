"""The GPU architecture serve-bench launches for: the GPUs of the machine it runs on.

In order: `--arch`; this machine's GPUs as NVML names them (the compute capability, else the
product name in pcieprof/analysis/gpus.toml, through pcieprof.analysis.box); with `--resume`,
the architecture the bundle's launch search recorded; else the card's. `recommend` and the
report take it from their bundle's box instead (pcieprof.commands.tuning.the_launch).

With `--launch-prefix 'ssh HOST ...'` the server runs elsewhere and this machine's GPUs may not
be its GPUs: the line printed names where the architecture came from, so `--arch` can correct it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcieprof.analysis.box import Box, box_from
from pcieprof.bundle.serve_search import ServeSearch
from pcieprof.bundle.topology import Topology
from pcieprof.cards import NVLINK, PCIE, LaunchTarget, ModelCard, load_card
from pcieprof.discover.nvml import Nvml, collect
from pcieprof.tune.space import SearchSpace


@dataclass(frozen=True)
class ArchChoice:
    """Which architecture the launch is for.

    Attributes:
        arch: the architecture the launch search ranks values for; None: the card's.
        box: this machine's GPUs when NVML sees any and decided it, else None; an unknown
            architecture (`box.arch == ""`) gets no architecture-specific backends
            (pcieprof.commands.tuning.the_launch).
        line: where the architecture came from, one line.
    """

    arch: str | None
    box: Box | None
    line: str


def local_box(nvml: Nvml | None = None) -> tuple[Box | None, str]:
    """(this machine's GPUs as NVML reports them, "") or (None, why not: no driver, no GPU)."""
    w = nvml if nvml is not None else Nvml()
    try:
        part = collect(w)
    finally:
        w.shutdown()
    gpus = [g for g in part["gpus"] if g.get("name")]
    status = str(part["status"]["nvml"])
    if not gpus:  # NVML's status without its hint, which is for the measuring commands
        return None, "NVML names no GPU" if status == "ok" else status.split("; ")[0]
    # the pairs too: NVML's NVLink P2P answers tell the fabric (pcieprof.analysis.box.fabric_of)
    return box_from(Topology.from_json({"gpus": gpus, "pairs": part["pairs"]}),
                    where="this machine"), ""


def launch_arch(card: ModelCard, given: str | None, resumed: ServeSearch | None = None,
                seen: tuple[Box | None, str] | None = None) -> ArchChoice:
    """The architecture of serve-bench's launch (see the module docstring for the order).

    Args:
        card: the model card (its search's `arch` is the last resort).
        given: `--arch`, or None.
        resumed: the launch search `--resume` continues, or None.
        seen: local_box()'s answer when the caller already asked NVML (default: ask it).
    """
    if given:
        return ArchChoice(given, None, f"GPU architecture {given}: given (--arch)")
    if card.sglang.is_reference:  # it plays the card's search on the CPU, whatever GPUs are here
        return ArchChoice(None, None, f"GPU architecture {_cards(card)}: the card's (the "
                                      "reference server runs on the CPU)")
    box, why = seen if seen is not None else local_box()
    if box is not None:
        here = f"this machine's {box.describe()}"
        if box.arch:
            return ArchChoice(box.arch, box, f"GPU architecture {box.arch}: {here}, "
                                             f"{box.arch_source}; --arch names another")
        return ArchChoice(None, box, f"GPU architecture unknown: {here}, {box.arch_source}: "
                                     "no architecture-specific backends; --arch names one")
    if resumed is not None and resumed.arch:
        return ArchChoice(resumed.arch, None, f"GPU architecture {resumed.arch}: the resumed "
                                              f"search's (no GPU seen on this machine: {why})")
    return ArchChoice(None, None, f"GPU architecture {_cards(card)}: the card's (no GPU seen on "
                                  f"this machine: {why}); --arch names another")


def _cards(card: ModelCard) -> str:
    """The architecture a card's search is for (its own, or that of the card it plays)."""
    if not card.search:
        return "unknown"
    return SearchSpace.from_card(card.name, card.search,
                                 load_other=lambda name: load_card(name).search).arch


def launch_target(card: ModelCard, where: ArchChoice | None,
                  seen: tuple[Box | None, str] | None) -> tuple[LaunchTarget, str]:
    """The box serve-bench's launch is for, for the card's box settings (flags and environment
    for some architectures or fabrics only), and one line saying where its fabric came from.

    Architecture as `where` decided it (the card's when it names none and no GPU decided);
    fabric from this machine's NVML (its NVLink P2P answers) when it sees GPUs, the card's own
    box's when it sees none and the architecture is the card's too, else unknown (the settings
    that need it are left out, and the command's notes say so).
    """
    box, why = seen if seen is not None else (None, "not asked")
    if where is not None and where.box is not None:
        arch, arch_src = where.box.arch, where.box.arch_source
    elif where is not None and where.arch:
        arch, arch_src = where.arch, where.line
    else:
        arch, arch_src = _cards(card), f"the card's (no GPU seen on this machine: {why})"
    if box is not None:
        fabric, fabric_src = box.fabric, f"this machine's GPUs: {box.fabric_source}"
    elif (where is None or not where.arch) and card.sglang.fabric:
        fabric, fabric_src = card.sglang.fabric, f"the card's (no GPU seen on this machine: {why})"
    else:
        fabric, fabric_src = "", f"no GPU seen on this machine ({why})"
    target = LaunchTarget(arch=arch if arch != "unknown" else "", arch_source=arch_src,
                          fabric=fabric, fabric_source=fabric_src)
    shown = {PCIE: "PCIe-only (no NVLink)", NVLINK: "NVLink"}.get(fabric, "unknown")
    return target, f"GPU fabric {shown}: {fabric_src}"
