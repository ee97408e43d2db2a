"""The one-shot GPU proof of issue 17 (probes/gpu_proof.py), as far as a machine without a GPU goes:
its `--check` run, and its independent check of an attribution on real GPU traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pcieprof.analysis.attribution import attribute_traces
from probes.gpu_proof import DEADLINE_S, STEP_TIMEOUT_S, Proof, check_attribution, union_us

ROOT = Path(__file__).resolve().parents[2]


def test_union_of_overlapping_and_nested_intervals() -> None:
    assert union_us([(0, 10), (5, 10), (2, 3), (20, 5)]) == 20.0
    assert union_us([]) == 0.0


@pytest.mark.parametrize("trace", ["hta_nccl_single_rank/nccl_data.json.gz",
                                   "tracelens_b200_vllm_tp8/tracelens_b200_vllm_tp8_gptoss_eager_rank0.json.gz"])
def test_attribution_agrees_with_an_independent_union_on_real_traces(samples: Path, trace: str) -> None:
    path = samples / "traces" / trace
    check = check_attribution(path, attribute_traces([path]).to_json())
    assert check["gpu_events"] > 100
    assert check["problems"] == [], check


def test_check_mode_imports_plans_and_attributes_on_the_cpu(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "probes.gpu_proof", "--check", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=DEADLINE_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [s["name"] for s in plan] == ["deps", "nvml", "selftest", "one_gpu", "host_flag",
                                         "topology", "copies_vs_torch", "decode_trace",
                                         "attribute"]
    topo = next(s for s in plan if s["name"] == "topology")["argv"]
    assert topo[1:6] == ["-m", "pcieprof", "topology", "--backend", "cuda"] and "--quick" in topo
    proof = json.loads((tmp_path / "proof.json").read_text())
    assert proof["steps"]["attribute"]["status"] == "ok"
    assert (tmp_path / "attribution-cpu" / "attribution.json").is_file()

    assert proof["wall_s"] < DEADLINE_S and proof["deadline_s"] == DEADLINE_S
    with tarfile.open(tmp_path / "proof.tar.gz") as tar:  # one file to bring back
        assert "attribution-cpu/attribution.json" in tar.getnames()


def test_one_deadline_and_proof_json_after_every_step(tmp_path: Path) -> None:
    # issue 23 pt 10: the step timeouts added to 960 s against a 600 s command limit, and
    # proof.json was written only at the end
    assert DEADLINE_S <= 330 and max(STEP_TIMEOUT_S.values()) < DEADLINE_S  # each capped by what is left
    proof = Proof(tmp_path, {"steps": {}}, deadline_s=60)
    with proof.step("first") as rec:
        rec["x"] = 1
    assert json.loads((tmp_path / "proof.json").read_text())["steps"]["first"]["status"] == "ok"
    proof.deadline = proof.t0  # the deadline has passed: the next step does not start
    ran = []
    with proof.step("second") as rec:
        if rec["status"] != "not_run":
            ran.append(1)
    doc = json.loads((tmp_path / "proof.json").read_text())
    assert not ran and doc["steps"]["second"]["status"] == "not_run"
    assert doc["failed"] == ["second"] and (tmp_path / "proof.tar.gz").is_file()
    assert proof.timeout(120) == 1.0  # a subprocess started now gets what is left, at least 1 s


def test_a_step_whose_modules_are_missing_is_not_run_and_says_which(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 23 pt 9: the lent machine has no plotly, ijson or orjson
    import probes.gpu_proof as gp

    monkeypatch.setattr(gp.importlib.util, "find_spec", lambda name: None)
    proof = Proof(tmp_path, {"steps": {}})
    with proof.step("topology") as rec:
        assert rec["status"] == "not_run"
    assert "needs plotly" in rec["why"] and "--wheels" in rec["why"]
    missing = gp.install_wheels(None, tmp_path / "deps")
    assert missing["missing"] == ["ijson", "orjson", "plotly"]


def test_topology_measures_without_plotly_and_says_the_report_is_missing(tmp_path: Path) -> None:
    # issue 23 pt 9: `pcieprof topology` imported the report (plotly) before measuring anything
    block = tmp_path / "site"
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class B(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'plotly':\n"
        "            raise ImportError(f'No module named {name!r}', name='plotly')\n"
        "sys.meta_path.insert(0, B())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(block), str(ROOT)])}
    out = tmp_path / "b"
    proc = subprocess.run([sys.executable, "-m", "pcieprof", "topology", "--backend", "sim",
                           "--quick", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parts"]["report"]["status"] == "failed"
    assert "needs plotly" in manifest["parts"]["report"]["why"]
    assert (out / "allreduce.csv").is_file()
