"""Progress and messages on stderr; results go to files and a short summary to stdout.

One module so that `--quiet` silences everything in one place, and so that every line passes
through pcieprof.redact (secrets masked) on its way out.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn,
                           TimeElapsedColumn)

from pcieprof.redact import redact

_state = {"quiet": False, "debug": False}
_err = Console(stderr=True, highlight=False, soft_wrap=True)


def configure(*, quiet: bool = False, debug: bool = False) -> None:
    """Set verbosity for the whole process (called by the CLI)."""
    _state["quiet"] = quiet
    _state["debug"] = debug


def is_quiet() -> bool:
    return _state["quiet"]


def is_debug() -> bool:
    return _state["debug"]


def info(message: str) -> None:
    """A progress line on stderr (suppressed by --quiet)."""
    if not _state["quiet"]:
        _err.print(redact(message), markup=False)


def warn(message: str) -> None:
    """A warning on stderr; shown even with --quiet, because it changes what the results mean."""
    _err.print(f"warning: {redact(message)}", markup=False, style="yellow")


def debug(message: str) -> None:
    if _state["debug"]:
        _err.print(f"debug: {redact(message)}", markup=False, style="dim")


class Task:
    """Handle for one progress bar."""

    def __init__(self, progress: Progress | None, task_id: TaskID | None) -> None:
        self._p = progress
        self._id = task_id

    def advance(self, n: float = 1, description: str | None = None) -> None:
        if self._p is not None and self._id is not None:
            if description:
                self._p.update(self._id, advance=n, description=redact(description))
            else:
                self._p.update(self._id, advance=n)

    def describe(self, description: str) -> None:
        if self._p is not None and self._id is not None:
            self._p.update(self._id, description=redact(description))


@contextmanager
def task(description: str, total: float | None) -> Iterator[Task]:
    """A progress bar on stderr for `total` steps (spinner-like when total is None)."""
    if _state["quiet"] or not sys.stderr:
        yield Task(None, None)
        return
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=_err, transient=False)
    with progress:
        yield Task(progress, progress.add_task(description, total=total))
