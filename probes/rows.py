"""How a torchrun worker hands rows and progress to the runner: one JSONL file per rank.

Each line is either `{"table": "p2p", "row": {...}}` (a row for the bundle) or
`{"event": "start", ...}` (a case is starting: the runner's watchdog uses it as the heartbeat and
to name what hung). Every line is flushed and fsynced, so rows are on disk as they are measured;
the runner appends them to the bundle as they arrive.

Test-only hook: with `PCIEPROF_TEST_HOOKS=i-know-this-is-for-tests` set, `PCIEPROF_TEST_HANG=
"<rank>:<where>[:<label>]"` makes that rank sleep forever when it reaches `where` (the message
size in bytes for the all-reduce worker, the P2P case index for the copy worker, 10000 + index for
a concurrent case), only in the launch called `label` (an all-reduce variant name, or `copies`)
when given; `PCIEPROF_TEST_DIE` (same syntax) makes it exit with status 17 there, and
`PCIEPROF_TEST_CORRUPT` (same syntax, copy worker, cpu backend) flips one received byte before
the check, to prove that wrong bytes become status=error; `PCIEPROF_TEST_STUCK` (same syntax)
makes that rank a process that outlives its launch, as one stuck in the driver does: it stops
dying with its parent, ignores SIGTERM, SIGINT and SIGHUP, and sleeps (only SIGKILL ends it).
All need the guard variable too, so a stray setting cannot trigger them. They exist only to test
the watchdog (tests/probes/).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, TextIO

from pcieprof.parent_death import set_parent_death_signal

_GUARD = "i-know-this-is-for-tests"
#: Set by the runner for a launch on one node: the file the ranks meet at (a torch FileStore, no
#: socket) instead of env://, where rank 0 would host a TCPStore (torchrun's MASTER_ADDR/PORT),
#: and torch's TCPStore listens on every interface whatever host it is given.
STORE_FILE_VAR = "PCIEPROF_STORE_FILE"


class RowWriter:
    """Appends rows and events of one rank to `<dir>/rank<r>.jsonl`."""

    def __init__(self, directory: Path | str, rank: int) -> None:
        self.path = Path(directory) / f"rank{rank}.jsonl"
        self.rank = rank
        self._f: TextIO = self.path.open("a", encoding="utf-8")

    def _write(self, obj: dict[str, Any]) -> None:
        self._f.write(json.dumps(obj, allow_nan=False, default=_nan_free) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def row(self, table: str, row: Any) -> None:
        """One row for a bundle table: a typed row of pcieprof.bundle.rows or a dict of its
        columns (NaN is written as null)."""
        cells = asdict(row) if is_dataclass(row) and not isinstance(row, type) else dict(row)
        self._write({"table": table, "row": {k: _finite(v) for k, v in cells.items()}})

    def event(self, name: str, **fields: Any) -> None:
        """A progress event (e.g. `start` of a case), stamped with the rank and the time."""
        self._write({"event": name, "rank": self.rank, "t": time.time(), **fields})

    def close(self) -> None:
        self._f.close()


def _finite(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return None
    return v


def _nan_free(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(type(obj).__name__)


def test_hook(rank: int, where: int, label: str) -> None:
    """Test-only: hang or die at (rank, size or case index, launch label) when the guarded env
    asks for it."""
    if os.environ.get("PCIEPROF_TEST_HOOKS") != _GUARD:
        return
    for var, act in (("PCIEPROF_TEST_HANG", "hang"), ("PCIEPROF_TEST_DIE", "die"),
                     ("PCIEPROF_TEST_STUCK", "stuck")):
        spec = os.environ.get(var, "")
        if not spec:
            continue
        r, w, lab = (spec.split(":") + ["", ""])[:3]
        if r.strip() == str(rank) and w.strip() == str(where) and lab.strip() in ("", label):
            if act == "stuck":
                set_parent_death_signal(0)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_IGN)
            if act in ("hang", "stuck"):
                print(f"pcieprof test hook: rank {rank} {act}s at {where}", file=sys.stderr,
                      flush=True)
                while True:
                    time.sleep(3600)
            print(f"pcieprof test hook: rank {rank} dies at {where}", file=sys.stderr, flush=True)
            os._exit(17)


def test_corrupt(rank: int, where: int, label: str) -> bool:
    """Test-only: True when the guarded env asks this rank to corrupt what it received here."""
    if os.environ.get("PCIEPROF_TEST_HOOKS") != _GUARD:
        return False
    r, w, lab = (os.environ.get("PCIEPROF_TEST_CORRUPT", "").split(":") + ["", ""])[:3]
    return r.strip() == str(rank) and w.strip() == str(where) and lab.strip() in ("", label)


def die_with_parent() -> None:
    """Ask Linux to kill this worker when its parent (the torchrun agent) dies, so a killed run
    never leaves workers behind (pcieprof.parent_death; a no-op elsewhere than Linux)."""
    set_parent_death_signal(signal.SIGKILL)


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown (seconds with torch loaded, on a busy machine):
    every row is already fsynced and the process group destroyed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def init_group(backend: str, timeout: datetime.timedelta, **kwargs: Any) -> None:
    """`torch.distributed.init_process_group(backend, ...)` at the store the runner names
    (STORE_FILE_VAR: one node), else env:// (several nodes: torchrun's rendezvous, at the
    endpoint the user gave)."""
    import torch.distributed as dist  # heavy: torch (the runner imports this module)

    path = os.environ.get(STORE_FILE_VAR)
    if not path:
        dist.init_process_group(backend, timeout=timeout, **kwargs)
        return
    rank, world, _ = dist_env()
    store = dist.FileStore(path, world)
    store.set_timeout(timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout,
                            **kwargs)


def dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) as torchrun sets them."""
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")))
