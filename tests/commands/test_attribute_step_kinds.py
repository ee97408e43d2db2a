"""`attribute` says what a step kind is: SGLang's / vLLM's EXTEND is the prefill step (SGLang's
ForwardMode: "also called prefill"). Real trace: the vLLM TP8 rank-0 trace of
../shared/samples/traces (one prefill step, see test_attribution_vllm_steps)."""

from __future__ import annotations

from pathlib import Path

from builders.cli import cli

VLLM = "traces/tracelens_b200_vllm_tp8/tracelens_b200_vllm_tp8_gptoss_eager_rank0.json.gz"


def test_extend_step_is_named_prefill(samples: Path, tmp_path: Path) -> None:
    r = cli("attribute", str(samples / VLLM), "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "per EXTEND" in ln)
    assert "per EXTEND (prefill: the prompt's tokens) step (n=1)" in line
