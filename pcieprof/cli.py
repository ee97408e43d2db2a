"""The `pcieprof` command line: a thin click group. Each subcommand lives in pcieprof/commands/.

Errors are caught once, here: a PcieprofError prints one line and exits with its code; --debug
shows the traceback instead.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from typing import Any

import click

from pcieprof import __version__, progress
from pcieprof.commands.options import verbosity
from pcieprof.errors import ExitCode, PcieprofError

# subcommand name -> module in pcieprof.commands. Imported lazily so that `pcieprof --help` and
# light commands do not pay for torch or plotly.
COMMANDS: dict[str, str] = {
    "topology": "topology",
    "import": "import_",
    "sim": "sim",
    "serve-bench": "serve_bench",
    "reference-server": "reference_server",
    "attribute": "attribute",
    "report": "report",
    "recommend": "recommend",
    "compare": "compare",
    "demo": "demo",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if self._available(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        try:
            module = importlib.import_module(f"pcieprof.commands.{COMMANDS[name]}")
        except ModuleNotFoundError as exc:
            if exc.name == f"pcieprof.commands.{COMMANDS[name]}":
                return None
            raise
        return getattr(module, "command")

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # Verbosity is process state set by eager options; start each invocation from the default.
        progress.configure(quiet=False, debug=False)
        return super().main(*args, **kwargs)

    @staticmethod
    def _available(name: str) -> bool:
        return importlib.util.find_spec(f"pcieprof.commands.{COMMANDS[name]}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pcieprof")
@verbosity
def cli() -> None:
    """PCIe/virtualization profiler and topology tuner for multi-GPU LLM serving.

    Measure (topology, serve-bench, import) into a results bundle; analyse, tune and report from
    bundles (attribute, recommend, report, compare). `pcieprof demo` runs it all without a GPU.
    """


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point."""
    try:
        return cli.main(args=argv, prog_name="pcieprof", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("pcieprof: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("pcieprof: interrupted; the bundle keeps what was measured", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(ExitCode.BAD_INPUT if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except PcieprofError as exc:
        if progress.is_debug():
            traceback.print_exc()
        click.echo(f"pcieprof: error: {exc.one_line()}", err=True)
        sys.exit(int(exc.exit_code))
    except Exception as exc:  # a bug: still one line unless --debug
        if progress.is_debug():
            raise
        click.echo(f"pcieprof: internal error: {type(exc).__name__}: {exc} "
                   f"(rerun with --debug for the traceback)", err=True)
        sys.exit(ExitCode.FAILURE)
