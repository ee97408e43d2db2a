"""The static type check (mypy, configured in pyproject.toml), run by the README's test command.

It is the only check that reaches the code CI cannot run (CUDA, NVML, NCCL): issue 15's defect 1
(an import inside an `if` made `ctypes` a local of the whole function, so every CUDA copy probe
raised UnboundLocalError) is the kind of error it reports.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"


def _mypy(args: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: it is in the test extra (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(CONFIG),
                           "--cache-dir", str(cache), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_the_package_type_checks(tmp_path: Path) -> None:
    proc = _mypy([], ROOT, tmp_path / "cache")  # the files the config names: pcieprof, probes
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout


def test_a_name_bound_in_one_branch_only_is_reported(tmp_path: Path) -> None:
    # the shape of defect 1, as it was in probes/p2p_worker.py
    (tmp_path / "loader.py").write_text(textwrap.dedent('''
        def load(path: str | None) -> object:
            if path is None:
                import ctypes.util
                path = ctypes.util.find_library("cudart")
            if path is None:
                raise OSError("libcudart not found")
            return ctypes.CDLL(path)
    '''))
    proc = _mypy(["loader.py"], tmp_path, tmp_path / "cache")
    assert proc.returncode == 1
    assert 'Name "ctypes" may be undefined  [possibly-undefined]' in proc.stdout


def test_the_probes_are_checked_strictly(tmp_path: Path) -> None:
    pkg = tmp_path / "probes"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "worker.py").write_text("def copy(dst, src):\n    return dst\n")
    proc = _mypy(["-p", "probes"], tmp_path, tmp_path / "cache")
    assert proc.returncode == 1
    assert "Function is missing a type annotation  [no-untyped-def]" in proc.stdout
