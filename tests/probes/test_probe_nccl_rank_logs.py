"""NCCL's INFO lines reach the bundle whole (issue 23 pt 1).

NCCL prints them with C stdio (src/debug.cc): to stdout, block-buffered when stdout is a file, and
the workers leave through os._exit, so without NCCL_DEBUG_FILE each rank loses its last block and
the ranks' blocks interleave mid-line. A GPU launch cannot run here, so torchrun is replaced by a
stand-in that behaves that way: it starts one process per rank, each writes the lines its rank
printed in a real NCCL 2.28.9 log (../shared/samples/tool-outputs/nccl_debug_info_4x5060ti_p2p_
cumem.log, 4 ranks) through a 4 KiB stdout buffer and leaves with os._exit, unless NCCL_DEBUG_FILE
names a file: then, as NCCL does, it writes there (`%p` = its pid), line-buffered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pcieprof import probe_runner
from pcieprof.bundle import Bundle
from pcieprof.importers.nccl_log import parse_nccl_log
from pcieprof.probe_runner import ProbeRunner
from probes import variants as V
from probes.plan import build_plan

LOG = "tool-outputs/nccl_debug_info_4x5060ti_p2p_cumem.log"

RANK = r'''
import json, os, re, sys, time
log, rows, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(f"{rows}/rank{rank}.jsonl", "a") as ev:
    ev.write(json.dumps({"event": "init", "rank": rank, "pid": os.getpid(), "t": time.time()}) + "\n")
lines = [ln for ln in open(log, "rb").read().splitlines(keepends=True)
         if re.match(rb"\S+:\d+:\d+ \[%d\] " % rank, ln)]
target = os.environ.get("NCCL_DEBUG_FILE")
if target:  # NCCL: fopen(..., "w") + setlinebuf
    out = open(target.replace("%p", str(os.getpid())), "wb", buffering=0)
    for ln in lines:
        out.write(ln)
else:  # C stdout on a regular file: 4 KiB blocks, never flushed before os._exit
    out = os.fdopen(1, "wb", buffering=4096)
    for ln in lines:
        out.write(ln)
with open(f"{rows}/rank{rank}.jsonl", "a") as ev:
    ev.write(json.dumps({"event": "done", "rank": rank, "size": 8, "t": time.time()}) + "\n")
    ev.write(json.dumps({"event": "finished", "rank": rank, "t": time.time()}) + "\n")
os._exit(0)
'''


class StdioLaunches:
    """Stands in for subprocess.Popen in the runner: each torchrun launch becomes one process per
    rank that writes its NCCL lines as C stdio would."""

    def __init__(self, log: Path, script: Path) -> None:
        self.log, self.script = log, script
        self.real = subprocess.Popen
        self.envs: list[dict[str, str]] = []

    def __call__(self, cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
        if "torch.distributed.run" not in cmd:
            return self.real(cmd, **kw)
        self.envs.append(dict(kw["env"]))
        nproc = int(cmd[cmd.index("--nproc-per-node") + 1])
        rows = cmd[cmd.index("--rows") + 1]
        ranks = " & ".join(f"{sys.executable} {self.script} {self.log} {rows} {r}"
                           for r in range(nproc))
        return self.real(["sh", "-c", f"{ranks} & wait"], **kw)


def test_every_rank_s_nccl_lines_reach_the_log_whole(tmp_path: Path, samples: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    launches = StdioLaunches(samples / LOG, script)
    monkeypatch.setattr(probe_runner.subprocess, "Popen", launches)
    plan = build_plan("cuda", [1, 2, 3, 4], quick=True, max_size=64,
                      variants=[V.VARIANTS["default"]], group_kinds=[])
    plan.p2p, plan.concurrent = [], []
    bundle = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cuda")
    steps: list[int] = []
    runner = ProbeRunner(bundle, plan, on_progress=lambda what, n: steps.append(n)
                         if what == "step" else None)
    try:
        runner.run_allreduce()
    finally:
        runner.cleanup()
    want = (samples / LOG).read_bytes().splitlines()
    real = parse_nccl_log((samples / LOG).read_text())
    for name in ("nccl/default.tuning.log", "nccl/default.log"):
        got = bundle.file(name).read_bytes().splitlines()
        nccl = [ln for ln in got if b" NCCL " in ln]
        assert sorted(nccl) == sorted(want), name  # every line, none cut, none twice
        parsed = parse_nccl_log(bundle.file(name).read_text())
        assert parsed.rings == real.rings
    assert len(launches.envs) == 2  # the untimed launch with the tuner log, then the timed one
    assert all("%p" in e["NCCL_DEBUG_FILE"] for e in launches.envs)
    assert steps == [1, 1]  # rank 0's step of each launch moves the progress bar (issue 24)
    choices = json.loads(bundle.file("nccl_choices.json").read_text())
    assert choices["default"]["parsed"]["rings"] == real.rings


def test_a_rank_killed_mid_line_leaves_no_cut_line(tmp_path: Path) -> None:
    rows = tmp_path / "launch1"
    rows.mkdir()
    (rows / "nccl.200.log").write_bytes(b"h:200:1 [1] NCCL INFO Channel 00/02 : 0 1 2 3\n"
                                        b"h:200:1 [1] NCCL INFO Channel 01/02 : 0 1 2")
    (rows / "nccl.100.log").write_bytes(b"h:100:1 [0] NCCL INFO comm 0x1 rank 0 nranks 4\n")
    log = tmp_path / "x.log"
    log.write_bytes(b"torchrun says\n")
    events = [{"event": "init", "rank": 1, "pid": 200}, {"event": "init", "rank": 0, "pid": 100}]
    assert probe_runner.append_rank_logs(rows, log, events) == 2
    assert log.read_bytes().splitlines() == [
        b"torchrun says", b"h:100:1 [0] NCCL INFO comm 0x1 rank 0 nranks 4",
        b"h:200:1 [1] NCCL INFO Channel 00/02 : 0 1 2 3"]
