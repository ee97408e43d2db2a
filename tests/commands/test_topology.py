"""`pcieprof topology` for real on the cpu backend (torchrun + gloo, 2 ranks, tiny sizes): a
complete bundle, a killed run's partial bundle, and one-line errors for bad input."""

from __future__ import annotations

import csv
import json
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders.cli import cli, pcieprof_argv
from builders.procs import alive, descendants

from pcieprof.analysis.decode_band import band_for
from pcieprof.bundle import Bundle

TOPOLOGY = ("topology", "--backend", "cpu", "--nranks", "2", "--quick")


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children (and theirs) waited for so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@pytest.mark.timeout(600)
def test_cpu_run_writes_a_complete_bundle(tmp_path: Path) -> None:
    out = tmp_path / "b"
    cpu0 = _children_cpu_s()
    # the wall-clock timeout only ends a hang; the run's cost is bounded on CPU time below
    proc = cli(*TOPOLOGY, "--max-size", "64KiB", "--variants", "default,proto_ll,nch2",
               "--out", str(out), process=True, timeout=540)
    cpu = _children_cpu_s() - cpu0  # pcieprof, torchrun and the ranks
    assert proc.returncode == 0, proc.stderr
    b = Bundle.open(out)
    assert b.backend == "cpu" and b.source == "measured"
    for part in ("p2p", "concurrent", "allreduce"):
        assert b.part(part).status == "ok", b.part(part)
    p2p = b.read_table("p2p")
    assert (p2p["backend"] == "cpu").all() and (p2p["status"] == "ok").all()
    for path in ("p2p", "host_staged"):
        bw = p2p[(p2p["path"] == path) & (p2p["direction"] == "uni") & p2p["bandwidth_gbps"].notna()]
        assert {(int(r.src), int(r.dst)) for r in bw.itertuples()} == {(0, 1), (1, 0)}
        assert (bw["bandwidth_gbps"] > 0).all()
        assert (bw["bandwidth_gbps_min"] <= bw["bandwidth_gbps"]).all()
    assert set(p2p["path"]) == {"p2p", "host_staged", "h2d", "d2h"}
    assert p2p["detail"].str.contains("not a GPU fabric").all()
    ar = b.read_table("allreduce")
    assert list(dict.fromkeys(ar["variant"])) == ["default", "proto_ll", "nch2"]
    for _, g in ar.groupby(["variant", "dtype"]):
        # 8 B .. 64 KiB in powers of two, and GLM-5's decode sizes under the cap (12, 24, 48 KiB)
        assert sorted(g["size_bytes"]) == sorted({8 << i for i in range(14)}
                                                 | {s for s in band_for().sizes() if s <= 64 << 10})
        assert {12 << 10, 24 << 10, 48 << 10} <= set(g["size_bytes"])
    assert (ar["status"] == "ok").all()
    ok = ar.dropna(subset=["time_us"])
    assert ((ok["busbw_gbps"] / ok["algbw_gbps"] - 1.0).abs() < 1e-9).all()  # 2(n-1)/n = 1 at n=2
    assert ar[ar["variant"] != "default"]["detail"].str.contains("gloo ignores").all()
    cc = b.read_table("concurrent")
    assert {"write", "read"} <= set(cc["op"]) and (cc["flow"] == -1).any()
    choices = json.loads((out / "nccl_choices.json").read_text())
    assert set(choices) == {"default", "proto_ll", "nch2"}
    assert (out / "nccl" / "proto_ll.log").is_file()
    assert (out / "report.html").is_file()
    assert not list(out.glob(".probe-work-*"))  # the raw per-rank rows are gone after a normal end
    assert "p2p bandwidth, GB/s" in proc.stdout and "all-reduce time" in proc.stdout
    assert f"pcieprof report {out}" in proc.stdout
    assert "measure this machine" in proc.stdout
    assert cpu < 200, cpu


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_run_leaves_a_partial_bundle_with_intact_rows(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "b"
    # all-reduce only, sizes up to 16 MiB: one launch that runs long enough to be cut halfway
    proc = subprocess.Popen(pcieprof_argv(*TOPOLOGY, "--max-size", "16MiB", "--probes",
                                          "allreduce", "--variants", "default", "--out", str(out),
                                          "-q"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        table = out / "allreduce.csv"
        while time.monotonic() < deadline:  # halfway: some all-reduce rows are in
            if table.is_file() and len(table.read_text().splitlines()) > 6:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        else:
            pytest.fail("no all-reduce rows within 300 s")
        family = descendants(proc.pid)
        assert family, "the torchrun launch should be running"
        proc.send_signal(sig)
        proc.communicate(timeout=120)  # reads its pipes while it ends: a full one cannot block it
        if sig == signal.SIGTERM:
            assert proc.returncode == 130
        end = time.monotonic() + 60
        while any(alive(p) for p in family) and time.monotonic() < end:
            time.sleep(0.2)
        assert not [p for p in family if alive(p)], "workers left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "partial"
    if sig == signal.SIGTERM:
        assert "SIGTERM" in manifest["why"]
        assert manifest["parts"]["allreduce"]["status"] == "partial"
    with (out / "allreduce.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert len(body) >= 6 and all(len(r) == len(header) for r in body)
    df = Bundle.open(out).read_table("allreduce")
    assert len(df) == len(body) and (df["status"] == "ok").all()
    assert not (out / "p2p.csv").exists()


@pytest.mark.slow
def test_a_run_that_measured_nothing_exits_4(tmp_path: Path) -> None:
    """Every all-reduce launch dies (the probes' test hook kills rank 0 at the one size swept):
    the bundle keeps the error rows and the summary, and the exit status says nothing was
    measured (4), in one line naming the bundle."""
    out = tmp_path / "b"
    proc = cli(*TOPOLOGY, "--probes", "allreduce", "--max-size", "8", "--variants", "default",
               "--no-report", "--out", str(out), process=True, timeout=240,
               env={"PCIEPROF_TEST_HOOKS": "i-know-this-is-for-tests", "PCIEPROF_TEST_DIE": "0:8"})
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("pcieprof: "))
    assert "no probe measured anything" in line and str(out) in line
    ar = Bundle.open(out).read_table("allreduce")
    assert len(ar) and (ar["status"] == "error").all()


def test_bad_input_gets_one_line_and_a_nonzero_exit(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    r = cli("topology", "--backend", "cpu", "--nranks", "0")
    assert r.returncode == 2 and "--nranks 0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    r = cli("topology", "--backend", "cpu", "--out", str(full))
    assert r.returncode == 2 and "not empty" in r.stderr and "--force" in r.stderr
    assert (full / "x").read_text() == "keep me"
    r = cli("topology", "--backend", "sim", "--devices", "0,99", "--out", str(tmp_path / "s"))
    assert r.returncode == 2 and "unknown device index 99" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
    r = cli("topology", "--backend", "cpu", "--devices", "0,1")
    assert r.returncode == 2 and "--nranks" in r.stderr
    r = cli("topology", "--backend", "cpu", "--variants", "proto_fast")
    assert r.returncode == 2 and "unknown variant" in r.stderr
    r = cli("topology", "--backend", "cpu", "--max-size", "lots")
    assert r.returncode == 2 and "number of bytes" in r.stderr
    monkeypatch.setattr(sys, "platform", "darwin")
    r = cli("topology", "--backend", "cpu")
    assert r.returncode == 3 and "needs Linux" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cuda_backend_without_a_gpu_says_so(tmp_path: Path) -> None:
    from pcieprof.measurement import gpu_count

    if gpu_count()[0]:
        pytest.skip("this machine has a GPU")
    r = cli("topology", "--backend", "cuda", "--out", str(tmp_path / "c"))
    assert r.returncode == 3 and "--backend cpu" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_auto_falls_back_to_cpu_in_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    from pcieprof.measurement import gpu_count, resolve_backend

    if gpu_count()[0]:
        pytest.skip("this machine has a GPU")
    capfd.readouterr()
    assert resolve_backend("auto") == "cpu"
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "running the cpu backend" in err[0]
    assert resolve_backend("cpu") == "cpu"
