"""Keeping the rank processes tied to their parent, so none outlives it.

Each worker rank asks the kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG, set
between fork and exec), and also watches its parent's pid from a thread, for the case where the
parent died before the prctl took effect.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from pcieprof.parent_death import set_parent_death_signal


def die_with_parent() -> None:
    """SIGKILL for the calling process when its parent dies (pcieprof.parent_death)."""
    set_parent_death_signal(signal.SIGKILL)


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
