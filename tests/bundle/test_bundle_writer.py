"""The manifest's writer record (pcieprof.bundle.writer): a bundle whose writer died with parts
`running` is read as `interrupted`; a live writer's, or one on another host, is left alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pcieprof.bundle import Bundle, writer

# a writer that dies the way SIGKILL or the OOM killer end one: no finish(), no handler
DIE_WRITING = """
import os, sys
from pcieprof.bundle import Bundle
b = Bundle.create(sys.argv[1], command="topology", source="measured", backend="cpu")
b.set_part("discovery", "ok")
b.set_part("allreduce", "running")
print(os.getpid(), flush=True)
os._exit(9)
"""


def test_a_dead_writers_running_parts_read_as_interrupted(tmp_path: Path) -> None:
    out = tmp_path / "b"
    proc = subprocess.run([sys.executable, "-c", DIE_WRITING, str(out)], capture_output=True,
                          text=True, timeout=60)
    pid = int(proc.stdout.strip())
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["parts"]["allreduce"]["status"] == "running"
    assert on_disk["writer"]["pid"] == pid and on_disk["writer"]["start_ticks"]
    b = Bundle.open(out)
    assert b.manifest.status == "interrupted"
    assert b.part("allreduce").status == "interrupted"
    assert b.part("discovery").status == "ok"
    why = b.manifest.why
    assert f"pid {pid} on host" in why and "left running: allreduce" in why
    # the reading changes nothing on disk until a reader saves the manifest
    assert json.loads((out / "manifest.json").read_text())["parts"]["allreduce"]["status"] == \
        "running"


def test_a_live_writer_is_left_alone(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    b.set_part("allreduce", "running")
    again = Bundle.open(b.path)
    assert again.part("allreduce").status == "running"
    assert again.manifest.status == "partial"
    b.finish()
    assert Bundle.open(b.path).manifest.status == "partial"  # finished, not interrupted


def test_a_writer_elsewhere_or_a_reused_pid(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    b.set_part("allreduce", "running")
    me = dict(b.manifest.writer)
    b.manifest.writer = {**me, "host": "some-other-node"}
    b.save_manifest()
    assert writer.state(b.manifest.writer) == "unknown"
    assert Bundle.open(b.path).part("allreduce").status == "running"  # cannot tell from here
    b.manifest.writer = {**me, "start_ticks": "1"}  # this pid, another process's start
    b.save_manifest()
    assert writer.state(b.manifest.writer) == "gone"
    assert Bundle.open(b.path).part("allreduce").status == "interrupted"


def test_another_process_that_goes_on_writing_becomes_the_writer(tmp_path: Path) -> None:
    out = tmp_path / "b"
    subprocess.run([sys.executable, "-c", DIE_WRITING, str(out)], capture_output=True,
                   timeout=60, check=False)
    b = Bundle.open(out)  # e.g. `recommend` adding its part to a bundle
    b.set_part("recommendations", "running")
    assert writer.is_this_process(b.manifest.writer)
    assert Bundle.open(out).part("recommendations").status == "running"
