"""`pcieprof topology --nnodes 2` for real: two "nodes" on this machine (two pcieprof processes,
loopback rendezvous, the cpu backend, tiny plans). Every collective row lands in node 0's bundle,
the manifests say the layout, a node that never joins ends the run within the rendezvous
deadline in one line, and a node killed mid-sweep stops the cross-node cases at once and reads
as interrupted afterwards."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from builders.cli import cli, pcieprof_argv
from builders.procs import free_port

from pcieprof.bundle import Bundle

#: A tiny plan: cross-node all-reduce only, 8..64 B, one variant unless a test adds more.
RUN = pcieprof_argv("topology", "--backend", "cpu", "--quick", "--probes", "allreduce",
                    "--max-size", "64", "--no-report")


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node of these runs shares one rendezvous token (the nodes inherit it)."""
    monkeypatch.setenv("PCIEPROF_RDZV_TOKEN", "multinode-test-token-0123456789")


def _node(rank: int, out: Path, endpoint: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(RUN + ["--nnodes", "2", "--node-rank", str(rank),
                                   "--rdzv-endpoint", endpoint, "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()


def _ended(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _said(*ends: tuple[int, str, str]) -> str:
    """Each node's exit code and the tail of its stderr (where its ranks' failures and, with
    PYTHONFAULTHANDLER, their stacks end up) as one text: pytest shows a str message whole and
    shortens a tuple or list."""
    return "\n".join(f"--- node {n}: exit {rc}\n{err[-3000:]}" for n, (rc, _, err) in enumerate(ends))


def _two_nodes(tmp_path: Path, nranks: int, wait0_s: float) -> tuple[str, Path, Path,
                                                                     tuple[int, str, str],
                                                                     tuple[int, str, str]]:
    """Nodes 0 and 1 of a `nranks`-per-node run (default variant) on this machine, until both
    end: the endpoint, their bundles, and (exit code, stdout, stderr) of each."""
    endpoint = f"127.0.0.1:{free_port()}"
    n0, n1 = tmp_path / "n0", tmp_path / "n1"
    args = ("--nranks", str(nranks), "--variants", "default", "--rdzv-timeout", "60")
    p0 = _node(0, n0, endpoint, *args)
    p1 = _node(1, n1, endpoint, *args)
    try:
        return endpoint, n0, n1, _ended(p0, wait0_s), _ended(p1, 120)
    finally:
        _stop(p0, p1)


@pytest.mark.timeout(600)
def test_two_nodes_one_rank_each_give_one_dataset_in_node0s_bundle(tmp_path: Path) -> None:
    endpoint, n0, n1, end0, end1 = _two_nodes(tmp_path, 1, 240)
    (rc0, out0, err0), (rc1, out1, err1) = end0, end1
    assert rc0 == 0 and rc1 == 0, _said(end0, end1)
    b0, b1 = Bundle.open(n0), Bundle.open(n1)
    # one rank per node is a 2-rank all-reduce across the nodes, every row in node 0's bundle
    ar = b0.read_table("allreduce")
    assert len(ar) == 8 and (ar["status"] == "ok").all()  # 4 sizes x 2 dtypes
    assert set(ar["nranks"]) == {2} and set(ar["ranks"]) == {(0, 1)}
    assert not (n1 / "allreduce.csv").exists() and not (n1 / "nccl_choices.json").exists()
    assert (n1 / "nccl" / "default.log").is_file()  # node 1's ranks' own output stays there
    for rank, b in ((0, b0), (1, b1)):
        nodes = b.manifest.nodes
        assert nodes is not None and nodes.nnodes == 2 and nodes.node_rank == rank
        assert nodes.rdzv_endpoint == endpoint and nodes.stride == 1
        assert [(n.node_rank, n.devices, n.gpus) for n in nodes.nodes] == \
            [(0, [0], [0]), (1, [0], [1])]
        assert nodes.nodes[0].bundle == str(n0.resolve())
        assert b.manifest.status == "ok" and b.part("allreduce").status == "ok"
    assert b0.manifest.nodes.collective_rows == "this bundle"
    assert str(n0.resolve()) in b1.part("allreduce").extra["rows_in"]
    assert f"node 0 (" in b1.manifest.nodes.collective_rows
    # plan.json says what the rows say, on both nodes
    for d in (n0, n1):
        plan = json.loads((d / "plan.json").read_text())
        assert plan["nnodes"] == 2 and plan["nranks"] == 2 and plan["ranks_per_node"] == 1
        assert [(c["nranks"], c["global_ranks"]) for c in plan["allreduce"]] == [(2, [0, 1])]
    assert f"all-reduce rows of the 2 nodes x 1 process run: node 0" in out1
    assert "2 nodes x 1 process (2 ranks, inter-node)" in out0
    assert "inter-node transport: gloo over TCP" in out0
    assert "node 1 (" in err0 and "joined" in err0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_nodes_of_two_ranks_inter_and_intra_node_rows(tmp_path: Path) -> None:
    _, n0, n1, end0, end1 = _two_nodes(tmp_path, 2, 300)
    assert end0[0] == 0 and end1[0] == 0, _said(end0, end1)
    ar = Bundle.open(n0).read_table("allreduce")
    assert (ar["status"] == "ok").all()
    # across the nodes: 4 ranks, global GPUs node x 2 + device; node 0's own 2 GPUs beside it
    groups = {(int(n), tuple(r)) for n, r in zip(ar["nranks"], ar["ranks"])}
    assert groups == {(4, (0, 1, 2, 3)), (2, (0, 1))}
    assert len(ar[ar["nranks"] == 4]) == 8 and len(ar[ar["nranks"] == 2]) == 8
    choices = json.loads((n0 / "nccl_choices.json").read_text())
    assert set(choices) == {"default", "default.node0"}
    assert choices["default"]["ranks"] == [0, 1, 2, 3]
    assert sorted(p.name for p in (n1 / "nccl").iterdir()) == ["default.log"]


@pytest.mark.timeout(600)
def test_a_node_that_never_joins_ends_the_run_within_the_deadline(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    p0 = _node(0, tmp_path / "n0", endpoint, "--nranks", "1", "--rdzv-timeout", "4")
    try:
        rc, out, err = _ended(p0, 240)
    finally:
        _stop(p0)
    wall = time.monotonic() - t0
    assert rc == 3, err
    lines = [ln for ln in err.splitlines() if ln.startswith("pcieprof: error")]
    assert len(lines) == 1 and f"rendezvous {endpoint}: node 1 of 2 did not join within 4 s" \
        in lines[0], err
    assert "Traceback" not in err
    # the deadline plus start-up (python, pcieprof) on a loaded 2-core machine, well under the
    # 180 s per case of a torchrun rendezvous timeout
    assert wall < 4 + 120, wall
    m = json.loads((tmp_path / "n0" / "manifest.json").read_text())
    assert m["nodes"]["nnodes"] == 2 and m["nodes"]["nodes"] == []
    assert "node 1 of 2 did not join" in m["why"]
    # the other way round: node 1 alone names node 0
    p1 = _node(1, tmp_path / "n1", endpoint, "--nranks", "1", "--rdzv-timeout", "3")
    try:
        rc, _, err = _ended(p1, 240)
    finally:
        _stop(p1)
    assert rc == 3 and f"rendezvous {endpoint}: node 0 did not answer within 3 s" in err


@pytest.mark.timeout(900)
def test_a_node_killed_mid_sweep_stops_the_cross_node_cases_at_once(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    n0, n1 = tmp_path / "n0", tmp_path / "n1"
    # a rendezvous timeout far above the bound on `after` below: a node 0 that waited for one
    # per case would show, however loaded the machine
    three = ("--nranks", "1", "--variants", "default,proto_ll,nch2", "--rdzv-timeout", "600")
    p0 = _node(0, n0, endpoint, *three)
    p1 = _node(1, n1, endpoint, *three)
    try:
        table = n0 / "allreduce.csv"
        deadline = time.monotonic() + 300
        while not (table.is_file() and len(table.read_text().splitlines()) > 1):
            assert time.monotonic() < deadline, "no all-reduce row within 300 s"
            if p0.poll() is not None or p1.poll() is not None:
                _stop(p0, p1)
                pytest.fail(_said(_ended(p0, 60), _ended(p1, 60)))
            time.sleep(0.1)
        p1.send_signal(signal.SIGKILL)  # the whole node 1 process, as a machine lost
        p1.wait(timeout=60)
        t_kill = time.monotonic()
        end0 = _ended(p0, 300)
        rc0, _, err0 = end0
        after = time.monotonic() - t_kill
    finally:
        _stop(p0, p1)
    assert rc0 == 0, _said(end0)
    assert after < 120, after  # at once: no per-case rendezvous timeout (600 s)
    b0 = Bundle.open(n0)
    part = b0.part("allreduce")
    assert b0.manifest.status == "partial" and part.status == "partial"
    assert "node 1 (" in part.why and "lost" in part.why
    assert part.extra["cases"] + part.extra["not_run"] == 3 and part.extra["not_run"] >= 1
    ar = b0.read_table("allreduce")
    # ok and failed rows name the same group
    assert set(ar["nranks"]) == {2} and set(ar["ranks"]) == {(0, 1)}
    assert set(ar["variant"]) <= {"default", "proto_ll"}
    assert err0.count("the remaining cross-node cases are not run") == 1
    # the dead node's bundle: its writer is gone, so the next reader finds it interrupted
    b1 = Bundle.open(n1)
    assert b1.manifest.status == "interrupted"
    assert b1.part("allreduce").status == "interrupted"
    assert f"pid {p1.pid}" in b1.manifest.why


@pytest.mark.parametrize("argv, says", [
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"], "--nnodes 2 needs --node-rank"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"],
     "--node-rank 2 is not in 0..1"),
    (["--nnodes", "2", "--node-rank", "1"], "--nnodes 2 needs --rdzv-endpoint"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "nohost"], "expected HOST:PORT"),
    (["--node-rank", "1"], "--node-rank 1 needs --nnodes above 1"),
    # unused on one node, but a malformed endpoint is refused, not passed over silently
    (["--rdzv-endpoint", "127.0.0.1:41303:5"], "--rdzv-endpoint '127.0.0.1:41303:5': expected"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:1",
      "--rdzv-token-file", "/nonexistent/tok"], "--rdzv-token-file /nonexistent/tok: cannot read"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1", "--ring-order",
      "1,0"], "--ring-order orders the GPUs of one node"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1", "--backend", "sim"],
     "--backend sim models one box"),
])
def test_bad_node_options_get_one_line(tmp_path: Path, argv: list[str], says: str) -> None:
    r = cli("topology", "--backend", "cpu", "--out", str(tmp_path / "b"), *argv)
    assert r.returncode == 2
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_several_nodes_without_a_shared_token_stop_before_the_bundle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PCIEPROF_RDZV_TOKEN")
    r = cli("topology", "--backend", "cpu", "--out", str(tmp_path / "b"), "--nnodes", "2",
            "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:1")
    assert r.returncode == 2 and "shared rendezvous token" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "b").exists()
