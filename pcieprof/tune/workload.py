"""The whole workload a global NCCL setting is priced on (issue 22, point 4).

An NCCL variable such as NCCL_PROTO=LL applies to every all-reduce a server makes, not only to
decode-sized ones: decode steps over the card's concurrency range (batch 1 .. the band's largest
batch, the card's --max-running-requests) and prefill, which SGLang runs in chunks of
--chunked-prefill-size tokens (the card's flag; SGLang's own default 8192 when the card sets
none, python/sglang/srt/server_args.py of the pinned 0.5.23), one all-reduce of chunk x hidden x
2 bytes per collective of the forward pass (pcieprof.cards.step). A setting is offered as global
only when it slows none of these phases in the bundle's own curves; otherwise a size-aware route
(NCCL's example tuner plugin) is offered instead, with its limits.

Where the prefill message lies beyond the largest measured size, it is priced by the curves'
extrapolation rule (pcieprof.analysis.curves: time grows with size from the largest point), i.e.
at the ratio of the two settings there, and said so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from pcieprof.analysis.curves import EXTRAPOLATED, Curve
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.cards.card import ModelCard
from pcieprof.cards.step import message_bytes
from pcieprof.tune.assumed import RESTS_ON
from pcieprof.units import size_label

#: SGLang's --chunked-prefill-size when the card sets none (server_args.py default for GPUs
#: without a per-GPU rule; assumed for the cards that name none).
SGLANG_DEFAULT_CHUNK = 8192
#: The range that default may take, for the verdict at both ends (issue 22 point 7): the range
#: itself is assumed (SGLang sizes its default by the GPU's memory and version; pcieprof does
#: not read which one the server picks), from a small-GPU 2048 to the 16384 large cards set.
SGLANG_CHUNK_RANGE = (2048, 16384)
#: A phase is slowed when the setting takes more than this much longer there (relative): the
#: spread below which pcieprof's measurements do not separate two settings.
SLOWER = 0.02
#: How a card says a setting it carries has no price in the bundle, and why (a caveat starting
#: so, then `VAR[=VALUE]: why`): the walk over every carried setting accepts a setting without
#: a price only with it (tests/tune/test_tune_workload.py).
UNPRICED = "unpriced: "


@dataclass(frozen=True)
class Phase:
    """One kind of forward pass and its all-reduce.

    Attributes:
        name: `decode, batch 64` or `prefill chunk of 16384 tokens`.
        size_bytes: its all-reduce message.
        count: all-reduces of that size per forward pass.
    """

    name: str
    size_bytes: int
    count: int


@dataclass(frozen=True)
class PhaseTime:
    """A phase under the default and under a setting (us per all-reduce)."""

    phase: Phase
    base_us: float
    new_us: float
    how: str = ""

    @property
    def change(self) -> float:
        """Relative change of the setting against the default (+0.35 = 35% slower)."""
        return self.new_us / self.base_us - 1 if self.base_us > 0 else 0.0

    def text(self) -> str:
        """`prefill chunk of 16384 tokens (192 MiB): 10.5 -> 14.7 ms per all-reduce (+40%)`."""
        unit, k = ("ms", 1e3) if self.base_us >= 1e3 else ("us", 1.0)
        return (f"{self.phase.name} ({size_label(self.phase.size_bytes)}): "
                f"{self.base_us / k:.3g} -> {self.new_us / k:.3g} {unit} per all-reduce "
                f"({self.change * 100:+.0f}%{', ' + self.how if self.how else ''})")


def chunked_prefill(card: ModelCard) -> tuple[int, str]:
    """(prefill chunk in tokens, where it comes from): the card's --chunked-prefill-size, else
    SGLang's default."""
    flags = list(card.sglang.recommended_flags)
    for i, f in enumerate(flags):
        value = f.split("=", 1)[1] if f.startswith("--chunked-prefill-size=") else (
            flags[i + 1] if f == "--chunked-prefill-size" and i + 1 < len(flags) else None)
        if value is not None and value.lstrip("-").isdigit() and int(value) > 0:
            return int(value), f"the card's --chunked-prefill-size {value}"
    return SGLANG_DEFAULT_CHUNK, (f"SGLang's default --chunked-prefill-size {SGLANG_DEFAULT_CHUNK} "
                                  f"(the card sets none)")


