"""Rank 0: the server process. Binds the port, starts the other ranks, serves HTTP.

Startup, in order: parse flags (one line and exit 2 on a bad one); bind the HTTP socket (exit 1
with uvicorn's "error while attempting to bind" text if the port is taken); start ranks 1..N-1
(before importing torch here, so the imports overlap); create the gloo rendezvous store on
127.0.0.1 at a free port (every socket of the ranks' group listens on loopback); join the
group; load the shard; start the scheduler thread and the HTTP site; send SGLang's warm-up request; print "The server is fired up and ready to roll!"
(SGLang's exact readiness line, http_server.py).

Death, in every form, takes the whole server down: a rank that exits makes rank 0 print SGLang's
"Received sigquit from a child process. It usually means the child failed." and exit 1; a
scheduler exception prints "Scheduler hit an exception: <traceback>" first; SIGTERM/SIGINT stop
the ranks and exit; and the ranks die with rank 0 (a parent-death SIGKILL and their pid
watchdog).

The ranks are members of rank 0's process group (pcieprof.proc_group.start_member), not groups
of their own: the launcher that started rank 0 owns that group, and its stop (SIGTERM, grace,
SIGKILL to the group, then waiting until no member is left) covers the ranks as it covers
SGLang's scheduler processes. Ranks ignore SIGTERM; rank 0 ends them (kill_members).
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Sequence

from pcieprof import loopback, proc_group
from pcieprof.refserver import logs
from pcieprof.refserver.args import ArgsError, ServerArgs, parse_args
from pcieprof.refserver.logs import server_log
from pcieprof.refserver.names import IDENTITY, READY_LINE, SIGQUIT_LINE

if TYPE_CHECKING:  # torch and aiohttp are imported after the ranks start, to overlap imports
    from aiohttp import web

    from pcieprof.refserver.scheduler import Scheduler


class _Ranks:
    """The worker rank processes and the thread that notices when one dies."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.exiting = False
        self._lock = threading.Lock()

    def spawn(self, argv: Sequence[str], world: int, store_port: int) -> None:
        for rank in range(1, world):
            spec = {"rank": rank, "world_size": world, "store_port": store_port,
                    "parent_pid": os.getpid(), "argv": list(argv)}
            self.procs.append(proc_group.start_member(
                [sys.executable, "-m", "pcieprof.refserver.worker", json.dumps(spec)],
                death_signal=signal.SIGKILL, close_fds=True))
        threading.Thread(target=self._watch, name="rank-watch", daemon=True).start()

    def _watch(self) -> None:
        while True:
            for rank, p in enumerate(self.procs, start=1):
                rc = p.poll()
                if rc is not None and not self.exiting:
                    server_log.error(f"{SIGQUIT_LINE} (TP{rank}, pid {p.pid}, "
                                     f"{proc_group.exit_text(rc)})")
                    die(1)
            time.sleep(0.1)

    def kill(self) -> None:
        with self._lock:
            self.exiting = True
            proc_group.kill_members(self.procs, 5.0)


_RANKS = _Ranks()


