"""How the commands run the tuner: with SGLang's command builder wired in, and in memory for
a report of bundles that have no recommendations.json yet.

The tuner (pcieprof.tune) knows no launcher and the report (pcieprof.report) runs no tuner; the
commands join them here.
"""

from __future__ import annotations

import shlex
from typing import Sequence

from pcieprof import progress
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.cards import ModelCard
from pcieprof.errors import BadInput, PcieprofError
from pcieprof.serve.sglang_cmd import LaunchConfig, build_command
from pcieprof.tune.layout import Candidate, LaunchCommand
from pcieprof.tune.recommend import recommend


def sglang_launch(card: ModelCard, layout: Candidate, env: dict[str, str]) -> LaunchCommand:
    """The SGLang command of one layout (pcieprof.serve.sglang_cmd), as the tuner's
    CommandBuilder; `python3`, not this interpreter's path: it runs on the serving box."""
    dp = layout.dp if layout.dp_attention else (layout.replicas if layout.replicas > 1 else None)
    try:
        cmd = build_command(card, LaunchConfig(
            tp=layout.tp, pp=layout.pp if layout.pp > 1 else None,
            ep=layout.ep if layout.ep > 1 else None, dp=dp, dp_attention=layout.dp_attention,
            env=dict(env)), python="python3")
    except BadInput as exc:
        return LaunchCommand(notes=[f"no SGLang command: {exc.one_line()}"])
    notes = list(cmd.notes)
    card_env = {k: v for k, v in card.sglang.env.items() if k not in env}
    if card_env:
        notes.append("environment from the model card (its public sources), not checked by "
                     "this bundle: " + " ".join(f"{k}={v}" for k, v in card_env.items()))
    return LaunchCommand(command=" ".join(shlex.quote(a) for a in cmd.argv), env=dict(cmd.env),
                         notes=notes)


def tune(bundle: Bundle, card: ModelCard, band: DecodeBand, *, layouts: bool = True,
         context: int = 8192, write_files: bool = True) -> Recommendations:
    """pcieprof.tune.recommend with the SGLang command builder."""
    return recommend(bundle, card, band=band, layouts=layouts, context=context,
                     write_files=write_files, command=sglang_launch)


def for_report(bundles: Sequence[Bundle], card: ModelCard,
               band: DecodeBand) -> dict[str, Recommendations]:
    """The tuner's output, computed in memory (nothing written), for each bundle that has P2P or
    all-reduce rows but no recommendations.json. A bundle the tuner cannot read gets a document
    whose `error` says why, so the report shows it and renders the rest."""
    out: dict[str, Recommendations] = {}
    for b in bundles:
        if b.has(Recommendations.FILE) or (b.read_table("p2p").empty
                                           and b.read_table("allreduce").empty):
            continue
        try:
            doc = tune(b, card, band, write_files=False)
        except PcieprofError as exc:
            progress.warn(f"{b.path}: the tuner could not run: {exc.one_line()}")
            doc = Recommendations(model=card.name, error=exc.one_line())
        doc.computed_by_report = True
        out[str(b.path)] = doc
    return out
