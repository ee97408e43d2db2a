"""serve-bench launches for the GPUs of the machine it runs on (issue 22 point 2): the
architecture from this machine's NVML (compute capability, else the product name in gpus.toml)
when it has GPUs, the card's when it has none, --arch over both. NVML is replayed from the
snapshot derived from the real 8x RTX PRO 6000 box's logs (tests/data/nvml_snapshot_rtxpro6000_8x)
and from a recorded no-driver answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.bundle.serve_search import ServeSearch
from pcieprof.commands import launch_arch
from pcieprof.discover.nvml import Nvml
from pcieprof.discover.nvml_snapshot import NvmlReplay

SNAP = Path(__file__).resolve().parents[1] / "data" / "nvml_snapshot_rtxpro6000_8x" / "snapshot.json"
NO_DRIVER = {"format": "pcieprof-nvml-snapshot", "version": 1, "init": {"error": 9}, "calls": {}}
# (tests/conftest.py gives every other test this no-driver answer)


def _nvml(monkeypatch: pytest.MonkeyPatch, snapshot: object) -> None:
    """serve-bench's NVML answers as `snapshot` recorded them."""
    monkeypatch.setattr(launch_arch, "Nvml", lambda: Nvml(NvmlReplay(snapshot)))  # type: ignore[arg-type]


def _comments(*args: str) -> list[str]:
    r = cli("serve-bench", "--model", "glm5-nvfp4", "--dry-run", "--port", "30000", *args)
    assert r.returncode == 0, r.stderr
    return [ln for ln in r.stdout.splitlines() if ln.startswith("# ")]


def test_the_architecture_of_this_machines_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvml(monkeypatch, SNAP)
    lines = _comments()
    arch = next(ln for ln in lines if ln.startswith("# GPU architecture"))
    assert arch.startswith("# GPU architecture sm120: this machine's 8x NVIDIA RTX PRO 6000 "
                           "Blackwell Server Edition")
    assert "product name 'NVIDIA RTX PRO 6000 Blackwell Server Edition' in gpus.toml" in arch
    assert any("first-ranked configuration for sm120" in ln for ln in lines)
    assert "# launch search: glm5-nvfp4 on sm120; " in "\n".join(_comments("--sweep"))


def test_without_a_gpu_the_cards_architecture_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvml(monkeypatch, NO_DRIVER)
    arch = next(ln for ln in _comments() if ln.startswith("# GPU architecture"))
    assert arch.startswith("# GPU architecture sm120: the card's (no GPU seen on this machine: ")
    assert "--arch" in arch


def test_arch_given_wins_over_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvml(monkeypatch, SNAP)
    lines = _comments("--arch", "sm100")
    assert "# GPU architecture sm100: given (--arch)" in lines
    assert any("first-ranked configuration for sm100" in ln for ln in lines)


def test_the_gpus_facts_go_through_gpus_toml() -> None:
    box = launch_arch.local_box(Nvml(NvmlReplay(json.loads(SNAP.read_text()))))[0]
    assert box is not None and box.gpus == 8 and box.arch == "sm120"
    assert box.memory_source == "NVML memory total (this machine)"
    assert launch_arch.local_box(Nvml(NvmlReplay(NO_DRIVER)))[0] is None


