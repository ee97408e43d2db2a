"""TP ranks 1..N-1: `python -m pcieprof.refserver.worker '<json>'`, started by rank 0 only.

Each follows rank 0's step plans until told to stop; it dies with its parent (the parent-death
SIGKILL rank 0 asked for before exec, proc_group.start_member, and a pid watchdog) and exits with status 1, after SGLang's "Scheduler hit an exception:" line, when
anything goes wrong.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import traceback

import torch.distributed as dist

from pcieprof import loopback
from pcieprof.parent_death import watch_parent
from pcieprof.refserver import logs
from pcieprof.refserver.args import parse_args
from pcieprof.refserver.engine import RankEngine, broadcast_plan
from pcieprof.refserver.ranks import RENDEZVOUS_TIMEOUT, join_group, load_model


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    rank, world, parent = int(spec["rank"]), int(spec["world_size"]), int(spec["parent_pid"])
    # A native crash (a SIGSEGV in the profiler's stop, say) leaves its Python stack in the
    # server log instead of only a peer's "Connection reset" on rank 0.
    faulthandler.enable()
    if os.getppid() != parent:
        return 1
    # Rank 0 decides when the server stops: a SIGTERM/SIGINT sent to the whole process group
    # reaches rank 0, which stops every rank; were the ranks to die of it first, rank 0 would
    # report a failed child. Rank 0's death still kills them (PDEATHSIG, watchdog).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent)
    args = parse_args(spec["argv"])
    logs.configure(rank, args.log_level)
    try:
        store = dist.TCPStore(loopback.HOST, int(spec["store_port"]), world, is_master=False,
                              timeout=RENDEZVOUS_TIMEOUT)
        cpu_group = join_group(store, rank, world)
        model = load_model(args, rank, world)
        dist.barrier(group=cpu_group)
        engine = RankEngine(model, rank, world, cpu_group)
        while True:
            plan = broadcast_plan(None, cpu_group, world)
            if plan.shutdown:
                break
            engine.execute(plan)
        engine.shutdown()
        return 0
    except Exception:
        logs.rank_log.error(f"Scheduler hit an exception: {traceback.format_exc()}")
        logs.flush()
        return 1


if __name__ == "__main__":
    code = main(sys.argv[1:])
    logs.flush()
    os._exit(code)  # do not wait on gloo's threads
