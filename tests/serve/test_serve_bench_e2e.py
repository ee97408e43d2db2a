"""serve-bench end to end against the reference server: real subprocesses, nothing left behind.

These launch `python -m pcieprof.refserver` (TP=2 over gloo) through the CLI, as a user would.
"""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from builders.cli import cli, pcieprof_argv
from builders.procs import group_gone

pytest.importorskip("pcieprof.refserver.server")
pytestmark = pytest.mark.slow

FAST = ["--num-requests", "6", "--warmup", "1", "--input-len", "16", "--output-len", "12"]


def _attempts(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "serve" / "attempts.jsonl").read_text().splitlines()]


def _assert_gone(attempts: list[dict]) -> None:
    """No process of any attempt's server group is left (zombies get a moment to be reaped)."""
    for a in attempts:
        if a.get("pid"):
            assert group_gone(a["pid"]), f"server group {a['pid']} of attempt {a['name']} is left"


def test_tiny_cpu_tp2_writes_a_complete_bundle(tmp_path: Path) -> None:
    out = tmp_path / "b"
    p = cli("serve-bench", "--model", "tiny-cpu", "--tp", "2", "--out", str(out), *FAST,
            "--decode-batches", "1,4,16", "--decode-output-len", "24", "--profile-steps", "4",
            process=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    parts = {k: (v["status"], v.get("why")) for k, v in manifest["parts"].items()}
    assert manifest["status"] == "ok" and manifest["backend"] == "cpu", (parts, p.stderr[-1500:])
    assert manifest["parts"]["serve"]["status"] == "ok"
    summary = json.loads((out / "serve" / "summary.json").read_text())
    assert [r["label"] for r in summary["runs"]] == ["c=1", "c=4", "c=16", "c=64"]
    for r in summary["runs"]:
        assert r["completed"] == 6 and r["output_len_mismatch"] == 0
        assert r["ttft_ms"]["n"] == 6 and r["tpot_ms"]["median"] > 0
        assert r["output_throughput"] > 0
    assert "tpot_ms" in summary["formulas"]
    reqs = (out / "serve" / "requests.jsonl").read_text().splitlines()
    assert len(reqs) == 4 * 7 and sum(json.loads(x)["warmup"] for x in reqs) == 4
    curve = (out / "serve" / "decode_curve.csv").read_text().splitlines()
    assert curve[0].startswith("backend,batch_size,step_time_ms") and len(curve) == 4
    traces = sorted((out / "serve" / "traces").glob("*.trace.json.gz"))
    assert {t.name.split("-TP-")[1][0] for t in traces} == {"0", "1"}
    # Asked without Python stacks (the stop of a with_stack profiler is where servers crash):
    # the traces hold step spans and collectives, no python_function events.
    index = json.loads((out / "serve" / "traces" / "index.json").read_text())
    assert index["request"]["with_stack"] is False
    for t in traces:
        with gzip.open(t, "rt") as f:
            cats = {e.get("cat") for e in json.load(f)["traceEvents"]}
        assert "python_function" not in cats and "user_annotation" in cats, (t.name, cats)
    assert (out / "serve" / "server-0.log").read_text().count("fired up") == 1
    assert "c=64" in p.stdout and "bundle (ok)" in p.stdout
    _assert_gone(_attempts(out))


def test_nan_after_20_is_one_classified_line_and_a_partial_bundle(tmp_path: Path) -> None:
    # 4-token probes pass, and the server dies in the middle of the concurrency sweep (a NaN
    # during the probe itself is the sweep test's nan attempt).
    probe = "4"
    out = tmp_path / "nan"
    p = cli("serve-bench", "--model", "tiny-cpu", "--tp", "2", "--inject", "nan-after 20",
            "--probe-tokens", probe, "--out", str(out), *FAST, process=True, timeout=400)
    assert p.returncode == 1, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("pcieprof: error: server nan_in_decode") and "probability tensor" in last
    assert json.loads((out / "manifest.json").read_text())["status"] == "partial"
    att = _attempts(out)
    assert att[0]["outcome"] == "nan_in_decode" and att[0]["time_to_failure_s"] > 0
    assert "probability tensor" in att[0]["excerpt"]
    if probe == "4":
        assert att[0]["benchmarked"] and "while benchmarking" in last
        rows = [json.loads(x) for x in (out / "serve" / "requests.jsonl").read_text().splitlines()]
        assert any(r["ok"] for r in rows) and any(not r["ok"] for r in rows)
    _assert_gone(att)


def test_sweep_records_each_attempt_and_benchmarks_the_first_healthy(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('[[sweep]]\nname = "crash"\ninject = "crash-on-start"\n'
                     '[[sweep]]\nname = "nan"\ninject = "nan-after 8"\n'
                     
                     '[[sweep]]\nname = "healthy"\n'
                     '[[sweep]]\nname = "never-tried"\ninject = "crash-on-start"\n')
    out = tmp_path / "sw"
    p = cli("serve-bench", "--model", "tiny-cpu", "--tp", "2", "--sweep-file", str(sweep),
            "--out", str(out), *FAST, "--concurrency", "1,4", "--decode-batches", "none",
            "--no-profile", "--probe-timeout", "8", process=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    att = _attempts(out)
    assert [a["outcome"] for a in att] == ["crashed", "nan_in_decode", "ok"]
    assert [a["benchmarked"] for a in att] == [False, False, True]
    assert all(a["time_to_failure_s"] > 0 for a in att[:2])
    assert "crash-on-start" in att[0]["excerpt"]
    summary = json.loads((out / "serve" / "summary.json").read_text())
    assert summary["attempt"] == "healthy" and len(summary["runs"]) == 2
    assert json.loads((out / "manifest.json").read_text())["status"] == "ok"
    _assert_gone(att)


@pytest.mark.parametrize("when", ["startup", "load"])
def test_ctrl_c_tears_the_server_down(tmp_path: Path, when: str) -> None:
    out = tmp_path / "int"
    proc = subprocess.Popen(pcieprof_argv("serve-bench", "--model", "tiny-cpu", "--tp", "2",
                                          "--out", str(out), "--num-requests", "400",
                                          "--concurrency", "2", "--output-len", "64"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = out / "serve" / ("attempts.jsonl" if when == "startup" else "requests.jsonl")
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and proc.poll() is None:
            if marker.is_file() and marker.stat().st_size > 0:
                break
            time.sleep(0.2)
        assert marker.is_file(), "serve-bench never got there"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert json.loads((out / "manifest.json").read_text())["status"] == "partial", err[-2000:]
    att = _attempts(out)
    assert att and att[0]["pid"]
    if when == "startup":
        assert att[0]["outcome"] == "interrupted"
    _assert_gone(att)


def test_glm5_dry_run_prints_command_and_environment(tmp_path: Path) -> None:
    p = cli("serve-bench", "--model", "glm5-nvfp4", "--dry-run", "--out", str(tmp_path / "x"),
            process=True, timeout=400)
    assert p.returncode == 0, p.stderr
    assert "-m sglang.launch_server --model-path nvidia/GLM-5-NVFP4 --tp-size 8" in p.stdout
    assert "--quantization modelopt_fp4 --kv-cache-dtype bf16" in p.stdout
    assert "export SGLANG_ENABLE_JIT_DEEPGEMM=0" in p.stdout
    # no bundle priced the card's NCCL_P2P_LEVEL=SYS on this box: left out, and said so
    assert "export NCCL_P2P_LEVEL" not in p.stdout
    assert "# not set: NCCL_P2P_LEVEL=SYS, the card's, not checked on this box" in p.stdout
    argv = json.loads(p.stdout.split("# argv: ")[1].splitlines()[0])
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert not (tmp_path / "x").exists()


def test_url_attaches_to_a_running_server(tmp_path: Path) -> None:
    from builders.fakeserver import FakeServer

    out = tmp_path / "att"
    with FakeServer(token_delay_s=0.001) as srv:
        p = cli("serve-bench", "--model", "tiny-cpu", "--url", srv.url, "--out", str(out),
                *FAST, "--concurrency", "2", "--decode-batches", "1,2", "--no-profile",
                "--api", "completions", process=True, timeout=400)
    assert p.returncode == 0, p.stderr[-2000:]
    att = _attempts(out)
    assert att[0]["name"] == "attached" and att[0]["pid"] is None
    summary = json.loads((out / "serve" / "summary.json").read_text())
    assert summary["api"] == "completions" and summary["runs"][0]["completed"] == 6
    assert not (out / "serve" / "server-0.log").exists()


def test_glm5_without_sglang_is_one_line(tmp_path: Path) -> None:
    if __import__("importlib").util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")
    p = cli("serve-bench", "--model", "glm5-nvfp4", "--out", str(tmp_path / "g"),
            process=True, timeout=400)
    assert p.returncode == 3
    assert p.stderr.strip().splitlines()[-1].startswith("pcieprof: error: sglang is not installed")

