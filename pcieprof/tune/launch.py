"""The SGLang launch backends of the printed commands, and the advice saying where they come from.

serve-bench's launch search (`--sweep`) tries attention/DSA/GEMM/MoE/KV/CUDA-graph choices until
one serves correct tokens, and records the winner in a serve bundle's serve/search.json
(pcieprof.bundle.serve_search). When such a winner is at hand, every layout's SGLang command uses
its backends. When none is, the commands use the search's first-ranked configuration for the GPU
architecture (what the search would launch first), labelled as not yet served on this box: the
card's plain defaults (FlashInfer attention in glm5-nvfp4.toml) are what the issue 11 field report saw die
of NaN in decode, so they are never printed as the advice.

The ranking lives with the search (pcieprof.tune.space), a layer the tuner does not import: the
commands (pcieprof.commands.tuning) work out the `LaunchChoice` and build the commands with it;
this module turns it into the recommendation that `recommend` and the report print (rule
`launch_config`, its action the top layout's command ready to paste).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable

from pcieprof.analysis.box import GIB, Box, gib
from pcieprof.bundle.recommendations import LayoutAdvice, Recommendation, Recommendations
from pcieprof.cards import ModelCard
from pcieprof.tune.communicators import env_for
from pcieprof.tune.layout import Candidate, CommandBuilder, gpu_memory
from pcieprof.tune.memory import Placement, fit, widest_tp
from pcieprof.tune.quant_arch import blocked, fallback, unchecked

#: The rule name of the launch recommendation.
RULE = "launch_config"
#: How its evidence names the serve bundle the backends come from (read back by `searched_in`).
FROM = "launch search in "
#: Above the speed-ups (a server that dies of NaN serves nothing), below the warnings about
#: wrong data (p2p_data_errors) and hangs (allreduce_hang).
PRIORITY_SERVED = 800.0
#: Not served yet: advice, listed after every measured change.
PRIORITY_UNSERVED = 0.9
#: The label of backends no search has served on this box (issue 11's wording).
NOT_YET = "not yet served on this box: run serve-bench --sweep"


@dataclass(frozen=True)
class LaunchChoice:
    """The launch backends the commands use, and why.

    Attributes:
        config: axis -> value (pcieprof.tune.space axes: attention_backend, dsa_decode_backend,
            ..., cuda_graph "on"/"off"); {} leaves every backend to the card and SGLang.
        served: True when a launch search served correct tokens with it.
        label: one line: where the backends come from (shown next to every command).
        arch: the GPU architecture the values were ranked or served on (`sm120`), or "".
        serve_bundle: the serve bundle whose search it comes from, or "".
        evidence: lines behind it (the attempts, or the ranking's reasons).
        caveats: what it does not show (a reference-server search, another layout served).
        served_command: the winner's own command, as it served ("" when not served).
        neutral: True when no architecture-specific backend is set (the box's architecture is
            unknown, or the card has no launch evidence for it).
    """

    config: dict[str, str]
    served: bool
    label: str
    arch: str = ""
    serve_bundle: str = ""
    evidence: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()
    served_command: str = ""
    neutral: bool = False

    def describe(self) -> str:
        """The set values, `axis=value, ...` ("the card's defaults" when none)."""
        vals = [f"{a}={v}" for a, v in self.config.items() if v]
        if self.neutral:
            return "none architecture-specific (SGLang's own choices)"
        return ", ".join(vals) or "the card's defaults"


def launch_line(result: Recommendations, layout: LayoutAdvice | None = None,
                command: str = "", env: dict[str, str] | None = None) -> str:
    """One shell line ready to paste: the recommended environment, the layout's own environment,
    then its command (or `command` / `env` when no layout was ranked)."""
    cmd = layout.command if layout is not None else command
    if not cmd:
        return ""
    # the command's own env was built over result.env (card settings it makes moot left out,
    # and a graph file its communicators do not cover: tune.communicators), so a key of
    # result.env it lacks stays out
    own = layout.env if layout is not None else env or {}
    merged = {k: v for k, v in result.env.items() if k in own}
    for k, v in own.items():
        merged.setdefault(k, str(v))
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in merged.items())
    return f"{prefix} {cmd}".strip()


#: How the launch recommendation's action names the serve-bench command of the same launch.
BENCH = "# the same launch, benchmarked: "


#: How the launch recommendation's action names the serve-bench command of the same launch.
BENCH = "# the same launch, benchmarked: "


def apply(result: Recommendations, choice: LaunchChoice, card: ModelCard,
          command: CommandBuilder, box: Box | None = None, context: int = 8192,
          bench: Callable[[LayoutAdvice | None, int, dict[str, str]], str] | None = None
          ) -> Recommendations:
    """Add the launch recommendation to `result` (in place) and label every layout's command.

    The box decides what may be launched: no layout wider than its GPUs, none that does not fit
    its GPU memory (then the recommendation says so and carries no launch line).

    Args:
        result: the tuner's output, whose layouts' commands were built with `choice`.
        choice: the launch backends used.
        card: the model card.
        command: the builder the layouts' commands came from, for the card's default layout
            when no layout was ranked.
        box: the bundle's box (GPU count, architecture, memory); None: unknown.
        context: tokens per request of the memory fit.
        bench: (layout, TP, the recommended environment the line sets) -> the serve-bench
            command that launches the same line (layout None: the card's default layout at that
            TP); written under the line as a shell comment, so the action stays pasteable.
    """
    for lay in result.layouts:
        lay.notes.insert(0, f"launch backends: {choice.describe()} ({choice.label})")
    caveats = list(choice.caveats)
    fit_words: list[str] = []  # the default layout's memory fit, said with the box
    top: LayoutAdvice | None = None
    own: dict[str, str]
    if result.layouts_unranked and result.layouts[0].fits:
        # layouts that fit but could not be ranked (no compute anchor): none is chosen to
        # launch, and the recommendation says why (none fitting is said below, as ranked)
        line, where, tp, own = "", "", card.sglang.tp_default, {}
        verdict = (f"No launch layout chosen for {card.name}: the parallel layouts are not "
                   f"ranked (no compute anchor for it)")
    elif result.layouts:
        top = result.layouts[0]
        where, tp, own = top.label, top.tp, top.env
        line = launch_line(result, top) if top.fits else ""
        verdict = "" if top.fits else (
            f"{card.name} does not fit this box in any layout: {top.label} needs "
            f"{gib(top.weights_gib * GIB)} of weights per GPU, has "
            f"{gib(top.gpu_memory_gib * GIB * top.mem_fraction)} at --mem-fraction-static "
            f"{top.mem_fraction:g}"
            + (" at the high end of the assumed range" if top.gpu_memory_gib_low is not None
               else "") + f" ({top.memory_source})")
    else:
        line, where, verdict, tp, own = _default_layout(result, card, command, box, context,
                                                        caveats, fit_words)
    # a checkpoint the box's GPUs cannot load stops the launch whatever the layout
    if line and (why := blocked(card.sglang.quantization, box)):
        line, verdict = "", f"{card.name} does not run on this box: {why}"
    risk = (unchecked(card.sglang.quantization, box)
            or fallback(card.sglang.quantization, box)) if line else None
    if bench is not None and line:
        line += "\n" + BENCH + bench(top, tp, {k: v for k, v in result.env.items() if k in own})
    if verdict and not line:
        title = verdict
    elif choice.served:
        title = (f"Launch SGLang with the backends the launch search served correct tokens "
                 f"with: {choice.describe()}")
    else:
        title = f"SGLang launch backends {choice.describe()}: {NOT_YET}"
    evidence = list(choice.evidence)
    if box is not None and box.gpus:  # no "0x GPU" box where the bundle names none
        evidence.insert(0, f"the box: {box.describe()}; architecture from {box.arch_source}; "
                           f"memory from {box.memory_source}"
                           + "".join(f"; {w}" for w in fit_words))
    if choice.serve_bundle:
        evidence.insert(0, f"{FROM}{choice.serve_bundle}")
    kv = choice.config.get("kv_cache_dtype", "")
    if kv and not kv.startswith(card.kv_cache.dtype):
        caveats.append(f"kv_cache_dtype={kv}, while the layouts' memory fit assumed the card's "
                       f"{card.kv_cache.dtype} KV cache")
    if line:
        caveats.append(f"the command is for the {where} layout; the backends are the same for "
                       f"every layout's command")
        # the card's settings for some boxes only: which the box took, which it is not for,
        # and which it could not be checked for (said with the line, never guessed)
        fit = card.sglang.for_box(box.target() if box is not None else None)
        caveats += fit.unknown
        evidence += [f"set for this box: {x}" for x in fit.applied] + list(fit.not_for_box)
    rec = Recommendation(
        rule=RULE, kind="launch" if line else "info", title=title, action=line,
        gain_text=choice.label, evidence=evidence,
        caveats=caveats, risks=[risk] if risk else [],
        confidence="measured" if choice.served else "advice",
        priority=PRIORITY_SERVED if choice.served else PRIORITY_UNSERVED,
        ranked_by=(f"score {PRIORITY_SERVED:g}, fixed: served correct tokens (above every "
                   "speed-up)" if choice.served else
                   f"score {PRIORITY_UNSERVED:g}, fixed: not yet served on this box"))
    result.recommendations = [r for r in result.recommendations if r.rule != RULE]
    result.recommendations.append(rec)
    result.recommendations.sort(key=lambda r: -r.priority)
    return result


def _default_layout(result: Recommendations, card: ModelCard, command: CommandBuilder,
                    box: Box | None, context: int, caveats: list[str],
                    fit_words: list[str]) -> tuple[str, str, str, int, dict[str, str]]:
    """(launch line, layout label, verdict, TP, the line's environment) of the card's default
    layout narrowed to the box:
    TP no wider than its GPUs; no line when the model does not fit there. The fit of a line
    offered goes into `fit_words` (said with the box), and into `caveats` where it is not
    checked against the box's own memory (unknown, uncertain, or assumed)."""
    tp = card.sglang.tp_default
    if box is None or not box.gpus:
        return "", f"TP{tp}", (f"no launch line: this bundle shows no GPUs, so no layout of "
                               f"{card.name} can be checked against its box (run pcieprof "
                               f"topology, or import nvidia-smi topo -m, on the serving box)"), tp, {}
    # memory the bundle does not tell is the card's, said to be assumed: the same fit the
    # ranked layouts get, so a 2x RTX 2080 Ti is not handed a 210 GiB-per-GPU launch line
    sized = gpu_memory(box, card)
    tp = widest_tp(card, min(tp, box.gpus))
    f = fit(card, Placement(tp=tp), sized, context)
    # the card's default TP may be narrower than the box needs (a config.json card says TP1):
    # the narrowest wider TP that fits, up to the GPU count, rather than "does not fit"
    # an uncertain fit (at one end of an assumed memory's range only) is taken when no narrower
    # TP fits, and replaced by a wider one that fits at both ends
    widest = (tp, f)
    for wider in sorted({widest_tp(card, t) for t in range(tp + 1, box.gpus + 1)}):
        if f.fits or f.has is None or wider <= tp:
            continue
        wf = fit(card, Placement(tp=wider), sized, context)
        if wf.fits or (wf.uncertain and f.fits is False):
            tp, f = wider, wf
        widest = (wider, wf)
    if f.fits is False:  # none fits: the verdict of the widest TP the box holds says the most
        tp, f = widest
    label = f"TP{tp}"
    if f.fits is False:
        return "", label, f"{card.name} at {label}: {f.verdict()}", tp, {}
    fit_words.append(f"{label}: {f.verdict()}")
    if f.fits is None or sized is not box:  # unchecked, uncertain, or on assumed memory
        caveats.append(f"{label}: {f.verdict()}")
    own, left_out = env_for(dict(result.env), set(result.ring.order) if result.ring else None,
                            tp)
    caveats += left_out
    built = command(card, Candidate(label, tp=tp), own)
    return launch_line(result, None, built.command, built.env), label, "", tp, built.env


def launch_recommendation(result: Recommendations) -> Recommendation | None:
    """The launch recommendation of a tuner's output, or None (older documents)."""
    return next((r for r in result.recommendations if r.rule == RULE), None)


def searched_in(result: Recommendations) -> str | None:
    """The serve bundle whose launch search the document's commands use, or None."""
    rec = launch_recommendation(result)
    if rec is None:
        return None
    return next((e[len(FROM):] for e in rec.evidence if e.startswith(FROM)), None)
