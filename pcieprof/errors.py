"""The one error type of pcieprof, caught once at the top of the CLI."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes. Scripts (and `pcieprof compare --fail-if`) rely on these."""

    OK = 0
    FAILURE = 1  # the work ran and found a problem (a regression, a crashed launch); a bug
    BAD_INPUT = 2  # the user's arguments or files are wrong
    ENVIRONMENT = 3  # something this machine lacks (no GPU, no NVML, not Linux)
    MEASUREMENT = 4  # a measurement could not be completed
    INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT


class PcieprofError(Exception):
    """An error the user can act on: shown as one line (plus an optional hint), never a traceback.

    Args:
        message: what went wrong, in one line.
        hint: what to do about it, e.g. "Use --backend cpu to run without GPUs".
        exit_code: the process exit status.
    """

    def __init__(self, message: str, *, hint: str | None = None,
                 exit_code: ExitCode = ExitCode.BAD_INPUT) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def one_line(self) -> str:
        """The message and hint as the single line the CLI prints."""
        return f"{self.message} ({self.hint})" if self.hint else self.message


class BadInput(PcieprofError):
    """Arguments or input files that cannot be used."""


class EnvironmentMissing(PcieprofError):
    """A capability this machine lacks (GPU, driver, OS)."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, exit_code=ExitCode.ENVIRONMENT)
