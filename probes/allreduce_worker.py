"""All-reduce sweep of one variant over one group (allreduce.csv), run inside torchrun workers.

    NCCL_...=... python -m torch.distributed.run --standalone --nproc-per-node N \
        -m probes.allreduce_worker --plan plan.json --case K --rows DIR

One launch is one `AllReduceCase`: a fresh process group, because NCCL reads its environment at
communicator init. On `cuda` the runner sets CUDA_VISIBLE_DEVICES to the case's ring order, so
local rank r drives GPU ranks[r]; on `cpu` the group is gloo over N local processes.

Per size and dtype: `warmup` untimed all-reduces, then timed ones (each timed on its own: CUDA
events on cuda, perf_counter_ns on cpu); a row keeps the median over iterations of the slowest
rank's time, with min and max. algbw = size / time and busbw = algbw * 2(n-1)/n (nccl-tests).
After the timed ones, one all-reduce of known values is checked (sum of rank+1 over n ranks);
a wrong sum gives status=error.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from pcieprof.bundle.rows import AllReduceRow
from pcieprof.schema import busbw_factor_allreduce
from probes.plan import AllReduceCase, Plan, iters_for
from probes.rows import RowWriter, die_with_parent, dist_env, exit_now, test_hook

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: Bytes one size may move in timed iterations (fewer iterations at large sizes).
BUDGET_BYTES = {"cuda": 2 * 1024**3, "cpu": 64 * 1024**2}


def allreduce_row(case: AllReduceCase, backend: str, size: int, dtype: str,
                  times_s: list[float], ok: bool, detail: str = "", world: int = 0
                  ) -> AllReduceRow:
    """The allreduce.csv row of one size from per-iteration times (seconds, slowest rank);
    `world` is the process-group size when it spans several nodes."""
    n = world or len(case.ranks)
    # several nodes: the global ranks (each node runs the case's devices in its ring order)
    ranks = tuple(case.ranks) if n == len(case.ranks) else tuple(range(n))
    row = AllReduceRow(backend=backend, variant=case.variant, env=dict(case.env), nranks=n,
                       ranks=ranks, size_bytes=size, dtype=dtype, iters=len(times_s),
                       detail=detail)
    if not ok:
        row.status, row.detail = "error", "all-reduce result is wrong (checked sum of rank+1)"
        return row
    t = statistics.median(times_s)
    algbw = size / t / 1e9
    row.time_us, row.time_us_min, row.time_us_max = t * 1e6, min(times_s) * 1e6, max(times_s) * 1e6
    row.algbw_gbps, row.busbw_gbps = algbw, algbw * busbw_factor_allreduce(n)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--case", required=True, type=int, help="index into plan.allreduce")
    ap.add_argument("--rows", required=True, type=Path, help="directory for rank<r>.jsonl")
    args = ap.parse_args(argv)
    plan = Plan.from_json(args.plan.read_text(encoding="utf-8"))
    case = plan.allreduce[args.case]
    die_with_parent()
    rank, world, local_rank = dist_env()
    if world % len(case.ranks):
        raise SystemExit(f"case {case.label} needs {len(case.ranks)} ranks per node, got {world}")
    out = RowWriter(args.rows, rank)
    # longer than the runner's watchdog, so a stuck collective is killed and labelled a
    # hang by the runner rather than aborted by the process group's own timeout
    timeout = datetime.timedelta(seconds=2 * plan.timeout_s + 30)
    cuda = plan.backend == "cuda"
    out.event("init")
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        if rank == 0:
            v = torch.cuda.nccl.version()
            out.event("versions", nccl=".".join(map(str, v)) if isinstance(v, tuple) else str(v))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
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
                iters = iters_for(size, case.iters, budget)
                dist.barrier()
                for _ in range(min(case.warmup, iters)):
                    dist.all_reduce(x)
                times = torch.zeros(iters, dtype=torch.float64, device=device)
                if cuda:
                    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                          for _ in range(iters)]
                    for e0, e1 in ev:
                        e0.record()
                        dist.all_reduce(x)
                        e1.record()
                    torch.cuda.synchronize()
                    for i, (e0, e1) in enumerate(ev):
                        times[i] = e0.elapsed_time(e1) / 1e3
                else:
                    for i in range(iters):
                        t0 = time.perf_counter_ns()
                        dist.all_reduce(x)
                        times[i] = (time.perf_counter_ns() - t0) / 1e9
                x.fill_(rank + 1)
                dist.all_reduce(x)
                # one reduction for both: a collective ends with its slowest rank (MAX of the
                # times), and any rank that got a wrong sum raises the last element to 1
                wrong = float(not bool((x == world * (world + 1) / 2).all()))
                stats = torch.cat([times, torch.tensor([wrong], dtype=torch.float64, device=device)])
                dist.all_reduce(stats, op=dist.ReduceOp.MAX)
                if rank == 0:
                    out.row("allreduce", allreduce_row(case, plan.backend, size, dtype,
                                                       [float(t) for t in stats[:-1].cpu()],
                                                       float(stats[-1]) == 0.0, case.detail, world))
                out.event("done", case=args.case, size=size, dtype=dtype)
        out.event("finished")  # teardown from here on is not a hang
    finally:
        dist.destroy_process_group()
        out.close()
    return 0


if __name__ == "__main__":
    exit_now(main())
