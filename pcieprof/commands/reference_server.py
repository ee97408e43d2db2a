"""`pcieprof reference-server [SGLang-style flags]`: run the reference server in the foreground.

The same server and flags as `python -m pcieprof.refserver` (see pcieprof/refserver): SGLang's
HTTP surface over a tiny tensor-parallel MoE model on CPU, a test and demo target for
serve-bench, not a serving engine. Flags are passed through unparsed so that the server's own
parser (SGLang's flag names) is the one that accepts or refuses them.
"""

from __future__ import annotations

import sys

import click

from pcieprof.errors import BadInput, ExitCode
from pcieprof.refserver.args import ArgsError, parse_args
from pcieprof.refserver.server import main


@click.command(
    "reference-server",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                      "help_option_names": []},
    add_help_option=False,
)
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def command(server_args: tuple[str, ...]) -> None:
    """Serve the tiny-cpu model with SGLang's HTTP API (test and demo target, not a serving
    engine). Takes SGLang's flags: --tp-size N --host H --port P --max-running-requests N
    --random-seed S, plus --inject 'nan-after N' | hang | 'hang-after N' | crash-on-start |
    unsupported-arch | hang-in-capture, or --inject-matrix FILE (faults by launch flags).
    `pcieprof reference-server --help` lists them all."""
    try:
        parse_args(server_args)  # refuse bad flags the pcieprof way, before starting anything
    except ArgsError as exc:
        raise BadInput(str(exc), hint="pcieprof reference-server --help lists the flags") from None
    code = main(list(server_args))
    if code:
        sys.exit(ExitCode.BAD_INPUT if code == 2 else ExitCode.FAILURE)
