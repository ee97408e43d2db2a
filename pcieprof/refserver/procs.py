"""Keeping the rank processes tied to their parent, so none outlives it.

Each worker rank asks the kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG, set
between fork and exec), and also watches its parent's pid from a thread, for the case where the
parent died before the prctl took effect.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL) for the calling process (Linux; no-op elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> threading.Thread:
    """Exit this process as soon as `parent_pid` is no longer its parent."""
    def run() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(interval_s)

    t = threading.Thread(target=run, name="parent-watchdog", daemon=True)
    t.start()
    return t
