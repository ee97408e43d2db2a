"""Traces from the reference server (pcieprof.refserver, TP over 2 CPU processes with gloo):
its /start_profile writes one gzipped trace per rank; attribution counts the gloo all-reduces
as communication, per rank and per step[DECODE bs=N] step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from builders.procs import free_port

from pcieprof.analysis.attribution import attribute_traces

pytest.importorskip("pcieprof.refserver")


def _http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


@pytest.fixture(scope="module")
def refserver_traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("ref")
    port = free_port()
    log = (out / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "pcieprof.refserver", "--tp-size", "2",
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while _http(f"{base}/health_generate", timeout=10)[0] != 200:
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail("reference server did not come up:\n" + (out / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        code, text = _http(f"{base}/start_profile", {"output_dir": str(out / "traces"), "num_steps": 8})
        assert code == 200, text
        threads = [threading.Thread(target=_http, args=(f"{base}/generate", {
            "text": f"hello {i}", "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}))
            for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        deadline = time.time() + 180
        while len(list((out / "traces").glob("*-TP-*.trace.json.gz"))) < 2 and time.time() < deadline:
            time.sleep(0.5)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=120)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        log.close()
    files = sorted((out / "traces").glob("*-TP-*.trace.json.gz"))
    assert len(files) == 2, (out / "server.log").read_text()[-3000:]
    return files


def test_refserver_gloo_allreduce_is_comm_per_rank_and_decode_step(refserver_traces: list[Path]) -> None:
    doc = attribute_traces(refserver_traces)
    assert doc.timeline == "cpu"
    assert sorted(r.rank for r in doc.ranks) == [0, 1]
    for r in doc.ranks:
        assert r.rank_source == "distributedInfo"
        assert r.totals["comm_us"] > 0 and r.totals["compute_us"] > 0
        fams = {f["family"]: f for f in r.families}
        assert fams["gloo"]["class"] == "communication"
    decode = [s for s in doc.steps if s.kind == "DECODE"]
    assert decode, [s.name for s in doc.steps]
    assert all(s.bs and s.bs >= 1 for s in decode)
    assert all(s.comm_us and s.comm_us > 0 for s in decode)
    names = {k["name"] for k in doc.top_kernels if k["class"] == "communication"}
    assert "gloo:all_reduce" in names
    assert doc.cross_rank.status == "ok"
