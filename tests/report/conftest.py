"""Fixtures of the report tests; helpers live in report_fixtures.py (a unique module name)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from report_fixtures import make_bundle

from pcieprof.bundle import Bundle

DATA = Path(__file__).parent / "data"


@pytest.fixture
def bundle_factory(tmp_path: Path) -> Callable[..., Bundle]:
    """make_bundle under tmp_path: factory(name, **kw)."""
    def factory(name: str = "calib", **kw: object) -> Bundle:
        return make_bundle(tmp_path / name, **kw)  # type: ignore[arg-type]
    return factory




@pytest.fixture
def serve_bundle(tmp_path: Path) -> Path:
    """A copy of tests/data/tiny_cpu_serve (a real serve-bench run of the reference server)."""
    import shutil

    dst = tmp_path / "tiny_cpu_serve"
    shutil.copytree(DATA / "tiny_cpu_serve", dst)
    return dst


@pytest.fixture(scope="session")
def sim_vm_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulated rtxpro6000-8x-vm box (quick plan plus TP4 sub-groups), made once."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("sim") / "vm"
    r = subprocess.run([sys.executable, "-m", "pcieprof", "topology", "--backend", "sim",
                        "--sim-profile", "rtxpro6000-8x-vm", "--quick", "--variants",
                        "default,p2p_level_sys,proto_ll,nch8", "--no-report", "-q",
                        "-o", str(out)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"sim backend unavailable: {r.stderr.strip()[-300:]}")
    return out
