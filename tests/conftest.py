"""Shared test fixtures. Real data lives in ../shared/samples (read-only) and tests/data/; what
the tests build is in tests/builders/ (importable as `builders`: this file puts tests/ on the
path)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from builders.bundles import (DEMO_PROFILES, REPORT_DATA, make_bundle, sim_bundle, two_switch,
                              write_matrix_bundle)
from builders.launch_search import SearchRun, run_interrupted_and_resumed

from pcieprof.bundle import Bundle

# Every process the tests start (servers, torchrun agents, gloo ranks and workers) inherits
# this and dumps its Python stack on a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL):
# a crash on a CI machine then shows where it was in the output a failing test prints, not only
# an exit code. setdefault: a value the user set stays.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

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


@pytest.fixture(autouse=True)
def _cwd_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests write only under their tmp dirs: what a command writes by default relative to the
    working directory (reports/<command>-<time>) lands in the test's own tmp dir, and so does
    that of the processes it starts."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True, scope="session")
def _session_state_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same for what session fixtures run (autouse ones of a scope are set up first): the
    launch search fixture served on the reference server and wrote the user's served.json, which
    a later `pcieprof demo` there then followed."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PCIEPROF_STATE_DIR", str(tmp_path_factory.mktemp("session-state")))
        yield


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record of launches served on this machine (pcieprof.serve.served) lives in the
    test's tmp dir: no test reads or writes the user's, and none sees another's."""
    monkeypatch.setenv("PCIEPROF_STATE_DIR", str(tmp_path / "pcieprof-state"))


#: NVML's answer on a machine without the NVIDIA driver (NVML_ERROR_DRIVER_NOT_LOADED)
NO_DRIVER_NVML = {"format": "pcieprof-nvml-snapshot", "version": 1, "init": {"error": 9},
                  "calls": {}}


@pytest.fixture(autouse=True)
def _no_local_gpus(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve-bench launches for this machine's GPUs (pcieprof.commands.launch_arch): in-process
    tests see NVML's no-driver answer, so they launch the same on a GPU box as here; a test
    replays a snapshot to see GPUs, and `gpu`-marked tests see the real ones."""
    if "gpu" in request.keywords:
        return
    from pcieprof.commands import launch_arch
    from pcieprof.discover.nvml import Nvml
    from pcieprof.discover.nvml_snapshot import NvmlReplay

    monkeypatch.setattr(launch_arch, "Nvml", lambda: Nvml(NvmlReplay(NO_DRIVER_NVML)))


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


@pytest.fixture
def vm_bundle(tmp_path: Path) -> Bundle:
    """`write_matrix_bundle` of `two_switch` seen from a VM (flat tree, IOMMU on)."""
    bw, lat = two_switch()
    return write_matrix_bundle(tmp_path / "vm", bw, lat, flat_vm=True)


@pytest.fixture
def bundle_factory(tmp_path: Path) -> Callable[..., Bundle]:
    """`make_bundle` under tmp_path: factory(name, **kw)."""
    def factory(name: str = "calib", **kw: object) -> Bundle:
        return make_bundle(tmp_path / name, **kw)  # type: ignore[arg-type]
    return factory


@pytest.fixture
def serve_bundle(tmp_path: Path) -> Path:
    """A copy of tests/report/data/tiny_cpu_serve (a real serve-bench run of the reference
    server)."""
    dst = tmp_path / "tiny_cpu_serve"
    shutil.copytree(REPORT_DATA / "tiny_cpu_serve", dst)
    return dst


@pytest.fixture(scope="session")
def sim_vm_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulated rtxpro6000-8x-vm box (quick plan), made once per session: copy it before
    changing it."""
    return sim_bundle(tmp_path_factory.mktemp("sim") / "vm", "rtxpro6000-8x-vm", "--quick")


@pytest.fixture(scope="session")
def sim_vm_variants_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulated rtxpro6000-8x-vm box (quick plan with four variants), made once per
    session: copy it before changing it."""
    return sim_bundle(tmp_path_factory.mktemp("sim") / "vm", "rtxpro6000-8x-vm", "--quick",
                      "--variants", "default,p2p_level_sys,proto_ll,nch8")


@pytest.fixture(scope="session")
def demo_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo's two simulated boxes (the full plan, as `pcieprof demo` makes them), made once
    per session: copy one before changing it."""
    root = tmp_path_factory.mktemp("demo")
    return {p: sim_bundle(root / f"topology-{p}", p) for p in DEMO_PROFILES}


@pytest.fixture(scope="session")
def launch_search(tmp_path_factory: pytest.TempPathFactory) -> SearchRun:
    """The launch search on the reference server under the field-report matrix, interrupted by
    Ctrl-C and resumed (builders.launch_search), run once per session: copy its bundle before
    changing it."""
    pytest.importorskip("pcieprof.refserver.server")
    return run_interrupted_and_resumed(tmp_path_factory.mktemp("search") / "search")