def phases(band: DecodeBand, count: Callable[[int], int]) -> list[Phase]:
    """Decode at every batch of the band and one prefill chunk of the band's card.

    Args:
        band: the decode band (its card, batch range and message sizes).
        count: batch -> all-reduces per forward pass over the full group.
    """
    out = [Phase(f"decode, batch {b}", band.message_bytes(b), count(b)) for b in band.batches]
    if band.card is not None:
        chunk, _ = chunked_prefill(band.card)
        out.append(Phase(f"prefill chunk of {chunk} tokens", message_bytes(band.card, chunk),
                         count(1)))
    return out


def describe(band: DecodeBand) -> str:
    """The workload in one line, with the ranking metric the tuner orders settings by."""
    said = (f"decode at batch {band.batch_min}-{band.batch_max} "
            f"({size_label(band.lo_bytes)}-{size_label(band.hi_bytes)})")
    if band.card is not None:
        chunk, where = chunked_prefill(band.card)
        said += (f" and prefill in chunks of {chunk} tokens "
                 f"({size_label(message_bytes(band.card, chunk))}, {where})")
    return (f"{band.model}: {said}; ranked by the all-reduce time saved per decode step, "
            f"averaged over the decode batches")


def price(band: DecodeBand, count: Callable[[int], int], base: Curve,
          new: Curve) -> list[PhaseTime]:
    """Every phase of the workload under the default curve and the setting's."""
    out = []
    for ph in phases(band, count):
        how = ""
        if base.extent(ph.size_bytes) == EXTRAPOLATED or new.extent(ph.size_bytes) == EXTRAPOLATED:
            top = min(base.max_size, new.max_size)
            how = f"beyond the measured sizes: at the ratio of {size_label(top)}"
        t0, t1 = base.at(ph.size_bytes), new.at(ph.size_bytes)
        if math.isfinite(t0) and math.isfinite(t1):
            out.append(PhaseTime(ph, t0, t1, how))
    return out


def slowed(times: list[PhaseTime]) -> list[PhaseTime]:
    """The phases the setting slows by more than SLOWER."""
    return [t for t in times if t.change > SLOWER]


def chunk_range(band: DecodeBand, base: Curve, new: Curve) -> list[str]:
    """When the card names no prefill chunk (SGLang's default is assumed): the setting's change
    of the prefill all-reduce at both ends of SGLANG_CHUNK_RANGE, one line starting as
    pcieprof.tune.assumed's (recommend prints it as `range: ...`); [] when the card names one."""
    if band.card is None or chunked_prefill(band.card)[1].startswith("the card's"):
        return []
    ends = []
    for chunk in SGLANG_CHUNK_RANGE:
        size = message_bytes(band.card, chunk)
        t0, t1 = base.at(size), new.at(size)
        if not (math.isfinite(t0) and math.isfinite(t1) and t0 > 0):
            return []
        change = t1 / t0 - 1
        ends.append(f"{change * 100:+.0f}% at {chunk} ({'slowed' if change > SLOWER else 'not slowed'})")
    lo, hi = SGLANG_CHUNK_RANGE
    return [f"{RESTS_ON}SGLang's default --chunked-prefill-size = {SGLANG_DEFAULT_CHUNK} tokens "
            f"(assumed: the card names none; range {lo}-{hi} tokens, itself assumed): prefill "
            f"all-reduce {ends[0]}, {ends[1]}"]


#: NCCL's example tuner plugin: size ranges per collective, read from a CSV file.
TUNER_SOURCE = ("NVIDIA/nccl ext-tuner/example/README.md: CSV collective_type,min_bytes,"
                "max_bytes,algorithm,protocol,channels,nNodes,nRanks (8 fields; numPipeOps and "
                "regBuff optional), `#` comments; the file named by NCCL_TUNER_CONFIG_FILE; "
                "sizes no line matches fall back to ring/simple")
MAX_BYTES = 4294967295  # the README's "covers all sizes" upper bound
#: Where `pcieprof recommend` writes the tuner plugin's configuration (NCCL_TUNER_CONFIG_FILE).
TUNER_FILE = "tune/nccl_tuner.conf"


def tuner_config(proto: str, cross: int, why: str) -> str:
    """The example tuner plugin's configuration: all-reduces up to `cross` bytes with `proto`,
    larger ones with simple, both on the ring, on one node, any rank count (`why`: a comment
    line saying where the split comes from)."""
    return "\n".join([
        "# NCCL example tuner plugin configuration (NVIDIA/nccl ext-tuner/example), written by "
        "pcieprof recommend",
        "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks",
        f"# {why}",
        f"allreduce,0,{cross},ring,{proto},-1,1,-1",
        f"allreduce,{cross + 1},{MAX_BYTES},ring,simple,-1,1,-1", ""])


