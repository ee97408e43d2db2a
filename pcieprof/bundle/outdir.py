"""What may happen to an `--out` directory before a bundle is written into it.

Three rules (issue 25 points 4 and 5):
- an --out never is, nor holds, one of the command's inputs (`attribute run1/traces --out run1`
  would replace the traces it is about to read);
- `--force` replaces only a pcieprof bundle, and only its own files: the manifest, the files the
  bundle contract names (pcieprof.bundle.contract), the probes' scratch directories, a nested
  bundle's own files likewise; a `thesis.tex` or a `.git/` beside them stays, and a symbolic link
  is removed as a link, never followed;
- one writer at a time: the writer holds an exclusive lock on the directory (flock on the
  directory itself, so no lock file is left in the bundle) until it ends, and a second one is
  refused with one line.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Sequence

from pcieprof.bundle import contract
from pcieprof.errors import BadInput

MANIFEST = "manifest.json"
#: Scratch directories pcieprof.probe_runner makes inside a bundle (`.probe-work-XXXX`).
_SCRATCH_PREFIX = ".probe-work-"

#: Directory -> open descriptor holding its lock, for the life of the command (release_locks).
_LOCKS: dict[Path, int] = {}


def refuse_inputs_inside(out: Path, inputs: Sequence[Path | str]) -> None:
    """Refuse (BadInput) an `out` that is one of `inputs` or a directory above one.

    Raises:
        BadInput: naming the input and the --out.
    """
    try:
        dst = out.resolve()
        for given in inputs:
            src = Path(given).resolve()
            if src == dst or dst in src.parents:
                raise BadInput(f"--out {out} holds the input {given}: writing the bundle there "
                               "could replace it", hint="choose an --out outside the inputs")
    except (OSError, RuntimeError):  # a loop of links: nothing is written through it either
        raise BadInput(f"--out {out}: cannot resolve the path") from None


def lock(path: Path) -> None:
    """Hold an exclusive lock on the directory `path` until release_locks (or the process ends).

    Raises:
        BadInput: another process holds it (another pcieprof writing the same --out).
    """
    key = path.resolve()
    if key in _LOCKS:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BadInput(f"{path}: another pcieprof is writing a bundle there now",
                       hint="wait for it to end, or choose another --out") from None
    except OSError:  # a file system without locks: writing still works, unguarded
        os.close(fd)
        return
    _LOCKS[key] = fd


def unlock(path: Path) -> None:
    """Release the lock on `path` (its writer is done with it, or refused it)."""
    fd = _LOCKS.pop(path.resolve(), None)
    if fd is not None:
        os.close(fd)


def release_locks() -> None:
    """Release every lock this process holds (a new command invocation in the same process)."""
    for fd in _LOCKS.values():
        os.close(fd)
    _LOCKS.clear()


def is_bundle(path: Path) -> bool:
    """Whether `path` holds a pcieprof manifest (a JSON object with a schema_version)."""
    mpath = path / MANIFEST
    if mpath.is_symlink() or not mpath.is_file():
        return False
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and "schema_version" in manifest


def clear_bundle(path: Path) -> None:
    """Remove a bundle's own files from `path` for --force, or refuse (BadInput) a directory
    that is not a bundle, or that is a symbolic link (its files are elsewhere)."""
    if path.is_symlink():
        raise BadInput(f"--out {path} is a symbolic link: --force does not delete through it",
                       hint="give the directory it points to, or another --out")
    if not is_bundle(path):
        raise BadInput(f"output directory {path} is not empty and not a pcieprof bundle (no "
                       f"{MANIFEST}): --force replaces only a bundle's own files",
                       hint="choose another --out")
    _remove_own(path)


def _remove_own(root: Path) -> None:
    """Unlink the bundle's own files under `root` (never following a link), then the
    directories that held them and are left empty; a nested bundle likewise."""
    emptied: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        if rel_dir != "." and rel_dir.split("/", 1)[0] in contract.NESTED:
            dirnames[:] = []  # a nested bundle: its own rule, below
            continue
        scratch = rel_dir != "." and rel_dir.split("/", 1)[0].startswith(_SCRATCH_PREFIX)
        links = [d for d in dirnames if (here / d).is_symlink()]
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in filenames + links:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if scratch or rel == MANIFEST or contract.entry(rel) is not None:
                (here / name).unlink()
                emptied.append(here)
    for name in contract.NESTED:
        nested = root / name
        if nested.is_dir() and not nested.is_symlink() and is_bundle(nested):
            _remove_own(nested)
            emptied.append(nested)
    for d in sorted(set(emptied), key=lambda p: len(p.parts), reverse=True):
        while d != root and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent


__all__ = ["clear_bundle", "is_bundle", "lock", "refuse_inputs_inside", "release_locks",
           "unlock"]
