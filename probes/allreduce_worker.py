"""All-reduce sweep of one variant over one group (allreduce.csv), run inside torchrun workers.

    NCCL_...=... python -m torch.distributed.run --standalone --nproc-per-node N \
        -m probes.allreduce_worker --plan plan.json --case K --rows DIR

(how it can be run by hand; pcieprof's runner starts one-node launches on loopback only, with the
ranks meeting at a FileStore: probes.rows.init_group)

One launch is one `AllReduceCase`: a fresh process group, because NCCL reads its environment at
communicator init. On `cuda` the runner sets CUDA_VISIBLE_DEVICES to the case's ring order, so
local rank r drives GPU ranks[r]; on `cpu` the group is gloo over N local processes.

Per size and dtype, as nccl-tests times: `warmup` untimed all-reduces, then `TRIALS` trials,
each a barrier (and, on cuda, a device synchronize) followed by `iters` all-reduces back to back
between one start and one end mark (CUDA events on the current stream on cuda, perf_counter_ns on
cpu), so the host's time to issue one all-reduce is not inside each measurement. On cuda the
timed figure (`time_us`) is that loop captured once in a CUDA graph and replayed per trial
(`time_graph`): called from Python, at 8 B-64 KiB on PCIe GPUs the host's time per call can
exceed the collective's, the stream drains between calls and the loop times host dispatch,
while nccl-tests calls NCCL directly and SGLang's decode all-reduces run inside CUDA graphs; the
Python loop's figure stays beside it (`time_us_eager`). A trial gives
time / iters; each rank's per-trial times are reduced with MAX (a collective ends with its slowest
rank) and the row keeps the median over trials, with the fastest and slowest trial as min and max.
algbw = size / time and busbw = algbw * 2(n-1)/n (nccl-tests). After the timed ones, one
all-reduce of known values is checked (every rank adds ones: the sum is n, `check_sum`); a wrong
sum gives status=error.

`--untimed`: one all-reduce per size and dtype and no rows. The runner launches each cuda case
this way first, with NCCL's TUNING log on (one line per collective, written by rank 0 while the
collective runs), and the timed launch without it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from pcieprof.bundle.rows import AllReduceRow
from pcieprof.schema import busbw_factor_allreduce
from probes.gpu_api import CudaApi, TorchCuda
from pcieprof.bundle.plan import AllReduceCase, Plan
from probes.plan import iters_for
from probes.rows import RowWriter, die_with_parent, dist_env, exit_now, init_group, test_hook

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: Bytes one size may move in timed iterations (fewer iterations at large sizes, never fewer
#: than 3): 512 MiB on cuda, 3 iterations at 256 MiB; 2 GiB made the large sizes most of an
#: 8-GPU case's time once each is timed twice (eager and as a CUDA graph).
BUDGET_BYTES = {"cuda": 512 * 1024**2, "cpu": 64 * 1024**2}
#: Timed trials per size (each `iters` all-reduces back to back).
TRIALS = 5


def time_back_to_back(op: Callable[[], object], iters: int, trials: int, *,
                      api: CudaApi | None = None, device: int = 0,
                      start: Callable[[], object] = lambda: None) -> list[float]:
    """Seconds per operation, one value per trial: `start()` (a barrier), then `iters` calls of
    `op` back to back between one start and one end mark, as nccl-tests times a collective.

    Args:
        op: one operation (an all-reduce).
        iters: operations per trial.
        trials: trials.
        api: CUDA calls (events on `device`'s current stream); None: host clock (perf_counter_ns)
            around blocking operations.
        device: CUDA ordinal of this rank.
        start: what begins each trial (a barrier across ranks).
    """
    out = []
    for _ in range(trials):
        start()
        if api is None:
            t0 = time.perf_counter_ns()
            for _ in range(iters):
                op()
            out.append((time.perf_counter_ns() - t0) / 1e9 / iters)
            continue
        api.synchronize(device)  # the previous trial's work is done: the trial starts empty
        stream = api.current_stream(device)
        e0, e1 = api.event(), api.event()
        e0.record(stream)
        for _ in range(iters):
            api.enqueue(stream, op)
        e1.record(stream)
        e1.synchronize()
        out.append(e0.elapsed_time(e1) / 1e3 / iters)
    return out


#: Seconds the stream is held before a graph replay, so the launch's host time stays outside the
#: events (the copies' hold, probes.p2p_worker).
GRAPH_HOLD_S = 1e-4


def time_graph(op: Callable[[], object], iters: int, trials: int, *, api: CudaApi,
               device: int = 0, start: Callable[[], object] = lambda: None) -> list[float]:
    """Seconds per operation, one value per trial, with the `iters` operations captured once as a
    CUDA graph and each trial one replay between two events: the way SGLang's decode runs its
    all-reduces, and free of the host's time per call, which at small sizes on PCIe GPUs can
    exceed the collective's and drain the stream between eager calls.

    Args: as `time_back_to_back` (`api` required: graphs are CUDA's).
    """
    graph = api.capture(device, op, iters)
    out = []
    for _ in range(trials):
        start()
        api.synchronize(device)
        stream = api.current_stream(device)
        api.block(stream, GRAPH_HOLD_S)
        e0, e1 = api.event(), api.event()
        e0.record(stream)
        api.replay(stream, graph)
        e1.record(stream)
        e1.synchronize()
        out.append(e0.elapsed_time(e1) / 1e3 / iters)
    return out


def check_sum(world: int) -> float:
    """The sum the data check expects: every rank contributes ones, so a rank left out (or
    counted twice) changes it, and every partial sum is an integer up to `world`, exact in bf16
    up to 256 ranks (8 bits of mantissa). Contributions of rank + 1 summed to world(world+1)/2,
    whose odd partial sums above 256 bf16 rounds: a false error from 23 ranks on."""
    return float(world)


def allreduce_row(case: AllReduceCase, backend: str, size: int, dtype: str,
                  times_s: list[float], ok: bool, detail: str = "",
                  ranks: tuple[int, ...] | None = None, iters: int = 1,
                  eager_s: list[float] | None = None) -> AllReduceRow:
    """The allreduce.csv row of one size from per-trial times (seconds per all-reduce, slowest
    rank); `iters` all-reduces per trial; `ranks` the group as the rows name it (several nodes:
    `Plan.global_ranks`, global GPU numbers), the case's devices by default. On cuda `times_s`
    are CUDA-graph replays and `eager_s` the same loop called from Python (time_us_eager)."""
    ranks = tuple(case.ranks) if ranks is None else tuple(ranks)
    n = len(ranks)
    row = AllReduceRow(backend=backend, variant=case.variant, env=dict(case.env), nranks=n,
                       ranks=ranks, size_bytes=size, dtype=dtype, iters=iters, detail=detail)
    if not ok:
        row.status, row.detail = "error", "all-reduce result is wrong (checked: every rank adds ones)"
        return row
    t = statistics.median(times_s)
    algbw = size / t / 1e9
    row.time_us, row.time_us_min, row.time_us_max = t * 1e6, min(times_s) * 1e6, max(times_s) * 1e6
    if eager_s:
        row.time_us_eager = statistics.median(eager_s) * 1e6
    row.algbw_gbps, row.busbw_gbps = algbw, algbw * busbw_factor_allreduce(n)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--case", required=True, type=int, help="index into plan.allreduce")
    ap.add_argument("--rows", required=True, type=Path, help="directory for rank<r>.jsonl")
    ap.add_argument("--untimed", action="store_true",
                    help="one all-reduce per size and dtype, no rows (the NCCL tuner log run)")
    args = ap.parse_args(argv)
    plan = Plan.from_json(json.loads(args.plan.read_text(encoding="utf-8")), str(args.plan))
    case = plan.allreduce[args.case]
    die_with_parent()
    rank, world, local_rank = dist_env()
    if world != plan.world(case):
        raise SystemExit(f"case {case.label} needs {plan.world(case)} ranks "
                         f"({plan.case_nodes(case)} node(s) x {len(case.ranks)}), got {world}")
    out = RowWriter(args.rows, rank)
    # longer than the runner's watchdog, so a stuck collective is killed and labelled a
    # hang by the runner rather than aborted by the process group's own timeout
    timeout = datetime.timedelta(seconds=2 * plan.timeout_s + 30)
    cuda = plan.backend == "cuda"
    out.event("init", pid=os.getpid())
    api: CudaApi | None = None
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        init_group("nccl", timeout, device_id=device)
        api = TorchCuda()
        if rank == 0:
            v = torch.cuda.nccl.version()
            out.event("versions", nccl=".".join(map(str, v)) if isinstance(v, tuple) else str(v))
    else:
        device = torch.device("cpu")
        init_group("gloo", timeout)
    out.event("ready")
    budget = BUDGET_BYTES["cuda" if cuda else "cpu"]
    try:
        for dtype in case.dtypes:
            tdt = TORCH_DTYPES[dtype]
            esize = torch.tensor([], dtype=tdt).element_size()
            for size in case.sizes:
                out.event("start", case=args.case, variant=case.variant, size=size, dtype=dtype)
                test_hook(rank, size, case.variant)
                x = torch.zeros(max(size // esize, 1), dtype=tdt, device=device)
                if args.untimed:
                    dist.all_reduce(x)
                    if api is not None:
                        api.synchronize(local_rank)
                    out.event("done", case=args.case, size=size, dtype=dtype)
                    continue
                iters = iters_for(size, case.iters, budget)
                dist.barrier()
                for _ in range(min(case.warmup, iters)):
                    dist.all_reduce(x)
                eager = time_back_to_back(lambda: dist.all_reduce(x), iters, TRIALS, api=api,
                                          device=local_rank, start=dist.barrier)
                graph, why = eager, ""
                if api is not None:  # the timed figure: the loop as a CUDA graph (see time_graph)
                    try:
                        graph = time_graph(lambda: dist.all_reduce(x), iters, TRIALS, api=api,
                                           device=local_rank, start=dist.barrier)
                    except RuntimeError as exc:
                        why = f"CUDA graph capture failed ({exc}); time_us is the eager loop"
                times = torch.tensor(graph + eager, dtype=torch.float64, device=device)
                x.fill_(1)
                dist.all_reduce(x)
                # one reduction for both: a collective ends with its slowest rank (MAX of the
                # times), and any rank that got a wrong sum raises the last element to 1
                wrong = float(not bool((x == check_sum(world)).all()))
                stats = torch.cat([times, torch.tensor([wrong], dtype=torch.float64, device=device)])
                dist.all_reduce(stats, op=dist.ReduceOp.MAX)
                if rank == 0:
                    got = [float(t) for t in stats[:-1].cpu()]
                    detail = "; ".join(d for d in (case.detail_at(size), why) if d)
                    out.row("allreduce", allreduce_row(
                        case, plan.backend, size, dtype, got[:TRIALS], float(stats[-1]) == 0.0,
                        detail, plan.global_ranks(case), iters,
                        eager_s=got[TRIALS:] if api is not None else None))
                out.event("done", case=args.case, size=size, dtype=dtype)
        out.event("finished")  # teardown from here on is not a hang
    finally:
        dist.destroy_process_group()
        out.close()
    return 0


if __name__ == "__main__":
    exit_now(main())
