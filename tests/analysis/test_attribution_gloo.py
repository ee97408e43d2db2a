"""Gloo all-reduce time on CPU-only traces is communication, per rank and per decode step.

Two real processes run a tiny TP-style decode loop (matmul then gloo all_reduce, inside
SGLang-named `step[DECODE bs=N]` spans) under torch.profiler, as the reference server does; the
traces they write are attributed. Rank 1 computes longer on purpose, so rank 0 waits for it
inside the all-reduce: the cross-rank split must put that wait on rank 0. The barrier that
lines the ranks up after the profiler starts is set to `ignore` through a user class table
(--classes), so start-up skew does not count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from builders.cli import cli
from builders.procs import free_port

from pcieprof.analysis.attribution import attribute_traces

WORKER = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    from torch.profiler import profile, ProfilerActivity, record_function
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    x = torch.randn(8, 128); w = torch.randn(128, 128)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        dist.barrier()  # absorbs the ranks' different start-up times (ignored by the test's table)
        for step in range(4):
            with record_function("step[DECODE bs=8]"):
                for layer in range(3):
                    y = x @ w
                    if rank == 1:
                        t = time.perf_counter()
                        while time.perf_counter() - t < 0.004:   # the slow rank
                            y = torch.tanh(y)
                    dist.all_reduce(y)
            p.step()
    p.export_chrome_trace(os.path.join(out, f"{time.time():.0f}-TP-{rank}.trace.json.gz"))
    dist.destroy_process_group()
""")


def ranks_report(procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> str:
    """Each rank's exit status and the end of its output, as one string (pytest shortens the repr
    of anything else, which hid the failing rank once in CI)."""
    parts = []
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if not ln.startswith("USDT:")]
        parts.append(f"rank {rank}: exit {p.returncode}\n" + "\n".join(lines[-40:]))
    return "\n".join(parts)


def run_ranks(out: Path, script: Path) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    """Both ranks of the worker, to their end (bounded); their output goes to files, not pipes,
    so nothing blocks on a full pipe."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    logs = [out / f"rank{r}.log" for r in range(2)]
    procs = []
    for r, log in enumerate(logs):
        with log.open("wb") as sink:
            procs.append(subprocess.Popen([sys.executable, "-X", "faulthandler", str(script), str(r), "2",
                                           str(out)], env=env, stdout=sink, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs, logs


@pytest.fixture(scope="module")
def gloo_traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    # The worker is torch alone (no pcieprof code): it makes this test's input. It failed once in
    # CI with the failing rank's output hidden, and passed 100 runs here (60 beside six busy loops)
    # plus 300 profile cycles in one pair of ranks, so the cause is not known. A failed run is
    # reported as a warning, with each rank's exit and output, and made once more; a second
    # failure fails the test.
    for attempt in (1, 2):
        out = tmp_path_factory.mktemp(f"gloo{attempt}")
        script = out / "worker.py"
        script.write_text(WORKER)
        procs, logs = run_ranks(out, script)
        if all(p.returncode == 0 for p in procs):
            break
        report = ranks_report(procs, logs)
        assert attempt == 1, report
        warnings.warn(f"the gloo workers failed once and were run again:\n{report}", stacklevel=1)
    files = sorted(out.glob("*-TP-*.trace.json.gz"))
    assert len(files) == 2
    return files


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("cls") / "ignore_barrier.toml"
    t.write_text('[[rule]]\npattern = "^gloo:barrier"\nclass = "ignore"\napplies_to = "cpu"\n')
    return t


def test_gloo_allreduce_is_communication_per_rank_and_step(gloo_traces: list[Path], classes: Path) -> None:
    doc = attribute_traces(gloo_traces, classes=classes)
    assert doc.timeline == "cpu"
    assert [r.rank for r in doc.ranks] == [0, 1]
    for r in doc.ranks:
        t = r.totals
        assert r.mode == "cpu" and r.steps_from == "cpu step[] annotations"
        assert t["comm_us"] and t["compute_us"]
        fams = {f["family"]: f for f in r.families}
        assert fams["gloo"]["class"] == "communication" and fams["gloo"]["count"] >= 12
    steps = [s for s in doc.steps if s.kind == "DECODE"]
    assert len(steps) == 8 and all(s.bs == 8 for s in steps)
    assert all(s.comm_us for s in steps)
    # rank 0 is fast, so it spends its all-reduces waiting for rank 1
    r0, r1 = doc.ranks
    assert (r0.totals["comm_us"] or 0) > (r1.totals["comm_us"] or 0)
    sk = {p.rank: p for p in doc.cross_rank.per_rank}
    assert sk[0].wait_us > sk[1].wait_us
    assert sk[0].wait_us > 0.5 * 12 * 4000 * 0.5  # most of the ~4 ms x 12 of rank 1's extra work


def test_cli_writes_bundle_tables(gloo_traces: list[Path], tmp_path: Path) -> None:
    """The CLI on the same traces (built-in table only)."""
    out = tmp_path / "b"
    r = cli("attribute", *map(str, gloo_traces), "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout
    for name in ("per_rank", "per_step", "per_class", "top_kernels", "classes"):
        assert (out / "attribution" / f"{name}.csv").stat().st_size > 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "ok" and man["parts"]["attribution"]["backend"] == "cpu"
    doc = json.loads((out / "attribution.json").read_text())
    assert doc["classes"][0]["pattern"]
