"""Shared test fixtures. Real data lives in ../shared/samples (read-only) and tests/data/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SAMPLES = SHARED / "samples"
DATA = ROOT / "tests" / "data"


def have_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if have_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_verbosity() -> None:
    """In-process CLI calls with --quiet/--debug must not leak into the next test."""
    from pcieprof import progress

    progress.configure(quiet=False, debug=False)


@pytest.fixture(scope="session")
def samples() -> Path:
    """../shared/samples: real tool outputs (never edit)."""
    if not SAMPLES.is_dir():
        pytest.skip("../shared/samples not present beside the checkout")
    return SAMPLES


@pytest.fixture(scope="session")
def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not exe:
        pytest.skip("no headless Chromium on this machine")
    return exe
