"""Options every command shares: --out, --force, --quiet, --debug."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from pcieprof import progress


def _set_quiet(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        progress.configure(quiet=True, debug=progress.is_debug())
    return value


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        progress.configure(quiet=progress.is_quiet(), debug=True)
    return value


def verbosity(f: Callable[..., Any]) -> Callable[..., Any]:
    """--quiet and --debug; they act as soon as parsed and are not passed to the command."""
    f = click.option("--quiet", "-q", is_flag=True, expose_value=False, callback=_set_quiet,
                     is_eager=True, help="No progress on stderr.")(f)
    f = click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug,
                     is_eager=True, help="Show tracebacks and debug messages.")(f)
    return f


def out_dir(f: Callable[..., Any]) -> Callable[..., Any]:
    """--out DIR (default: reports/<command>-<timestamp>) and --force."""
    f = click.option("--out", "-o", "out", type=click.Path(path_type=Path), default=None,
                     help="Bundle directory to write (default: reports/<command>-<time>).")(f)
    f = click.option("--force", is_flag=True,
                     help="Replace the pcieprof bundle in a non-empty --out (its own files "
                          "only; any other directory is refused).")(f)
    return f
