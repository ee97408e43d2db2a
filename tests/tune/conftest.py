"""Fixtures of the tuner tests; helpers live in tune_fixtures.py (a unique module name)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tune_fixtures import run_cli, two_switch, write_matrix_bundle

from pcieprof.bundle import Bundle


@pytest.fixture
def vm_bundle(tmp_path: Path) -> Bundle:
    bw, lat = two_switch()
    return write_matrix_bundle(tmp_path / "vm", bw, lat, flat_vm=True)


@pytest.fixture(scope="session")
def sim_vm_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulated rtxpro6000-8x-vm box (quick plan), made once per session."""
    out = tmp_path_factory.mktemp("sim") / "vm"
    r = run_cli("topology", "--backend", "sim", "--sim-profile", "rtxpro6000-8x-vm", "--quick",
                "--no-report", "-q", "-o", str(out))
    if r.returncode != 0:
        pytest.skip(f"sim backend unavailable: {r.stderr.strip()[-300:]}")
    return out
