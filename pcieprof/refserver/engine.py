"""What every rank does each step: the plan rank 0 broadcasts, and its execution.

Rank 0's scheduler decides a StepPlan (which requests, which new tokens, profiler commands,
injected faults) and broadcasts it over the CPU group, as SGLang's scheduler broadcasts its
requests to the other TP ranks (broadcast_pyobj on a gloo group); then all ranks run the same
forward, whose collectives go over the TP group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from pcieprof.refserver.logs import rank_log
from pcieprof.refserver.model import KVCache, TinyMoEModel
from pcieprof.refserver.names import step_span_name
from pcieprof.refserver.profiling import ProfileStart, RankProfiler


@dataclass
class ReqSlice:
    """One request's part of a step.

    Attributes:
        rid: the request's integer id (same on every rank).
        token_ids: the new tokens (the prompt for EXTEND, the last token for DECODE).
        start: position of the first new token.
        capacity: KV-cache length to allocate at EXTEND (prompt + max new tokens).
    """

    rid: int
    token_ids: list[int]
    start: int
    capacity: int


@dataclass
class StepPlan:
    """Everything the ranks need for one step, decided by rank 0.

    Attributes:
        step: forward-step counter (0-based, counts EXTEND and DECODE steps).
        mode: "EXTEND", "DECODE", or None for a step that only carries commands.
        reqs: the batch.
        free: requests whose KV caches can be dropped.
        profile_stop: stop the profiler (and write the trace) before this step.
        profile_start: start the profiler before this step.
        poison: injected fault: NaN logits in this step.
        hang: injected fault: stop making progress in this step.
        shutdown: leave the loop.
    """

    step: int
    mode: str | None = None
    reqs: list[ReqSlice] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    profile_stop: bool = False
    profile_start: ProfileStart | None = None
    poison: bool = False
    hang: bool = False
    shutdown: bool = False


def broadcast_plan(plan: StepPlan | None, cpu_group: Any, world_size: int) -> StepPlan:
    """Send (rank 0) or receive (other ranks) the step plan."""
    if world_size == 1:
        assert plan is not None
        return plan
    box: list[Any] = [plan]
    dist.broadcast_object_list(box, src=0, group=cpu_group)
    return box[0]


class RankEngine:
    """One rank's model, KV caches and profiler, stepping through plans."""

    def __init__(self, model: TinyMoEModel, tp_rank: int, world_size: int, cpu_group: Any) -> None:
        self.model = model
        self.tp_rank = tp_rank
        self.world_size = world_size
        self.cpu_group = cpu_group
        self.caches: dict[int, KVCache] = {}
        self.profiler = RankProfiler(tp_rank)
        self.last_trace: str | None = None

    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        """Run one plan; returns the logits of a forward step (None for command-only steps)."""
        for rid in plan.free:
            self.caches.pop(rid, None)
        if plan.profile_stop:
            path = self.profiler.stop()
            self.last_trace = str(path) if path else None
            if self.world_size > 1:
                dist.barrier(group=self.cpu_group)
        if plan.profile_start is not None:
            self.profiler.start(plan.profile_start)
        if plan.hang:
            self._hang()
        if plan.mode is None:
            return None
        caches = []
        for r in plan.reqs:
            if plan.mode == "EXTEND":
                self.caches[r.rid] = self.model.new_cache(r.capacity)
            caches.append(self.caches[r.rid])
        tokens = [t for r in plan.reqs for t in r.token_ids]
        segs = [(r.start, len(r.token_ids)) for r in plan.reqs]
        with torch.profiler.record_function(step_span_name(plan.mode, len(plan.reqs),
                                                           len(tokens))):
            logits = self.model.forward(tokens, segs, caches, poison=plan.poison)
        self.profiler.step()
        return logits

    def _hang(self) -> None:
        if self.tp_rank == 0 and self.world_size > 1:
            # Rank 0 goes on into the forward and waits in its first all_reduce for peers that
            # never come: a real collective hang, as NCCL hangs over a broken P2P path.
            rank_log.warning("[pcieprof inject] hang: this step's collectives will never "
                             "complete (injected fault)")
            return
        rank_log.warning("[pcieprof inject] hang: this rank stops making progress "
                         "(injected fault)")
        while True:
            time.sleep(3600)

    def shutdown(self) -> None:
        if self.profiler.active:
            self.profiler.stop()
