"""torch.profiler on every rank, started and stopped at the same step, traces named as SGLang's.

SGLang (python/sglang/srt/managers/scheduler_profiler_mixin.py) writes one Chrome trace per rank
on stop, named

    [{profile_prefix}-]{profile_id}-TP-{tp_rank}[-{stage}].trace.json.gz

where profile_id is the time the profile was requested (`str(time.time())`) and stage, with
`profile_by_stage`, is the ForwardMode name of the window: `EXTEND` (prefill) or `DECODE`. The
output directory is the request's `output_dir`, else env `SGLANG_TORCH_PROFILER_DIR`, else /tmp.
Each step runs inside `record_function("step[DECODE bs=N]")` or `step[EXTEND bs=N toks=T]` as
SGLang's model runner names it (python/sglang/srt/model_executor/model_runner.py,
build_step_span_name), and the profiler's own `ProfilerStep#N` spans mark steps too.

Here every trace is written to a hidden temporary name in the same directory and renamed into
place, so a collector that waits for `*-TP-<r>*.trace.json.gz` never reads half a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from pcieprof.refserver.logs import rank_log as logger
from pcieprof.refserver.names import default_output_dir, trace_file_name


@dataclass
class ProfileStart:
    """A start command, broadcast to every rank with the step plan."""

    output_dir: str
    profile_id: str
    stage: str | None
    prefix: str | None
    activities: list[str]
    with_stack: bool
    record_shapes: bool


class RankProfiler:
    """One rank's profiler: starts, steps and stops on the commands of the step plan."""

    def __init__(self, tp_rank: int) -> None:
        self.tp_rank = tp_rank
        self._prof: torch.profiler.profile | None = None
        self._cmd: ProfileStart | None = None

    @property
    def active(self) -> bool:
        return self._prof is not None

    def start(self, cmd: ProfileStart) -> None:
        if self._prof is not None:
            self.stop()
        if "GPU" in cmd.activities:
            logger.info("Profiler activity GPU requested; this CPU-only server records CPU")
        self._cmd = cmd
        # A schedule that always records makes torch emit ProfilerStep#N spans on step().
        self._prof = torch.profiler.profile(
            activities=[ProfilerActivity.CPU],
            schedule=lambda _step: ProfilerAction.RECORD,
            with_stack=cmd.with_stack,
            record_shapes=cmd.record_shapes,
        )
        self._prof.start()
        stage = f" for {cmd.stage}" if cmd.stage else ""
        logger.info(f"Profiling starts{stage}. Traces will be saved to: {cmd.output_dir} "
                    f"(with profile id: {cmd.profile_id})")

    def step(self) -> None:
        if self._prof is not None:
            self._prof.step()

    def stop(self) -> Path | None:
        """Stop and write this rank's trace; returns its path (None if not profiling)."""
        if self._prof is None or self._cmd is None:
            return None
        prof, cmd = self._prof, self._cmd
        self._prof, self._cmd = None, None
        prof.stop()
        out = Path(cmd.output_dir).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        name = trace_file_name(cmd.profile_id, self.tp_rank, cmd.stage, cmd.prefix)
        # torch gzips when the name ends in .gz; the hidden name does not match *.trace.json.gz
        tmp = out / f".{name}.{os.getpid()}.partial.gz"
        prof.export_chrome_trace(str(tmp))
        final = out / name
        os.replace(tmp, final)
        logger.info(f"Stop profiling{'-' + cmd.stage if cmd.stage else ''}... "
                    f"Profiling done. Traces are saved to: {out} ({name})")
        return final


def profile_start_from_request(body: dict[str, Any], profile_id: str,
                               stage: str | None) -> ProfileStart:
    """Build the start command from a /start_profile body (SGLang's ProfileReqInput fields)."""
    acts = body.get("activities") or ["CPU", "GPU"]
    with_stack = body.get("with_stack")
    record_shapes = body.get("record_shapes")
    return ProfileStart(
        output_dir=str(body.get("output_dir") or default_output_dir()),
        profile_id=profile_id,
        stage=stage,
        prefix=body.get("profile_prefix") or None,
        activities=[str(a) for a in acts],
        # SGLang's defaults: with_stack True, record_shapes False
        with_stack=True if with_stack is None else bool(with_stack),
        record_shapes=False if record_shapes is None else bool(record_shapes),
    )
