"""Run the probes of a plan through torchrun, with a watchdog, and put their rows into the bundle.

Each launch is `python -m torch.distributed.run ... -m probes.<worker>` in its own process
session, so the whole torchrun tree can be killed at once. Workers stream rows to per-rank JSONL
files (probes.rows); this module appends them to the bundle as they arrive, watches the
heartbeat events, and:
- kills a launch that shows no progress for `plan.timeout_s` (a hang: NCCL over a broken
  IOMMU/ACS path hangs on its first all-reduce), records `status=hang` with variant, size and
  ranks, and goes on (the copy probe resumes after the hung case; the sweep with the next variant);
- records a launch that exits non-zero mid-case (a dead rank) as `status=error` with its exit;
- on Ctrl-C / SIGTERM (the caller raises), kills the launch in `finally`.

Several nodes: every node runs `pcieprof topology` with the same --nnodes/--rdzv-endpoint; the
copy probes stay on each node, each all-reduce case is one torchrun job across the nodes (the
case's ranks on every node), and the node holding global rank 0 writes its rows.

Every all-reduce case is its own launch (fresh process group: NCCL reads its env at init), with
NCCL_DEBUG=INFO captured into `nccl/<variant>.log` and what NCCL chose into nccl_choices.json.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pcieprof import progress
from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclCase, NcclChoices, NcclParsed
from pcieprof.bundle.rows import AllReduceRow
from pcieprof.importers.nccl_log import parse_nccl_log
from probes.plan import AllReduceCase, P2PCase, Plan
from probes.variants import GLOO_IGNORES_NCCL, NCCL_DEBUG_ENV

#: Seconds a launch may take before its first event (python + torch import on a busy machine).
STARTUP_GRACE_S = 120.0
POLL_S = 0.2
#: Seconds a launch whose ranks all reported `finished` may take to exit before it is killed
#: (torchrun's agent lingers a few seconds after its workers are gone).
TEARDOWN_GRACE_S = 3.0
#: Test-only hook variables (see probes/rows.py); passed through to workers only when set.
TEST_HOOK_VARS = ("PCIEPROF_TEST_HOOKS", "PCIEPROF_TEST_HANG", "PCIEPROF_TEST_DIE",
                  "PCIEPROF_TEST_CORRUPT")


@dataclass
class Launch:
    """How torchrun is started: one node (`--standalone`) or several (`--nnodes` + rendezvous).

    Attributes:
        nnodes: number of nodes ("1", or "2", or "1:4" as torchrun takes it).
        rdzv_endpoint: host:port of the c10d rendezvous (several nodes).
        rdzv_id: the job id every node passes.
    """

    nnodes: str = "1"
    rdzv_endpoint: str | None = None
    rdzv_id: str = "pcieprof"

    def args(self) -> list[str]:
        if self.nnodes in ("1", "1:1") and not self.rdzv_endpoint:
            return ["--standalone", "--nnodes", "1"]
        out = ["--nnodes", self.nnodes, "--rdzv-backend", "c10d", "--rdzv-id", self.rdzv_id]
        if self.rdzv_endpoint:
            out += ["--rdzv-endpoint", self.rdzv_endpoint]
        return out


@dataclass
class LaunchResult:
    """What one torchrun launch did.

    Attributes:
        status: `ok`, `hang` (killed by the watchdog) or `error` (non-zero exit).
        returncode: torchrun's exit status (None when killed).
        current: the last `start` event with no `done` (what was running when it ended).
        rows: rows appended to the bundle.
        why: one line on what went wrong.
        events: every event seen (the `versions` event carries the NCCL version).
    """

    status: str
    returncode: int | None
    current: dict[str, Any] | None
    rows: int
    why: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)


class _Tail:
    """Reads the complete lines added to the rank<r>.jsonl files of one launch."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.offsets: dict[Path, int] = {}

    def read(self) -> list[dict[str, Any]]:
        out = []
        for p in sorted(self.dir.glob("rank*.jsonl")):
            off = self.offsets.get(p, 0)
            with p.open("rb") as f:
                f.seek(off)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            for line in data[:end].splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
            self.offsets[p] = off + end
        return out


