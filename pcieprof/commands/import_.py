"""`pcieprof import FILE... [--out DIR] [--force]`: other tools' outputs into one bundle.

Formats are recognised by content (see pcieprof.importers.formats); several files of one machine
make one bundle. The numbers are labelled `source=imported`, `backend=imported`.
"""

from __future__ import annotations

from pathlib import Path

import click

from pcieprof import bundle as bundle_mod
from pcieprof.commands.options import out_dir, verbosity
from pcieprof.importers.bundle_writer import import_files
from pcieprof.importers.formats import FORMATS


@click.command("import", help="Import tool outputs (nvidia-smi topo, p2pBandwidthLatencyTest, "
               "nvbandwidth, nccl-tests, NCCL logs and XML, lspci -vvv, nvidia-smi -q, ...) "
               "into a bundle. Formats: " + "; ".join(f.what for f in FORMATS.values()) + ".")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(path_type=Path))  # checked by the reader: one line, exit 2
@out_dir
@verbosity
def command(files: tuple[Path, ...], out: Path | None, force: bool) -> None:
    """Import FILES into one bundle and print what was recognised in each."""
    target = out or bundle_mod.default_out_dir("import")
    bundle, parsed = import_files(list(files), target, force=force)
    width = max(len(str(f.path)) for f in parsed)
    for f in parsed:
        click.echo(f"{str(f.path):<{width}}  {f.parsed.summary}")
    part = bundle.part("import")
    rows = part.extra.get("rows", {}) if part else {}
    made = ", ".join(f"{n} {t} rows" for t, n in rows.items() if n) or "no table rows"
    click.echo(f"bundle: {bundle.path} (source=imported; {made}; topology.json)")
    click.echo(f"report: pcieprof report {bundle.path}")