def die(code: int) -> None:
    """Take the whole server down now: every rank, then this process."""
    _RANKS.kill()
    logs.flush()
    os._exit(code)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    """Run the reference server until it is killed; returns an exit status on early failure."""
    argv = list(sys.argv[1:] if argv is None else argv)
    faulthandler.enable()  # a native crash leaves its Python stack in the log
    logs.configure(0)
    try:
        args = parse_args(argv)
    except ArgsError as exc:
        sys.stderr.write(f"pcieprof reference server: error: {exc}\n")
        return 2
    logs.configure(0, args.log_level)
    server_log.info(IDENTITY)
    server_log.info(f"server_args={args}")
    for flag, value in args.ignored_flags.items():
        server_log.info(f"--{flag}={value}: a GPU setting of SGLang, ignored by this CPU server")
    if args.inject.rule:
        server_log.warning(f"[pcieprof inject] fault matrix {args.inject.rule}: "
                           f"{args.inject.describe()}")
    if args.inject.kind != "none":
        server_log.warning(f"[pcieprof inject] fault injection enabled: {args.inject.describe()}"
                           f" (every injected fault is labelled [pcieprof inject] in this log)")
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        server_log.error(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on "
                         f"address ('{args.host}', {args.port}): {str(exc.strerror).lower()}")
        return 1
    port = sock.getsockname()[1]

    def on_signal(signum: int, _frame: object) -> None:
        server_log.info(f"Received {signal.Signals(signum).name}; stopping all ranks.")
        die(0 if signum == signal.SIGTERM else 130)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    world = args.tp_size
    try:
        # Gloo's own connections between ranks listen on the interface GLOO_SOCKET_IFNAME
        # names, else on the address the host name resolves to: loopback unless the user
        # chose otherwise (torch.distributed docs, "Choosing the network interface to use").
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback.interface())
        # Start the other ranks first, so that their imports of torch overlap with ours.
        store_sock = loopback.listening_socket()
        store_port = int(store_sock.getsockname()[1])
        if world > 1:
            _RANKS.spawn(argv, world, store_port)
        import torch.distributed as dist

        from pcieprof.refserver.ranks import RENDEZVOUS_TIMEOUT, join_group, load_model

        store = None
        if world > 1:
            store = dist.TCPStore(loopback.HOST, store_port, world, is_master=True,
                                  wait_for_workers=False, timeout=RENDEZVOUS_TIMEOUT,
                                  master_listen_fd=store_sock.fileno())
        else:
            store_sock.close()
        cpu_group = join_group(store, 0, world) if world > 1 else None
        model = load_model(args, 0, world)
        if world > 1:
            dist.barrier(group=cpu_group)
    except Exception:
        server_log.error(f"Scheduler hit an exception: {traceback.format_exc()}")
        server_log.error(SIGQUIT_LINE)
        die(1)
        return 1  # not reached
    from pcieprof.refserver.engine import RankEngine
    from pcieprof.refserver.http_api import build_app
    from pcieprof.refserver.metrics import ServerMetrics
    from pcieprof.refserver.model import TinyMoEConfig
    from pcieprof.refserver.scheduler import Scheduler

    engine = RankEngine(model, 0, world, cpu_group)
    cfg = TinyMoEConfig()
    max_tokens = args.max_running_requests * args.context_length
    logs.rank_log.info(f"KV Cache is allocated. #tokens: {max_tokens}, per-request capacity: "
                       f"prompt + max_new_tokens, dtype: float32")
    if args.inject.kind == "hang-in-capture":
        _hang_in_capture()
    metrics = ServerMetrics(args.served_model_name, max_tokens)

    def on_fatal(_tb: str) -> None:
        if _RANKS.exiting:
            return
        server_log.error(SIGQUIT_LINE)
        die(1)

    scheduler = Scheduler(args, engine, cpu_group, metrics, on_fatal,
                          is_stopping=lambda: _RANKS.exiting)
    app = build_app(args, scheduler, metrics, cfg)
    asyncio.run(_serve(app, args, sock, port, scheduler))
    return 0


def _hang_in_capture(steps: int = 6, done: int = 2) -> None:
    """Injected fault: start SGLang's decode CUDA-graph capture, log progress for `done` of
    `steps` batch sizes, then never finish (as sgl-project/sglang PR #29580 reports for the full
    decode graph on SM120). The HTTP server never starts; SIGTERM still stops everything."""
    sizes = [2 ** i for i in range(steps)][::-1]
    logs.rank_log.info("Capture target decode CUDA graph begin. backend=full, "
                       "num_tokens_per_req=1, avail mem=0.00 GB [pcieprof inject] hang-in-capture:"
                       " this capture never ends (injected fault)")
    for i, bs in enumerate(sizes[:done]):
        time.sleep(0.2)
        logs.rank_log.info(f"Capturing batches (bs={bs} avail_mem=0.00 GB): "
                           f"{100 * (i + 1) // steps}% | {i + 1}/{steps}")
    logs.flush()
    while True:
        time.sleep(3600)


async def _serve(app: web.Application, args: ServerArgs, sock: socket.socket, port: int,
                 scheduler: Scheduler) -> None:
    from aiohttp import web

    from pcieprof.refserver.http_api import STATE_KEY, warm_up

    runner = web.AppRunner(app, handle_signals=False, access_log=server_log,
                           access_log_format='%a - "%r" %s')
    await runner.setup()
    await web.SockSite(runner, sock).start()
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{port}"
    server_log.info(f"Serving HTTP on {url} (pcieprof reference server, TP={args.tp_size})")
    scheduler.start(asyncio.get_running_loop())
    if not args.skip_server_warmup:
        try:
            await warm_up(app, url.replace("0.0.0.0", "127.0.0.1"))
        except Exception as exc:
            server_log.error(f"Initialization failed. warmup error: {exc!r}")
            die(1)
    app[STATE_KEY].status = "Up"
    scheduler.mark_ready()
    server_log.info(READY_LINE)
    await asyncio.Event().wait()
