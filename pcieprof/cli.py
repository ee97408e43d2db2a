"""The `pcieprof` command line: a thin click group. Each subcommand lives in pcieprof/commands/.

Errors are caught once, here: a PcieprofError prints one line and exits with its code; --debug
shows the traceback instead.
"""

from __future__ import annotations

import errno
import importlib.util
import sys
import traceback
from typing import Any, NoReturn

import click

from pcieprof import __version__, bundle, progress
from pcieprof.commands.options import verbosity
from pcieprof.errors import ExitCode, PcieprofError
from pcieprof.redact import redact, remember_environ

# subcommand name -> (module in pcieprof.commands, one line for --help). A module is imported
# only when its command runs, so `pcieprof --help` and light commands do not pay for torch,
# pandas or plotly.
COMMANDS: dict[str, tuple[str, str]] = {
    "topology": ("topology", "Discover GPUs, PCIe tree, IOMMU/ACS/VM; probe P2P and all-reduce."),
    "import": ("import_", "Import other tools' outputs (nvidia-smi, nccl-tests, ...) as a bundle."),
    "sim": ("sim", "The PCIe fabric model: profiles, their tree, the calibration table."),
    "serve-bench": ("serve_bench", "Launch or attach SGLang, drive load, profile and attribute."),
    "reference-server": ("reference_server", "Run pcieprof's reference server (a test target)."),
    "attribute": ("attribute", "Split decode time into communication, compute and idle."),
    "report": ("report", "Write the offline HTML report of one or more bundles."),
    "recommend": ("recommend", "Recommend NCCL settings, ring order and parallel layout."),
    "compare": ("compare", "Compare the metrics of two bundles; exit 1 on a regression."),
    "demo": ("demo", "Everything above on a simulated 8-GPU VM box, no GPU needed."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"pcieprof.commands.{COMMANDS[name][0]}")
        return getattr(module, "command")

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in COMMANDS.items()])

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # Verbosity is process state set by eager options; start each invocation from the default.
        progress.configure(quiet=False, debug=False)
        return super().main(*args, **kwargs)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pcieprof")
@verbosity
def cli() -> None:
    """PCIe/virtualization profiler and topology tuner for multi-GPU LLM serving.

    Measure (topology, serve-bench, import) into a results bundle; analyse, tune and report from
    bundles (attribute, recommend, report, compare). `pcieprof demo` runs it all without a GPU.
    """


def _interrupted() -> NoReturn:
    """Ctrl-C (or SIGTERM where a command turns it into one), for every command: each bundle
    this process started and did not finish is marked partial and named, then exit 130."""
    left = bundle.unfinished()
    for b in left:
        try:
            if b.manifest.end_time is None:  # its command did not mark it itself
                b.interrupted("interrupted (Ctrl-C); what was written so far is kept")
        except OSError:
            pass  # the path is still worth printing; the manifest says partial already
        click.echo(f"pcieprof: interrupted; partial bundle: {b.path}", err=True)
    if not left:
        click.echo("pcieprof: interrupted", err=True)
    sys.exit(ExitCode.INTERRUPTED)


#: What the kernel answers a write that cannot be stored: no space, over a file size limit or a
#: quota, a read-only file system. Wherever it comes from, the --out cannot be written: exit 2.
CANNOT_WRITE = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS}


def _cannot_write(exc: OSError) -> NoReturn:
    """A write refused by the file system, for every command: each bundle this process started
    and did not finish is marked partial where that can still be written (the manifest is
    replaced atomically, so it otherwise stays as it was: partial), then one line, exit 2."""
    if progress.is_debug():
        traceback.print_exc()
    left = bundle.unfinished()
    for b in left:
        try:
            b.interrupted(f"stopped: {exc.strerror}")
        except OSError:
            pass
    what = f"cannot write {exc.filename}" if exc.filename else "cannot write the output"
    where = f"; partial bundle: {left[0].path}" if left else ""
    click.echo(redact(f"pcieprof: error: {what}: {exc.strerror or exc}{where} (free space, or "
                      "choose an --out on another file system)"), err=True)
    sys.exit(ExitCode.BAD_INPUT)


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point."""
    bundle.forget_unfinished()
    remember_environ()  # a secret this process inherits is masked wherever it would be shown
    try:
        return cli.main(args=argv, prog_name="pcieprof", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _interrupted()
    except click.exceptions.UsageError as exc:  # one line, as every other bad input
        where = exc.ctx.command_path if exc.ctx is not None else "pcieprof"
        click.echo(f"pcieprof: error: {redact(exc.format_message())} (see {where} --help)",
                   err=True)
        sys.exit(ExitCode.BAD_INPUT)
    except click.exceptions.ClickException as exc:
        click.echo(f"pcieprof: error: {redact(exc.format_message())}", err=True)
        sys.exit(ExitCode.BAD_INPUT if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except PcieprofError as exc:
        if progress.is_debug():
            traceback.print_exc()
        click.echo(f"pcieprof: error: {redact(exc.one_line())}", err=True)
        sys.exit(int(exc.exit_code))
    except Exception as exc:  # a bug: still one line unless --debug
        if isinstance(exc, OSError) and exc.errno in CANNOT_WRITE:
            _cannot_write(exc)
        if progress.is_debug():
            raise
        click.echo(f"pcieprof: internal error: {type(exc).__name__}: {redact(str(exc))} "
                   f"(rerun with --debug for the traceback)", err=True)
        sys.exit(ExitCode.FAILURE)