def crossover(base: Curve, new: Curve) -> int | None:
    """The largest size of the sweep up to which the setting is faster at every measured size
    from the smallest on (bytes), or None."""
    last = None
    for size in sorted(set(base.time_us.index) & set(new.time_us.index)):
        if not new.time_us[size] < base.time_us[size]:
            break
        last = int(size)
    return last


def on_the_workload(rec: Recommendation, band: DecodeBand, count: Callable[[int], int],
                    base: Curve | None, new: Curve | None, bundle: Bundle | None = None,
                    write: bool = False) -> Recommendation:
    """A global NCCL setting priced on the whole workload: its card states the phases and the
    ranking metric; one that slows any phase is turned into advice that sets nothing globally,
    with the size-aware route where NCCL has one (the protocol, through the tuner plugin).

    Args:
        rec: an `env` recommendation (a variable NCCL reads for every collective).
        band: the decode band (its card gives the prefill chunk).
        count: batch -> all-reduces per forward pass.
        base: the default curve; new: the curve measured with `rec.env` (None: not measured,
            returned as it is).
        bundle: where the tuner plugin's configuration goes (TUNER_FILE), named in the card.
        write: write it there (False: the card says `pcieprof recommend` writes it).
    """
    if base is None or new is None or rec.kind != "env" or not rec.env:
        return rec
    times = price(band, count, base, new)
    if not times:
        return rec
    shown = [times[0], *[t for t in times[1:] if t is times[-1] or t.phase.name.startswith(
        f"decode, batch {band.batch_max}")]]
    rec.evidence.append(f"whole workload ({describe(band)}): "
                        + "; ".join(t.text() for t in shown) + f" [{new.variant} vs "
                        f"{base.variant}, {base.nranks} ranks]")
    rec.caveats.extend(chunk_range(band, base, new))
    slow = slowed(times)
    if not slow:
        return rec
    setting = " ".join(f"{k}={v}" for k, v in rec.env.items())
    where = ", ".join(t.text() for t in slow[-2:])
    faster = [t for t in times if t.change < -SLOWER]
    caveats = [f"{setting} applies to every collective of every communicator: as a global "
               f"setting it slows {where}"]
    if "NCCL_PROTO" in rec.env and len(rec.env) == 1 and faster:
        proto = rec.env["NCCL_PROTO"].lower()
        cross = crossover(base, new) or max(t.phase.size_bytes for t in faster)
        conf = Path(TUNER_FILE) if bundle is None else bundle.path / TUNER_FILE
        if bundle is not None and write:
            bundle.write_text(TUNER_FILE, tuner_config(
                proto, cross, f"{setting} up to {size_label(cross)} ({cross} bytes): faster than "
                f"NCCL's default at every measured size up to there in {bundle.path.name}'s "
                f"{base.nranks}-rank all-reduce curves ({new.variant} vs {base.variant})"))
        written = "" if bundle is not None and bundle.has(TUNER_FILE) else (
            "   # written by: pcieprof recommend BUNDLE")
        action = (f"# {setting} only up to {size_label(cross)}: NCCL's example tuner plugin "
                  f"(NVIDIA/nccl ext-tuner/example; build it with make) picks the protocol per "
                  f"size range from {conf.name} (allreduce 0-{cross} bytes ring/{proto}, larger "
                  f"ring/simple)\n"
                  f"export NCCL_TUNER_PLUGIN=/path/to/libnccl-tuner-example.so\n"
                  f"export NCCL_TUNER_CONFIG_FILE={conf}{written}")
        caveats += [f"the tuner file's limits: it forces the ring algorithm for all-reduces, "
                    f"every other collective falls back to ring/simple, and the split at "
                    f"{size_label(cross)} is read from the {base.nranks}-rank curves only (smaller "
                    f"communicators get the same split); measure it before serving with it "
                    f"[{TUNER_SOURCE}]"]
        title = (f"{setting} is faster at decode sizes but slower in prefill: not set "
                 f"globally; choose it per size with NCCL's tuner plugin")
    else:
        action = (f"# {setting} is not offered: NCCL reads it for every size and has no "
                  f"size-aware setting for it; keep NCCL's default")
        title = f"{setting} helps some sizes and slows others: not set globally"
    return replace(rec, kind="info", env={}, action=action, title=title,
                   caveats=[*caveats, *rec.caveats], risks=[])
