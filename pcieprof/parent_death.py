"""The one way a process pcieprof starts is tied to its parent: a parent-death signal.

`set_parent_death_signal(sig)` asks Linux to send `sig` to the calling process when its parent
dies (prctl PR_SET_PDEATHSIG, linux/prctl.h; Linux >= 2.1.57): a launched server, a torchrun
agent or a probe worker never outlives pcieprof, even when pcieprof is SIGKILLed. It is safe as a
`preexec_fn` (between fork and exec): libc is loaded here, at import, not in the forked child.
Each caller picks its signal: SIGTERM for a process that tears down its own children (torchrun,
a server's process group), SIGKILL for a leaf (a worker rank), 0 to clear it (a test hook that
must outlive its parent). Elsewhere than Linux it does nothing.

`watch_parent(pid)` is the second tie, from the child's side: a thread that ends the process
once its parent is no longer `pid` (for a parent that died before the request took effect, or
where there is no prctl).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h

_LIBC: ctypes.CDLL | None
try:
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


def set_parent_death_signal(sig: int, parent: int | None = None) -> None:
    """Have `sig` sent to this process when its parent dies (0: no signal any more).

    Args:
        sig: the signal number (e.g. `signal.SIGTERM`), or 0 to clear the request.
        parent: the pid the parent had before the fork (as a `preexec_fn`): if the parent died
            before the request took effect, `sig` is sent at once (the kernel would not).
    """
    if _LIBC is None:
        return
    if _LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return
    if sig and parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), int(sig))


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> threading.Thread:
    """Exit this process (status 1, at once) as soon as `parent_pid` is no longer its parent."""
    def run() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(interval_s)

    t = threading.Thread(target=run, name="parent-watchdog", daemon=True)
    t.start()
    return t
