"""Helpers shared by the importers: line handling and the one-line parse error.

Every parser reports a malformed or truncated input the same way: a `BadInput` whose single line
names the file, the 1-based line number and what was expected there, never a traceback.
"""

from __future__ import annotations

import re
from typing import NoReturn

from pcieprof.errors import BadInput

#: ANSI escape sequences (nvidia-smi underlines its header row with ESC[4m ... ESC[0m).
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """`text` without ANSI escape sequences."""
    return ANSI_RE.sub("", text)


def split_lines(text: str) -> list[str]:
    """The lines of `text` without line endings (CRLF and a missing final newline accepted)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def fail(name: str, lineno: int | None, expected: str, *, got: str | None = None) -> NoReturn:
    """Raise the importers' one-line error.

    Args:
        name: the file name, as the user gave it.
        lineno: 1-based line number, or None when the problem is the file as a whole.
        expected: what the parser expected to find there.
        got: the offending text (shortened), if it helps.
    """
    where = f"{name}:{lineno}" if lineno is not None else name
    msg = f"{where}: expected {expected}"
    if got is not None:
        shown = got.strip()
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg += f", got {shown!r}" if shown else ", got an empty line"
    raise BadInput(msg, hint="is the file complete and unedited?")


def parse_float(token: str, name: str, lineno: int, what: str) -> float:
    """`float(token)` or the one-line error naming `what`."""
    try:
        return float(token)
    except ValueError:
        fail(name, lineno, what, got=token)


def parse_int(token: str, name: str, lineno: int, what: str) -> int:
    """`int(token)` or the one-line error naming `what`."""
    try:
        return int(token)
    except ValueError:
        fail(name, lineno, what, got=token)
