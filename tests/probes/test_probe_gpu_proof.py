"""The one-shot GPU proof of issue 17 (probes/gpu_proof.py), as far as a machine without a GPU goes:
its `--check` run, and its independent check of an attribution on real GPU traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pcieprof.analysis.attribution import attribute_traces
from probes.gpu_proof import check_attribution, union_us

ROOT = Path(__file__).resolve().parents[2]


def test_union_of_overlapping_and_nested_intervals() -> None:
    assert union_us([(0, 10), (5, 10), (2, 3), (20, 5)]) == 20.0
    assert union_us([]) == 0.0


@pytest.mark.parametrize("trace", ["hta_nccl_single_rank/nccl_data.json.gz",
                                   "tracelens_b200_vllm_tp8/tracelens_b200_vllm_tp8_gptoss_eager_rank0.json.gz"])
def test_attribution_agrees_with_an_independent_union_on_real_traces(samples: Path, trace: str) -> None:
    path = samples / "traces" / trace
    check = check_attribution(path, attribute_traces([path]))
    assert check["gpu_events"] > 100
    assert check["problems"] == [], check


def test_check_mode_imports_plans_and_attributes_on_the_cpu(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "probes.gpu_proof", "--check", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [s["name"] for s in plan] == ["nvml", "selftest", "topology", "copies_vs_torch",
                                         "decode_trace", "attribute"]
    topo = next(s for s in plan if s["name"] == "topology")["argv"]
    assert topo[1:6] == ["-m", "pcieprof", "topology", "--backend", "cuda"] and "--quick" in topo
    proof = json.loads((tmp_path / "proof.json").read_text())
    assert proof["steps"]["attribute"]["status"] == "ok"
    assert (tmp_path / "attribution-cpu" / "attribution.json").is_file()
