"""How the commands run the tuner: with SGLang's command builder and the launch backends wired
in, and in memory for a report of bundles that have no recommendations.json yet.

The tuner (pcieprof.tune) knows no launcher and the report (pcieprof.report) runs no tuner; the
commands join them here. The launch backends of the commands (pcieprof.tune.launch) come from a
serve bundle's launch search (`recommend --serve`, or a serve bundle given to `report`), else
from the search's first-ranked configuration for the GPU architecture (pcieprof.tune.search).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from pcieprof import progress
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.box import Box, box_of
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.bundle.serve_search import ServeSearch
from pcieprof.cards import ModelCard, load_card
from pcieprof.errors import BadInput, PcieprofError
from pcieprof.serve.sglang_cmd import LaunchConfig, build_command
from pcieprof.tune import launch, speculative
from pcieprof.tune.launch import NOT_YET, LaunchChoice
from pcieprof.tune.layout import Candidate, CommandBuilder, LaunchCommand
from pcieprof.tune.recommend import recommend
from pcieprof.tune.search import Search, Step
from pcieprof.tune.space import SearchSpace

#: Evidence lines kept per attempt list (the document keeps them all).
MAX_ATTEMPT_LINES = 12


def sglang_launch(card: ModelCard, layout: Candidate, env: dict[str, str],
                  axes: dict[str, str] | None = None, neutral: bool = False) -> LaunchCommand:
    """The SGLang command of one layout (pcieprof.serve.sglang_cmd), as the tuner's
    CommandBuilder; `python3`, not this interpreter's path: it runs on the serving box.

    Args:
        card: the model card.
        layout: the parallel layout.
        env: the recommended environment.
        axes: launch backends by search axis (LaunchChoice.config); None: the card's.
        neutral: leave out the card's own backend choices too (an architecture the card has
            no launch evidence for).
    """
    dp = layout.dp if layout.dp_attention else (layout.replicas if layout.replicas > 1 else None)
    cfg = LaunchConfig(tp=layout.tp, pp=layout.pp if layout.pp > 1 else None,
                       ep=layout.ep if layout.ep > 1 else None, dp=dp,
                       dp_attention=layout.dp_attention, env=dict(env),
                       card_backends=not neutral)
    if axes:
        cfg = cfg.with_axes(axes, cfg.name)
    try:
        cmd = build_command(card, cfg, python="python3")
    except BadInput as exc:
        return LaunchCommand(notes=[f"no SGLang command: {exc.one_line()}"])
    notes = list(cmd.notes)
    card_env = {k: v for k, v in cmd.env.items() if k in card.sglang.env and k not in env}
    if card_env:
        notes.append("environment from the model card (its public sources), not checked by "
                     "this bundle: " + " ".join(f"{k}={v}" for k, v in card_env.items()))
    return LaunchCommand(command=" ".join(shlex.quote(a) for a in cmd.argv), env=dict(cmd.env),
                         notes=notes)


def builder(choice: LaunchChoice | None) -> CommandBuilder:
    """The CommandBuilder that writes `choice`'s backends into every layout's command."""
    axes = dict(choice.config) if choice is not None else None
    neutral = choice is not None and choice.neutral

    def build(card: ModelCard, layout: Candidate, env: dict[str, str]) -> LaunchCommand:
        return sglang_launch(card, layout, env, axes, neutral)

    return build


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
        same = [a for a in results if {k: v for k, v in a.config.items() if v}
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
    choice = choice if choice is not None else launch_choice(card, box=box)
    build = builder(choice)
    result = recommend(bundle, card, band=band, layouts=layouts, context=context,
                       write_files=write_files, command=build)
    result = launch.apply(result, choice, card, build, box=box, context=context)
    return speculative.add(result, card)


def serve_searches(bundles: Sequence[Bundle]) -> list[Bundle]:
    """The bundles that hold a launch search (serve/search.json)."""
    return [b for b in bundles if b.has(ServeSearch.FILE)]


def for_report(bundles: Sequence[Bundle], card: ModelCard, band: DecodeBand,
               choice: LaunchChoice | None = None) -> dict[str, Recommendations]:
    """The tuner's output, computed in memory (nothing written), for each bundle that has P2P or
    all-reduce rows but no recommendations.json, or one whose commands were made without the
    served launch search `choice` comes from. A bundle the tuner cannot read gets a document
    whose `error` says why, so the report shows it and renders the rest."""
    out: dict[str, Recommendations] = {}
    for b in bundles:
        if b.read_table("p2p").empty and b.read_table("allreduce").empty:
            continue
        stored = b.read_doc(Recommendations)
        if stored is not None and not (choice is not None and choice.served and not _same(
                launch.searched_in(stored), choice.serve_bundle)):
            continue
        if stored is not None and choice is not None:
            progress.info(f"{b.path}: recommendations.json was made without the launch search "
                          f"in {choice.serve_bundle}; the report computes them with it")
        try:
            doc = tune(b, card, band, write_files=False, choice=choice)
        except PcieprofError as exc:
            progress.warn(f"{b.path}: the tuner could not run: {exc.one_line()}")
            doc = Recommendations(model=card.name, error=exc.one_line())
        doc.computed_by_report = True
        out[str(b.path)] = doc
    return out



def _same(a: str | None, b: str) -> bool:
    return a is not None and Path(a).resolve() == Path(b).resolve()
