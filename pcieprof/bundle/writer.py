"""Who is writing a bundle: the writing process's pid, host, boot and start time, kept in the
manifest (`writer`) so that a reader can tell a bundle still being written from one whose writer
died (SIGKILL, the OOM killer, a node lost with its machine).

A part says `running` while its writer works on it, and a dead writer cannot say otherwise.
`Bundle.create` (and `Bundle.set_part(..., "running")` from another process) records
`record()`; `Bundle.open` asks `state()` and, when the writer is gone, reads the parts it left
`running` as `interrupted` (pcieprof.bundle). Every long-running writer (topology, serve-bench)
gets this without code of its own.

A pid alone is not enough: pids are reused. The process's start time in clock ticks since boot
(/proc/<pid>/stat field 22, proc(5)) and the boot id (/proc/sys/kernel/random/boot_id) name one
process of one boot. A writer on another host cannot be checked from here: its state is `unknown`.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

State = Literal["running", "gone", "unknown"]


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> str | None:
    """Start time of a live process in clock ticks since boot, None when it is gone (a zombie
    is gone: it holds nothing and writes nothing)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else None


def record(pid: int | None = None) -> dict[str, Any]:
    """The writer record of process `pid` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(),
            "start_ticks": _start_ticks(pid),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def is_this_process(rec: dict[str, Any] | None) -> bool:
    """True when `rec` names the calling process."""
    if not rec:
        return False
    return rec.get("pid") == os.getpid() and rec.get("host") == socket.gethostname() and \
        rec.get("start_ticks") == _start_ticks(os.getpid())


def state(rec: dict[str, Any] | None) -> State:
    """`running` (the writer still runs), `gone` (it ended, or the machine rebooted since) or
    `unknown` (no record, another host, or no /proc to ask)."""
    if not rec or not isinstance(rec.get("pid"), int) or rec.get("host") != socket.gethostname():
        return "unknown"
    boot = _boot_id()
    if boot is None or not Path("/proc/self/stat").exists():
        return "unknown"
    if rec.get("boot_id") and rec["boot_id"] != boot:
        return "gone"
    ticks = _start_ticks(int(rec["pid"]))
    if ticks is None:
        return "gone"
    return "running" if rec.get("start_ticks") in (None, ticks) else "gone"


def describe(rec: dict[str, Any]) -> str:
    """`pid 123 on host h, started 2026-...`: the writer as a reader names it."""
    return (f"pid {rec.get('pid')} on host {rec.get('host')}"
            + (f", started {rec['started']}" if rec.get("started") else ""))
