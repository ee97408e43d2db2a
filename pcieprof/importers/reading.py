"""Reading one input file of `pcieprof import`, with a bound on everything.

A tool output is a text file of at most a few megabytes. What else can be named on the command
line is read so that no input costs more than MAX_BYTES of memory or PIPE_TIMEOUT_S of waiting:
- a regular file larger than MAX_BYTES is refused before it is read;
- a pipe (`<(nvidia-smi topo -m)`, a FIFO) or a character device (`/dev/zero`, `/dev/stdin`) is
  read without blocking, up to MAX_BYTES and for at most PIPE_TIMEOUT_S, then refused if it gave
  more, gave nothing, or did not end (a FIFO nobody writes to ends this way too);
- NUL bytes in the first chunk (a binary file, /dev/zero) stop the read at once;
- a directory, a socket or a block device is refused without reading.
Each refusal is one line naming the file (exit 2).
"""

from __future__ import annotations

import os
import select
import stat
import time
from pathlib import Path

from pcieprof.errors import BadInput

#: The largest input read (the largest real tool outputs are a few MB: lspci -vvv, dmesg).
MAX_BYTES = 64 * 1024 * 1024
#: How long a pipe or device may take to deliver its whole content.
PIPE_TIMEOUT_S = 10.0
#: A line longer than this is not a tool's text output (real lines are < 1 kB; NCCL's are
#: < 1 kB by its buffer, nvbandwidth -j is indented).
MAX_LINE_CHARS = 1024 * 1024
_CHUNK = 64 * 1024


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _check_chunk(path: Path, data: bytes) -> None:
    if b"\x00" in data:
        gz = data[:2] == b"\x1f\x8b"  # gzip magic: how profiler traces are usually kept
        raise BadInput(f"{path}: expected a text file (tool output), got binary data "
                       f"({'gzip' if gz else 'NUL bytes'})",
                       hint="a PyTorch profiler (Kineto) trace goes to `pcieprof attribute "
                            "TRACE...`" if gz else None)


def _read_stream(path: Path, fd: int, deadline: float) -> bytes:
    """Read a pipe or character device without blocking, bounded in bytes and time.

    Waits (select) before each read: a FIFO whose writer has not connected yet is not at its
    end (Linux reports the end only once a writer came and went), so it is waited for, up to
    the deadline, like a writer that is slow.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadInput(f"{path}: expected the input to end within {PIPE_TIMEOUT_S:g} s "
                           f"(got {size} bytes so far)", hint="save the output to a file first")
        ready, _, _ = select.select([fd], [], [], min(left, 0.25))
        if not ready:
            continue
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            continue
        if not data:
            return b"".join(chunks)
        if not chunks:
            _check_chunk(path, data)
        chunks.append(data)
        size += len(data)
        if size > MAX_BYTES:
            raise BadInput(f"{path}: expected at most {_size(MAX_BYTES)} of tool output, got "
                           "more", hint="is this the right file?")


def read_input(path: Path) -> tuple[bytes, str]:
    """The bytes of `path` and their text (UTF-8; other bytes replaced, never fatal).

    Raises:
        BadInput: the path cannot be read, is not a file, a pipe or a character device, is
            larger than MAX_BYTES, holds NUL bytes or a line over MAX_LINE_CHARS, is empty, or
            (a pipe or device) does not end within PIPE_TIMEOUT_S.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    kind = _kind(st.st_mode)
    streaming = stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)
    if not (stat.S_ISREG(st.st_mode) or streaming):
        raise BadInput(f"{path}: expected a file of tool output, got {kind}")
    if not streaming and st.st_size > MAX_BYTES:
        raise BadInput(f"{path}: expected at most {_size(MAX_BYTES)} of tool output, got "
                       f"{_size(st.st_size)}", hint="is this the right file?")
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_NONBLOCK if streaming else 0))
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        if streaming:
            raw = _read_stream(path, fd, time.monotonic() + PIPE_TIMEOUT_S)
        else:
            with os.fdopen(os.dup(fd), "rb") as fh:
                head = fh.read(_CHUNK)
                _check_chunk(path, head)
                raw = head + fh.read(MAX_BYTES + 1 - len(head))
            if len(raw) > MAX_BYTES:  # it grew while we read it
                raise BadInput(f"{path}: expected at most {_size(MAX_BYTES)} of tool output, "
                               "got more", hint="is this the right file?")
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if not raw.strip():
        raise BadInput(f"{path}: expected tool output, got "
                       + ("an empty pipe" if streaming and not raw else "an empty file"))
    text = raw.decode("utf-8", errors="replace")
    _check_lines(path, text)
    return raw, text


def _check_lines(path: Path, text: str) -> None:
    """Refuse a line over MAX_LINE_CHARS, naming it."""
    lengths = [len(line) for line in text.split("\n")]
    if max(lengths) > MAX_LINE_CHARS:
        k = next(i for i, n in enumerate(lengths) if n > MAX_LINE_CHARS)
        raise BadInput(f"{path}:{k + 1}: expected a line of tool output (at most "
                       f"{MAX_LINE_CHARS // 1024} kB), got {lengths[k]} characters in one line",
                       hint="is this the right file?")
