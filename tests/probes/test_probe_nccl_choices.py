"""What NCCL chose, recorded per variant from a real NCCL_DEBUG=INFO log (shared samples)."""

from __future__ import annotations

import shutil
from pathlib import Path

from pcieprof.bundle import Bundle
from pcieprof.probe_runner import ProbeRunner
from probes.plan import build_plan


def test_choices_from_a_real_nccl_log(tmp_path: Path, samples: Path) -> None:
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cuda")
    plan = build_plan("cuda", [3, 1, 0, 2], quick=True)
    runner = ProbeRunner(bundle, plan)
    try:
        log = bundle.file("nccl/default.log")
        shutil.copy(samples / "tool-outputs" / "nccl_debug_info_4x5060ti_p2p_cumem.log", log)
        case = plan.allreduce[0]
        entry = runner._entry(case, "nccl/default.log", case.ranks)
        parsed = runner._parse("nccl/default.log", entry)
    finally:
        runner.cleanup()
    assert parsed is not None
    assert parsed["nccl_version"].startswith("2.28.9")
    assert parsed["peer_transport"]["0->1"] == "P2P/CUMEM"
    assert parsed["rings"]["0"] == [0, 1, 2, 3]
    assert entry["rank_to_device"] == {"0": 3, "1": 1, "2": 0, "3": 2}
    assert entry["log"] == "nccl/default.log"


def test_cpu_choices_say_nccl_was_not_used(tmp_path: Path) -> None:
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    plan = build_plan("cpu", [0, 1], quick=True)
    runner = ProbeRunner(bundle, plan)
    try:
        case = plan.allreduce[2]
        entry = runner._entry(case, "nccl/proto_ll.log", case.ranks)
    finally:
        runner.cleanup()
    assert entry["parsed"] is None and "gloo ignores NCCL_* settings" in entry["note"]
