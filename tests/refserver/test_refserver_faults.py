"""Faults chosen by the launch flags (--inject-matrix): the matrix itself, and the real server
failing by it: an architecture error while loading, a hang in CUDA-graph capture, NaN in decode
unless the right pair of backends is given; plus SGLang's output_ids / return_logprob answer."""

from __future__ import annotations

import json
import math
import time
import urllib.request
from pathlib import Path

import pytest

from pcieprof.refserver.args import ArgsError, parse_args
from pcieprof.refserver.faults import MatrixError, choose, launch_flags, load_matrix

MATRIX = Path(__file__).resolve().parents[1] / "data" / "fault_matrix" / "field_report_sm120.toml"
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


def test_matrix_rules_follow_the_flags() -> None:
    rules = load_matrix(MATRIX)
    pick = lambda **kw: choose(rules, {k.replace("_", "-"): v for k, v in kw.items()})  # noqa: E731
    # the field report's shape: NaN unless dsa + trtllm
    assert pick(attention_backend="flashinfer", cuda_graph="on").fault == "nan-after 0"
    assert pick(attention_backend="dsa", dsa_decode_backend="tilelang").fault == "nan-after 0"
    assert pick(attention_backend="dsa", dsa_decode_backend="trtllm", cuda_graph="on") is None
    # earlier rules win: an unsupported prefill kernel fails before any decode
    r = pick(attention_backend="dsa", dsa_decode_backend="trtllm",
             dsa_prefill_backend="flashmla_sparse")
    assert r.fault == "unsupported-arch" and "SM90a and SM100f" in r.line
    # both conditions of a `when` must hold
    assert pick(attention_backend="dsa", dsa_decode_backend="flashinfer_sparse_mla",
                cuda_graph="on").fault == "hang-in-capture"
    assert pick(attention_backend="dsa", dsa_decode_backend="flashinfer_sparse_mla",
                cuda_graph="off").fault == "nan-after 0"


def test_launch_flags_read_cuda_graphs_both_spellings() -> None:
    assert launch_flags({})["cuda-graph"] == "on"
    assert launch_flags({"disable-cuda-graph": True})["cuda-graph"] == "off"
    assert launch_flags({"cuda-graph-backend-decode": "disabled"})["cuda-graph"] == "off"
    assert launch_flags({"cuda-graph-backend-decode": "full"})["cuda-graph"] == "on"


def test_parse_args_takes_the_matrix_fault(tmp_path: Path) -> None:
    a = parse_args(["--inject-matrix", str(MATRIX), "--attention-backend", "dsa",
                    "--dsa-decode-backend", "flashinfer_sparse_mla"])
    assert a.inject.kind == "hang-in-capture" and "rule 2" in a.inject.rule
    a = parse_args(["--inject-matrix", str(MATRIX), "--attention-backend", "dsa",
                    "--dsa-decode-backend", "trtllm"])
    assert a.inject.kind == "none" and "no rule matches" in a.inject.rule
    # the fault's text is not in the args' repr (the server logs its args before any fault)
    a = parse_args(["--inject-matrix", str(MATRIX), "--fp8-gemm-backend", "deep_gemm"])
    assert a.inject.kind == "unsupported-arch" and "Unsupported architecture" in a.inject.line
    assert "Unsupported" not in repr(a)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[fault]]\nwhen = { attention-backend = ["x"] }\n')
    with pytest.raises(ArgsError, match="has no fault"):
        parse_args(["--inject-matrix", str(bad)])
    bad.write_text('[[fault]]\nfault = "explode"\n')
    with pytest.raises(ArgsError, match="rule 0.*not understood"):
        parse_args(["--inject-matrix", str(bad)])
    with pytest.raises(ArgsError, match="not together with --inject"):
        parse_args(["--inject-matrix", str(MATRIX), "--inject", "hang"])
    with pytest.raises(MatrixError, match="unreadable"):
        load_matrix(tmp_path / "missing.toml")


def test_unsupported_arch_by_flags_fails_while_loading(start_server) -> None:
    s = start_server(["--inject-matrix", str(MATRIX), "--attention-backend", "dsa",
                      "--dsa-prefill-backend", "flashmla_sparse"])
    assert s.wait_exit(180) == 1
    log = s.log()
    assert "[pcieprof inject] fault matrix" in log and "rule 1" in log
    # the traceback ends in the line the public report quotes, labelled as injected
    assert "RuntimeError: [pcieprof inject] RuntimeError: Sparse Attention Forward Kernel is " \
           "only supported on SM90a and SM100f architectures." in log
    assert SIGQUIT in log and "fired up" not in log


def test_hang_in_capture_stops_before_ready(start_server) -> None:
    s = start_server(["--inject-matrix", str(MATRIX), "--attention-backend", "dsa",
                      "--dsa-decode-backend", "flashinfer_sparse_mla"])
    deadline = time.monotonic() + 180
    while "Capturing batches (bs=16" not in s.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = s.log()
    assert "Capture target decode CUDA graph begin" in log and "Capturing batches (bs=16" in log
    time.sleep(2.0)
    assert s.proc.poll() is None and "fired up" not in s.log()  # alive, never ready
    assert s.log().count("Capturing batches") == 2  # and no more progress


def test_generate_answers_output_ids_and_logprobs(start_server) -> None:
    s = start_server([])
    s.wait_ready()
    body = json.dumps({"input_ids": [5, 6, 7], "return_logprob": True,
                       "sampling_params": {"max_new_tokens": 6, "ignore_eos": True,
                                           "sampling_seed": 3}}).encode()
    req = urllib.request.Request(s.url + "/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    ids = out["output_ids"]
    lps = out["meta_info"]["output_token_logprobs"]
    assert len(ids) == 6 == out["meta_info"]["completion_tokens"]
    assert [t for _lp, t, _txt in lps] == ids
    assert all(math.isfinite(lp) and lp <= 0 for lp, _t, _txt in lps)
