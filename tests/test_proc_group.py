"""pcieprof.proc_group's members: a process started with `start_member` stays in its caller's
process group (so a group stop of the caller's launcher reaches it), dies with its caller, and
`kill_members` ends and reaps it; `exit_text` says how a process ended. Real processes only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from builders.procs import alive, gone

from pcieprof import proc_group

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]

# A middle process starts a member and dies at once: its member must follow it.
MIDDLE = """
import os, signal, sys
from pcieprof import proc_group
child = proc_group.start_member([sys.executable, "-c", "import time; time.sleep(60)"],
                                death_signal=signal.SIGKILL)
print(child.pid, os.getpgid(child.pid) == os.getpgrp(), flush=True)
os._exit(0)
"""


def test_a_member_stays_in_its_callers_group_and_is_killed_and_reaped() -> None:
    members = [proc_group.start_member(SLEEP, death_signal=signal.SIGKILL) for _ in range(2)]
    try:
        assert all(os.getpgid(p.pid) == os.getpgrp() for p in members)
        members[0].kill()
        members[0].wait(timeout=10)  # one already ended (and reaped) is no error
        assert proc_group.kill_members(members, 10.0) == []
        assert [p.returncode for p in members] == [-signal.SIGKILL] * 2
    finally:
        for p in members:
            if p.poll() is None:
                p.kill()


def test_a_member_dies_with_its_caller() -> None:
    out = subprocess.run([sys.executable, "-c", MIDDLE], capture_output=True, text=True,
                         timeout=60)
    pid, same_group = out.stdout.split()
    child = int(pid)
    try:
        assert same_group == "True"
        # it sleeps 60 s: gone within 30 s (a loaded machine's delays) is gone with its caller
        assert gone(child, 30.0), "the member outlived its caller"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_exit_text_names_the_status_or_the_signal() -> None:
    assert proc_group.exit_text(0) == "exited with status 0"
    assert proc_group.exit_text(1) == "exited with status 1"
    assert proc_group.exit_text(-11) == "killed by signal 11 (SIGSEGV)"
    assert proc_group.exit_text(-9) == "killed by signal 9 (SIGKILL)"
