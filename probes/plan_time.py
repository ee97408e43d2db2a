"""How long a plan will take, said before it starts: launches x cases x expected time per case.

Nothing here is measured on a GPU box yet: every rate and overhead below is an ASSUMED number,
named and used in one place, to be replaced by what the first real run records (its manifest has
the wall time of each part). The estimate is meant to be right within a factor of two, so that
a run of hours is not started by mistake; the rows of the run are the measurement.

Model (per backend):
- a torchrun launch costs LAUNCH_S before its first case and after its last (python and torch
  import, the process group, NCCL's communicator init, teardown). cuda runs each all-reduce case
  twice (the untimed launch with NCCL's TUNING log, then the timed one), cpu once; the copies are
  one launch.
- one all-reduce of `s` bytes over `n` ranks takes LATENCY_US + s x 2(n-1)/n / BUSBW (nccl-tests'
  bus-bandwidth convention), and never less than the host's HOST_US per Python call when called
  eagerly. A timed size runs `warmup` eager all-reduces, then TRIALS trials of `iters` (eagerly
  and, on cuda, again as a CUDA graph), each trial after a barrier (BARRIER_S).
- a copy moves its bytes at COPY_GBPS (per direction); a latency case costs COPY_LATENCY_US per
  copy; every copy case adds CASE_S (fills, the data check, the row), and on cuda the CPU's
  passes over its host slots (every iteration has its own, checked every trial) at
  HOST_PASS_GBPS.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcieprof.bundle.plan import Plan
from probes.plan import iters_for

#: ASSUMED seconds per torchrun launch outside its cases (cuda: a first guess, to be replaced by
#: the first box's manifest). The cpu figures here and below are fitted to one run on the
#: project's loaded 2-core build box (`topology --backend cpu --quick`, 4 ranks: 52 s per
#: all-reduce variant, 31 s of copies).
LAUNCH_S = {"cuda": 12.0, "cpu": 15.0, "sim": 0.0}
#: ASSUMED all-reduce bus bandwidth, GB/s: cuda PCIe GPUs in a VM (NCCL through host memory or
#: P2P at a few GB/s to ~20 GB/s); cpu gloo between local processes.
BUSBW_GBPS = {"cuda": 10.0, "cpu": 0.3, "sim": 1e9}
#: ASSUMED latency of one all-reduce, us.
LATENCY_US = {"cuda": 30.0, "cpu": 1000.0, "sim": 0.0}
#: ASSUMED host time of one all-reduce called from Python, us.
HOST_US = {"cuda": 30.0, "cpu": 50.0, "sim": 0.0}
#: ASSUMED seconds per timed trial for its barrier and synchronize.
BARRIER_S = {"cuda": 0.002, "cpu": 0.005, "sim": 0.0}
#: ASSUMED copy bandwidth, GB/s per direction (cuda: PCIe Gen4/5 x16 through a VM; cpu: memcpy).
COPY_GBPS = {"cuda": 15.0, "cpu": 2.0, "sim": 1e9}
#: ASSUMED time of one small copy, us.
COPY_LATENCY_US = {"cuda": 15.0, "cpu": 20.0, "sim": 0.0}
#: ASSUMED seconds of work around each copy case (fills, poison, the data check).
CASE_S = {"cuda": 0.05, "cpu": 0.05, "sim": 0.0}
#: ASSUMED GB/s of one pass of the CPU over pinned host memory (torch's threads on a server;
#: cuda only: the host buffers of probes.p2p_worker.Landing, every iteration's slot).
HOST_PASS_GBPS = {"cuda": 10.0, "cpu": 10.0, "sim": 1e9}
#: Timed trials per all-reduce size (probes.allreduce_worker.TRIALS; not imported: torch).
TRIALS = 5
#: Bytes one all-reduce size may move in timed iterations (probes.allreduce_worker.BUDGET_BYTES).
BUDGET_BYTES = {"cuda": 512 * 1024**2, "cpu": 64 * 1024**2, "sim": 512 * 1024**2}


@dataclass(frozen=True)
class PlanTime:
    """What a plan is expected to cost.

    Attributes:
        launches: torchrun launches (copies and all-reduce).
        copy_cases: P2P and concurrent cases.
        allreduce_cases: all-reduce cases.
        copies_s: expected seconds of the copies part.
        allreduce_s: expected seconds of the all-reduce part.
    """

    launches: int
    copy_cases: int
    allreduce_cases: int
    copies_s: float
    allreduce_s: float

    @property
    def seconds(self) -> float:
        """Expected seconds of the whole plan."""
        return self.copies_s + self.allreduce_s

    def describe(self) -> str:
        """One line: what runs and how long it is expected to take."""
        return (f"{self.launches} launches, {self.copy_cases} copy and {self.allreduce_cases} "
                f"all-reduce cases: expected {minutes(self.seconds)} (copies "
                f"{minutes(self.copies_s)}, all-reduce {minutes(self.allreduce_s)}; assumed "
                "rates, probes/plan_time.py)")


def minutes(seconds: float) -> str:
    """`~40 s`, `~3.5 min`, `~1.2 h`."""
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.1f} min"
    return f"~{seconds / 3600:.1f} h"


def allreduce_case_s(plan: Plan, k: int) -> float:
    """Expected seconds of all-reduce case `k`, its launches included."""
    b = plan.backend
    case = plan.allreduce[k]
    n = plan.world(case)
    factor = 2 * (n - 1) / n if n > 1 else 0.0
    cuda = b == "cuda"
    s = LAUNCH_S[b] * (2 if cuda else 1)
    for size in case.sizes:
        gpu = LATENCY_US[b] * 1e-6 + size * factor / (BUSBW_GBPS[b] * 1e9)
        eager = max(gpu, HOST_US[b] * 1e-6)
        iters = iters_for(size, case.iters, BUDGET_BYTES[b])
        timed = (min(case.warmup, iters) + TRIALS * iters + 2) * eager + TRIALS * BARRIER_S[b]
        if cuda:  # the same trials again as CUDA graph replays, and the untimed launch's one
            timed += TRIALS * iters * gpu + TRIALS * BARRIER_S[b] + eager
        s += timed * len(case.dtypes)
    return s


def copies_s(plan: Plan) -> float:
    """Expected seconds of the copy cases, their launch included."""
    b = plan.backend
    if not plan.p2p and not plan.concurrent:
        return 0.0
    s = LAUNCH_S[b]
    for c in plan.p2p:
        copies = (c.trials + 1) * c.iters * (2 if c.direction == "bi" else 1)
        # host-staged copies go twice over the link (down to host memory, up to the GPU)
        legs = 2 if c.path == "host_staged" else 1
        if c.kind == "latency":
            s += copies * legs * COPY_LATENCY_US[b] * 1e-6
        else:
            s += copies * legs * c.size_bytes / (COPY_GBPS[b] * 1e9)
        s += CASE_S[b]
        if b == "cuda":  # the CPU's passes over host slots: d2h's pattern (~5 passes) once,
            # then its poison and compare per trial; a host-staged bounce buffer's fill per trial
            passes = {"d2h": 5 + 2 * c.trials, "host_staged": c.trials}.get(c.path, 0)
            host = c.size_bytes * c.iters * (2 if c.direction == "bi" else 1)
            s += passes * host / (HOST_PASS_GBPS[b] * 1e9)
    for cc in plan.concurrent:
        # the flows share the links: as if one after the other at the copy rate (pessimistic)
        s += 2 * cc.iters * len(cc.flows) * cc.size_bytes / (COPY_GBPS[b] * 1e9) + CASE_S[b]
    return s


def estimate(plan: Plan) -> PlanTime:
    """The expected cost of `plan` (see the module docstring for the model and its assumptions)."""
    per_case = 2 if plan.backend == "cuda" else 1
    launches = len(plan.allreduce) * per_case + (1 if plan.p2p or plan.concurrent else 0)
    if plan.backend == "sim":
        launches = 0
    return PlanTime(launches=launches, copy_cases=len(plan.p2p) + len(plan.concurrent),
                    allreduce_cases=len(plan.allreduce), copies_s=copies_s(plan),
                    allreduce_s=sum(allreduce_case_s(plan, k) for k in range(len(plan.allreduce))))
