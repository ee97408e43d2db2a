"""Processes the tests started, and only those: their tree from /proc, the TCP sockets they
listen on, free loopback ports.

A test never looks at the machine's other processes: engineers and CI run other tests at the same
time. `descendants(pid)` walks the children of a process the test started; a command that may leave
orphans behind (which Linux hands to init, out of the test's tree) runs below `reaper_argv`, a
child subreaper (prctl PR_SET_CHILD_SUBREAPER, Linux >= 3.4) that adopts them, writes their command
lines to a file once the command has ended, then kills them.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
#: Seconds a process stopped by a command may take to exit after the command did (SIGTERM
#: handlers, a loaded machine) before `reaper_argv` counts it as left behind.
LINGER_S = 10.0
#: The addresses a loopback-only listener may have (an IPv4 one seen by an IPv6 socket included).
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


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


def gone(pid: int, within_s: float) -> bool:
    """True once `pid` has exited (or is a zombie), waiting up to `within_s` for it."""
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


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


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _address(hex_addr: str) -> str:
    """/proc/net/tcp{,6} local address (little-endian words) as text, without the port."""
    raw = bytes.fromhex(hex_addr.split(":")[0])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ".".join(str(b) for b in words)
    return str(ipaddress.IPv6Address(words))


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in LISTEN state that one of `pids` holds, matched
    by socket inode in /proc/<pid>/net/tcp{,6} (the process's own network namespace)."""
    rows = []
    for pid in pids:
        inodes = _socket_inodes(pid)
        if not inodes:
            continue
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:  # 0A: TCP_LISTEN
                    rows.append((pid, _address(f[1]), int(f[1].split(":")[1], 16)))
    return rows


def reaper_argv(report: Path) -> list[str]:
    """The words to put before a command line to run it below a subreaper that writes, to `report`
    (JSON), the command lines of the processes of the command's tree still alive LINGER_S after it
    ended."""
    return [sys.executable, str(Path(__file__).resolve()), str(report), "--"]


def _reap(report: Path, argv: list[str]) -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    code = subprocess.call(argv)
    # what the command stopped as it exited may still be on its way out (seconds, on a loaded
    # machine): left behind is what is still there after LINGER_S
    deadline = time.monotonic() + LINGER_S
    while True:
        left = sorted(p for p in descendants(os.getpid()) if alive(p))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
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
