"""What NCCL chose, recorded per variant from a real NCCL_DEBUG=INFO log (shared samples)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclCase, NcclChoices
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
    assert str(parsed.nccl_version).startswith("2.28.9")
    assert parsed.peer_transport["0->1"] == "P2P/CUMEM"
    assert parsed.rings["0"] == [0, 1, 2, 3]
    assert entry.rank_to_device == {"0": 3, "1": 1, "2": 0, "3": 2}
    assert entry.log == "nccl/default.log"
    # written and read back through the typed document: NCCL's rank-space ring as devices
    entry.parsed = parsed
    doc = NcclChoices(cases={"default": entry}).to_json()
    case = NcclChoices.from_json(json.loads(json.dumps(doc))).cases["default"]
    assert case.ring_devices() == [3, 1, 0, 2]


def test_cpu_choices_say_nccl_was_not_used(tmp_path: Path) -> None:
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    plan = build_plan("cpu", [0, 1], quick=True)
    runner = ProbeRunner(bundle, plan)
    try:
        case = plan.allreduce[2]
        entry = runner._entry(case, "nccl/proto_ll.log", case.ranks)
    finally:
        runner.cleanup()
    assert entry.parsed is None and "gloo ignores NCCL_* settings" in entry.note


def test_tuning_choices_get_the_dtype_of_their_all_reduce() -> None:
    # issue 23 pt 8: a TUNING line names bytes only, so bf16 and fp32 of one size merged; the
    # untimed launch runs dtype by dtype, size by size, and rank 0 logs in that order
    from pcieprof.probe_runner import with_dtypes
    from pcieprof.bundle.plan import AllReduceCase

    case = AllReduceCase("default", {}, [0, 1], [8, 16], ["bf16", "fp32"], 1, 1)
    algo = ["TREE", "RING", "RING", "RING"]
    tuner = [{"coll": "AllReduce", "bytes": b, "algo": a, "proto": "LL"}
             for b, a in zip([8, 16, 8, 16], algo)]
    entry = NcclCase("default")
    got = with_dtypes(tuner, case, entry)
    assert [(t["bytes"], t["dtype"], t["algo"]) for t in got] == [
        (8, "bf16", "TREE"), (16, "bf16", "RING"), (8, "fp32", "RING"), (16, "fp32", "RING")]
    # a log that does not match the launch's sequence is left as it was, and says so
    short = with_dtypes(tuner[:3], case, entry)
    assert all("dtype" not in t for t in short) and "dtypes not assigned" in str(entry.extra["notes"])