def _new_session_with_parent_death() -> None:
    """preexec for torchrun: own session (killpg reaches all of it), SIGTERM if we die."""
    os.setsid()
    try:
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def kill_group(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """SIGTERM the launch's process group, then SIGKILL what is left after `grace_s`."""
    if proc.poll() is not None:
        _killpg(proc.pid, signal.SIGKILL)  # stray workers of a finished agent
        return
    _killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ProbeRunner:
    """Runs a plan's probes into a bundle.

    Args:
        bundle: the bundle to append rows to (its parts are set by the caller).
        plan: what to measure.
        launch: torchrun node/rendezvous options.
        on_progress: called with a short description after each row batch (progress bars).
    """

    def __init__(self, bundle: Bundle, plan: Plan, launch: Launch | None = None,
                 on_progress: Callable[[str, int], None] | None = None) -> None:
        self.bundle = bundle
        self.plan = plan
        self.launch = launch or Launch()
        self.on_progress = on_progress or (lambda _d, _n: None)
        # inside the bundle directory, so a run killed with SIGKILL leaves its raw per-rank rows
        # with its bundle (not in /tmp); removed by cleanup() after a normal end
        self.work = Path(tempfile.mkdtemp(prefix=".probe-work-", dir=bundle.path))
        self.plan_file = self.work / "plan.json"
        self.plan_file.write_text(plan.to_json(), encoding="utf-8")
        self._proc: subprocess.Popen[Any] | None = None
        self._nlaunch = 0

    # -- one launch ------------------------------------------------------------------------------

    def _run(self, module: str, args: list[str], nproc: int, env: dict[str, str],
             log: Path, launch: Launch | None = None) -> LaunchResult:
        self._nlaunch += 1
        rows_dir = self.work / f"launch{self._nlaunch}"
        rows_dir.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", *(launch or self.launch).args(),
               "--nproc-per-node", str(nproc), "--max-restarts", "0",
               "--monitor-interval", "0.5",
               "-m", module, "--plan", str(self.plan_file), "--rows", str(rows_dir), *args]
        full_env = {k: v for k, v in os.environ.items() if k not in TEST_HOOK_VARS or v}
        full_env.update(env)
        full_env.setdefault("OMP_NUM_THREADS", "1")
        # worker modules are imported from this checkout/installation
        root = str(Path(__file__).resolve().parents[1])
        full_env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in
                                                 full_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        progress.debug(f"launch: {' '.join(cmd)}")
        tail = _Tail(rows_dir)
        events: list[dict[str, Any]] = []
        open_cases: dict[int, dict[str, Any]] = {}
        last: dict[str, Any] | None = None
        finished: set[int] = set()
        nrows = 0
        with log.open("wb") as logf:
            self._proc = proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, env=full_env,
                                                 preexec_fn=_new_session_with_parent_death)
            last_activity = time.monotonic()
            started = False
            status, why = "ok", ""
            try:
                while True:
                    rc = proc.poll()
                    batch: dict[str, list[dict[str, Any]]] = {}
                    for item in tail.read():
                        last_activity = time.monotonic()
                        if "table" in item:
                            batch.setdefault(item["table"], []).append(item["row"])
                            continue
                        events.append(item)
                        started = True
                        if item.get("event") == "start":
                            open_cases[item["rank"]] = item
                            last = item
                        elif item.get("event") == "done":
                            open_cases.pop(item["rank"], None)
                        elif item.get("event") == "finished":
                            finished.add(item["rank"])
                    for table, rows in batch.items():
                        nrows += self.bundle.append_rows(table, rows)
                        self.on_progress(table, len(rows))
                    if rc is not None:
                        # after every local rank said `finished`, an untidy exit (e.g. another
                        # node's agent gone first) loses nothing
                        if rc != 0 and len(finished) < nproc:
                            status = "error"
                            why = f"torchrun exited with status {rc}: {_last_error(log)}"
                        break
                    limit = self.plan.timeout_s + (0 if started else STARTUP_GRACE_S)
                    if len(finished) >= nproc:
                        # every local rank measured everything and its rows are on disk: a slow
                        # teardown is not a hang, and not worth waiting long for either
                        limit = TEARDOWN_GRACE_S
                    if time.monotonic() - last_activity > limit and len(finished) >= nproc:
                        progress.debug("launch finished but did not exit; killed")
                        kill_group(proc)
                        break
                    if time.monotonic() - last_activity > limit:
                        status = "hang"
                        why = (f"no progress for {limit:g} s; launch killed" if started else
                               f"no worker started within {limit:g} s; launch killed")
                        kill_group(proc)
                        for item in tail.read():  # rows that landed during the kill
                            if "table" in item:
                                nrows += self.bundle.append_rows(item["table"], [item["row"]])
                        break
                    time.sleep(POLL_S)
            finally:
                kill_group(proc)
                self._proc = None
        current = None
        if status != "ok":
            current = min(open_cases.values(), key=lambda e: e.get("t", 0)) if open_cases else last
        return LaunchResult(status, proc.returncode, current, nrows, why, events)

    def kill(self) -> None:
        """Kill the running launch (signal handlers call this)."""
        if self._proc is not None:
            kill_group(self._proc, grace_s=2.0)

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    # -- copies ----------------------------------------------------------------------------------

    def run_copies(self) -> dict[str, dict[str, Any]]:
        """P2P and concurrent cases, resuming after a hung or failed case.

        Returns per part ("p2p", "concurrent") {status, why, rows, hangs, errors}.
        """
        from probes.p2p_worker import concurrent_rows, p2p_row  # lazy: torch

        nproc = 1 if self.plan.backend == "cuda" else self.plan.nranks
        env: dict[str, str] = {}
        if self.plan.backend == "cuda":
            # CUDA ordinals = NVML indices: PCI bus order, every GPU up to the highest one visible
            env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(max(self.plan.devices) + 1)))}
        result = {p: {"status": "ok", "why": None, "rows": 0, "hangs": 0, "errors": 0}
                  for p in ("p2p", "concurrent")}
        resume = ""
        n = 0
        while True:
            n += 1
            tag = f"pcieprof{self.work.name}-copies{n}"
            args = ["--shm-tag", tag] + (["--resume", resume] if resume else [])
            try:
                # copies are between this node's devices: always a one-node launch
                r = self._run("probes.p2p_worker", args, nproc, env,
                              self.bundle.file(f"logs/copies-{n}.log"), Launch())
            finally:  # a killed launch cannot remove its shared-memory windows itself
                for f in Path("/dev/shm").glob(f"{tag}-*"):
                    f.unlink(missing_ok=True)
            self.bundle.register(f"logs/copies-{n}.log")
            for ev in r.events:
                if ev.get("event") == "done" and ev.get("rank") == 0:
                    result[ev["part"]]["rows"] += 1
            if r.status == "ok":
                break
            if r.current is None:  # died before the first case: nothing to resume
                for part in result.values():
                    part.update(status="failed", why=r.why)
                break
            part, idx = r.current["part"], int(r.current["case"])
            key = "hangs" if r.status == "hang" else "errors"
            result[part][key] += 1
            result[part]["status"] = "partial"
            result[part]["why"] = r.why
            if part == "p2p":
                case: P2PCase = self.plan.p2p[idx]
                self.bundle.append_rows("p2p", [p2p_row(case, self.plan.backend, None,
                                                        status=r.status, detail=r.why)])
            else:
                cc = self.plan.concurrent[idx]
                self.bundle.append_rows("concurrent", concurrent_rows(
                    cc, self.plan.backend, None, None, r.why, status=r.status))
            progress.warn(f"{part} case {idx} ({r.status}): {r.why}; going on with the next case")
            nxt = self._next_case(part, idx)
            if nxt is None:
                break
            resume = nxt
        return result

    def _next_case(self, part: str, idx: int) -> str | None:
        if part == "p2p" and idx + 1 < len(self.plan.p2p):
            return f"p2p:{idx + 1}"
        if part == "p2p" and self.plan.concurrent:
            return "concurrent:0"
        if part == "concurrent" and idx + 1 < len(self.plan.concurrent):
            return f"concurrent:{idx + 1}"
        return None

    # -- all-reduce ------------------------------------------------------------------------------

    def run_allreduce(self) -> dict[str, Any]:
        """Every all-reduce case, each a fresh launch. Returns {status, why, variants, hangs, errors}."""
        out: dict[str, Any] = {"status": "ok", "why": None, "cases": 0, "hangs": 0, "errors": 0}
        choices = NcclChoices()
        whys = []
        for k, case in enumerate(self.plan.allreduce):
            name = case.variant if case.ranks == self.plan.devices else case.label
            log = self.bundle.file(f"nccl/{name}.log")
            env = dict(case.env)
            if self.plan.backend == "cuda":
                env.update(NCCL_DEBUG_ENV)
                env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, case.ranks))
            progress.info(f"all-reduce {k + 1}/{len(self.plan.allreduce)}: {case.label} "
                          f"{' '.join(f'{a}={b}' for a, b in case.env.items()) or '(no env)'}")
            # a rendezvous id per case: every node derives the same one, and consecutive jobs
            # never meet in a finished job's rendezvous
            launch = Launch(self.launch.nnodes, self.launch.rdzv_endpoint,
                            f"{self.launch.rdzv_id}-ar{k}")
            r = self._run("probes.allreduce_worker", ["--case", str(k)], len(case.ranks), env, log,
                          launch)
            self.bundle.register(f"nccl/{name}.log")
            out["cases"] += 1
            for ev in r.events:
                if ev.get("event") == "versions" and ev.get("nccl"):
                    self.bundle.set_versions(nccl=ev["nccl"])
            choices.cases[name] = self._choices(case, log)
            self.bundle.write_doc(choices)
            if r.status != "ok":
                out["hangs" if r.status == "hang" else "errors"] += 1
                cur = r.current or {}
                size = int(cur.get("size", 0) or 0)
                dtype = str(cur.get("dtype", ""))
                where = f"size {size} B, dtype {dtype}" if cur else "before the first message"
                detail = (f"{r.why} (variant {case.variant}, {where}, "
                          f"ranks {','.join(map(str, case.ranks))})")
                self.bundle.append_rows("allreduce", [AllReduceRow(
                    backend=self.plan.backend, variant=case.variant, env=dict(case.env),
                    nranks=len(case.ranks), ranks=tuple(case.ranks), size_bytes=size,
                    dtype=dtype, iters=0, status=r.status, detail=detail)])
                whys.append(f"{case.label}: {r.status}")
                progress.warn(f"all-reduce {case.label}: {detail}; going on with the next variant")
        if whys:
            out.update(status="partial", why="; ".join(whys))
        return out

    def _choices(self, case: AllReduceCase, log: Path) -> NcclCase:
        """What NCCL chose for one case, from its NCCL_DEBUG=INFO log (parsed by
        pcieprof.importers.nccl_log). NCCL's rings are in rank space; rank r drives ranks[r]."""
        entry = NcclCase(variant=case.variant, ranks=tuple(case.ranks), env=dict(case.env),
                         log=str(log.relative_to(self.bundle.path)))
        if self.plan.backend != "cuda":
            entry.note = (f"{self.plan.backend} backend: gloo process group, NCCL not used"
                          + (f"; {GLOO_IGNORES_NCCL}" if case.env else ""))
            return entry
        try:
            entry.parsed = NcclParsed.from_json(
                parse_nccl_log(log.read_text(encoding="utf-8", errors="replace")))
        except Exception as exc:  # a log we cannot read must not end the sweep
            entry.note = f"could not parse the NCCL log: {exc}"
        return entry


_EXC_LINE = re.compile(r"^(\[[^\]]*\]:?\s*)?[\w.]*(Error|Exception|Interrupt)\w*: ")


def _last_error(log: Path, n: int = 300) -> str:
    """One line on why a launch died: the workers' last Python exception, else torchrun's
    `exitcode` line (a rank killed by a signal or os._exit has no exception)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "no log"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    exc = [ln for ln in lines if _EXC_LINE.match(ln) and "ChildFailedError" not in ln]
    code = [ln for ln in lines if ln.startswith("exitcode")]
    parts = []
    if code:
        parts.append(" ".join(code[-1].split()))
    if exc:
        parts.append(exc[-1])
    return ("; ".join(parts) or (lines[-1] if lines else "no output"))[:n]
