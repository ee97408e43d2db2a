"""pcieprof.parent_death: a child started with the parent-death signal dies with its parent, and
at once when its parent was gone before the request took effect. Real processes: a middle
process (this interpreter) starts a sleeping child and exits; the test watches only that child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from builders.procs import alive, gone

MIDDLE = """
import os, signal, subprocess, sys
from functools import partial
from pcieprof.parent_death import set_parent_death_signal
parent = os.getpid() if sys.argv[1] == "self" else 1  # 1: a parent that is not the real one
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         preexec_fn=partial(set_parent_death_signal, signal.SIGTERM, parent))
print(child.pid, flush=True)
if sys.argv[1] == "self":
    os._exit(0)  # the parent dies; its child should follow
child.wait(timeout=10)  # killed at once by the check
print(child.returncode, flush=True)
"""


def test_child_dies_with_its_parent() -> None:
    out = subprocess.run([sys.executable, "-c", MIDDLE, "self"], capture_output=True, text=True,
                         timeout=60)
    child = int(out.stdout.split()[0])
    try:
        # it sleeps 60 s: gone within 30 s (a loaded machine's delays) is gone with its parent
        assert gone(child, 30.0), "the child outlived its parent"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_child_of_a_parent_already_gone_ends_at_once() -> None:
    out = subprocess.run([sys.executable, "-c", MIDDLE, "other"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "-15"  # SIGTERM, sent by the check itself
