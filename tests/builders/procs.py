"""Processes the tests started, and only those: their tree from /proc, free loopback ports.

A test never looks at the machine's other processes: engineers and CI run other tests at the same
time. `descendants(pid)` walks the children of a process the test started; a command that may leave
orphans behind (which Linux hands to init, out of the test's tree) runs below `reaper_argv`, a
child subreaper (prctl PR_SET_CHILD_SUBREAPER, Linux >= 3.4) that adopts them, writes their command
lines to a file once the command has ended, then kills them.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: [state, ppid, ...]; None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True while /proc/<pid> exists and is not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def descendants(pid: int) -> set[int]:
    """All processes below `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children.setdefault(int(stat[1]), []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def group_gone(pgid: int, within_s: float = 5.0) -> bool:
    """True once no process is left in the process group `pgid` (of a server the test's command
    started: its pid, recorded in the bundle), waiting up to `within_s` for it to be reaped."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def cmdline(pid: int) -> str:
    """The command line of `pid`, words joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def reaper_argv(report: Path) -> list[str]:
    """The words to put before a command line to run it below a subreaper that writes, to `report`
    (JSON), the command lines of the processes of the command's tree still alive once it ended."""
    return [sys.executable, str(Path(__file__).resolve()), str(report), "--"]


def _reap(report: Path, argv: list[str]) -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    code = subprocess.call(argv)
    time.sleep(0.5)  # what the command stops as it exits has a moment to go
    left = sorted(p for p in descendants(os.getpid()) if alive(p))
    report.write_text(json.dumps([cmdline(p) for p in left]))
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in left:  # adopted: ours to reap
        try:
            os.waitpid(p, 0)
        except ChildProcessError:
            pass
    return code


if __name__ == "__main__":
    sys.exit(_reap(Path(sys.argv[1]), sys.argv[3:]))
