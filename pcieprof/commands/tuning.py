"""How the commands run the tuner: with SGLang's command builder and the launch backends wired
in (`tune`; `recommend` saves its result, pcieprof.commands.recommend.save).

The tuner (pcieprof.tune) knows no launcher and the report (pcieprof.report) runs no tuner; the
commands join them here. The launch backends of the commands (pcieprof.tune.launch) come from a
serve bundle's launch search (`recommend --serve`, or a serve bundle given to `report`), else
from the search's first-ranked configuration for the GPU architecture (pcieprof.tune.search).
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import Sequence

from pcieprof import progress
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.box import Box, box_of
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import LayoutAdvice, Recommendations
from pcieprof.bundle.serve_search import ServeSearch
from pcieprof.cards import LaunchTarget, ModelCard, load_card
from pcieprof.errors import BadInput, PcieprofError
from pcieprof.serve.served import last_served, measured_here
from pcieprof.serve.sglang_cmd import LaunchConfig, ParserSpec, build_command, load_parser
from pcieprof.tune import launch, speculative
from pcieprof.tune.launch import NOT_YET, LaunchChoice
from pcieprof.tune.layout import Candidate, CommandBuilder, LaunchCommand
from pcieprof.tune.recommend import cpu_only, recommend
from pcieprof.tune.search import Search, Step
from pcieprof.tune.space import FLAGS, SearchSpace

#: Evidence lines kept per attempt list (the document keeps them all).
MAX_ATTEMPT_LINES = 12


@functools.cache
def sglang_parser() -> ParserSpec | None:
    """SGLang's own parser as serve-bench reads it without --sglang-path (the installed sglang,
    else PCIEPROF_SGLANG_PATH or the pinned release's parser-only install), read once per
    process: building it takes a child interpreter seconds. None where none is importable."""
    return load_parser(None)


def sglang_launch(card: ModelCard, layout: Candidate, env: dict[str, str],
                  axes: dict[str, str] | None = None, neutral: bool = False,
                  target: LaunchTarget | None = None,
                  parser: ParserSpec | None = None) -> LaunchCommand:
    """The SGLang command of one layout (pcieprof.serve.sglang_cmd), as the tuner's
    CommandBuilder; `python3`, not this interpreter's path: it runs on the serving box.

    Args:
        card: the model card.
        layout: the parallel layout.
        env: the recommended environment.
        axes: launch backends by search axis (LaunchChoice.config); None: the card's.
        neutral: leave out the card's own backend choices too (an architecture the card has
            no launch evidence for).
        target: the box (architecture, fabric) the card's box settings are checked against;
            None: unknown, none of them set.
        parser: SGLang's parser to check and translate the flags with (sglang_parser), as
            serve-bench --dry-run does; None: unchecked, and the notes say so.
    """
    dp = layout.dp if layout.dp_attention else (layout.replicas if layout.replicas > 1 else None)
    cfg = LaunchConfig(tp=layout.tp, pp=layout.pp if layout.pp > 1 else None,
                       ep=layout.ep if layout.ep > 1 else None, dp=dp,
                       dp_attention=layout.dp_attention, env=dict(env),
                       card_backends=not neutral)
    if axes:
        cfg = cfg.with_axes(axes, cfg.name)
    try:
        cmd = build_command(card, cfg, python="python3", parser=parser, target=target)
    except BadInput as exc:
        return LaunchCommand(notes=[f"no SGLang command: {exc.one_line()}"])
    # the words of serve-bench --dry-run's header, so both say the same of one command
    checked = ([f"checked against SGLang {cmd.checked_against}'s own parser"]
               if cmd.checked_against else [])
    notes = checked + list(cmd.notes)
    own = card.sglang.for_box(target).env
    card_env = {k: v for k, v in cmd.env.items() if k in own and k not in env}
    if card_env:
        notes.append("environment from the model card (its public sources), not checked by "
                     "this bundle: " + " ".join(f"{k}={v}" for k, v in card_env.items()))
    return LaunchCommand(command=" ".join(shlex.quote(a) for a in cmd.argv), env=dict(cmd.env),
                         notes=notes)


def builder(choice: LaunchChoice | None, target: LaunchTarget | None = None,
            parser: ParserSpec | None = None) -> CommandBuilder:
    """The CommandBuilder that writes `choice`'s backends into every layout's command, with
    the card's box settings that hold on `target` (the bundle's box), checked by `parser`."""
    axes = dict(choice.config) if choice is not None else None
    neutral = choice is not None and choice.neutral

    def build(card: ModelCard, layout: Candidate, env: dict[str, str]) -> LaunchCommand:
        return sglang_launch(card, layout, env, axes, neutral, target, parser)

    return build


def the_launch(card: ModelCard, arch: str | None = None, bundle: Bundle | None = None,
               serve: Bundle | None = None, given: dict[str, str] | None = None,
               box: Box | None = None) -> LaunchChoice:
    """The one launch configuration that serve-bench (without --sweep) launches and recommend,
    the report and their SGLang commands print (issue 22, point 1).

    In order: `serve`'s launch search when given; the serve bundle that last served `card` on
    this machine (pcieprof.serve.served) when `bundle` is None (serve-bench on this machine) or
    was measured here; else the search's first-ranked configuration for `arch` (default: the
    card's). `given` backends (serve-bench's --attention-backend etc.) start the search instead:
    its first step from them, as `--sweep` would launch first. `box` (the bundle's) names the
    architecture when `arch` does not (pcieprof.commands.tuning.launch_choice).

    Raises:
        BadInput: `serve` cannot say (see launch_choice).
    """
    if given:
        return _first_from(card, arch or (box.arch if box is not None and box.arch else None),
                           given)
    if serve is None and (bundle is None or measured_here(bundle.manifest)):
        space = _space(card, arch or (box.arch if box is not None and box.arch else None))
        last = last_served(card.name, space.arch) if space is not None else None
        if last is not None:
            try:
                choice = launch_choice(card, Bundle.open(last).check(), space.arch if
                                       space is not None else arch)
            except PcieprofError as exc:
                progress.warn(f"{last}: the launch served last on this machine cannot be read "
                              f"({exc.one_line()}); the first-ranked configuration instead")
            else:
                if choice.served:
                    return choice
    return launch_choice(card, serve, arch, box=box)


def _first_from(card: ModelCard, arch: str | None, given: dict[str, str]) -> LaunchChoice:
    """The search's first step started from the backends the user gave."""
    space = _space(card, arch)
    if space is None:
        return LaunchChoice(dict(given), False, "given on the command line (the card has no "
                                                "launch search)")
    step = Search(space, start=given).next([])
    assert isinstance(step, Step)
    told = ", ".join(f"{a}={v}" for a, v in given.items())
    return LaunchChoice(dict(step.config), False,
                        f"{told} as given, the other backends the search's first-ranked for "
                        f"{space.arch}; {NOT_YET}", arch=space.arch,
                        evidence=tuple(step.changes),
                        caveats=tuple(failing(card, step.config, space.arch)))


def failing(card: ModelCard, config: dict[str, str], arch: str | None = None) -> list[str]:
    """The values of `config` the card marks as failing on `arch` (one line each): never
    launched unless the user names them."""
    space = _space(card, arch)
    if space is None:
        return []
    out = []
    for axis, value in config.items():
        r = space.rank_of(axis, value) if value and axis in FLAGS else None
        if r is not None and r.verdict == "fails":
            out.append(f"the card marks {axis}={value} as failing: {r.why}")
    return out


def launch_choice(card: ModelCard, serve: Bundle | None = None,
                  arch: str | None = None, box: Box | None = None) -> LaunchChoice:
    """The launch backends for `card`'s commands: the winner of `serve`'s launch search, else
    the search's first-ranked configuration for `arch` (default: the box's architecture when
    `box` is given, else the card's), labelled as not yet served. A box whose architecture is
    unknown, or one the card has no launch evidence for, gets no architecture-specific
    backends (SGLang chooses them), and says so.

    Raises:
        BadInput: `serve` has no launch search, or searched another model or architecture.
    """
    doc = None
    if serve is not None:
        doc = serve.read_doc(ServeSearch)
        if doc is None:
            raise BadInput(f"{serve.path} has no launch search (serve/search.json)",
                           hint="give the --out of a `pcieprof serve-bench --sweep` run")
        if card.name not in (doc.card, doc.like):
            played = f" (playing {doc.like})" if doc.like else ""
            raise BadInput(f"{serve.path} searched launches of {doc.card}{played}, not of "
                           f"{card.name}", hint=f"--model {doc.like or doc.card}")
        if arch and doc.arch and arch != doc.arch:
            raise BadInput(f"--arch {arch}: {serve.path} searched for {doc.arch}")
        if doc.winner is not None:
            return _served(card, serve, doc)
    arch = arch or (doc.arch if doc is not None else None)
    if arch is None and box is not None and card.search:
        neutral = _arch_neutral(card, box)
        if neutral is not None:
            return neutral
        arch = box.arch
    space = _space(card, arch)
    if space is None:
        return LaunchChoice({}, False, f"{NOT_YET} (the card has no launch search: its "
                                       f"defaults)")
    step = Search(space).next([])
    assert isinstance(step, Step)  # the first step of a search without history always is
    label = f"{NOT_YET} (the search's first-ranked configuration for {space.arch})"
    caveats: list[str] = []
    if doc is not None and serve is not None:
        results = [a for a in doc.attempts if a.outcome not in ("running", "interrupted")]
        again = ("serve-bench --sweep --resume --out " + str(serve.path)
                 if doc.status in ("running", "interrupted") else "serve-bench --sweep")
        label = (f"not yet served on this box: the launch search in {serve.path} is "
                 f"{doc.status} after {len(results)} attempt(s) without one; run {again} (the "
                 f"search's first-ranked configuration for {space.arch})")
        same = [a for a in results if a.search is not None
                and {k: v for k, v in a.search.config.items() if v}
                == {k: v for k, v in step.config.items() if v}]
        if same:
            caveats.append(f"this configuration failed there: attempt {same[0].index} "
                           f"{same[0].outcome}: {same[0].deciding_line[:200]}")
    return LaunchChoice(dict(step.config), False, label, arch=space.arch,
                        serve_bundle=str(serve.path.resolve()) if serve is not None else "",
                        evidence=tuple(step.changes), caveats=tuple(caveats))


def _arch_neutral(card: ModelCard, box: Box) -> LaunchChoice | None:
    """The choice without architecture-specific backends for a box whose architecture is
    unknown or has no launch evidence in the card; None when the card knows it."""
    known = {str(c.get("arch")) for c in card.search.get("claim", [])} | {
        str(card.search.get("arch", ""))}
    if box.arch and box.arch in known:
        return None
    why = (f"no launch evidence for {box.arch} in card {card.name} (it has "
           f"{', '.join(sorted(k for k in known if k and k != 'any'))})" if box.arch
           else f"GPU architecture unknown: {box.arch_source}")
    axes = [str(a) for a in card.search.get("axes", [])]
    return LaunchChoice({a: "" for a in axes if a != "cuda_graph"}, False,
                        f"{why}: no architecture-specific backends, SGLang chooses them",
                        arch=box.arch, neutral=True)


def _space(card: ModelCard, arch: str | None) -> SearchSpace | None:
    if not card.search:
        return None
    return SearchSpace.from_card(card.name, card.search, arch=arch,
                                 load_other=lambda name: load_card(name).search)


def _served(card: ModelCard, serve: Bundle, doc: ServeSearch) -> LaunchChoice:
    assert doc.winner is not None
    w = doc.winner
    results = doc.results
    label = (f"served correct tokens in the launch search in {serve.path}: attempt {w.index}, "
             f"after {len(results) - 1} failed attempt(s), on {doc.arch or 'an unnamed arch'}")
    caveats = []
    if doc.card != card.name:
        where = " on the reference server, whose faults its launch flags inject" \
            if serve.backend == "cpu" else ""
        caveats.append(f"the search served {doc.card}, a stand-in playing {card.name}'s "
                       f"search{where}: it shows what the search does, not that SGLang serves "
                       f"{card.name} with these backends")
        label += f" ({doc.card} standing in for {card.name})"
    tp = _flag(w.argv, ("--tp-size", "--tp"))
    if tp:
        caveats.append(f"served with --tp-size {tp}; the other layouts' commands use the same "
                       f"backends, not launched")
    evidence = [f"{a.label}: attempt {a.index} {a.outcome}"
                + (f" after {a.time_to_failure_s:.1f} s" if a.time_to_failure_s else "")
                + (f": {a.deciding_line[:200]}" if a.deciding_line else "")
                for a in results[-MAX_ATTEMPT_LINES:]]
    evidence.append(f"served as: {w.command}")
    return LaunchChoice(dict(w.config), True, label, arch=doc.arch,
                        serve_bundle=str(serve.path.resolve()),
                        evidence=tuple(evidence), caveats=tuple(caveats),
                        served_command=w.command)


def _flag(argv: list[str], names: tuple[str, ...]) -> str:
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            return argv[i + 1]
        for n in names:
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return ""


def tune(bundle: Bundle, card: ModelCard, band: DecodeBand, *, layouts: bool = True,
         context: int = 8192, write_files: bool = True,
         choice: LaunchChoice | None = None) -> Recommendations:
    """pcieprof.tune.recommend with the SGLang command builder and the launch backends
    (`choice`; default: launch_choice for the bundle's box, the first-ranked, not yet served)."""
    box = box_of(bundle)
    choice = choice if choice is not None else the_launch(card, bundle=bundle, box=box)
    # a cpu bundle gets no SGLang command: no parser to read for it
    parser = None if cpu_only(bundle) else sglang_parser()
    build = builder(choice, box.target(), parser)
    result = recommend(bundle, card, band=band, layouts=layouts, context=context,
                       write_files=write_files, command=build)
    if cpu_only(bundle):  # no GPU evidence: no SGLang GPU command either (issue 22, point 3)
        return result
    # a neutral choice leaves out the card's own backends, which serve-bench cannot: no line
    bench = None if choice.neutral else (
        lambda lay, tp, env: bench_line(card, lay, tp, env, choice))
    result = launch.apply(result, choice, card, build, box=box, context=context, bench=bench)
    return _mtp_checked(speculative.add(result, card), parser)


def _mtp_checked(result: Recommendations, parser: ParserSpec | None) -> Recommendations:
    """The MTP card's line (the top layout's checked command plus its speculative flags) with
    those flags checked by `parser` too: one it refuses leaves the card without a line."""
    rec = next((r for r in result.recommendations if r.rule == speculative.RULE and r.action),
               None)
    top = result.layouts[0].command if result.layouts else ""
    if rec is None or parser is None or not top or top not in rec.action:
        return result
    flags = shlex.split(rec.action[rec.action.index(top) + len(top):])
    try:
        parser.reconcile(flags)
    except BadInput as exc:
        rec.kind, rec.action = "info", ""
        rec.caveats = [f"no SGLang command: {exc.one_line()}", *rec.caveats]
    else:
        rec.evidence = [*rec.evidence, f"{' '.join(flags)}: checked against SGLang "
                                       f"{parser.version}'s own parser"]
    return result


def bench_line(card: ModelCard, layout: LayoutAdvice | None, tp: int, env: dict[str, str],
               choice: LaunchChoice) -> str:
    """The `pcieprof serve-bench` command that launches exactly a layout's printed SGLang line
    (same argv and environment, on the same default port where it is free here; serve-bench
    says which one after it it takes where not): the layout's parallel sizes (`tp` alone for
    the card's default layout narrowed to the box), every launch backend of `choice` and the
    recommended environment."""
    args = ["pcieprof", "serve-bench", "--model", card.name, "--tp", str(tp)]
    if layout is not None:
        if layout.pp > 1:
            args += ["--pp", str(layout.pp)]
        if layout.ep > 1:
            args += ["--ep", str(layout.ep)]
        if layout.dp_attention:
            args += ["--dp", str(layout.tp), "--enable-dp-attention"]
        elif layout.replicas > 1:
            args += ["--dp", str(layout.replicas)]
    for axis, value in choice.config.items():
        if axis == "cuda_graph":
            args += ["--disable-cuda-graph"] if value == "off" else []
        elif value:
            args += [FLAGS[axis], value]
    for k, v in env.items():
        args += ["--env", f"{k}={v}"]
    return " ".join(shlex.quote(a) for a in args)


def serve_searches(bundles: Sequence[Bundle]) -> list[Bundle]:
    """The bundles that hold a launch search (serve/search.json)."""
    return [b for b in bundles if b.has(ServeSearch.FILE)]

