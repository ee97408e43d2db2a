"""Steps of the real vLLM TP8 trace (../shared/samples/traces/tracelens_b200_vllm_tp8, see its
SOURCES.md): found from vLLM's execute_context_* annotations, and the per-step communication,
compute, memory, overlap and idle time checked against an independent computation written here
with plain json and list-based interval maths. Variants made from the same file (the annotation
renamed to a decode step, removed so that only the execute_model frame is left, or removed with
it) check the other step sources and the one line a trace without any step marker gets."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from builders.cli import cli

from pcieprof.analysis.attribution import NO_STEPS, attribute_traces

VLLM = "traces/tracelens_b200_vllm_tp8/tracelens_b200_vllm_tp8_gptoss_eager_rank0.json.gz"
STEP = "execute_context_1(888_788544)_generation_0(0)"


def _events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _merge(iv: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for s, t in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], t)
        else:
            out.append([s, t])
    return out


def _length(m: list[list[float]]) -> float:
    return sum(t - s for s, t in m)


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def independent_step(events: list[dict[str, Any]], t0: float, t1: float) -> dict[str, float]:
    """GPU events whose launching runtime call (by correlation id) starts in [t0, t1): their
    union per kind (communication: NCCL and all-reduce kernels; memory: memcpy/memset; compute:
    the other kernels), comm time with compute running, and the step's span and idle time."""
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    mine = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and t0 <= launch.get(e["args"].get("correlation"), float("nan")) < t1]
    kind = {}
    for e in mine:
        if e["cat"] != "kernel":
            kind[id(e)] = "mem"
        elif e["name"].startswith("nccl") or "all_reduce" in e["name"]:
            kind[id(e)] = "comm"
        else:
            kind[id(e)] = "comp"
    iv = {k: _merge([(e["ts"], e["ts"] + e["dur"]) for e in mine if kind[id(e)] == k])
          for k in ("comm", "comp", "mem")}
    every = _merge([(e["ts"], e["ts"] + e["dur"]) for e in mine])
    span = every[-1][1] - every[0][0]
    ov = _overlap(iv["comm"], iv["comp"])
    return {"n_events": len(mine), "span_us": span, "idle_us": span - _length(every),
            "comm_us": _length(iv["comm"]), "compute_us": _length(iv["comp"]),
            "memory_us": _length(iv["mem"]), "comm_overlap_compute_us": ov,
            "exposed_comm_us": _length(iv["comm"]) - ov,
            "n_comm": sum(1 for e in mine if kind[id(e)] == "comm")}


def _check(step: dict[str, Any], ref: dict[str, float]) -> None:
    assert step["n_events"] == ref["n_events"]
    for k in ("span_us", "idle_us", "comm_us", "compute_us", "memory_us",
              "comm_overlap_compute_us", "exposed_comm_us"):
        assert step[k] == pytest.approx(ref[k], rel=1e-9, abs=1e-6), k


def _variant(samples: Path, tmp_path: Path, edit: Any) -> Path:
    """The real trace with each event passed through `edit` (None drops it)."""
    path = tmp_path / "vllm_variant_rank0.json.gz"
    with gzip.open(samples / VLLM, "rt") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e2 for e2 in (edit(e) for e in doc["traceEvents"]) if e2 is not None]
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def test_vllm_step_split_matches_independent_computation(samples: Path) -> None:
    events = _events(samples / VLLM)
    ann = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("execute_context_")]
    assert [e["name"] for e in ann] == [STEP]
    ref = independent_step(events, ann[0]["ts"], ann[0]["ts"] + ann[0]["dur"])
    assert ref["n_comm"] == 74 and ref["comm_us"] > 0 and ref["compute_us"] > 0

    doc = attribute_traces([samples / VLLM], workers=1).to_json()
    r = doc["ranks"][0]
    assert r["steps_from"] == "vLLM execute_context annotations" and r["steps_note"] is None
    (step,) = doc["steps"]
    assert (step["name"], step["kind"], step["bs"]) == (STEP, "EXTEND", 1)
    _check(step, ref)
    assert r["step_kinds"]["EXTEND"]["n"] == 1
    assert r["step_kinds"]["EXTEND"]["mean_comm_us"] == step["comm_us"]
    assert r["decode_steps"] is None  # a prefill step is no decode step
    # torch symmetric-memory all-reduce is communication
    fams = {f["family"]: f for f in r["families"]}
    assert fams["torch_symm_mem"]["class"] == "communication" and fams["torch_symm_mem"]["count"] == 73


def test_decode_step_of_vllm(samples: Path, tmp_path: Path) -> None:
    name = "execute_context_0(0)_generation_4(4)"

    def edit(e: dict[str, Any]) -> dict[str, Any]:
        if e.get("name") == STEP:
            e["name"] = name
        return e

    doc = attribute_traces([_variant(samples, tmp_path, edit)], workers=1).to_json()
    (step,) = doc["steps"]
    assert (step["kind"], step["bs"]) == ("DECODE", 4)
    d = doc["ranks"][0]["decode_steps"]
    assert d["n"] == 1 and d["mean_comm_us"] == step["comm_us"] and d["mean_span_us"] == step["span_us"]


def test_execute_model_frame_when_no_annotation(samples: Path, tmp_path: Path) -> None:
    events = _events(samples / VLLM)
    frame = [e for e in events if e.get("cat") == "python_function"
             and re.search(r": execute_model$", e["name"])]
    assert len(frame) == 1
    ref = independent_step(events, frame[0]["ts"], frame[0]["ts"] + frame[0]["dur"])
    path = _variant(samples, tmp_path, lambda e: None if e.get("name") == STEP else e)
    doc = attribute_traces([path], workers=1).to_json()
    assert doc["ranks"][0]["steps_from"] == "execute_model spans"
    (step,) = doc["steps"]
    _check(step, ref)


def test_trace_without_step_markers_says_so(samples: Path, tmp_path: Path) -> None:
    def edit(e: dict[str, Any]) -> dict[str, Any] | None:
        n = str(e.get("name", ""))
        return None if n == STEP or n.endswith(": execute_model") else e

    path = _variant(samples, tmp_path, edit)
    doc = attribute_traces([path], workers=1).to_json()
    r = doc["ranks"][0]
    assert (r["steps_from"], r["n_steps"], r["steps_note"]) == ("none", 0, NO_STEPS)
    assert r["totals"]["comm_us"] > 0
    r = cli("attribute", str(path), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert sum(NO_STEPS in line for line in out.splitlines()) == 1
    written = json.loads((tmp_path / "out" / "attribution.json").read_text())
    assert written["ranks"][0]["steps_note"] == NO_STEPS
