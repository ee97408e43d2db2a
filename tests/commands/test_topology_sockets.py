"""`pcieprof topology` on one node listens on loopback only (issue 13): the listening TCP sockets
of its whole process tree (pcieprof, the torchrun agents, the workers), sampled from /proc while a
real cpu run goes (torchrun + gloo, 2 ranks, tiny sizes). torchrun's `--standalone` would have
its agent listen on every interface (two TCPStores on `*`); gloo and NCCL are told the loopback
interface, which the workers' environment shows."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from builders.cli import pcieprof_argv
from builders.procs import LOOPBACK, cmdline, descendants, listening

from pcieprof import loopback

RUN = ("topology", "--backend", "cpu", "--nranks", "2", "--quick", "--variants", "default",
       "--max-size", "64KiB", "--no-report", "-q")


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


@pytest.mark.timeout(600)
def test_one_node_run_listens_on_loopback_only(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME",
                                                            "NCCL_SOCKET_IFNAME")}
    proc = subprocess.Popen(pcieprof_argv(*RUN, "--out", str(tmp_path / "b")), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[tuple[str, int], str] = {}  # (address, port) -> the listening process
    workers: dict[int, dict[str, str]] = {}  # worker pid -> its environment
    deadline = time.monotonic() + 400
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            pids = {proc.pid} | descendants(proc.pid)
            for pid, addr, port in listening(pids):
                seen.setdefault((addr, port), cmdline(pid)[:120])
            for pid in pids:
                if pid not in workers and "-m probes." in cmdline(pid):
                    workers[pid] = _environ(pid)
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert seen, "no listening socket seen: the sampling saw nothing to check"
    # the workers' gloo listeners, at least, of the copy and the all-reduce launch
    assert any("probes.p2p_worker" in c for c in seen.values()), seen
    assert any("probes.allreduce_worker" in c for c in seen.values()), seen
    wide = {k: c for k, c in seen.items() if k[0] not in LOOPBACK}
    assert not wide, f"listening beyond loopback: {wide}"
    assert len(workers) >= 4, workers  # 2 ranks x (copies, all-reduce)
    name = loopback.interface()
    for e in workers.values():
        assert e.get("GLOO_SOCKET_IFNAME") == name and e.get("NCCL_SOCKET_IFNAME") == f"={name}"
        assert e.get("PCIEPROF_STORE_FILE") and e.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1"
