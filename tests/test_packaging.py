"""A non-editable install must carry the data files (cards, profiles, templates, class table)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_wheel_carries_package_data(tmp_path: Path) -> None:
    # built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "tests", "reports", "build", "*.egg-info", "__pycache__", ".*_cache"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path), str(src)], capture_output=True, text=True)
    if r.returncode != 0 and "No module named" in r.stderr:
        pytest.skip(f"cannot build a wheel here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("pcieprof-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    in_tree = {str(p.relative_to(ROOT)) for p in (ROOT / "pcieprof").rglob("*")
               if p.is_file() and p.suffix in {".toml", ".csv", ".j2", ".css"}}
    assert in_tree, "no data files found in the source tree"
    assert in_tree <= names, f"missing from the wheel: {sorted(in_tree - names)}"
    assert any(n.startswith("probes/") for n in names)