def test_a_resumed_search_keeps_its_architecture_without_a_gpu(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _nvml(monkeypatch, NO_DRIVER)
    out = tmp_path / "search"
    b = Bundle.create(out, command="serve-bench", source="measured", backend="cuda")
    b.write_doc(ServeSearch(card="glm5-nvfp4", arch="sm100", status="interrupted"))
    b.finish()
    lines = _comments("--sweep", "--resume", "--out", str(out))
    assert "# launch search: glm5-nvfp4 on sm100; " in "\n".join(lines)
    assert any(ln.startswith("# GPU architecture sm100: the resumed search's (no GPU seen")
               for ln in lines)


def _two_gpus() -> dict[str, object]:
    """The 8x RTX PRO 6000 snapshot as a 2-GPU machine sees it: NVML counts 2 devices (the
    first two of the recorded ones answer as recorded)."""
    snap = json.loads(SNAP.read_text())
    snap["calls"]["nvmlDeviceGetCount()"] = {"value": 2}
    return snap


def _serve(*args: str) -> tuple[int, str, str]:
    r = cli("serve-bench", "--model", "glm5-nvfp4", "--port", "30000", *args)
    return r.returncode, r.stdout, r.stderr


def test_tp_larger_than_this_machines_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvml(monkeypatch, _two_gpus())
    rc, out, err = _serve("--tp", "8")
    assert rc == 2, err
    assert "--tp 8 needs 8 GPUs; this machine has 2 (NVML)" in err
    assert "Traceback" not in err and out == ""
    rc, out, err = _serve("--tp", "8", "--pp", "2", "--nnodes", "2",
                          "--dist-init-addr", "10.0.0.1:5000")
    assert rc == 2 and "--tp 8 --pp 2 over 2 nodes needs 8 GPUs per node; this machine has 2" \
        in err


def test_tp_within_the_gpus_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvml(monkeypatch, _two_gpus())
    assert not any("needs" in ln for ln in _comments("--tp", "2"))


def test_tp_larger_than_the_gpus_is_a_note_when_launched_elsewhere_or_dry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _nvml(monkeypatch, _two_gpus())
    dry = [ln for ln in _comments("--tp", "8") if "needs 8 GPUs" in ln]
    assert dry == ["# --tp 8 needs 8 GPUs; this machine has 2 (NVML): this launch would be "
                   "refused here"]
    there = [ln for ln in _comments("--tp", "8", "--launch-prefix", "ssh gpuhost")
             if "needs 8 GPUs" in ln]
    assert there == ["# --tp 8 needs 8 GPUs; this machine has 2 (NVML): --launch-prefix starts "
                     "the server, so its machine's GPUs decide"]


def test_without_a_gpu_the_count_is_said_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvml(monkeypatch, NO_DRIVER)
    line = next(ln for ln in _comments("--tp", "8") if "needs 8 GPUs" in ln)
    assert line.startswith("# --tp 8 needs 8 GPUs: not checked against this machine (no GPU "
                           "seen: ")


def _sweep(tmp_path: Path) -> Path:
    f = tmp_path / "sweep.toml"
    f.write_text('[[sweep]]\nname = "small"\ntp = 2\n\n[[sweep]]\nname = "wide"\ntp = 8\n')
    return f


def test_a_sweep_file_configuration_larger_than_the_gpus_is_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the plain --tp was checked, a --sweep-file's configurations were not: "wide" started
    # SGLang on 8 ranks of a 2-GPU machine
    _nvml(monkeypatch, _two_gpus())
    rc, out, err = _serve("--sweep-file", str(_sweep(tmp_path)), "--out", str(tmp_path / "b"))
    assert rc == 2, err
    assert "--sweep-file sweep.toml entry 1 (wide): --tp 8 needs 8 GPUs; this machine has 2 " \
           "(NVML)" in err
    assert "Traceback" not in err and out == "" and not (tmp_path / "b").exists()
    # dry: a note naming the configuration; the one that fits says nothing
    r = cli("serve-bench", "--model", "glm5-nvfp4", "--dry-run", "--port", "30000",
            "--sweep-file", str(_sweep(tmp_path)))
    assert r.returncode == 0, r.stderr
    needs = [ln for ln in r.stdout.splitlines() if "needs" in ln and ln.startswith("# ")]
    assert needs == ["# --sweep-file sweep.toml entry 1 (wide): --tp 8 needs 8 GPUs; this "
                     "machine has 2 (NVML): this launch would be refused here"]


def test_a_sweep_file_within_the_gpus_passes(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    _nvml(monkeypatch, _two_gpus())
    f = tmp_path / "fits.toml"
    f.write_text('[[sweep]]\nname = "a"\ntp = 2\n\n[[sweep]]\nname = "b"\ntp = 1\n')
    assert not any("needs" in ln for ln in _comments("--sweep-file", str(f)))


def _dry(*args: str) -> str:
    r = cli("serve-bench", "--model", "glm5-nvfp4", "--dry-run", "--port", "30000", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_fabric_of_this_machines_gpus_decides_the_pcie_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the real box's topo -m shows no NV#: NVML's NVLink P2P answers say PCIe-only, and the
    # card's settings for PCIe boxes are set
    _nvml(monkeypatch, SNAP)
    out = _dry()
    assert "# GPU fabric PCIe-only (no NVLink): this machine's GPUs: no GPU pair has NVLink P2P" \
        in out
    assert "--disable-custom-all-reduce" in out and "export NCCL_IB_DISABLE=1" in out
    # NCCL_P2P_LEVEL=SYS holds for the fabric, but no bundle of this box priced it
    assert "export NCCL_P2P_LEVEL" not in out
    assert "# not set: NCCL_P2P_LEVEL=SYS, the card's, not checked on this box" in out
    # the same GPUs answering NVLink OK for every pair: none of the PCIe settings
    snap = json.loads(SNAP.read_text())
    for key in snap["calls"]:
        if key.startswith("nvmlDeviceGetP2PStatus(") and key.endswith(",2)"):
            snap["calls"][key] = {"value": 0}
    _nvml(monkeypatch, snap)
    out = _dry()
    assert "# GPU fabric NVLink: this machine's GPUs: NVLink between every GPU pair" in out
    assert "--disable-custom-all-reduce" not in out.replace("# not set: --disable", "")
    assert "NCCL_P2P_LEVEL" not in out and "NCCL_IB_DISABLE" not in out
    assert "export SGLANG_ENABLE_JIT_DEEPGEMM=0" in out  # still sm120


def test_without_a_gpu_an_arch_given_leaves_the_fabric_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _nvml(monkeypatch, NO_DRIVER)
    out = _dry("--arch", "sm120")
    assert "# GPU fabric unknown: no GPU seen on this machine" in out
    assert "# not set: --disable-custom-all-reduce (for PCIe-only boxes, S6, S7): the box's " \
           "fabric is unknown" in out
    assert "export NCCL_P2P_LEVEL" not in out and "export SGLANG_ENABLE_JIT_DEEPGEMM=0" in out
