"""`pcieprof report BUNDLE... [-o FILE]`: one self-contained offline HTML page.

The page draws what the bundles saved. A bundle with P2P or all-reduce rows whose
recommendations.json is missing or stale (made for another card, or without the launch search
of a serve bundle given with it) gets `recommend`'s result written into it first
(pcieprof.commands.recommend.save_for_report, one progress line); a bundle that cannot be
written is drawn without recommendations, with one line saying why. A serve bundle of
`serve-bench --sweep` given with a topology bundle is joined to it: the topology bundle's SGLang
commands use the launch backends the search served correct tokens with.
"""

from __future__ import annotations

from pathlib import Path

import click

from pcieprof import progress
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle, default_out_dir, prepare_out_file
from pcieprof.commands.card_choice import MODEL_HELP, card_for
from pcieprof.commands.options import verbosity
from pcieprof.commands.recommend import save_for_report
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
              help="Do not write recommendations into bundles without a current "
                   "recommendations.json: draw what each bundle saved, as it is.")
@verbosity
def command(bundles: tuple[Path, ...], out: Path | None, model: str | None, batch_max: int,
            no_tune: bool) -> None:
    """Write the HTML report of one or more BUNDLES (several are shown side by side).

    Plotly is inlined once, so the file opens from disk without a network. Every figure says
    whether its numbers were measured, simulated or imported, and by which backend. Give a
    topology bundle and a `serve-bench --sweep` bundle together (`pcieprof report TOPOLOGY
    SERVE`) and the SGLang commands of the first use the launch backends the search found
    healthy; the second shows the search's attempts next to its winner.

    The page draws what the bundles saved: a bundle with P2P or all-reduce rows and no current
    recommendations.json (none, or one made for another model) first gets `pcieprof
    recommend`'s written into it, said in one line; one that cannot be written is drawn without
    recommendations, and the page says why.
    """
    opened = [Bundle.open(b).check() for b in bundles]
    card = card_for(model, opened)
    band = DecodeBand.of_card(card, 1, batch_max)
    if out is None:
        out = (opened[0].path / "report.html" if len(opened) == 1
               else default_out_dir("compare").with_suffix(".html"))
    prepare_out_file(out)  # before the work: a directory or an unwritable place is one line
    unsaved = {} if no_tune else save_for_report(opened, card, band)
    progress.info(f"report of {len(opened)} bundle(s) -> {out}")
    path = write_report(opened, out, ctx=ReportContext(band=band, unsaved=unsaved))
    click.echo(f"report: {path}")

