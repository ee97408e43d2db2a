"""A machine whose copies all hang costs a few deadlines, not one per case (issue 23 pt 5).

A VM that advertises P2P but breaks it hangs every peer copy; the runner resumed after each hang,
a deadline plus a launch each: on 8 GPUs about 200 copy cases, hours. The runner's launch is
replaced here by one that hangs at the first case it is asked to run (what such a VM does), and
the plan is the full 8-GPU one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pcieprof.bundle import Bundle
from pcieprof.probe_runner import HANGS_PER_CLASS, LaunchResult, ProbeRunner
from probes.p2p_worker import case_order
from probes.plan import build_plan


def test_every_copy_hangs_and_each_class_stops_after_its_first_hangs(tmp_path: Path) -> None:
    plan = build_plan("cuda", list(range(8)))
    plan.allreduce = []
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cuda")
    runner = ProbeRunner(bundle, plan)
    launches: list[list[str]] = []

    envs: list[dict[str, str]] = []

    def hang_at_first(module: str, args: list[str], nproc: int, env: dict[str, str],
                      *_a: Any, **_k: Any) -> LaunchResult:
        launches.append(args)
        envs.append(env)
        opt = {k: args[args.index(k) + 1] for k in ("--resume", "--skip") if k in args}
        part, idx = case_order(runner.plan, "both", opt.get("--resume", ""),
                               opt.get("--skip", ""))[0]
        return LaunchResult("hang", None, {"part": part, "case": idx}, 0,
                            "no progress for 60 s; launch killed")

    runner._run = hang_at_first  # type: ignore[method-assign]
    try:
        out = runner.run_copies()
    finally:
        runner.cleanup()
    classes = {"p2p", "host_staged", "h2d", "d2h", "concurrent"}
    assert len(launches) == HANGS_PER_CLASS * len(classes)  # was one per case: 200+
    p2p = bundle.read_table("p2p")
    assert len(p2p) == len(plan.p2p)  # every case has its row
    assert (p2p["status"] == "hang").sum() == HANGS_PER_CLASS * 4
    assert set(p2p["status"]) == {"hang", "not_run"}
    assert p2p[p2p["status"] == "not_run"]["detail"].str.contains("cases hung").all()
    cc = bundle.read_table("concurrent")
    assert set(cc["status"]) == {"hang", "not_run"}
    assert out["p2p"]["status"] == "partial" and out["p2p"]["not_run"] == len(plan.p2p) - 8
    assert "not run after hangs" in out["p2p"]["why"]
    # issue 23 pt 8: the copy buffers must not be expandable segments (VMM memory, which the
    # probe's cudaDeviceEnablePeerAccess does not map for peers)
    assert all(e["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False" for e in envs)


def test_the_copy_worker_leaves_out_the_classes_it_is_told_to() -> None:
    plan = build_plan("cuda", [0, 1], quick=True)
    order = case_order(plan, "both", "p2p:1", "p2p,concurrent")
    assert order and all(p == "p2p" and plan.p2p[i].path != "p2p" for p, i in order)
    assert order[0][1] >= 1
