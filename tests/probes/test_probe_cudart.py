"""Loading the CUDA runtime the copy probe needs (issue 15, defect 1), against fake /proc/self/maps
files: this machine has no libcudart, so loading fails, and it must fail as the documented
OSError (peer copies become not_supported), never as an UnboundLocalError that kills every copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.gpu_api import Cudart, find_cudart

# The shape of a real /proc/self/maps line of a process that imported a CUDA build of torch
# (address range, perms, offset, dev, inode, path).
MAPPED = ("7f2a3c000000-7f2a3c0a1000 r-xp 00000000 103:02 1234567                   "
          "{path}\n")


def _maps(tmp_path: Path, *libs: str) -> Path:
    p = tmp_path / "maps"
    lines = ["55d0c0a00000-55d0c0a01000 r--p 00000000 103:02 42   /usr/bin/python3.11\n"]
    lines += [MAPPED.format(path=lib) for lib in libs]
    p.write_text("".join(lines))
    return p


def test_the_runtime_torch_loaded_is_the_one_used(tmp_path: Path) -> None:
    lib = "/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
    assert find_cudart(_maps(tmp_path, "/usr/lib/libc.so.6", lib)) == lib


def test_a_mapped_runtime_that_cannot_load_is_an_oserror(tmp_path: Path) -> None:
    # the branch that looks the library up elsewhere is not taken here: before the fix this
    # raised UnboundLocalError ("ctypes" bound only inside that branch)
    missing = tmp_path / "gone" / "libcudart.so.12"
    with pytest.raises(OSError):
        Cudart(maps=_maps(tmp_path, str(missing)))


def test_no_runtime_anywhere_is_an_oserror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes.util

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    with pytest.raises(OSError, match="libcudart"):
        Cudart(maps=_maps(tmp_path))
