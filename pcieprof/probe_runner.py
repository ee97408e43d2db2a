"""Run the probes of a plan through torchrun, with a watchdog, and put their rows into the bundle.

Each launch is `python -m torch.distributed.run ... -m probes.<worker>` in its own process
session, so the whole torchrun tree can be killed at once.

On one node nothing a launch opens listens beyond loopback (pcieprof.loopback): torchrun's
rendezvous is its c10d backend on a FileStore in the launch's scratch directory (`--rdzv-conf
store_type=file`, torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py) instead of
`--standalone`'s TCPStore, with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 so that the agent hosts no
TCPStore for its workers either (dynamic_rendezvous.py; torch's TCPStore listens on every
interface whatever host it is given); the workers meet at a FileStore of their own
(probes.rows.STORE_FILE_VAR); gloo's connections listen on the loopback interface
(GLOO_SOCKET_IFNAME), NCCL's bootstrap, proxy and RAS sockets too (NCCL_SOCKET_IFNAME `=<lo>`,
exact match: NCCL user guide, "Environment Variables"; its RAS runs "on top of the
bootstrap/out-of-band network interface", NCCL user guide, "RAS"), unless the user's own value
passes (GLOO_SOCKET_IFNAME of the shell, NCCL_SOCKET_IFNAME kept by the plan). Several nodes
listen where the user's --rdzv-endpoint says (torchrun's static rendezvous, env://). Workers stream rows to per-rank JSONL
files (probes.rows); this module appends them to the bundle as they arrive, watches the
heartbeat events, and:
- kills a launch that shows no progress for `plan.timeout_s` (a hang: NCCL over a broken
  IOMMU/ACS path hangs on its first all-reduce), records `status=hang` with variant, size and
  ranks, and goes on (the copy probe resumes after the hung case, and after HANGS_PER_CLASS hangs
  of one class of copies leaves the rest of it out, status=not_run; the sweep with the next
  variant);
- records a launch that exits non-zero mid-case (a dead rank) as `status=error` with its exit;
- on Ctrl-C / SIGTERM (the caller raises), kills the launch in `finally`.

Several nodes: every node runs `pcieprof topology` with the same --nnodes/--rdzv-endpoint and
its own --node-rank; the copy probes stay on each node; each launch of an all-reduce case is one
torchrun job across the nodes (the case's ranks on every node, torchrun's static rendezvous at a
port node 0 picks for that launch), started in step through pcieprof.node_group. `--node-rank`
fixes the global rank order, so node 0 holds global rank 0 and its bundle gets every row.

Every all-reduce case is its own launch (fresh process group: NCCL reads its env at init). On
cuda each case runs twice: first untimed, one all-reduce per size, with NCCL's tuner log on
(`nccl/<variant>.tuning.log`: NCCL_DEBUG_SUBSYS with TUNING prints one line per collective, which
must not run inside a timed loop), then timed with NCCL's init log only (`nccl/<variant>.log`);
what NCCL chose goes into nccl_choices.json. A ring order (ranks not in ascending order) is applied
through NCCL_GRAPH_FILE and checked against the rings NCCL printed (probes.nccl_graph).

NCCL writes its INFO lines to C stdout, block-buffered when stdout is a file, and the workers leave
through `os._exit`: each rank would lose its last block and eight ranks would interleave blocks
mid-line in one file. So every launch with NCCL_DEBUG gets NCCL_DEBUG_FILE, one file per rank
(`%p`, the pid: NCCL's debug.cc substitutes it, and opens that file line-buffered: `setlinebuf`,
2.2x; unbuffered before), and after the launch the runner appends each rank's complete lines, in
rank order, to the launch's log (NCCL's own lines carry `host:pid:tid [dev]`, so the log reads as
one NCCL log). A user's NCCL_DEBUG_FILE the plan keeps is left alone.

The user's NCCL_* and TORCH_NCCL_* variables do not reach any launch, `default` included (a
variant measures its own settings only), unless the plan keeps them (`Plan.keep_env`); what was
left out or kept is recorded in nccl_choices.json. After a launch is killed, its ranks (torchrun
starts them in their own sessions, out of reach of the launch's process group) are killed by pid
and waited for, up to RANK_EXIT_WAIT_S, before the next launch starts.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from pcieprof import loopback, proc_group, progress
from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclCase, NcclChoices, NcclParsed
from pcieprof.bundle.rows import AllReduceRow
from pcieprof.bundle.topology import Topology
from pcieprof.importers.nccl_log import parse_nccl_log
from pcieprof.errors import BadInput
from pcieprof.node_group import NodeGroup, NodeLost, free_port
from pcieprof.redact import redact
from probes.nccl_graph import (GraphHeader, check_ring, header_from_dump, not_ring_sizes,
                               ring_graph_xml)
from pcieprof.bundle.plan import AllReduceCase, P2PCase, Plan
from probes.rows import STORE_FILE_VAR
from probes.variants import GLOO_IGNORES_NCCL, NCCL_DEBUG_ENV, NCCL_TUNING_LOG_ENV

#: Seconds a launch may take before its first event (python + torch import on a busy machine).
STARTUP_GRACE_S = 120.0
POLL_S = 0.2
#: Seconds a launch whose ranks all reported `finished` may take to exit before it is killed
#: (torchrun's agent lingers a few seconds after its workers are gone).
TEARDOWN_GRACE_S = 3.0
#: Test-only hook variables (see probes/rows.py); passed through to workers only when set.
TEST_HOOK_VARS = ("PCIEPROF_TEST_HOOKS", "PCIEPROF_TEST_HANG", "PCIEPROF_TEST_DIE",
                  "PCIEPROF_TEST_CORRUPT", "PCIEPROF_TEST_STUCK")
#: Prefixes of the user's environment variables that no launch inherits unless the plan keeps
#: them by name: they change what NCCL or torch's NCCL process group does.
NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_")
#: Seconds to wait after a kill for the launch's ranks to be gone (a rank stuck in the driver,
#: e.g. after an IOMMU fault, can hold its GPU); past it the run goes on and says so.
RANK_EXIT_WAIT_S = 30.0
#: Seconds a launch gets between SIGTERM and SIGKILL when the watchdog stops it.
KILL_GRACE_S = 5.0
#: Hangs in one class of copy cases (Plan.copy_class) after which the rest of the class is not run.
HANGS_PER_CLASS = 2
#: NCCL_DEBUG_FILE of a launch, in its rows directory: one file per rank (NCCL puts the pid for %p)
NCCL_RANK_LOG = "nccl.%p.log"
_RANK_LOG = re.compile(r"nccl\.(\d+)\.log")


def launch_environ(base: Mapping[str, str], keep: list[str] | tuple[str, ...] = ()
                   ) -> tuple[dict[str, str], dict[str, str]]:
    """The environment a launch starts from: `base` without its NCCL_* / TORCH_NCCL_* variables
    (except those named in `keep`). Returns (environment, the variables left out)."""
    env, dropped = {}, {}
    for k, v in base.items():
        if k.startswith(NCCL_PREFIXES) and k not in keep:
            dropped[k] = v
        elif k not in TEST_HOOK_VARS or v:
            env[k] = v
    return env, dropped


def masked(env: Mapping[str, str]) -> dict[str, str]:
    """`env` as it may be recorded: secrets masked by pcieprof.redact, the one place that knows
    them (a secret's name, and a URL's credentials under any name: `NCCL_*=http://u:p@h`)."""
    return redact(dict(env))


@dataclass
class Launch:
    """How torchrun is started: one node (its rendezvous on a FileStore: loopback only), or one
    node of several through torchrun's static rendezvous, where `--node-rank` fixes the global
    rank order (node r's ranks are r * nproc .. r * nproc + nproc - 1), so node 0 always holds
    global rank 0.

    Attributes:
        nnodes: number of nodes.
        node_rank: this node's rank.
        rdzv_endpoint: HOST:PORT of the rendezvous: for the run, where node 0's pcieprof
            listens (pcieprof.node_group); for one launch, where node 0's torchrun agent does.
        rdzv_id: the job id every node passes.
        rdzv_timeout_s: how long the nodes wait for each other, seconds.
        rdzv_token_file: where the nodes' shared token is (None: $PCIEPROF_RDZV_TOKEN).
    """

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "pcieprof"
    rdzv_timeout_s: float = 120.0
    rdzv_token_file: str | None = None

    def args(self, scratch: Path) -> list[str]:
        """torchrun's node and rendezvous options; on one node its rendezvous is a FileStore in
        `scratch` (a directory of this launch's own)."""
        if self.nnodes <= 1:
            return ["--nnodes", "1", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", str(scratch / "rdzv.store"),
                    "--rdzv-conf", "store_type=file", "--rdzv-id", self.rdzv_id]
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--rdzv-backend", "static", "--rdzv-endpoint", str(self.rdzv_endpoint),
                "--rdzv-id", self.rdzv_id,
                # static rendezvous: node 0's agent store waits this long for the others
                "--rdzv-conf", f"timeout={max(1, math.ceil(self.rdzv_timeout_s))}"]


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


#: Runs one launch of an all-reduce case: (stage, worker args, ranks on this node, env, log).
Launcher = Callable[[str, list[str], int, dict[str, str], Path], LaunchResult]


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


def append_rank_logs(rows_dir: Path, log: Path, events: list[dict[str, Any]]) -> int:
    """Append the per-rank NCCL logs of one launch (NCCL_RANK_LOG files in `rows_dir`) to `log`,
    rank by rank (each rank's pid from its `init` event; files of pids no event named after
    them), complete lines only: a rank killed mid-line leaves no cut line for the parser to
    misread (a cut "Channel 00/02 : 0 1 2" still looks like a ring). Returns the lines added."""
    files = {int(m.group(1)): f for f in rows_dir.iterdir() if (m := _RANK_LOG.fullmatch(f.name))}
    if not files:
        return 0
    rank_of = {int(e["pid"]): int(e.get("rank", 0)) for e in events
               if e.get("event") == "init" and isinstance(e.get("pid"), int)}
    n = 0
    with log.open("ab") as out:
        for pid in sorted(files, key=lambda p: (rank_of.get(p, 1 << 30), p)):
            data = files[pid].read_bytes()
            whole = data[:data.rfind(b"\n") + 1]
            out.write(whole)
            n += whole.count(b"\n")
    return n


def loopback_env(base: Mapping[str, str], scratch: Path) -> dict[str, str]:
    """The variables that keep a one-node launch on loopback (see the module's docstring), over
    the launch's environment `base`: its stores in `scratch`; the interface names only where
    `base` has none (the user's GLOO_SOCKET_IFNAME, an NCCL_SOCKET_IFNAME the plan keeps)."""
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           STORE_FILE_VAR: str(scratch / "group.store")}
    env.update(loopback_ifnames(base))
    return env


