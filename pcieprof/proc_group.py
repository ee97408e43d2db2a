"""The one way pcieprof starts and stops a process tree: a process group of its own.

A launch (a torchrun agent and its workers, a server and everything it starts) runs in a new
session, so one signal to its process group reaches every process in it, and it is tied to
pcieprof by a parent-death signal (pcieprof.parent_death), so it never outlives a pcieprof that
was SIGKILLed. Stopping is SIGTERM to the group, a grace period for a clean shutdown, then SIGKILL
to whatever is left; a group whose leader already ended holds only strays, which get SIGKILL at
once.

A process that is a part of the caller's own launch rather than a launch of its own (the worker
ranks a server starts, as SGLang's scheduler processes are children in the server's group) is a
*member*: `start_member` leaves it in the caller's process group, so whoever stops that group
(serve/launcher's `stop`) reaches it with its SIGKILL and waits until it is gone, and ties it to
the caller by a parent-death signal. The caller ends its members itself (`kill_members`), by pid:
a signal to the group would reach the caller too, and the group need not be the caller's (a
server run from a shell is in the shell job's group).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from pcieprof.parent_death import set_parent_death_signal

#: After SIGKILL: how long to wait for the group's last members to be gone, s.
GONE_S = 5.0


def start(argv: list[str], *, death_signal: int, **popen: Any) -> subprocess.Popen[Any]:
    """Start `argv` as the leader of a new session (its pgid is its pid).

    Args:
        argv: the command.
        death_signal: what it gets when pcieprof dies: SIGTERM for a process that tears down its
            own children (torchrun, a launch prefix), SIGKILL for one that need not.
        popen: the other subprocess.Popen arguments (env, stdout, ...).
    """
    return subprocess.Popen(argv, start_new_session=True,
                            preexec_fn=partial(set_parent_death_signal, death_signal, os.getpid()),
                            **popen)


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to the process group `pgid`; a group already gone is no error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pgid: int) -> bool:
    """Whether the group has a member that is not a zombie."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) succeeds for zombies too; a group of only zombies of ours is reaped by wait.
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # fields after the command name: state ppid pgrp ...
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) > 2 and int(rest[2]) == pgid and rest[0] != "Z":
            return True
    return False


def stop(proc: subprocess.Popen[Any], grace_s: float) -> int | None:
    """Stop the group `proc` leads: SIGTERM, up to `grace_s` for it to end, then SIGKILL (at once
    when the leader had already ended: what is left are strays). Safe to call more than once.

    Returns:
        The leader's exit status, or None if it could not be reaped.
    """
    pgid = proc.pid
    if proc.poll() is None:
        signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not alive(pgid):
                break
            time.sleep(0.05)
    if proc.poll() is None or alive(pgid):
        signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        end = time.monotonic() + GONE_S
        while alive(pgid) and time.monotonic() < end:
            time.sleep(0.05)
    return proc.poll()


def start_member(argv: list[str], *, death_signal: int, **popen: Any) -> subprocess.Popen[Any]:
    """Start `argv` in the caller's own process group, tied to the caller by `death_signal`.

    The signal is sent when the thread that calls this ends (PR_SET_PDEATHSIG follows the
    parent thread): call it from the thread that lives as long as the process, the main one.

    Args:
        argv: the command.
        death_signal: what it gets when the caller dies (SIGKILL for a worker rank).
        popen: the other subprocess.Popen arguments.
    """
    return subprocess.Popen(argv, preexec_fn=partial(set_parent_death_signal, death_signal,
                                                     os.getpid()), **popen)


def kill_members(procs: Sequence[subprocess.Popen[Any]], wait_s: float) -> list[int]:
    """SIGKILL each of `procs` still running and reap them, all within one `wait_s` deadline.

    Popen.kill does nothing to a process already reaped, so a reused pid is never signalled.

    Returns:
        The pids still running after `wait_s`.
    """
    for p in procs:
        if p.poll() is None:
            p.kill()
    deadline = time.monotonic() + wait_s
    left: list[int] = []
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            left.append(p.pid)
    return left


def exit_text(returncode: int) -> str:
    """How a process ended, from its Popen.returncode: "exited with status 1", "killed by
    signal 11 (SIGSEGV)"."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"killed by signal {-returncode}{name}"
