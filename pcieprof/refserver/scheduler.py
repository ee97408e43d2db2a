"""Rank 0's scheduler: continuous batching, sampling, profiling windows and injected faults.

A thread on rank 0 runs the loop SGLang's scheduler runs: take new requests, run a prefill
(EXTEND) step for those that fit, otherwise one DECODE step for every running request, sample one
token per request, stream it to its client, retire finished requests. New requests join the
running batch at the next step, so concurrent clients share decode steps.

The HTTP side talks to this thread through thread-safe calls (submit, abort, profile commands);
tokens go back through `loop.call_soon_threadsafe`, once per step for the whole batch.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import traceback
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from pcieprof.refserver.args import ServerArgs
from pcieprof.refserver.engine import RankEngine, ReqSlice, StepPlan, broadcast_plan
from pcieprof.refserver.logs import rank_log
from pcieprof.refserver.metrics import ServerMetrics
from pcieprof.refserver.names import default_output_dir, trace_file_name
from pcieprof.refserver.profiling import profile_start_from_request
from pcieprof.refserver.tokenizer import BOS_ID, EOS_ID

# Longest prefill step, in new tokens; more waiting requests wait for the next step.
MAX_PREFILL_TOKENS = 8192


@dataclass
class Request:
    """One generation request as the scheduler tracks it.

    Attributes:
        rid: client-visible request id.
        prompt_ids: prompt token ids.
        max_new_tokens: output budget.
        temperature: 0 for greedy.
        top_p, top_k: nucleus / top-k filters (1.0 / -1 for off).
        ignore_eos: keep generating through EOS.
        seed: per-request sampling seed.
        on_token: called on the event loop with (request, token_id, finish_reason or None).
        log_metrics: counted in /metrics (False for health checks and warm-up).
        return_logprob: record the log-probability of each output token (`output_logprobs`).
    """

    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    ignore_eos: bool
    seed: int
    on_token: Callable[["Request", int, dict[str, Any] | None], None]
    log_metrics: bool = True
    return_logprob: bool = False
    num: int = -1
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    created: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: dict[str, Any] | None = None
    aborted: bool = False
    generator: torch.Generator | None = None


class _ProfileWindow:
    """SGLang's profiling policy (scheduler_profiler_mixin.py), decided on rank 0.

    Without profile_by_stage: profile from the next step for num_steps forward steps (or until
    /stop_profile); one trace per rank. With it: an EXTEND window that opens at the first
    prefill step and closes after num_steps prefill steps or at the first decode step, and a
    DECODE window that opens at the first decode step and closes after num_steps decode steps;
    traces suffixed -EXTEND / -DECODE. A prefill step inside the DECODE window is recorded in
    it but not counted, as SGLang does while its prefill count stays under num_steps (SGLang
    would then stop the decode profiler under the EXTEND name; this server does not).
    """

    def __init__(self, body: dict[str, Any], profile_id: str) -> None:
        self.body = body
        self.profile_id = profile_id
        self.by_stage = bool(body.get("profile_by_stage"))
        n = body.get("num_steps")
        self.num_steps = int(n) if n else None
        self.pending: list[str | None] = ["EXTEND", "DECODE"] if self.by_stage else [None]
        stages = body.get("profile_stages")
        if self.by_stage and stages:
            wanted = {"prefill": "EXTEND", "extend": "EXTEND", "decode": "DECODE"}
            self.pending = [wanted[s.lower()] for s in stages if s.lower() in wanted]
        self.active: str | None | bool = False  # False: no window open; else its stage
        self.count = 0
        self.files: list[str] = []

    def done(self) -> bool:
        return self.active is False and not self.pending


class Scheduler:
    """The rank-0 scheduling loop (run in a thread by `start`).

    Args:
        args: server arguments.
        engine: rank 0's engine (model shard, KV caches, profiler).
        cpu_group: the gloo group plans are broadcast on.
        metrics: counters and histograms behind /metrics and /get_server_info.
        on_fatal: called (from this thread) with the log text when the loop dies.
        is_stopping: true once the server is being stopped on purpose; the collectives that
            fail because the other ranks were stopped are then not an error.
    """

    def __init__(self, args: ServerArgs, engine: RankEngine, cpu_group: Any,
                 metrics: ServerMetrics, on_fatal: Callable[[str], None],
                 is_stopping: Callable[[], bool] = lambda: False) -> None:
        self.args = args
        self.engine = engine
        self.cpu_group = cpu_group
        self.metrics = metrics
        self.on_fatal = on_fatal
        self.is_stopping = is_stopping
        self.loop: asyncio.AbstractEventLoop | None = None
        self._cv = threading.Condition()
        self._incoming: deque[Request] = deque()
        self._aborts: set[int] = set()
        self._commands: deque[tuple[str, Any, Future]] = deque()
        self._ids = itertools.count()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free: list[int] = []
        self.step = 0
        self.ready = False
        self.served_decode_steps = 0  # decode steps since ready (for injected faults)
        self.last_output_time = 0.0  # time.time() of the last token out (health checks)
        self._window: _ProfileWindow | None = None
        self._stopping: list[tuple[_ProfileWindow, str | None]] = []
        self._prefill: list[Request] = []
        self._stop_waiters: list[Future] = []
        self.traces_written: list[str] = []
        self._log_tokens = 0
        self._log_t0 = time.perf_counter()
        self.last_gen_throughput = 0.0

    # ---- calls from the HTTP thread ----------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> threading.Thread:
        self.loop = loop
        t = threading.Thread(target=self._run, name="scheduler", daemon=True)
        t.start()
        return t

    def submit(self, req: Request) -> None:
        req.num = next(self._ids)
        req.generator = torch.Generator().manual_seed(req.seed)
        with self._cv:
            self._incoming.append(req)
            self._cv.notify()

    def abort(self, req: Request) -> None:
        req.aborted = True  # no more tokens delivered; the loop drops it at the next step
        with self._cv:
            self._aborts.add(req.num)
            self._cv.notify()

    def command(self, name: str, payload: Any = None) -> Future:
        """Queue a profiler command ("start_profile" / "stop_profile"); resolves with
        (ok, message)."""
        fut: Future = Future()
        with self._cv:
            self._commands.append((name, payload, fut))
            self._cv.notify()
        return fut

    def mark_ready(self) -> None:
        self.ready = True

    def load(self) -> dict[str, int]:
        return {"num_running_reqs": len(self.running), "num_queue_reqs": len(self.waiting)}

    # ---- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                plan = self._next_plan()
                if plan is None:
                    continue
                plan = broadcast_plan(plan, self.cpu_group, self.engine.world_size)
                t0 = time.perf_counter()
                logits = self.engine.execute(plan)
                if plan.profile_stop:
                    self._after_profile_stop()
                if plan.mode is not None:
                    self._finish_step(plan, logits, t0)
        except Exception:
            if self.is_stopping():
                return
            tb = traceback.format_exc()
            rank_log.error(f"Scheduler hit an exception: {tb}")
            self.on_fatal(tb)

    def _next_plan(self) -> StepPlan | None:
        with self._cv:
            if not (self._incoming or self._aborts or self._commands or self.waiting
                    or self.running or self._free or self._window_needs_stop()):
                self._cv.wait(timeout=0.5)
            self.waiting.extend(self._incoming)
            self._incoming.clear()
            aborts, self._aborts = self._aborts, set()
            commands = list(self._commands)
            self._commands.clear()
        plan = StepPlan(step=self.step)
        for name, payload, fut in commands:
            self._handle_command(name, payload, fut, plan)
        if aborts:
            self._apply_aborts(aborts)
        if self._window_needs_stop():
            self._close_window(plan)
        batch, mode = self._pick_batch()
        if mode is not None:
            plan.mode = mode
            plan.reqs = batch
            self._profile_policy(plan)
            self._inject(plan)
        plan.free, self._free = self._free, []
        if plan.mode is None and not (plan.free or plan.profile_stop or plan.profile_start):
            return None
        return plan

    def _pick_batch(self) -> tuple[list[ReqSlice], str | None]:
        room = self.args.max_running_requests - len(self.running)
        if self.waiting and room > 0:
            new: list[Request] = []
            tokens = 0
            while self.waiting and len(new) < room:
                nxt = self.waiting[0]
                if new and tokens + len(nxt.prompt_ids) > MAX_PREFILL_TOKENS:
                    break
                new.append(self.waiting.popleft())
                tokens += len(nxt.prompt_ids)
            self._prefill = new
            rank_log.info(f"Prefill batch. #new-seq: {len(new)}, #new-token: {tokens}, "
                          f"#cached-token: 0, token usage: {self.metrics.token_usage:.2f}, "
                          f"#running-req: {len(self.running)}, #queue-req: {len(self.waiting)}, ")
            return [ReqSlice(r.num, list(r.prompt_ids), 0,
                             len(r.prompt_ids) + r.max_new_tokens) for r in new], "EXTEND"
        if self.running:
            return [ReqSlice(r.num, [r.output_ids[-1]], len(r.prompt_ids) + len(r.output_ids) - 1,
                             0) for r in self.running], "DECODE"
        return [], None

    def _finish_step(self, plan: StepPlan, logits: torch.Tensor | None, t0: float) -> None:
        assert logits is not None
        reqs = self._prefill if plan.mode == "EXTEND" else self.running
        now = time.perf_counter()
        events: list[tuple[Request, int, dict[str, Any] | None]] = []
        for row, req in zip(logits, reqs):
            tok = self._sample(row, req, plan.poison)
            req.output_ids.append(tok)
            if req.return_logprob:
                req.output_logprobs.append(float(torch.log_softmax(row.float(), -1)[tok]))
            if req.first_token_at is None:
                req.first_token_at = now
            elif req.log_metrics:
                self.metrics.observe_itl(now - (req.last_token_at or now))
            req.last_token_at = now
            if tok == EOS_ID and not req.ignore_eos:
                req.finish_reason = {"type": "stop", "matched": EOS_ID}
            elif len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = {"type": "length", "length": req.max_new_tokens}
            events.append((req, tok, req.finish_reason))
        if plan.mode == "EXTEND":
            self.running.extend(self._prefill)
            self._prefill = []
        else:
            self.served_decode_steps += 1 if self.ready else 0
        finished = [r for r in self.running if r.finish_reason is not None]
        if finished:
            self.running = [r for r in self.running if r.finish_reason is None]
            self._free.extend(r.num for r in finished)
            for r in finished:
                if r.log_metrics:
                    self.metrics.observe_finished(len(r.prompt_ids), len(r.output_ids),
                                                  (r.first_token_at or now) - r.created,
                                                  now - r.created)
        self.metrics.observe_step(plan.mode, len(plan.reqs), now - t0)
        self.metrics.set_load(len(self.running), len(self.waiting), self._used_tokens())
        self.step += 1
        if self._window is not None and self._window.active is not False:
            w = self._window
            if w.active is None or w.active == plan.mode:
                w.count += 1
        self.last_output_time = time.time()
        self._log_decode(plan)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(_deliver, events)

    def _sample(self, logits: torch.Tensor, req: Request, poisoned: bool) -> int:
        # BOS is never an output, and under ignore_eos neither is EOS: every token then has
        # text, so clients that count non-empty stream chunks count every token.
        logits = logits.clone()
        logits[BOS_ID] = float("-inf")
        if req.ignore_eos:
            logits[EOS_ID] = float("-inf")
        if req.temperature <= 1e-6 and not poisoned:
            return int(torch.argmax(logits))
        # Under an injected NaN this is the path that fails, as SGLang's sampling does:
        # torch.multinomial itself raises "probability tensor contains either `inf`, `nan` or
        # element < 0" (the exact text of aten's multinomial check).
        temperature = req.temperature if req.temperature > 1e-6 else 1.0
        logits = logits / temperature
        if req.top_k > 0:
            kth = torch.topk(logits, min(req.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if req.top_p < 1.0:
            sorted_p, idx = probs.sort(descending=True)
            drop = sorted_p.cumsum(0) - sorted_p > req.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, idx, sorted_p)
        return int(torch.multinomial(probs, 1, generator=req.generator))

    def _apply_aborts(self, nums: set[int]) -> None:
        self.waiting = deque(r for r in self.waiting if r.num not in nums)
        kept = []
        for r in self.running:
            if r.num in nums:
                r.aborted = True
                self._free.append(r.num)
            else:
                kept.append(r)
        self.running = kept

    def _used_tokens(self) -> int:
        return sum(len(r.prompt_ids) + len(r.output_ids) for r in self.running)

    def _log_decode(self, plan: StepPlan) -> None:
        self._log_tokens += len(plan.reqs)
        if plan.mode != "DECODE" or self.metrics.decode_steps % self.args.decode_log_interval:
            return
        now = time.perf_counter()
        self.last_gen_throughput = self._log_tokens / max(now - self._log_t0, 1e-9)
        self.metrics.gen_throughput = self.last_gen_throughput
        self._log_tokens, self._log_t0 = 0, now
        rank_log.info(f"Decode batch. #running-req: {len(self.running)}, "
                      f"#token: {self._used_tokens()}, "
                      f"token usage: {self.metrics.token_usage:.2f}, "
                      f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                      f"#queue-req: {len(self.waiting)}, ")

    # ---- injected faults ---------------------------------------------------------------

    def _inject(self, plan: StepPlan) -> None:
        inj = self.args.inject
        if not self.ready or inj.kind == "none":
            return
        if inj.kind == "nan-after" and plan.mode == "DECODE" \
                and self.served_decode_steps == inj.after_steps:
            rank_log.warning(f"[pcieprof inject] nan-after {inj.after_steps}: decode step "
                             f"{inj.after_steps + 1} after readiness gets NaN logits "
                             f"(injected fault)")
            plan.poison = True
        if inj.kind == "hang" and self.served_decode_steps >= inj.after_steps:
            rank_log.warning(f"[pcieprof inject] hang after {self.served_decode_steps} decode "
                             f"steps: the server stops making progress (injected fault)")
            plan.hang = True

    # ---- profiling ---------------------------------------------------------------------

    def _handle_command(self, name: str, body: Any, fut: Future, plan: StepPlan) -> None:
        if name == "start_profile":
            if self._window is not None and self._window.active is not False:
                fut.set_result((False, "Profiling is already in progress. "
                                       "Call /stop_profile first."))
                return
            body = dict(body or {})
            problem = _profile_request_problem(body)
            if problem:
                fut.set_result((False, problem))
                return
            self._window = _ProfileWindow(body, str(time.time()))
            if not self._window.by_stage:
                self._open_window(plan, None)
            fut.set_result((True, "Start profiling.\n"))
        elif name == "stop_profile":
            w = self._window
            if w is None or w.active is False:
                self._window = None
                fut.set_result((False, "Profiling is not in progress. "
                                       "Call /start_profile first."))
                return
            w.pending = []
            self._close_window(plan)
            self._stop_waiters.append(fut)

    def _open_window(self, plan: StepPlan, stage: str | None) -> None:
        w = self._window
        assert w is not None
        w.active = stage
        w.count = 0
        if stage in w.pending:
            w.pending.remove(stage)
        plan.profile_start = profile_start_from_request(w.body, w.profile_id, stage)

    def _close_window(self, plan: StepPlan) -> None:
        """Stop the open window before this plan's step; its traces are written then."""
        w = self._window
        assert w is not None and w.active is not False
        self._stopping.append((w, None if isinstance(w.active, bool) else w.active))
        plan.profile_stop = True
        w.active = False
        if w.done():
            self._window = None

    def _window_needs_stop(self) -> bool:
        w = self._window
        if w is None or w.active is False:
            return False
        return w.num_steps is not None and w.count >= w.num_steps

    def _profile_policy(self, plan: StepPlan) -> None:
        w = self._window
        if w is None or not w.by_stage:
            return
        if w.active == "EXTEND" and plan.mode != "EXTEND":
            self._close_window(plan)  # the first decode step ends the prefill window
            w = self._window
            if w is None:
                return
        if w.active is False and plan.mode in w.pending:
            self._open_window(plan, plan.mode)

    def _after_profile_stop(self) -> None:
        for w, stage in self._stopping:
            self.traces_written.extend(_trace_path(w, r, stage)
                                       for r in range(self.engine.world_size))
        self._stopping = []
        for fut in self._stop_waiters:
            fut.set_result((True, "Stop profiling. This will take some time.\n"))
        self._stop_waiters = []

    def profile_state(self) -> dict[str, Any]:
        w = self._window
        return {
            "in_progress": bool(w is not None and w.active is not False),
            "pending_stages": list(w.pending) if w else [],
            "traces_written": list(self.traces_written),
        }


def _profile_request_problem(body: dict[str, Any]) -> str | None:
    """Why a /start_profile body cannot be served here, or None."""
    if body.get("start_step") is not None:
        return "start_step is not supported by the pcieprof reference server"
    if body.get("merge_profiles"):
        return "merge_profiles is not supported by the pcieprof reference server"
    n = body.get("num_steps")
    if n is not None and (not isinstance(n, int) or n < 1):
        return "num_steps must be a positive integer"
    if body.get("profile_by_stage") and not n:
        return "profile_by_stage needs num_steps"
    out = Path(str(body.get("output_dir") or default_output_dir())).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create output_dir {out}: {exc.strerror}"
    if not os.access(out, os.W_OK):
        return f"output_dir {out} is not writable"
    return None


def _trace_path(w: _ProfileWindow, rank: int, stage: str | None) -> str:
    out = Path(str(w.body.get("output_dir") or default_output_dir())).expanduser()
    prefix = w.body.get("profile_prefix") or None
    return str(out / trace_file_name(w.profile_id, rank, stage, prefix))


def _deliver(events: list[tuple[Request, int, dict[str, Any] | None]]) -> None:
    for req, tok, finish in events:
        if not req.aborted:
            req.on_token(req, tok, finish)