def loopback_ifnames(base: Mapping[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME on the loopback interface, each unless `base`
    sets it: what pcieprof sets (recorded in nccl_choices.json as `launch_env`)."""
    name = loopback.interface()
    ours = {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": f"={name}"}  # `=`: exact name
    return {k: v for k, v in ours.items() if k not in base}


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time in clock ticks) from /proc/<pid>/stat, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], fields[19]


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of `pid`: {pid: start time} (the start time tells a reused pid)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            children.setdefault(st[0], []).append(int(d.name))
            starts[int(d.name)] = st[2]
    out: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        c = todo.pop()
        if c not in out and c in starts:
            out[c] = starts[c]
            todo += children.get(c, [])
    return out


def alive(pid: int, start: str | None = None) -> bool:
    """Whether `pid` runs (a zombie holds nothing: not alive), and is the process started at
    `start` when given."""
    st = _stat(pid)
    return st is not None and st[1] not in ("Z", "X") and (start is None or st[2] == start)


def reap(procs: Mapping[int, str | None], wait_s: float) -> list[int]:
    """SIGKILL the processes `procs` ({pid: start time}) that still run, and wait up to `wait_s`
    for them to be gone. Returns the pids still running after that."""
    for pid, start in procs.items():
        if alive(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + wait_s
    left = [p for p, st in procs.items() if alive(p, st)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p, procs[p])]
    return left


class ProbeRunner:
    """Runs a plan's probes into a bundle.

    Args:
        bundle: the bundle to append rows to (its parts are set by the caller).
        plan: what to measure.
        launch: torchrun node/rendezvous options.
        on_progress: called with (table, rows) after each row batch, and with ("step", 1)
            after each case step rank 0 finishes (a size of an all-reduce launch, a copy
            case): progress bars.
        group: the nodes of a multi-node run (pcieprof.node_group), joined; None on one node.
    """

    def __init__(self, bundle: Bundle, plan: Plan, launch: Launch | None = None,
                 on_progress: Callable[[str, int], None] | None = None,
                 group: NodeGroup | None = None) -> None:
        self.bundle = bundle
        self.group = group
        self._node_lost: str | None = None
        self.plan = copy.deepcopy(plan)  # ring orders get their graph file below
        self.launch = launch or Launch()
        self.on_progress = on_progress or (lambda _d, _n: None)
        kept, dropped = launch_environ(os.environ, self.plan.keep_env)
        self.env_record = {"left_out": masked(dropped),
                           "kept": masked({k: v for k, v in kept.items()
                                           if k.startswith(NCCL_PREFIXES)})}
        if dropped:
            progress.warn(f"not passed to the probes: {', '.join(sorted(dropped))} (each variant "
                          "measures its own NCCL settings only; recorded in nccl_choices.json)")
        self._graph_dumps: dict[tuple[int, ...], Path] = {}
        self._uuids: dict[int, str] | None = None  # NVML index -> UUID (topology.json)
        if self.plan.backend == "cuda" and self.launch.nnodes <= 1:
            for case in self.plan.allreduce:
                if _is_ring_order(case) and "NCCL_GRAPH_FILE" not in case.env:
                    case.env = {**case.env, "NCCL_GRAPH_FILE": f"nccl/{self._name(case)}.graph.xml"}
            if bundle.has("plan.json"):
                bundle.write_doc(self.plan)
        # inside the bundle directory, so a run killed with SIGKILL leaves its raw per-rank rows
        # with its bundle (not in /tmp); removed by cleanup() after a normal end
        self.work = Path(tempfile.mkdtemp(prefix=".probe-work-", dir=bundle.path))
        self.plan_file = self.work / "plan.json"
        self.plan_file.write_text(json.dumps(self.plan.to_json(), indent=1), encoding="utf-8")
        self._proc: subprocess.Popen[Any] | None = None
        self._nlaunch = 0

    def _name(self, case: AllReduceCase) -> str:
        """The case's file name stem: the variant over all devices, else variant@group (and
        `.node0` for node 0's own case in a multi-node plan)."""
        if case.ranks == self.plan.devices:
            return case.variant + (".node0" if case.node0_only else "")
        return case.label

    # -- one launch ------------------------------------------------------------------------------

    def _run(self, module: str, args: list[str], nproc: int, env: dict[str, str],
             log: Path, launch: Launch | None = None,
             abort: Callable[[], str | None] | None = None) -> LaunchResult:
        """One torchrun launch, watched until it ends; `abort` (polled) names a reason to kill
        it at once (another node lost, or its launch failed)."""
        self._nlaunch += 1
        rows_dir = self.work / f"launch{self._nlaunch}"
        rows_dir.mkdir()
        launch = launch or self.launch
        cmd = [sys.executable, "-m", "torch.distributed.run", *launch.args(rows_dir),
               "--nproc-per-node", str(nproc), "--max-restarts", "0",
               "--monitor-interval", "0.5",
               "-m", module, "--plan", str(self.plan_file), "--rows", str(rows_dir), *args]
        full_env = self._launch_base()
        full_env.update(env)
        full_env.setdefault("OMP_NUM_THREADS", "1")
        if full_env.get("NCCL_DEBUG") and "NCCL_DEBUG_FILE" not in full_env:
            full_env["NCCL_DEBUG_FILE"] = str(rows_dir / NCCL_RANK_LOG)
        if launch.nnodes <= 1:
            full_env.update(loopback_env(full_env, rows_dir))
        else:
            full_env.pop(STORE_FILE_VAR, None)  # env://, at the user's endpoint
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
        ranks: dict[int, str | None] = {}  # worker pid -> start time, from their `init` events
        stuck: list[int] = []
        nrows = 0

        def stop(p: subprocess.Popen[Any]) -> None:
            # torchrun starts its workers in their own sessions: the launch's process group
            # does not reach them, so they are found (as descendants, and by the pids they
            # reported) before the agent goes, and killed and waited for by pid
            procs: dict[int, str | None] = {**ranks, **descendants(p.pid)}
            proc_group.stop(p, KILL_GRACE_S)
            stuck[:] = reap(procs, RANK_EXIT_WAIT_S)

        with log.open("wb") as logf:
            # SIGTERM when pcieprof dies, so that torchrun tears its workers down
            self._proc = proc = proc_group.start(cmd, death_signal=signal.SIGTERM, stdout=logf,
                                                 stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, env=full_env)
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
                            if item.get("rank") == 0:
                                self.on_progress("step", 1)
                        elif item.get("event") == "finished":
                            finished.add(item["rank"])
                        elif item.get("event") == "init" and isinstance(item.get("pid"), int):
                            st = _stat(item["pid"])
                            ranks[item["pid"]] = st[2] if st else None
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
                    reason = abort() if abort is not None and len(finished) < nproc else None
                    if reason:
                        status, why = "error", reason
                        stop(proc)
                        for item in tail.read():  # rows that landed during the kill
                            if "table" in item:
                                nrows += self.bundle.append_rows(item["table"], [item["row"]])
                        break
                    limit = self.plan.timeout_s + (0 if started else STARTUP_GRACE_S)
                    if len(finished) >= nproc:
                        # every local rank measured everything and its rows are on disk: a slow
                        # teardown is not a hang, and not worth waiting long for either
                        limit = TEARDOWN_GRACE_S
                    if time.monotonic() - last_activity > limit and len(finished) >= nproc:
                        progress.debug("launch finished but did not exit; killed")
                        stop(proc)
                        break
                    if time.monotonic() - last_activity > limit:
                        status = "hang"
                        why = (f"no progress for {limit:g} s; launch killed" if started else
                               f"no worker started within {limit:g} s; launch killed")
                        stop(proc)
                        for item in tail.read():  # rows that landed during the kill
                            if "table" in item:
                                nrows += self.bundle.append_rows(item["table"], [item["row"]])
                        break
                    time.sleep(POLL_S)
            finally:
                stop(proc)
                self._proc = None
        append_rank_logs(rows_dir, log, events)
        if stuck:
            note = (f"{len(stuck)} rank process(es) still running {RANK_EXIT_WAIT_S:g} s after "
                    f"SIGKILL (pids {', '.join(map(str, stuck))}): the next launch may find "
                    "their GPUs busy")
            progress.warn(note)
            why = f"{why}; {note}" if why else note
        current = None
        if status != "ok":
            current = min(open_cases.values(), key=lambda e: e.get("t", 0)) if open_cases else last
        return LaunchResult(status, proc.returncode, current, nrows, why, events)

    def kill(self) -> None:
        """Kill the running launch (signal handlers call this)."""
        if self._proc is not None:
            proc_group.stop(self._proc, 2.0)

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    # -- copies ----------------------------------------------------------------------------------

    def run_copies(self) -> dict[str, dict[str, Any]]:
        """P2P and concurrent cases, resuming after a hung or failed case; after
        HANGS_PER_CLASS hangs in one class of copies (`Plan.copy_class`), the rest of that class is
        not run (rows with status not_run say why): a VM that advertises P2P but breaks it would
        otherwise hang every peer case, a deadline each (hours on 8 GPUs).

        Returns per part ("p2p", "concurrent") {status, why, rows, hangs, errors, not_run}.
        """
        from probes.p2p_worker import concurrent_rows, p2p_row  # heavy: torch

        nproc = 1 if self.plan.backend == "cuda" else self.plan.nranks
        env: dict[str, str] = {}
        if self.plan.backend == "cuda":
            # CUDA ordinals = NVML indices: PCI bus order, every GPU up to the highest one visible
            env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "CUDA_VISIBLE_DEVICES": self._visible(list(range(max(self.plan.devices) + 1))),
                   # expandable segments are mapped with the driver's VMM calls, which the copy
                   # probe's cudaDeviceEnablePeerAccess does not map for peers (issue 23 pt 8):
                   # the copy buffers come from plain cudaMalloc segments
                   "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
        result: dict[str, dict[str, Any]] = {
            p: {"status": "ok", "why": None, "rows": 0, "hangs": 0, "errors": 0, "not_run": 0}
            for p in ("p2p", "concurrent")}
        hangs: dict[str, int] = {}
        stopped: dict[str, str] = {}  # class -> why its remaining cases are not run
        ran: set[tuple[str, int]] = set()
        resume = ""
        n = 0
        while True:
            n += 1
            tag = f"pcieprof{self.work.name}-copies{n}"
            args = ["--shm-tag", tag] + (["--resume", resume] if resume else []) + (
                ["--skip", ",".join(sorted(stopped))] if stopped else [])
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
                    ran.add((str(ev["part"]), int(ev["case"])))
            if r.status == "ok":
                break
            if r.current is None:  # died before the first case: nothing to resume
                for part in result.values():
                    part.update(status="failed", why=r.why)
                break
            part, idx = r.current["part"], int(r.current["case"])
            ran.add((part, idx))
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
            cls = self.plan.copy_class(part, idx)
            if r.status == "hang":
                hangs[cls] = hangs.get(cls, 0) + 1
                if hangs[cls] >= HANGS_PER_CLASS:
                    stopped[cls] = (f"not run: {hangs[cls]} {cls} cases hung (no progress for "
                                    f"{self.plan.timeout_s:g} s each); the rest of the class is "
                                    "left out")
                    progress.warn(f"{cls} copies: {hangs[cls]} cases hung; the remaining {cls} "
                                  "cases are not run")
            progress.warn(f"{part} case {idx} ({r.status}): {r.why}; going on with the next case")
            nxt = self._next_case(part, idx, stopped)
            if nxt is None:
                break
            resume = nxt
        self._not_run_rows(stopped, ran, result)
        return result

    def _not_run_rows(self, stopped: dict[str, str], ran: set[tuple[str, int]],
                      result: dict[str, dict[str, Any]]) -> None:
        """Rows with status not_run for the cases of stopped classes that did not run."""
        from probes.p2p_worker import concurrent_rows, p2p_row  # heavy: torch

        for part, cases in (("p2p", self.plan.p2p), ("concurrent", self.plan.concurrent)):
            left = [i for i in range(len(cases)) if (part, i) not in ran
                    and self.plan.copy_class(part, i) in stopped]
            for i in left:
                why = stopped[self.plan.copy_class(part, i)]
                if part == "p2p":
                    self.bundle.append_rows("p2p", [p2p_row(self.plan.p2p[i], self.plan.backend,
                                                            None, status="not_run", detail=why)])
                else:
                    self.bundle.append_rows("concurrent", concurrent_rows(
                        self.plan.concurrent[i], self.plan.backend, None, None, why,
                        status="not_run"))
            if left:
                result[part]["not_run"] = len(left)
                result[part]["status"] = "partial"
                result[part]["why"] = "; ".join(dict.fromkeys(
                    x for x in (result[part]["why"], f"{len(left)} case(s) not run after "
                                "hangs in their class") if x))

    def _next_case(self, part: str, idx: int, stopped: Mapping[str, str] = {}) -> str | None:
        """PART:INDEX of the first case after (part, idx) whose class is not stopped."""
        order = ([("p2p", i) for i in range(len(self.plan.p2p))]
                 + [("concurrent", i) for i in range(len(self.plan.concurrent))])
        for p, i in order[order.index((part, idx)) + 1:]:
            if self.plan.copy_class(p, i) not in stopped:
                return f"{p}:{i}"
        return None

    # -- all-reduce ------------------------------------------------------------------------------

    def run_allreduce(self) -> dict[str, Any]:
        """Every all-reduce case, each a fresh launch (on cuda: an untimed launch with NCCL's tuner
        log, then the timed one).

        Several nodes (`self.group`): node 0 runs the plan and, for each launch of a cross-node
        case, tells the other nodes to start theirs (pcieprof.node_group); the others only
        follow. Node 0's rank 0 writes every row into node 0's bundle; a launch that fails on
        one node is stopped on the others at once; a node lost stops the cross-node cases that
        remain (node 0 still runs its own intra-node case).

        Returns:
            The part record {status, why, cases, hangs, errors, not_run}; on the other nodes
            with `from_node0`, node 0's record of the cross-node part.
        """
        if self.group is not None and not self.group.leader:
            return self._follow()
        out: dict[str, Any] = {"status": "ok", "why": None, "cases": 0, "hangs": 0, "errors": 0,
                               "not_run": 0}
        choices = NcclChoices()
        whys: list[str] = []
        group = self.group
        for k, case in enumerate(self.plan.allreduce):
            cross = group is not None and not case.node0_only
            if group is not None and not cross and not group.ended:
                group.end(self._summary(out, whys))  # the others go on with their copies
            if cross and self._lost():
                if not out["not_run"]:
                    progress.warn(f"all-reduce: {self._lost()}; the remaining cross-node cases "
                                  "are not run")
                out["not_run"] += 1
                continue
            over = (f" across {self.plan.nnodes} nodes ({self.plan.world(case)} ranks)" if cross
                    else " on this node" if group is not None else "")
            progress.info(f"all-reduce {k + 1}/{len(self.plan.allreduce)}: {case.label}{over} "
                          f"{' '.join(f'{a}={b}' for a, b in case.env.items()) or '(no env)'}")
            launch = self._stepper(k) if cross else self._local(Launch())
            try:
                r, name, entry = self._case(k, case, launch)
            except NodeLost as exc:  # before this node's launch started: the case did not run
                self._node_lost = str(exc)
                progress.warn(f"all-reduce: {exc}; the remaining cross-node cases are not run")
                out["not_run"] += 1
                continue
            out["cases"] += 1
            for ev in r.events:
                if ev.get("event") == "versions" and ev.get("nccl"):
                    self.bundle.set_versions(nccl=ev["nccl"])
            choices.cases[name] = entry
            self.bundle.write_doc(choices)
            if r.status != "ok":
                out["hangs" if r.status == "hang" else "errors"] += 1
                cur = r.current or {}
                size = int(cur.get("size", 0) or 0)
                dtype = str(cur.get("dtype", ""))
                where = f"size {size} B, dtype {dtype}" if cur else "before the first message"
                ranks = self.plan.global_ranks(case)
                detail = (f"{r.why} (variant {case.variant}, {where}, "
                          f"ranks {','.join(map(str, ranks))})")
                self.bundle.append_rows("allreduce", [AllReduceRow(
                    backend=self.plan.backend, variant=case.variant, env=dict(case.env),
                    nranks=len(ranks), ranks=ranks, size_bytes=size,
                    dtype=dtype, iters=0, status=r.status, detail=detail)])
                whys.append(f"{case.label}: {r.status}")
                progress.warn(f"all-reduce {case.label}: {detail}; going on with the next case")
        if group is not None and not group.ended:
            group.end(self._summary(out, whys))
        return self._summary(out, whys)

    def _lost(self) -> str | None:
        """Why the cross-node cases stop (another node lost), or None."""
        if self._node_lost is None and self.group is not None:
            self._node_lost = self.group.lost()
        return self._node_lost

    def _summary(self, out: dict[str, Any], whys: list[str]) -> dict[str, Any]:
        """The part record: partial when a case failed or a node was lost."""
        res = dict(out)
        notes = list(whys)
        if self._lost():
            notes.append(str(self._lost()) + (f"; {out['not_run']} cross-node case(s) not run"
                                              if out["not_run"] else ""))
        if notes:
            res.update(status="partial", why="; ".join(notes))
        return res

    def _peer_wait_s(self) -> float:
        """How long a node waits for another node's next step: its slowest launch (start-up,
        rendezvous, a case's deadline) and then some. A loss is seen sooner (node_group)."""
        return STARTUP_GRACE_S + self.launch.rdzv_timeout_s + 2 * self.plan.timeout_s + 30.0

    def _local(self, launch: Launch) -> Launcher:
        def run(_stage: str, args: list[str], nproc: int, env: dict[str, str],
                log: Path) -> LaunchResult:
            return self._run("probes.allreduce_worker", args, nproc, env, log, launch)
        return run

    def _stepper(self, k: int) -> Launcher:
        """Node 0's launcher of a cross-node case: each launch at a port of its own, started on
        every node, stopped on every node when one fails; the others' outcomes joined in."""
        group = self.group
        assert group is not None

        def run(stage: str, args: list[str], nproc: int, env: dict[str, str],
                log: Path) -> LaunchResult:
            port = free_port(group.host)
            step = group.start(k, stage, port)
            launch = Launch(group.nnodes, 0, f"{group.host}:{port}",
                            f"{self.launch.rdzv_id}-ar{k}-{stage}", self.launch.rdzv_timeout_s)
            r = self._run("probes.allreduce_worker", args, nproc, env, log, launch,
                          abort=lambda: group.failed_peer(step))
            if r.status != "ok":
                group.abort(step, r.why)
            try:
                answers = group.results(step, self._peer_wait_s())
            except NodeLost as exc:
                self._node_lost = str(exc)
                if r.status != "ok" or stage != "timed":  # else measured: its rows stand
                    r.status = "error"
                    r.why = r.why if str(exc) in r.why else \
                        "; ".join(x for x in (r.why, str(exc)) if x)
                return r
            bad = {n: a for n, a in answers.items() if a.get("status") != "ok"}
            if bad and (r.status != "ok" or stage != "timed"):
                said = "; ".join(f"node {n}: {a.get('why')}" for n, a in bad.items()
                                 if str(a.get("why")) not in r.why)
                r.status = r.status if r.status != "ok" else "error"
                r.why = "; ".join(x for x in (r.why, said) if x)
            return r
        return run

    def _follow(self) -> dict[str, Any]:
        """Nodes other than 0: launch what node 0 says, until its `end`; no rows here (node 0's
        rank 0 writes them), the NCCL logs of this node's ranks in this bundle."""
        group = self.group
        assert group is not None
        out: dict[str, Any] = {"status": "ok", "why": None, "cases": 0, "hangs": 0, "errors": 0,
                               "not_run": 0, "from_node0": None}
        whys: list[str] = []
        cuda = self.plan.backend == "cuda"
        started: set[int] = set()
        while True:
            try:
                msg = group.next_step(self._peer_wait_s())
            except NodeLost as exc:
                self._node_lost = str(exc)
                break
            if msg["op"] == "end":
                out["from_node0"] = msg.get("summary")
                break
            k, stage, step, port = msg.get("k"), msg.get("stage"), str(msg.get("step")), \
                msg.get("port")
            if type(k) is not int or not 0 <= k < len(self.plan.allreduce) or \
                    stage not in ("untimed", "timed") or type(port) is not int or \
                    not 0 < port < 65536:
                raise BadInput(f"node 0 asked for launch {str(msg)[:200]}: no case of this "
                               "node's plan")
            started.add(k)
            case = self.plan.allreduce[k]
            name = self._name(case)
            env, _devices = self._case_env(case)
            progress.info(f"all-reduce {k + 1}/{len(self.plan.allreduce)}: {case.label} across "
                          f"{self.plan.nnodes} nodes ({self.plan.world(case)} ranks)"
                          + (f", {stage} launch" if cuda else ""))
            if stage == "untimed":
                args, env, log = (["--case", str(k), "--untimed"], {**env, **NCCL_TUNING_LOG_ENV},
                                  f"nccl/{name}.tuning.log")
            else:
                args, log = ["--case", str(k)], f"nccl/{name}.log"
                env = {**env, **NCCL_DEBUG_ENV} if cuda else env
                out["cases"] += 1
            launch = Launch(group.nnodes, group.node_rank, f"{group.host}:{port}",
                            f"{self.launch.rdzv_id}-ar{k}-{stage}", self.launch.rdzv_timeout_s)
            r = self._run("probes.allreduce_worker", args, len(case.ranks), env,
                          self.bundle.file(log), launch, abort=lambda: group.failed_peer(step))
            self.bundle.register(log)
            group.send_result(step, r.status, r.why)
            if r.status != "ok":
                out["hangs" if r.status == "hang" else "errors"] += 1
                lost = group.lost()
                whys.append(f"{case.label}{f' ({stage})' if cuda else ''}: {r.status}"
                            + ("" if lost and lost in r.why else f": {r.why}"))
                progress.warn(f"all-reduce {case.label}: {r.why}")
        group.leave()
        if self._lost():
            out["not_run"] = sum(1 for k, c in enumerate(self.plan.allreduce)
                                 if not c.node0_only and k not in started)
            progress.warn(f"all-reduce: {self._lost()}" + (
                "; the remaining cross-node cases are not run" if out["not_run"] else ""))
        res = self._summary(out, whys)
        node0 = out["from_node0"] or {}
        if node0.get("status") not in (None, "ok") and res["status"] == "ok":
            res.update(status=node0["status"], why=f"node 0: {node0.get('why')}")
        return res

    def _visible(self, devices: list[int]) -> str:
        """CUDA_VISIBLE_DEVICES for GPUs given by NVML index, CUDA ordinal i = devices[i]: their
        UUIDs from the bundle's topology.json (NVML's, so the CUDA ordinals are those GPUs
        whatever order CUDA enumerates in), else the indices themselves, which CUDA reads in
        PCI bus order under CUDA_DEVICE_ORDER=PCI_BUS_ID, the order NVML indexes in on the
        machines seen so far (an assumption where the UUIDs are unknown)."""
        if self._uuids is None:
            topo = self.bundle.read_doc(Topology)
            self._uuids = {g.index: g.uuid for g in (topo.gpus if topo else []) if g.uuid}
        if all(d in self._uuids for d in devices):
            return ",".join(self._uuids[d] for d in devices)
        return ",".join(map(str, devices))

    def _case_env(self, case: AllReduceCase) -> tuple[dict[str, str], list[int]]:
        """A case's launch environment and the devices its ranks drive, in rank order."""
        cuda = self.plan.backend == "cuda"
        env = dict(case.env)
        # rank r drives the r-th GPU of the group in PCI order; a ring order is NCCL's graph
        # file's business (probes/nccl_graph.py says why a permutation is not enough)
        devices = sorted(case.ranks) if cuda and "NCCL_GRAPH_FILE" in env else list(case.ranks)
        if cuda:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = self._visible(devices)
            env = self._bundle_paths(env)
        return env, devices

    def _case(self, k: int, case: AllReduceCase, launch: Launcher
              ) -> tuple[LaunchResult, str, NcclCase]:
        """Run one case (cuda: the untimed launch with the tuner log, then the timed one).
        Returns the last launch's result, the case's name and its nccl_choices entry."""
        name = self._name(case)
        log = f"nccl/{name}.log"
        cuda = self.plan.backend == "cuda"
        env, devices = self._case_env(case)
        nproc = len(case.ranks)
        entry = self._entry(case, log, devices)
        r: LaunchResult | None = None
        if cuda:
            header = self._write_ring_graph(case, env)
            if header is not None:
                entry.ring_graph = {"file": case.env["NCCL_GRAPH_FILE"],
                                    "header": header.source}
            tuning_env = {**env, **NCCL_TUNING_LOG_ENV}
            if _plain_default(case):  # NCCL's own ring graph: the header for forced rings
                tuning_env["NCCL_GRAPH_DUMP_FILE"] = str(self.bundle.file(f"nccl/{name}.graph.xml"))
            r = launch("untimed", ["--case", str(k), "--untimed"], nproc, tuning_env,
                       self.bundle.file(f"nccl/{name}.tuning.log"))
            self.bundle.register(f"nccl/{name}.tuning.log")
            entry.tuning_log = f"nccl/{name}.tuning.log"
            tuned = self._parse(f"nccl/{name}.tuning.log", entry)
            entry.tuner = with_dtypes(tuned.tuner if tuned is not None else [], case, entry)
            if _plain_default(case) and self.bundle.has(f"nccl/{name}.graph.xml"):
                self.bundle.register(f"nccl/{name}.graph.xml")
                self._graph_dumps[tuple(devices)] = self.bundle.file(f"nccl/{name}.graph.xml")
            if _is_ring_order(case):
                check = check_ring(tuned, case.ranks, entry.rank_to_device)
                ring_check = entry.ring_check = {"untimed": check}
                how = ("NCCL_GRAPH_FILE" if "NCCL_GRAPH_FILE" in case.env
                       else "CUDA_VISIBLE_DEVICES order")
                said = (f"ring order applied through {how}: {check['why']} (NCCL's log)"
                        if check["applied"] else f"ring order NOT applied: {check['why']}")
                if not check["applied"]:
                    progress.warn(f"all-reduce {case.label}: {check['why']}")
                # the ring only runs where the tuner picks the ring algorithm: each size's rows
                # say where it did not (the tree is searched apart from the graph file)
                off = not_ring_sizes(tuned, case.sizes)
                ring_check["not_ring_sizes"] = {str(k): v for k, v in off.items()}
                case.size_detail = {str(k): f"NCCL's tuner chose {v} at {k} B: the ring order "
                                    "is not what ran at this size" for k, v in off.items()}
                if off and check["applied"]:
                    said += (f" at the sizes where NCCL runs the ring algorithm ({len(off)} of "
                             f"{len(case.sizes)} sizes ran another)")
                # said in every row of the timed launch
                case.detail = "; ".join(x for x in (case.detail, said) if x)
                self.plan_file.write_text(json.dumps(self.plan.to_json(), indent=1), encoding="utf-8")
            if r.status == "ok":
                r = None  # the timed launch follows
            else:
                entry.parsed = tuned
                r.why = f"{r.why} (untimed launch with NCCL's tuner log)"
        if r is None:
            r = launch("timed", ["--case", str(k)], nproc,
                       {**env, **NCCL_DEBUG_ENV} if cuda else env, self.bundle.file(log))
            self.bundle.register(log)
            if cuda:
                parsed = self._parse(log, entry)
                entry.parsed = replace(parsed, tuner=entry.tuner) if parsed else None
                if _is_ring_order(case) and entry.ring_check is not None:
                    entry.ring_check["timed"] = check_ring(parsed, case.ranks,
                                                           entry.rank_to_device)
        return r, name, entry

    def _bundle_paths(self, env: dict[str, str]) -> dict[str, str]:
        """NCCL_*_FILE values relative to the bundle as absolute paths (workers run elsewhere)."""
        return {k: (str(self.bundle.path / v) if k.startswith("NCCL_") and k.endswith("_FILE")
                    and v and not Path(v).is_absolute() else v) for k, v in env.items()}

    def _write_ring_graph(self, case: AllReduceCase, env: dict[str, str]) -> GraphHeader | None:
        """Write the NCCL_GRAPH_FILE of a ring-order case (not when the case brought its own):
        channels = the requested ring; count and speeds from NCCL's own graph for the same GPUs
        in their plain order when that ran first, else assumed."""
        rel = case.env.get("NCCL_GRAPH_FILE", "")
        if not _is_ring_order(case) or not rel or Path(rel).is_absolute():
            return None
        dump = self._graph_dumps.get(tuple(sorted(case.ranks)))
        header = GraphHeader()
        if dump is not None and dump.is_file():
            try:
                header = header_from_dump(dump.read_text(encoding="utf-8"),
                                          str(dump.relative_to(self.bundle.path)))
            except Exception as exc:  # noqa: BLE001 - a dump we cannot read leaves the default
                # said aloud: the forced ring then runs with an assumed header while its baseline
                # ran with NCCL's own, and the comparison is confounded
                progress.warn(f"NCCL graph dump {dump.name} not read ({exc}); {header.source}")
        self.bundle.write_text(rel, ring_graph_xml(list(case.ranks), header))
        return header

    def _entry(self, case: AllReduceCase, log: str, devices: list[int]) -> NcclCase:
        """The nccl_choices.json entry of one case before its launches."""
        # NCCL's rings are in rank space; rank r drives GPU devices[r] (several nodes: global
        # rank r the global GPU number of Plan.global_ranks, as the rows' `ranks`)
        if self.plan.case_nodes(case) > 1:
            ranks, to_device = list(self.plan.global_ranks(case)), list(self.plan.global_ranks(
                AllReduceCase(**{**asdict(case), "ranks": devices})))
        else:
            ranks, to_device = list(case.ranks), devices
        entry = NcclCase(variant=case.variant, ranks=tuple(ranks), env=dict(case.env), log=log,
                         user_env=self.env_record,
                         launch_env=({} if self.plan.case_nodes(case) > 1 else
                                     loopback_ifnames(self._launch_base())),
                         rank_to_device={str(r): d for r, d in enumerate(to_device)})
        if self.plan.backend != "cuda":
            entry.note = (f"{self.plan.backend} backend: gloo process group, NCCL not used"
                          + (f"; {GLOO_IGNORES_NCCL}" if case.env else ""))
        return entry

    def _launch_base(self) -> dict[str, str]:
        """The environment every launch starts from (the user's, NCCL_* left out unless kept)."""
        return launch_environ(os.environ, self.plan.keep_env)[0]

    def _parse(self, log: str, entry: NcclCase) -> NcclParsed | None:
        """What NCCL chose, from one NCCL_DEBUG=INFO log of the bundle (None when unreadable)."""
        try:
            return parse_nccl_log(self.bundle.file(log).read_text(encoding="utf-8",
                                                                  errors="replace"), log)
        except Exception as exc:  # noqa: BLE001 - a log we cannot read must not end the sweep
            entry.extra.setdefault("notes", []).append(f"could not parse {log}: {exc}")
            return None


def with_dtypes(tuner: list[dict[str, Any]], case: AllReduceCase,
                entry: NcclCase) -> list[dict[str, Any]]:
    """NCCL's TUNING choices of an untimed launch, each with the dtype of its all-reduce.

    A TUNING line names the bytes, not the dtype, so the bf16 and fp32 all-reduces of one byte
    count would merge. The untimed launch runs one all-reduce per dtype and size, dtype by
    dtype in the case's order, and rank 0 logs them in that order: when the log's all-reduce
    choices are exactly that sequence of byte counts, each gets its dtype; otherwise they stay
    as logged and the entry's `notes` say why."""
    seq = [(d, s) for d in case.dtypes for s in case.sizes]
    ar = [t for t in tuner if t.get("coll") in (None, "AllReduce")]
    if [int(t.get("bytes") or -1) for t in ar] != [s for _, s in seq]:
        if ar:
            entry.extra.setdefault("notes", []).append(
                f"{len(ar)} all-reduce TUNING lines for {len(seq)} all-reduces: dtypes not "
                "assigned (a TUNING line names bytes, not the dtype)")
        return tuner
    dtype_of = {id(t): d for t, (d, _) in zip(ar, seq)}
    return [{**t, "dtype": dtype_of[id(t)]} if id(t) in dtype_of else t for t in tuner]


def _is_ring_order(case: AllReduceCase) -> bool:
    """A case whose ranks ask for a ring order (not the GPUs' ascending order)."""
    return list(case.ranks) != sorted(case.ranks)


def _plain_default(case: AllReduceCase) -> bool:
    """NCCL's own choices: the default variant, no settings, GPUs in ascending order."""
    return case.variant == "default" and not case.env and not _is_ring_order(case)


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
