"""Copy probes (p2p.csv and concurrent.csv), run inside torchrun workers.

    python -m torch.distributed.run --standalone --nproc-per-node N -m probes.p2p_worker \
        --plan plan.json --rows DIR [--part p2p|concurrent]

(how it can be run by hand; pcieprof's runner starts one-node launches on loopback only, with the
ranks meeting at a FileStore: probes.rows.init_group)

`cuda` backend: ONE worker (nproc 1) drives every GPU of the plan, as nvbandwidth and
p2pBandwidthLatencyTest do: `path=p2p` is a peer copy with peer access enabled
(cudaMemcpyPeerAsync; a direct DMA, which in a VM goes through the IOMMU/ACS path),
`host_staged` two copies through one pinned host buffer, `h2d`/`d2h` pinned host <-> GPU. Timed
with CUDA events. Writes are issued on the source GPU's stream (its copy engine pushes), reads on
the destination's (its copy engine pulls) - the nvbandwidth convention, an assumption about which
engine the driver picks.

`cpu` backend: N workers, one per rank, each with its own private memory and a window of shared
host memory (/dev/shm) that the others can write: `p2p` is a copy from a rank's private buffer
into another rank's window, `host_staged` the same through an extra host bounce buffer, `h2d`/`d2h`
copies between a rank's shared host buffer and its private memory. Timed with perf_counter_ns.
This measures this machine's memory system and the harness, not a GPU fabric; rows say
backend=cpu.

Every copy moves the pattern of probes.pattern and the receiver checks it: wrong bytes give
status=error with no bandwidth.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from probes.gpu_api import CudaApi, Cudart, HostFlag, TorchCuda
from probes.host_flag import FlagError
from probes.numa import SYSFS, on_numa_node, pci_numa_node
from probes.pattern import HOST_END, case_seed, matches, pattern, poison
from pcieprof.bundle.plan import ConcurrentCase, P2PCase, Plan
from probes.rows import (RowWriter, die_with_parent, dist_env, exit_now, init_group, test_corrupt,
                         test_hook)

CPU_DETAIL = "cpu backend: host memcpy between processes; measures this machine, not a GPU fabric"


def _stats(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def p2p_row(case: P2PCase, backend: str, times_s: list[float] | None, *, status: str = "ok",
            detail: str = "") -> dict[str, Any]:
    """The p2p.csv row of one case from its per-trial times (seconds for `iters` copies)."""
    src, dst = case.row_ends()
    row: dict[str, Any] = {"backend": backend, "src": src, "dst": dst, "path": case.path,
                           "direction": case.direction, "size_bytes": case.size_bytes,
                           "iters": case.iters, "trials": case.trials, "status": status,
                           "detail": detail}
    if status != "ok" or not times_s:
        return row
    if case.kind == "bandwidth":
        moved = case.size_bytes * case.iters * (2 if case.direction == "bi" else 1)
        # median of bandwidths = bandwidth of the median time; min bandwidth from the max time
        med, lo, hi = _stats([moved / t / 1e9 for t in times_s])
        row.update(bandwidth_gbps=med, bandwidth_gbps_min=lo, bandwidth_gbps_max=hi)
    else:
        med, lo, hi = _stats([t / case.iters * 1e6 for t in times_s])
        row.update(latency_us=med, latency_us_min=lo, latency_us_max=hi)
    return row


def concurrent_rows(case: ConcurrentCase, backend: str, spans_s: list[tuple[float, float]] | None,
                    ok: list[bool] | None, detail: str = "", *, status: str = "ok",
                    timing: Round | None = None) -> list[dict[str, Any]]:
    """Per-flow rows and the aggregate (flow=-1) from each flow's (start, end) in seconds.

    With `status` other than ok (hang, not_supported) every row gets it and no bandwidth.
    `timing`: how the flows were released; a flow's row gets its device's bound on the anchor's
    lag after the host's release (cuda, host flag), the aggregate the largest (how far apart the
    anchors of its devices can be); each flow's start after the earliest flow's start, the
    aggregate the largest (the start skew)."""
    base: dict[str, Any] = {"backend": backend, "pattern": case.pattern, "op": case.op,
                            "size_bytes": case.size_bytes, "iters": case.iters}
    lag: dict[int, float | None] = {}
    if timing is not None:
        base["release"] = timing.release
        if timing.held is not None:
            base["held"] = "yes" if timing.held else "no"
        lag = timing.anchor_us
    if status != "ok" or spans_s is None or ok is None:
        return [{**base, "flow": i, "src": a, "dst": b, "status": status, "detail": detail}
                for i, (a, b) in enumerate(case.flows)] + \
               [{**base, "flow": -1, "src": -1, "dst": -1, "status": status, "detail": detail}]
    rows = []
    moved = case.size_bytes * case.iters
    first = min(t0 for t0, _ in spans_s)
    for i, ((src, dst), (t0, t1), good) in enumerate(zip(case.flows, spans_s, ok)):
        r = {**base, "flow": i, "src": src, "dst": dst, "detail": detail,
             "status": "ok" if good else "error", "start_skew_us": (t0 - first) * 1e6}
        if (b := lag.get(src if case.op == "write" else dst)) is not None:
            r["release_to_anchor_us_max"] = b
        if good:
            r["bandwidth_gbps"] = moved / (t1 - t0) / 1e9
        else:
            r["detail"] = "copied bytes do not match the pattern"
        rows.append(r)
    agg = {**base, "flow": -1, "src": -1, "dst": -1, "detail": detail,
           "start_skew_us": (max(t0 for t0, _ in spans_s) - first) * 1e6}
    if lag and all(v is not None for v in lag.values()):
        agg["release_to_anchor_us_max"] = max(v for v in lag.values() if v is not None)
    if all(ok):
        span = max(t1 for _, t1 in spans_s) - min(t0 for t0, _ in spans_s)
        agg.update(status="ok", bandwidth_gbps=moved * len(case.flows) / span / 1e9)
    else:
        agg.update(status="error", detail=f"{ok.count(False)} flow(s) moved wrong bytes")
    rows.append(agg)
    return rows


def p2p_result_row(case: P2PCase, backend: str, res: tuple[Any, ...], detail: str = ""
                   ) -> dict[str, Any]:
    """The p2p.csv row of a copier's `run_p2p` result (times or None, bytes correct[, why]):
    not run and correct is not_supported, not run and not correct an error (e.g. peer access
    that would not enable), wrong bytes an error."""
    times, ok = res[0], res[1]
    why = res[2] if len(res) > 2 else ""
    if times is None:
        return p2p_row(case, backend, None, detail=why,
                       status="not_supported" if ok else "error")
    if not ok:
        return p2p_row(case, backend, None, status="error",
                       detail="; ".join(x for x in ("copied bytes do not match the pattern", why)
                                        if x))
    return p2p_row(case, backend, times, detail="; ".join(x for x in (detail, why) if x))


# ------------------------------------------------------------------------------------------------
# cpu backend: processes and shared host memory


class CpuCopier:
    """Rank-to-rank copies through /dev/shm windows; every rank of the plan is one process."""

    def __init__(self, plan: Plan, rank: int, shm_dir: Path, tag: str) -> None:
        self.plan, self.rank, self.n = plan, rank, plan.nranks
        big = max([c.size_bytes for c in plan.p2p] + [8])
        slots = max([c.size_bytes * self.n for c in plan.concurrent] + [8])
        self.win_bytes = max(big, slots)
        self.stage_bytes = big

        def shared(name: str, size: int) -> torch.Tensor:
            return torch.from_file(str(shm_dir / f"{tag}-{name}"), shared=True, size=size,
                                   dtype=torch.uint8)

        self.win = {rank: shared(f"win{rank}", self.win_bytes)}
        self.stage = {rank: shared(f"stage{rank}", self.stage_bytes)}
        dist.barrier()  # every rank's files exist before anyone maps them
        for r in range(self.n):
            self.win.setdefault(r, shared(f"win{r}", self.win_bytes))
            self.stage.setdefault(r, shared(f"stage{r}", self.stage_bytes))
        self.local_src = torch.empty(self.win_bytes, dtype=torch.uint8)
        self.local_dst = torch.empty(self.win_bytes, dtype=torch.uint8)
        dist.barrier()  # everyone has mapped everything: the names can go, the mappings stay,
        for k in ("win", "stage"):  # so a killed run leaves nothing in /dev/shm
            (shm_dir / f"{tag}-{k}{rank}").unlink(missing_ok=True)

    def close(self) -> None:
        dist.barrier()

    # one direction of a case, issued by the rank that owns it
    def _op(self, case: P2PCase, src: int, dst: int) -> Callable[[], object]:
        s = case.size_bytes
        if case.path == "p2p":
            a, b = self.local_src[:s], self.win[dst][:s]
            return lambda: b.copy_(a)
        if case.path == "host_staged":
            a, m, b = self.local_src[:s], self.stage[src][:s], self.win[dst][:s]
            return lambda: b.copy_(m.copy_(a))
        if case.path == "h2d":
            a, b = self.stage[dst][:s], self.local_dst[:s]
            return lambda: b.copy_(a)
        a, b = self.local_src[:s], self.stage[src][:s]  # d2h
        return lambda: b.copy_(a)

    def run_p2p(self, idx: int, case: P2PCase) -> tuple[list[float] | None, bool]:
        s, me = case.size_bytes, self.rank
        if case.path == "h2d":
            owners = [(case.dst, case.dst)]
        elif case.path == "d2h":
            owners = [(case.src, case.src)]
        else:
            owners = [(case.src, case.dst)] + ([(case.dst, case.src)] if case.direction == "bi" else [])
        # a seed no other case uses, and every checked buffer first holds the complement of what
        # it should receive: stale or unwritten bytes cannot pass
        checks: list[tuple[torch.Tensor, int]] = []
        for a, b in owners:
            seed = case_seed("p2p", idx, a)
            if a == me:
                self.local_src[:s].copy_(pattern(s, seed))
                if case.path == "h2d":
                    self.stage[me][:s].copy_(pattern(s, seed))
            if case.path == "h2d" and b == me:
                checks.append((self.local_dst, seed))
            elif case.path == "d2h" and a == me:
                checks.append((self.stage[me], seed))
            elif case.path in ("p2p", "host_staged") and b == me:
                checks.append((self.win[me], seed))
        for buf, seed in checks:
            poison(buf, s, seed)
        mine = [(a, b) for a, b in owners if a == me]
        ops = [self._op(case, a, b) for a, b in mine]
        dist.barrier()  # every receiver has poisoned its buffer before anyone writes into it
        for op in ops:  # untimed warm-up: first touch of shared pages is not bandwidth
            op()
        times = torch.zeros(case.trials, dtype=torch.float64)
        for t in range(case.trials):
            dist.barrier()
            if ops:
                t0 = time.perf_counter_ns()
                for _ in range(case.iters):
                    for op in ops:
                        op()
                times[t] = (time.perf_counter_ns() - t0) / 1e9
        dist.barrier()
        if test_corrupt(me, idx, "copies"):
            for buf in (self.win[me], self.local_dst, self.stage[me]):
                buf[0] ^= 1
        good = all(matches(buf, s, seed) for buf, seed in checks)
        # one reduction: the slowest participant's time per trial, and a 1 from any rank that
        # received wrong bytes
        stats = torch.cat([times, torch.tensor([0.0 if good else 1.0], dtype=torch.float64)])
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        return [float(x) for x in stats[:-1]], float(stats[-1]) == 0.0

    def run_concurrent(self, idx: int, case: ConcurrentCase
                       ) -> tuple[list[tuple[float, float]], list[bool], str, Round]:
        """One concurrent case: ((start, end) CLOCK_MONOTONIC seconds per flow, bytes correct per
        flow, detail, the round: released by a barrier, each process then starting its flows'
        threads one by one, so the rows' start skew is what the clock saw)."""
        s, me = case.size_bytes, self.rank
        devs = self.plan.devices
        # flow i moves src's pattern into slot(src) of dst (write: src pushes into dst's window;
        # read: dst pulls from slot(dst) of src's window into its private memory); the receiving
        # slot first holds the complement of the pattern, poisoned before the barrier below
        jobs: list[tuple[int, Callable[[], object]]] = []
        for i, (a, b) in enumerate(case.flows):
            seed = case_seed("concurrent", idx, i)
            if case.op == "write" and a == me:
                src_t = self.local_src[devs.index(b) * s:(devs.index(b) + 1) * s]
                src_t.copy_(pattern(s, seed))
                dst_t = self.win[b][devs.index(a) * s:(devs.index(a) + 1) * s]
                jobs.append((i, partial(dst_t.copy_, src_t)))
            if case.op == "write" and b == me:
                poison(self.win[me][devs.index(a) * s:], s, seed)
            if case.op == "read":
                if a == me:
                    self.win[me][devs.index(b) * s:(devs.index(b) + 1) * s].copy_(pattern(s, seed))
                if b == me:
                    src_t = self.win[a][devs.index(b) * s:(devs.index(b) + 1) * s]
                    dst_t = self.local_dst[devs.index(a) * s:(devs.index(a) + 1) * s]
                    poison(dst_t, s, seed)
                    jobs.append((i, partial(dst_t.copy_, src_t)))
        spans = torch.zeros(len(case.flows), 2, dtype=torch.float64)

        def flow(i: int, op: Callable[[], object]) -> None:
            t0 = time.perf_counter_ns()  # CLOCK_MONOTONIC: comparable across processes
            for _ in range(case.iters):
                op()
            spans[i, 0], spans[i, 1] = t0 / 1e9, time.perf_counter_ns() / 1e9

        dist.barrier()
        threads = [threading.Thread(target=flow, args=j) for j in jobs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        dist.barrier()
        ok = torch.zeros(len(case.flows), dtype=torch.int32)
        for i, (a, b) in enumerate(case.flows):
            if b == me:
                got = (self.win[me] if case.op == "write" else self.local_dst)
                lo = devs.index(a) * s
                ok[i] = int(matches(got[lo:lo + s], s, case_seed("concurrent", idx, i)))
        dist.all_reduce(spans, op=dist.ReduceOp.SUM)
        dist.all_reduce(ok, op=dist.ReduceOp.SUM)
        times = [(float(x), float(y)) for x, y in spans]
        return times, [bool(v == 1) for v in ok], "", Round(times, None, "barrier")


# ------------------------------------------------------------------------------------------------
# cuda backend: one process, every GPU


#: Holding a stream before timing (see CudaCopier._leg_spans): at least this long, plus this much
#: per queued copy (torch's copy_ and cudaMemcpyPeerAsync take a few us of host time each), and
#: if the start event still fired before the host had queued everything, up to this many tries,
#: each hold 4x longer.
HOLD_MIN_S = 1e-4
HOLD_PER_COPY_S = 20e-6
HOLD_TRIES = 4
#: Seconds after which a timer thread writes the host flag itself if the host is still queueing:
#: a stream's queue can fill while it waits, and a host blocked on it would never write the flag
#: (nvbandwidth's spin kernel on its host latch has a timeout for the same reason). The round
#: then says the hold ended before all copies were queued.
RELEASE_TIMEOUT_S = 5.0
HOLD_SHORT = "the stream hold ended before all copies were queued: the time includes host queueing"

#: The (stream, copy) pairs of a leg, run at once; copy(k) is iteration k's copy, into slot k.
Leg = list[tuple[Any, Callable[[int], object]]]


def _slots(t: torch.Tensor, size: int, n: int) -> list[torch.Tensor]:
    """`n` consecutive views of `size` bytes of `t` (slot k is iteration k's)."""
    return [t[k * size:(k + 1) * size] for k in range(n)]


@dataclass
class Landing:
    """A buffer that iteration k of a round writes into at slot k, and what it must then hold.

    Why slots (issue 23 pt 8): with one source and one destination every iteration wrote the same
    bytes over the same bytes, so the check after the copies proved that one copy landed, not
    each; a middle copy dropped (a peer write a VM's IOMMU discards) left the buffer right. Now
    iteration k copies slot k of a source holding one long pattern into slot k of a destination
    that was poisoned before the round, so each iteration moves bytes no other moves and leaves
    its own slot to check. The copies stay what is timed: the same size, engine and stream, back
    to back; only their addresses differ (a bandwidth copy is far larger than the L2, so no
    iteration found the last one's bytes cached anyway; a latency case's slots share a page).
    The poison and the check run between rounds, outside the events, so nothing is added to the
    timed span. Slot contents differ between iterations (the pattern's words run on across them).
    """

    where: str  # "GPU 1" or "host (GPU 1's buffer)", for the detail
    device: int | None  # None: host memory, written by the CPU
    buf: torch.Tensor  # iters * size bytes
    seed: int
    #: host buffers: pattern(iters * size, seed) made once (the CPU's pattern costs ~1 s per
    #: 320 MiB); on a GPU it is made when needed, so as not to hold a second copy of every buffer
    host_expected: torch.Tensor | None = None

    def expected(self) -> torch.Tensor:
        """What `buf` must hold after a round."""
        if self.host_expected is not None:
            return self.host_expected
        return pattern(self.buf.numel(), self.seed, self.buf.device)


@dataclass
class Round:
    """One timed round of a leg (CudaCopier._leg_spans)."""

    #: each stream's (start, end), seconds from its device's anchor
    spans: list[tuple[float, float]]
    #: the streams were still held when the host had queued everything (None: nothing held,
    #: the cpu backend's barrier)
    held: bool | None
    #: host_flag | gate_event | barrier (cpu): what released the streams
    release: str
    #: device -> upper bound (us) on how long after the host's release its anchor fired (host
    #: flag only; None where the device's acknowledgement was not seen)
    anchor_us: dict[int, float | None] = field(default_factory=dict)


class CudaCopier:
    """Copies between the GPUs of the plan from one process, timed with CUDA events.

    Args:
        plan: the copy cases (devices are CUDA ordinals = NVML indices under PCI_BUS_ID order).
        api: the CUDA calls (default: torch.cuda; tests pass a stand-in).
        rt: the peer-copy runtime (default: the libcudart torch loaded, see `Cudart`).
        sysfs: where to read GPUs' NUMA nodes and nodes' CPUs.
    """

    def __init__(self, plan: Plan, api: CudaApi | None = None, rt: Any = None,
                 sysfs: Path = SYSFS) -> None:
        self.plan = plan
        self.api: CudaApi = api or TorchCuda()
        self.rt_why = ""
        if rt is None:
            try:
                rt = Cudart()
            except OSError as exc:  # host copies still work; peer copies need the runtime calls
                rt, self.rt_why = None, f"peer copies need libcudart: {exc}"
        self.rt = rt
        self.streams = {d: self.api.new_stream(d) for d in plan.devices}
        # every iteration has a slot of its own (Landing)
        big = max([c.size_bytes * c.iters for c in plan.p2p] + [8])
        self.src = {d: self.api.empty(big, d) for d in plan.devices}
        self.dst = {d: self.api.empty(big, d) for d in plan.devices}
        self.host: dict[int, torch.Tensor] = {}
        self.host_note: dict[int, str] = {}
        for d in plan.devices:
            node = pci_numa_node(self.api.bus_id(d), sysfs)
            with on_numa_node(node, sysfs) as placed:  # pinned pages come from the node that touches them
                self.host[d] = self.api.pinned(big)
                self.host[d].zero_()
            self.host_note[d] = (f"pinned host buffer on NUMA node {node} (the GPU's)" if placed
                                 else "pinned host buffer: GPU's NUMA node unknown, not placed")
        self.peer_ok: dict[tuple[int, int], bool] = {}
        #: pairs whose peer access the driver advertises but would not enable: their peer cases
        #: are errors with this reason; every other case (host-staged, H2D/D2H) still runs
        self.peer_failed: dict[tuple[int, int], str] = {}
        for a in plan.devices:
            for b in plan.devices:
                if a != b:
                    ok = self.api.can_access_peer(a, b) and self.rt is not None
                    if ok:
                        try:
                            self.rt.enable_peer(a, b)
                        except RuntimeError as exc:
                            ok, self.peer_failed[(a, b)] = False, str(exc)
                    self.peer_ok[(a, b)] = ok
        # the release of timed rounds: a host flag every device waits on where the driver can
        # map host memory and wait on it, else a gate event (recorded in the rows either way)
        self.anchor_streams = {d: self.api.new_stream(d) for d in plan.devices}
        self.flag: HostFlag | None = None
        self.flag_why = ""
        self.generation = 0
        try:
            self.flag = self.api.host_flag(list(plan.devices))
        except (FlagError, OSError) as exc:
            self.flag_why = f"no host flag ({exc})"

    @property
    def release(self) -> str:
        """What releases the streams of a timed round now: host_flag or gate_event."""
        return "host_flag" if self.flag is not None else "gate_event"

    def release_note(self, devices: set[int]) -> str:
        """What a row must say about its release (empty where nothing is assumed)."""
        if self.flag is not None:
            return ""
        why = f"streams released by a gate event: {self.flag_why}" if self.flag_why else ""
        if len(devices) > 1:
            why = "; ".join(x for x in (why, "the anchors of different devices are assumed "
                                             "simultaneous (released by the same event)") if x)
        return why

    def close(self) -> None:
        """Wait for every GPU, then free the host flag."""
        self._sync_all()
        if self.flag is not None:
            self.flag.close()

    def _sync_all(self) -> None:
        """Wait for every GPU of the plan: synchronize() without a device waits for the current
        one only, and the streams here are not ordered with each other."""
        for d in self.plan.devices:
            self.api.synchronize(d)

    def _on(self, device: int, op: Callable[[], object]) -> None:
        """Work on `device`'s default stream (fills, poison); _sync_all orders it before copies."""
        self.api.enqueue(self.api.current_stream(device), op)

    def _leg_spans(self, leg: Leg, iters: int) -> Round:
        """One timed round of `iters` rounds of the leg's copies (the (stream, copy) pairs of a
        leg running at once): each stream's (start, end) and how it was released.

        As cuda-samples' p2pBandwidthLatencyTest and nvbandwidth do, the copies are held until the
        host has queued them all, so that they start back to back and the host's queueing time
        stays outside the events. Every stream of the round waits on the host flag
        (`_flag_round`), which the host writes once everything is queued: all devices are
        released at one host moment. Where the devices cannot wait on host memory, one spin
        kernel and a gate event every other stream waits for release them (`_gate_round`). A spin
        kernel per stream, sized from the clock rate, had released each stream at its own moment
        (an idle GPU's spin can last several times longer; issue 23 pt 7).

        Each flow's own start and end are timed, not assumed: a stream can still start late
        (work queued on it before, a late wake). torch's Event.elapsed_time takes two events of
        one device, so each device has an anchor, the moment it was released, and every stream
        is timed from its device's anchor. With the host flag each anchor's lag after the host's
        write is bounded by the device's acknowledgement (Round.anchor_us); with the gate event
        the anchors of different devices are taken as one moment.
        """
        if self.flag is not None:
            try:
                return self._flag_round(self.flag, leg, iters)
            except FlagError as exc:  # a call the driver refused: the gate from now on
                self._sync_all()
                self.flag.close()
                self.flag, self.flag_why = None, f"the host flag failed ({exc})"
        return self._gate_round(leg, iters)

    def _flag_round(self, flag: HostFlag, leg: Leg, iters: int) -> Round:
        self.generation += 1
        g = self.generation
        devices = list(dict.fromkeys(self.api.device_of(s) for s, _ in leg))
        # if queueing blocks (a full queue behind a wait), a thread writes the flag (torch's
        # bindings and ctypes release the GIL around their calls)
        timer = threading.Timer(RELEASE_TIMEOUT_S, flag.write, (g,))
        timer.start()
        try:
            anchors: dict[int, Any] = {}
            for d in devices:  # each device's anchor on a stream of its own, then its ack
                st = self.anchor_streams[d]
                flag.wait(st, g)
                anchors[d] = self.api.event()
                anchors[d].record(st)
                flag.ack(st, g)
            marks = []
            for stream, _ in leg:
                flag.wait(stream, g)
                e0, e1 = self.api.event(), self.api.event()
                e0.record(stream)
                marks.append((anchors[self.api.device_of(stream)], e0, e1))
            for k in range(iters):
                for stream, op in leg:
                    self.api.enqueue(stream, partial(op, k))
            for (stream, _), (_, _, e1) in zip(leg, marks):
                e1.record(stream)
        except BaseException:
            flag.write(g)  # streams already waiting must not stay blocked
            raise
        finally:
            timer.cancel()
        held = not any(e0.query() for _, e0, _ in marks)
        bounds = flag.release(g)
        for ev in [*anchors.values(), *(e1 for _, _, e1 in marks)]:
            ev.synchronize()  # the anchors are on streams of their own
        spans = [(a.elapsed_time(e0) / 1e3, a.elapsed_time(e1) / 1e3) for a, e0, e1 in marks]
        # released before this write (the timer's): the acknowledgements bound nothing
        return Round(spans, held, "host_flag",
                     {d: bounds.get(d) if held else None for d in devices})

    def _gate_round(self, leg: Leg, iters: int) -> Round:
        """The release without a host flag: one spin kernel on the first stream, then a gate
        event every other stream waits for (cudaStreamWaitEvent takes an event of another
        device); on another device the anchor is the first event after the gate. If the gate has
        already opened when the queueing is done, the hold was too short: the round is repeated
        with a 4x longer hold."""
        hold = max(HOLD_MIN_S, iters * len(leg) * HOLD_PER_COPY_S)
        held = False
        spans: list[tuple[float, float]] = []
        first = leg[0][0]
        for _ in range(HOLD_TRIES):
            self.api.block(first, hold)
            gate = self.api.event()
            gate.record(first)
            anchors: dict[int, Any] = {self.api.device_of(first): gate}
            marks = []
            for stream, _ in leg:
                if stream is not first:
                    self.api.wait(stream, gate)
                dev = self.api.device_of(stream)
                if dev not in anchors:
                    anchors[dev] = self.api.event()
                    anchors[dev].record(stream)
                e0, e1 = self.api.event(), self.api.event()
                e0.record(stream)
                marks.append((anchors[dev], e0, e1))
            for k in range(iters):
                for stream, op in leg:
                    self.api.enqueue(stream, partial(op, k))
            for (stream, _), (_, _, e1) in zip(leg, marks):
                e1.record(stream)
            held = not gate.query()
            for _, _, e1 in marks:
                e1.synchronize()
            spans = [(a.elapsed_time(e0) / 1e3, a.elapsed_time(e1) / 1e3) for a, e0, e1 in marks]
            if held:
                break
            hold *= 4
        return Round(spans, held, "gate_event")

    def _timed(self, legs: list[Leg], iters: int) -> tuple[float, bool]:
        """Run legs one after the other. Returns (seconds: the sum over legs of each leg's span,
        its first stream's start to its last stream's end, every leg held)."""
        total, held = 0.0, True
        for leg in legs:
            r = self._leg_spans(leg, iters)
            total += max(t1 for _, t1 in r.spans) - min(t0 for t0, _ in r.spans)
            held = held and r.held is not False
        return total, held

    def _failed(self, pairs: list[tuple[int, int]]) -> str:
        """Why peer access could not be enabled on any of `pairs` ("" when it could)."""
        return "; ".join(self.peer_failed[p] for p in pairs if p in self.peer_failed)

    def _landing(self, where: str, device: int | None, buf: torch.Tensor, seed: int) -> Landing:
        return Landing(where, device, buf, seed,
                       pattern(buf.numel(), seed) if device is None else None)

    def _poison(self, landings: list[Landing], scratch: tuple[torch.Tensor, ...] = ()) -> None:
        """Fill every landing buffer with the complement of what it must receive, and every
        `scratch` buffer (host bounce buffers) with 0xFF, which no pattern word can hold (their
        top bit is clear): a copy out of a slot nothing wrote carries that on to its checked
        landing. After the last round's copies: the host's buffers are written by the CPU."""
        self._sync_all()
        for b in scratch:
            b.fill_(0xFF)
        for t in landings:
            if t.device is None:
                torch.bitwise_not(t.expected(), out=t.buf)
            else:
                self._on(t.device, partial(poison, t.buf, t.buf.numel(), t.seed))
        self._sync_all()

    def _landed(self, landings: list[Landing], size: int, n: int) -> str:
        """After a round: "" when every iteration's slot holds its bytes, else which did not."""
        self._sync_all()
        bad = []
        for t in landings:
            want = t.expected()
            if not torch.equal(t.buf, want):
                ks = [k for k, (g, w) in enumerate(zip(_slots(t.buf, size, n),
                                                       _slots(want, size, n)))
                      if not torch.equal(g, w)]
                bad.append(f"iteration(s) {','.join(str(k + 1) for k in ks)} of {n} did not "
                           f"land in {t.where}")
        return "; ".join(bad)

    def run_p2p(self, idx: int, case: P2PCase) -> tuple[list[float] | None, bool, str]:
        """One case: (seconds per trial or None when not run, bytes correct, detail). None with
        False: the case failed (peer access advertised but not enabled: status error); None with
        True: not supported. Bytes are correct when every iteration of every trial landed
        (Landing); otherwise the detail says which did not."""
        s, n = case.size_bytes, case.iters
        total = s * n
        dirs = [(case.src, case.dst)] + ([(case.dst, case.src)] if case.direction == "bi" else [])
        if case.path == "p2p":
            if failed := self._failed(dirs):
                return None, False, failed
            missing = [f"{a}->{b}" for a, b in dirs if not self.peer_ok[(a, b)]]
            if missing:
                return None, True, self.rt_why or (f"no peer access {','.join(missing)} "
                                                   "(can_device_access_peer)")
        # every landing is poisoned before each round with the complement of what it expects,
        # with a seed no other case uses: stale or unwritten bytes cannot pass
        landings: list[Landing] = []
        scratch: list[torch.Tensor] = []
        legs: list[Leg]
        notes: list[str] = []
        if case.path == "h2d":
            seed = case_seed("p2p", idx, HOST_END)
            h, d = self.host[case.dst][:total], self.dst[case.dst][:total]
            h.copy_(pattern(total, seed))
            hs, ds = _slots(h, s, n), _slots(d, s, n)
            legs = [[(self.streams[case.dst],
                      lambda k: ds[k].copy_(hs[k], non_blocking=True))]]
            landings.append(self._landing(f"GPU {case.dst}", case.dst, d, seed))
            notes.append(self.host_note[case.dst])
        elif case.path == "d2h":
            seed = case_seed("p2p", idx, case.src)
            d, h = self.src[case.src][:total], self.host[case.src][:total]
            self._on(case.src, partial(d.copy_, pattern(total, seed, d.device)))
            ds, hs = _slots(d, s, n), _slots(h, s, n)
            legs = [[(self.streams[case.src],
                      lambda k: hs[k].copy_(ds[k], non_blocking=True))]]
            landings.append(self._landing(f"host (GPU {case.src}'s buffer)", None, h, seed))
            notes.append(self.host_note[case.src])
        elif case.path == "p2p":
            leg: Leg = []
            for a, b in dirs:
                seed = case_seed("p2p", idx, a)
                sa, db = self.src[a][:total], self.dst[b][:total]
                self._on(a, partial(sa.copy_, pattern(total, seed, sa.device)))
                leg.append((self.streams[a], partial(self._peer_slot, _slots(db, s, n),
                                                     _slots(sa, s, n), s, self.streams[a])))
                landings.append(self._landing(f"GPU {b}", b, db, seed))
            legs = [leg]
        else:  # host_staged: GPU -> pinned host (source's stream), then host -> GPU (destination's)
            down: Leg = []
            up: Leg = []
            for a, b in dirs:
                seed = case_seed("p2p", idx, a)
                sa, h, db = self.src[a][:total], self.host[a][:total], self.dst[b][:total]
                self._on(a, partial(sa.copy_, pattern(total, seed, sa.device)))
                sas, hs, dbs = _slots(sa, s, n), _slots(h, s, n), _slots(db, s, n)
                down.append((self.streams[a],
                             partial(lambda hs, sas, k: hs[k].copy_(sas[k], non_blocking=True),
                                     hs, sas)))
                up.append((self.streams[b],
                           partial(lambda dbs, hs, k: dbs[k].copy_(hs[k], non_blocking=True),
                                   dbs, hs)))
                # the bounce buffer is filled too: a dropped down-copy would otherwise pass on
                # the bytes the last round left there (checked through the destination only:
                # the host's own pattern and compare would cost ~1 s per case)
                scratch.append(h)
                landings.append(self._landing(f"GPU {b} (down or up copy)", b, db, seed))
                notes.append(self.host_note[a])
            legs = [down, up]
        self._sync_all()  # fills (default streams) are done before any copy stream runs
        self._timed(legs, 1)  # untimed warm-up
        held = True
        times = []
        lost = ""
        for trial in range(case.trials):
            self._poison(landings, tuple(scratch))
            t, ok = self._timed(legs, n)
            times.append(t)
            held &= ok
            if not lost and (why := self._landed(landings, s, n)):
                lost = f"trial {trial + 1}: {why}"
        self._sync_all()
        if not held:
            notes.append(HOLD_SHORT)
        notes.append(self.release_note({d for a, b in dirs for d in (a, b) if d >= 0}))
        return times, not lost, "; ".join(x for x in dict.fromkeys([lost, *notes]) if x)

    def _peer_slot(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], nbytes: int,
                   stream: Any, k: int) -> None:
        self._peer(dsts[k], srcs[k], nbytes, stream)

    def _peer(self, dst: torch.Tensor, src: torch.Tensor, nbytes: int, stream: Any) -> None:
        assert self.rt is not None  # peer_ok is False without the runtime
        self.rt.memcpy_peer(dst, src, nbytes, stream)

    def run_concurrent(self, idx: int, case: ConcurrentCase
                       ) -> tuple[list[tuple[float, float]] | None, list[bool] | None, str,
                                  Round | None]:
        """One concurrent case: ((start, end) seconds per flow, bytes correct per flow, detail,
        the timed round); spans None: not run (bytes-correct None: not supported; all False: peer
        access failed)."""
        s = case.size_bytes
        if failed := self._failed(list(case.flows)):
            return None, [False] * len(case.flows), failed, None
        missing = [f"{a}->{b}" for a, b in case.flows if not self.peer_ok[(a, b)]]
        if missing:  # without peer access the driver would stage through the host: not P2P
            return None, None, self.rt_why or (f"no peer access {','.join(missing)} "
                                               "(can_device_access_peer)"), None
        n = case.iters
        landings: list[Landing] = []
        leg: Leg = []
        for i, (a, b) in enumerate(case.flows):
            seed = case_seed("concurrent", idx, i)
            src, dst = self.api.empty(s * n, a), self.api.empty(s * n, b)
            self._on(a, partial(src.copy_, pattern(s * n, seed, src.device)))
            # each flow its own stream: on the source for a write, on the destination for a read
            st = self.api.new_stream(a if case.op == "write" else b)
            leg.append((st, partial(self._peer_slot, _slots(dst, s, n), _slots(src, s, n), s, st)))
            landings.append(self._landing(f"GPU {b} (flow {i})", b, dst, seed))
        self._poison(landings)  # with the fills: every iteration's slot checked (Landing)
        # each flow's own (start, end) from the release: concurrent_rows prices the total over
        # the first start to the last end, each flow over its own span
        r = self._leg_spans(leg, n)
        lost = [self._landed([t], s, n) for t in landings]
        notes = [*lost, "" if r.held else HOLD_SHORT,
                 self.release_note({self.api.device_of(st) for st, _ in leg})]
        return r.spans, [not x for x in lost], "; ".join(x for x in notes if x), r


# ------------------------------------------------------------------------------------------------


def case_order(plan: Plan, part: str = "both", resume: str = "", skip: str = ""
               ) -> list[tuple[str, int]]:
    """The (part, index) of every case to run: of `part` (p2p, concurrent, both), from `resume`
    (PART:INDEX) on, without the classes named in `skip` (comma-separated, Plan.copy_class)."""
    parts = ["p2p", "concurrent"] if part == "both" else [part]
    order = [(p, i) for p in parts for i in range(len(plan.p2p if p == "p2p" else plan.concurrent))]
    if resume:
        rp, _, ri = resume.partition(":")
        order = order[order.index((rp, int(ri))):] if (rp, int(ri)) in order else []
    left_out = {c.strip() for c in skip.split(",") if c.strip()}
    return [(p, i) for p, i in order if plan.copy_class(p, i) not in left_out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--rows", required=True, type=Path, help="directory for rank<r>.jsonl")
    ap.add_argument("--part", choices=["p2p", "concurrent", "both"], default="both")
    ap.add_argument("--shm-tag", default="", help="prefix of the /dev/shm files (cpu backend); "
                    "the runner removes them after a killed launch")
    ap.add_argument("--resume", default="", help="PART:INDEX, the first case to run (after a hang)")
    ap.add_argument("--skip", default="", help="classes of cases not to run (Plan.copy_class: "
                    "p2p, host_staged, h2d, d2h, concurrent), comma-separated")
    args = ap.parse_args(argv)
    plan = Plan.from_json(json.loads(args.plan.read_text(encoding="utf-8")), str(args.plan))
    die_with_parent()
    rank, world, _ = dist_env()
    out = RowWriter(args.rows, rank)
    backend = plan.backend
    # longer than the runner's watchdog, so a stuck collective is killed and labelled a
    # hang by the runner rather than aborted by the process group's own timeout
    timeout = datetime.timedelta(seconds=2 * plan.timeout_s + 30)
    order = case_order(plan, args.part, args.resume, args.skip)
    out.event("init", pid=os.getpid())
    if backend == "cpu":
        init_group("gloo", timeout)
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else args.rows
        copier: Any = CpuCopier(plan, rank, shm, args.shm_tag or f"pcieprof-{os.getppid()}")
        detail = CPU_DETAIL
    else:
        if world != 1:
            raise SystemExit("the cuda copy probe runs as one process (--nproc-per-node 1)")
        copier = CudaCopier(plan)
        detail = ""
    out.event("ready")
    try:
        for part, idx in order:
            case: Any = (plan.p2p if part == "p2p" else plan.concurrent)[idx]
            out.event("start", part=part, case=idx)
            test_hook(rank, idx if part == "p2p" else 10_000 + idx, "copies")
            if part == "p2p":
                res = copier.run_p2p(idx, case)
                if rank == 0:
                    out.row("p2p", p2p_result_row(case, backend, res, detail))
            else:
                res = copier.run_concurrent(idx, case)
                spans, ok = res[0], res[1]
                why = res[2] if len(res) > 2 else ""
                timing = res[3] if len(res) > 3 else None
                if rank == 0:
                    d = "; ".join(x for x in (detail, case.detail, why) if x)
                    st = "ok" if spans is not None else (
                        "error" if ok is not None and not any(ok) else "not_supported")
                    for row in concurrent_rows(case, backend, spans, ok, d, status=st,
                                               timing=timing):
                        out.row("concurrent", row)
            out.event("done", part=part, case=idx)
        out.event("finished")  # teardown from here on is not a hang
    finally:
        if backend == "cpu":
            copier.close()
            dist.destroy_process_group()
        out.close()
    return 0


if __name__ == "__main__":
    exit_now(main())
