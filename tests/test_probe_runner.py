"""The watchdog, for real: torchrun + gloo with the test-only hooks of probes/rows.py making one
rank hang (or die) at one case; the hang is killed, recorded, and the sweep goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pcieprof import loopback
from pcieprof.bundle import Bundle
from pcieprof.probe_runner import (Launch, ProbeRunner, _stat, alive, launch_environ,
                                    loopback_env, loopback_ifnames, reap)
from probes import variants as V
from probes.plan import build_plan


@pytest.fixture()
def hooks(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("PCIEPROF_TEST_HOOKS", "i-know-this-is-for-tests")
    return monkeypatch


def test_hook_needs_its_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    from probes.rows import test_hook

    monkeypatch.delenv("PCIEPROF_TEST_HOOKS", raising=False)
    monkeypatch.setenv("PCIEPROF_TEST_DIE", "0:64")
    test_hook(0, 64, "default")  # without the guard: nothing happens (we are still here)


@pytest.mark.timeout(600)
def test_hang_and_dead_rank_are_recorded_and_the_sweep_goes_on(tmp_path: Path,
                                                                hooks: pytest.MonkeyPatch) -> None:
    # 15 s without progress is a hang: a rank of a loaded machine can go seconds without the CPU
    plan = build_plan("cpu", [0, 1], quick=True, max_size=4096, timeout_s=15,
                      variants=[V.VARIANTS[n] for n in ("default", "proto_ll")])
    plan.concurrent = plan.concurrent[:2]  # keeps the test short
    # copy probe: rank 1 hangs in case 3; all-reduce: rank 1 hangs at 1 KiB in `default`,
    # rank 0 dies at 64 B in `proto_ll` (which runs although `default` hung)
    hooks.setenv("PCIEPROF_TEST_HANG", "1:1024:default")
    hooks.setenv("PCIEPROF_TEST_DIE", "0:64:proto_ll")
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    runner = ProbeRunner(bundle, plan)
    try:
        t0 = time.monotonic()
        ar = runner.run_allreduce()
        took = time.monotonic() - t0
        hooks.setenv("PCIEPROF_TEST_HANG", "1:3:copies")
        hooks.delenv("PCIEPROF_TEST_DIE")
        hooks.setenv("PCIEPROF_TEST_CORRUPT", "1:5:copies")  # rank 1 receives in case 5
        copies = runner.run_copies()
    finally:
        runner.cleanup()
    assert took < 240  # two launches and one 15 s hang on a loaded machine; undetected: never
    df = bundle.read_table("allreduce")
    hang = df[df["status"] == "hang"]
    assert len(hang) == 1
    h = hang.iloc[0]
    assert (h["variant"], h["size_bytes"], h["ranks"]) == ("default", 1024, (0, 1))
    assert "no progress" in h["detail"] and "size 1024" in h["detail"]
    # rows measured before the hang are kept (bf16 8 B .. 512 B)
    ok_default = df[(df["variant"] == "default") & (df["status"] == "ok")]
    assert sorted(ok_default["size_bytes"]) == [8, 16, 32, 64, 128, 256, 512]
    dead = df[df["status"] == "error"]
    assert len(dead) == 1 and dead.iloc[0]["variant"] == "proto_ll"
    assert dead.iloc[0]["size_bytes"] == 64 and "exited with status" in dead.iloc[0]["detail"]
    before = df[(df["variant"] == "proto_ll") & (df["status"] == "ok")]
    assert sorted(before["size_bytes"]) == [8, 16, 32]
    assert ar["status"] == "partial" and ar["hangs"] == 1 and ar["errors"] == 1

    p2p = bundle.read_table("p2p")
    assert copies["p2p"]["hangs"] == 1 and copies["p2p"]["status"] == "partial"
    assert (p2p["status"] == "hang").sum() == 1
    assert len(p2p) == len(plan.p2p)  # the case after the hang and all the rest ran
    c5 = plan.p2p[5]
    assert c5.dst == 1 and c5.path in ("p2p", "host_staged")
    bad = p2p[p2p["status"] == "error"]
    assert len(bad) == 1 and bad.iloc[0]["bandwidth_gbps"] != bad.iloc[0]["bandwidth_gbps"]  # NaN
    assert "do not match" in bad.iloc[0]["detail"]
    assert (p2p[~p2p["status"].isin(["hang", "error"])]["status"] == "ok").all()
    assert copies["concurrent"]["status"] == "ok"
    assert not list(Path("/dev/shm").glob(f"*{runner.work.name}*"))
    assert not runner.work.exists()


def test_a_rank_that_outlives_its_killed_launch_is_gone_before_the_next(
        tmp_path: Path, hooks: pytest.MonkeyPatch) -> None:
    # rank 1 of `default` hangs at 16 B and no longer dies with torchrun or on SIGTERM (as a rank
    # stuck in the driver after an IOMMU fault): torchrun started it in its own session, so
    # killing the launch's process group does not reach it
    plan = build_plan("cpu", [0, 1], quick=True, max_size=64, timeout_s=12,
                      variants=[V.VARIANTS[n] for n in ("default", "proto_ll")])
    plan.p2p, plan.concurrent = [], []
    hooks.setenv("PCIEPROF_TEST_STUCK", "1:16:default")
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    runner = ProbeRunner(bundle, plan)
    pids: list[int] = []
    try:
        ar = runner.run_allreduce()
        for f in sorted((runner.work / "launch1").glob("rank*.jsonl")):
            pids += [e["pid"] for e in map(json.loads, f.read_text().splitlines())
                     if e.get("event") == "init"]
        assert len(pids) == 2
        assert not [p for p in pids if alive(p)], "a rank of the killed launch still runs"
        assert ar["hangs"] == 1
        df = bundle.read_table("allreduce")
        assert (df[df["variant"] == "proto_ll"]["status"] == "ok").all()  # the next launch ran
    finally:
        for p in pids:  # only the processes this test's launch started
            if alive(p):
                os.kill(p, signal.SIGKILL)
        runner.cleanup()


def test_reap_kills_by_pid_and_leaves_a_reused_pid_alone() -> None:
    with subprocess.Popen(["sleep", "30"]) as a, subprocess.Popen(["sleep", "30"]) as b:
        try:
            st = _stat(a.pid)
            assert st is not None
            # b is recorded with another start time: the pid now belongs to another process
            assert reap({a.pid: st[2], b.pid: "1"}, 5.0) == []
            assert a.wait(timeout=60) == -signal.SIGKILL
            assert b.poll() is None
        finally:
            b.kill()


def test_one_node_launches_stay_on_loopback_without_overriding_the_user(tmp_path: Path) -> None:
    """What keeps a one-node launch on loopback: stores in its scratch directory, the loopback
    interface for gloo and NCCL unless the launch's environment already names one (the user's
    GLOO_SOCKET_IFNAME; an NCCL_SOCKET_IFNAME reaches it only when the plan keeps it)."""
    name = loopback.interface()
    env = loopback_env({}, tmp_path)
    assert env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                   "PCIEPROF_STORE_FILE": str(tmp_path / "group.store"),
                   "GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": f"={name}"}
    user = {"GLOO_SOCKET_IFNAME": "eth9", "NCCL_SOCKET_IFNAME": "=ib0"}
    dropped, _ = launch_environ(user)  # not kept by the plan: NCCL's is left out, gloo's passes
    assert loopback_ifnames(dropped) == {"NCCL_SOCKET_IFNAME": f"={name}"}
    kept, _ = launch_environ(user, keep=["NCCL_SOCKET_IFNAME"])
    assert loopback_ifnames(kept) == {}
    # one node: torchrun's rendezvous is a file there, no --standalone (a TCPStore on `*`)
    args = Launch().args(tmp_path)
    assert "--standalone" not in args and str(tmp_path / "rdzv.store") in args
    assert args[args.index("--rdzv-conf") + 1] == "store_type=file"
    # several nodes: the user's endpoint, as given
    multi = Launch(2, 1, "10.0.0.1:29400").args(tmp_path)
    assert multi[multi.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
