"""Which serve bundle last served correct tokens on this machine, per model card and GPU
architecture: the launch search's record that `serve-bench --model M` (without `--sweep`) and
`recommend` on a bundle measured here launch from (issue 22, point 1).

The record is a pointer, not a copy: the winner itself stays in its bundle's serve/search.json
(pcieprof.bundle.serve_search), so what is launched is what that bundle shows. One JSON file per
user and machine, `$PCIEPROF_STATE_DIR/served.json` (default `$XDG_STATE_HOME/pcieprof`, i.e.
`~/.local/state/pcieprof`: machine state, not a cache that may be wiped). Entries carry the host
name, because a home directory may be shared between machines. A record that cannot be read or
written is a warning, never an error: the search's first-ranked configuration is the fallback.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pcieprof import progress
from pcieprof.bundle.manifest import Manifest

#: Environment variable naming the state directory (tests point it at a temporary one).
STATE_ENV = "PCIEPROF_STATE_DIR"
FILE = "served.json"


def state_dir() -> Path:
    """`$PCIEPROF_STATE_DIR`, else `$XDG_STATE_HOME/pcieprof`, else `~/.local/state/pcieprof`."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "pcieprof"


def _entries() -> list[dict[str, Any]]:
    path = state_dir() / FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        progress.warn(f"{path}: the record of served launches cannot be read ({exc}); ignored")
        return []
    served = doc.get("served") if isinstance(doc, dict) else None
    return [e for e in served if isinstance(e, dict)] if isinstance(served, list) else []


def record(card: str, arch: str, bundle: Path) -> None:
    """Remember that `bundle`'s launch search served `card` on `arch` on this machine.

    Args:
        card: the model card the search served (the stand-in's own name for tiny-cpu).
        arch: the GPU architecture it was ranked for (`sm120`), "" when unnamed.
        bundle: the serve bundle holding serve/search.json with the winner.
    """
    host = socket.gethostname()
    keep = [e for e in _entries()
            if (e.get("host"), e.get("card"), e.get("arch")) != (host, card, arch)]
    keep.append({"host": host, "card": card, "arch": arch, "bundle": str(bundle.resolve()),
                 "time": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    path = state_dir() / FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"schema": 1, "served": keep}, indent=1) + "\n",
                       encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        progress.warn(f"{path}: cannot record the served launch ({exc.strerror or exc}); "
                      f"serve-bench without --sweep will not launch it")


def last_served(card: str, arch: str) -> Path | None:
    """The serve bundle that last served `card` on `arch` on this machine, or None (no record,
    or its bundle is gone)."""
    host = socket.gethostname()
    for e in reversed(_entries()):
        if (e.get("host"), e.get("card"), e.get("arch")) == (host, card, arch):
            path = Path(str(e.get("bundle", "")))
            return path if (path / "serve" / "search.json").is_file() else None
    return None


def measured_here(manifest: Manifest) -> bool:
    """Whether a bundle's manifest says it was measured on this machine (not simulated, not
    imported from another box): only then does this machine's record apply to it."""
    return manifest.host == socket.gethostname() and manifest.source == "measured"
