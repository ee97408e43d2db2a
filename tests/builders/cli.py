"""The one way tests run the `pcieprof` command line.

`cli(*args)` runs it in this process (fast; what `pcieprof.cli.main` prints and the exit code it
ends with); `cli(*args, process=True)` runs `python -m pcieprof` as a real process, for what needs
one: commands that install signal handlers or launch workers, a changed working directory or
environment, a wall-clock bound, or an exit code the process itself must end with. Both return a
`subprocess.CompletedProcess` (returncode, stdout, stderr). A test that must hold the process
while it runs (to signal it, or to run two at once) starts `pcieprof_argv(...)` with Popen.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from builders.procs import reaper_argv
from pcieprof.cli import main


def pcieprof_argv(*args: str) -> list[str]:
    """`python -m pcieprof *args` with this interpreter."""
    return [sys.executable, "-m", "pcieprof", *args]


def cli(*args: str, process: bool = False, timeout: float = 300, cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        left_behind: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `pcieprof *args`.

    Args:
        args: the command line after `pcieprof`.
        process: run `python -m pcieprof` as a child process instead of in this one.
        timeout: with `process`, the bound on its wall time, s.
        cwd: with `process`, its working directory.
        env: with `process`, variables added to this process's environment.
        left_behind: with `process`, run it below `procs.reaper_argv(left_behind)`: once it has
            ended, this JSON file lists the command lines of the processes of its own tree that
            it left running (which are then killed).

    Returns:
        The exit code, stdout and stderr.
    """
    argv = pcieprof_argv(*args)
    if process:
        if left_behind is not None:
            argv = reaper_argv(left_behind) + argv
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env={**os.environ, **env} if env is not None else None)
    if cwd is not None or env is not None or left_behind is not None:
        raise TypeError("cwd, env and left_behind need a real process: pass process=True")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
