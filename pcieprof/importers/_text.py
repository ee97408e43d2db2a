"""Helpers shared by the importers: bounded text, line handling and the one-line parse error.

Every parser reports a malformed or truncated input the same way: a `BadInput` whose single line
names the file, the 1-based line number and what was expected there, never a traceback.

Pasted tool output comes with ANSI colour codes, CRLF line ends, shell prompts, Markdown fences
and prose around it; `clean_lines` removes what no parser wants (codes, CRs) and leaves the rest
for the parser to skip, so line numbers stay those of the file.

Format detection looks at a bounded head only (`head_lines`): at most HEAD_CHARS characters,
each line cut to DETECT_LINE_CHARS, so a hostile file (one 200 kB line, a megabyte of XML) costs
the same few milliseconds as a real one. Every detection pattern is linear in its input.
"""

from __future__ import annotations

import re
from typing import Callable, NoReturn, TypeVar

from pcieprof.errors import BadInput

N = TypeVar("N", int, float)

#: ANSI escape sequences: CSI (nvidia-smi underlines its header row with ESC[4m ... ESC[0m,
#: coloured logs use ESC[31m) and OSC (terminal titles), as terminals and log captures keep them.
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")

#: Characters of a file's head that format detection reads.
HEAD_CHARS = 256 * 1024
#: Each line of the head is cut to this many characters for detection (real lines are < 1 kB).
DETECT_LINE_CHARS = 4096


def strip_ansi(text: str) -> str:
    """`text` without ANSI escape sequences."""
    return ANSI_RE.sub("", text) if "\x1b" in text else text


def split_lines(text: str) -> list[str]:
    """The lines of `text` without line endings (CRLF and a missing final newline accepted)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


_EDITOR_NUMBER = re.compile(r"^ *(\d+)(?: |$)")


def _strip_editor_numbers(lines: list[str]) -> list[str]:
    """Lines copied from an editor showing line numbers (`  1 P2P=Disabled ...`, as pasted in
    NVIDIA/cuda-samples issue #230) without those numbers: only when every line, blank ones
    too, starts with the next number of one count, which no tool output does."""
    body = lines[:-1] if lines and lines[-1] == "" else lines
    if len(body) < 3:
        return lines
    first = _EDITOR_NUMBER.match(body[0])
    if first is None:
        return lines
    start = int(first.group(1))
    out = []
    for k, line in enumerate(body):
        m = _EDITOR_NUMBER.match(line)
        if m is None or int(m.group(1)) != start + k:
            return lines
        out.append(line[m.end():])
    return out + lines[len(body):]


def clean_lines(text: str) -> list[str]:
    """The lines of `text`, ANSI codes removed, CR/CRLF endings normalised and an editor's line
    numbers dropped; numbering is kept (line i of the result is line i+1 of the file)."""
    return _strip_editor_numbers(split_lines(strip_ansi(text)))


def head_lines(text: str) -> list[str]:
    """The cleaned lines of the head of `text` that format detection reads (bounded)."""
    head = text[:HEAD_CHARS]
    return [ln[:DETECT_LINE_CHARS] for ln in clean_lines(head)]


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
        shown = strip_ansi(got).strip()
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg += f", got {shown!r}" if shown else ", got an empty line"
    raise BadInput(msg, hint="is the file complete and unedited?")


def parse_float(token: str, name: str, lineno: int, what: str) -> float:
    """`float(token)` or the one-line error naming `what`."""
    return _parse(float, token, name, lineno, what)


def parse_int(token: str, name: str, lineno: int, what: str) -> int:
    """`int(token)` or the one-line error naming `what`."""
    return _parse(int, token, name, lineno, what)


def _parse(convert: Callable[[str], N], token: str, name: str, lineno: int, what: str) -> N:
    try:
        return convert(token)
    except ValueError:
        fail(name, lineno, what, got=token)
