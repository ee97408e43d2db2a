"""`pcieprof report BUNDLE... [-o FILE]`: one self-contained offline HTML page.

A serve bundle of `serve-bench --sweep` given with a topology bundle is joined to it: the
topology bundle's SGLang commands use the launch backends the search served correct tokens with
(computed by the report when its recommendations.json was made without them).
"""

from __future__ import annotations

from pathlib import Path

import click

from pcieprof import progress
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle, default_out_dir, prepare_out_file
from pcieprof.cards import ModelCard
from pcieprof.commands.card_choice import MODEL_HELP, card_for
from pcieprof.commands.options import verbosity
from pcieprof.commands.tuning import for_report, launch_choice, serve_searches
from pcieprof.errors import BadInput
from pcieprof.tune.launch import LaunchChoice
from pcieprof.report import ReportContext, write_report


@click.command("report")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "-o", "out", type=click.Path(path_type=Path), default=None,
              help="HTML file to write (default: BUNDLE/report.html for one bundle, "
                   "reports/compare-<time>.html for several).")
@click.option("--model", default=None, help=MODEL_HELP + " Its decode-message band is batch x "
              "hidden x 2 bytes.")
@click.option("--batch-max", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="Largest decode batch of the band.")
@click.option("--no-tune", is_flag=True,
              help="Do not run the tuner for bundles without recommendations.json.")
@verbosity
def command(bundles: tuple[Path, ...], out: Path | None, model: str | None, batch_max: int,
            no_tune: bool) -> None:
    """Write the HTML report of one or more BUNDLES (several are shown side by side).

    Plotly is inlined once, so the file opens from disk without a network. Every figure says
    whether its numbers were measured, simulated or imported, and by which backend. Give a
    topology bundle and a `serve-bench --sweep` bundle together (`pcieprof report TOPOLOGY
    SERVE`) and the SGLang commands of the first use the launch backends the search found
    healthy; the second shows the search's attempts next to its winner.
    """
    opened = [Bundle.open(b).check() for b in bundles]
    card = card_for(model, opened)
    band = DecodeBand.of_card(card, 1, batch_max)
    if out is None:
        out = (opened[0].path / "report.html" if len(opened) == 1
               else default_out_dir("compare").with_suffix(".html"))
    prepare_out_file(out)  # before the work: a directory or an unwritable place is one line
    recs = {} if no_tune else for_report(opened, card, band, _joined(opened, card))
    progress.info(f"report of {len(opened)} bundle(s) -> {out}")
    path = write_report(opened, out, ctx=ReportContext(band=band, recommendations=recs))
    click.echo(f"report: {path}")


def _joined(opened: list[Bundle], card: ModelCard) -> LaunchChoice | None:
    """The launch backends from the first serve bundle whose search served `card`, else the
    first-ranked ones of an unfinished search, else None: each bundle's own box decides (a
    search of another model is shown, not joined)."""
    first = None
    for b in serve_searches(opened):
        try:
            choice = launch_choice(card, b)
        except BadInput as exc:
            progress.warn(f"not joined: {exc.one_line()}")
            continue
        if choice.served:
            return choice
        first = first or choice
    return first
