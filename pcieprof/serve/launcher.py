"""Start a server (SGLang or the reference server) as its own process group, and always stop it.

The server runs in a new session (`start_new_session=True`), so it and every process it starts
(SGLang's scheduler and detokenizer processes, the reference server's rank processes) share one
process group that `stop()` signals as a whole: SIGTERM, a grace period, then SIGKILL. It also
dies with pcieprof, even when pcieprof is SIGKILLed: the kernel sends it a parent-death signal
(prctl PR_SET_PDEATHSIG), and its own children die with it (SGLang's scheduler processes set
their own parent-death SIGKILL, sglang.srt.utils.kill_itself_when_parent_died; the reference
server's ranks likewise, pcieprof.refserver.procs). Its stdout and stderr are copied as they come
into the bundle (`serve/server-<n>.log`) with secrets masked (pcieprof.redact), flushed as they
come. Readiness is SGLang's: `GET /health_generate` answers 200 once the server can generate a
token.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Callable

import aiohttp

from pcieprof import aio, proc_group, progress
from pcieprof.bundle.serve_search import Outcome
from pcieprof.redact import redact, remember_environ, unfinished_at
from pcieprof.serve.outcomes import ACCESS, PROGRESS, Classified, classify
from pcieprof.serve.sglang_cmd import ServerCommand, server_env


def free_port(host: str = "127.0.0.1", start: int = 30000, tries: int = 200) -> int:
    """The first port from `start` that can be bound on `host` now (0 tries = kernel's choice)."""
    for port in range(start, start + tries):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout_s: float = 5.0, max_bytes: int = 1 << 20) -> tuple[int, bytes]:
    """GET `url` within `timeout_s` seconds in all (connecting, headers and body: a server that
    drips bytes is cut off at the deadline); (status, body of at most `max_bytes`), status 0 when
    nothing usable answered (no connection, garbage or truncated HTTP, the deadline)."""
    try:
        return aio.run(_get(url, timeout_s, max_bytes))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        return 0, b""


async def _get(url: str, timeout_s: float, max_bytes: int) -> tuple[int, bytes]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url) as r:
            body = bytearray()
            while len(body) <= max_bytes:  # to the end: a short or dripping body is no answer
                chunk = await r.content.read(1 << 16)
                if not chunk:
                    break
                body += chunk
            return int(r.status), bytes(body[:max_bytes]) if r.status == 200 else b""


class ServerProcess:
    """One server process group with its log file.

    Args:
        cmd: the command (argv + env).
        log_path: where its stdout/stderr go.
        base_env: environment to start from (default: this process's).
    """

    def __init__(self, cmd: ServerCommand, log_path: Path,
                 base_env: dict[str, str] | None = None) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self._env = server_env(cmd, base_env)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.started_at = 0.0
        self.progress: ProgressWatch | None = None  # set by wait_ready
        self._pump: threading.Thread | None = None
        # The secret values it is given are masked wherever its log quotes them.
        remember_environ(self._env)
        redact(cmd.exec_argv())

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server in its own session; its output is written to `log_path`."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab", buffering=0)
        self._log.write(("# " + self.cmd.shell() + "\n").encode())
        self.started_at = time.monotonic()
        # Without a launch prefix the server itself gets SIGKILL when we die (nothing it could
        # do on SIGTERM is worth a server left behind); through a prefix (docker run, srun, ssh)
        # SIGTERM, which those forward to what they started.
        death = signal.SIGTERM if self.cmd.prefix else signal.SIGKILL
        self.proc = proc_group.start(self.cmd.exec_argv(), death_signal=death, env=self._env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, close_fds=True)
        assert self.proc.stdout is not None  # stdout=PIPE
        self._pump = threading.Thread(target=_copy_redacted, args=(self.proc.stdout, self._log),
                                      name=f"server-log-{self.proc.pid}", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        """The exit status once the server has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop the whole process group: SIGTERM, wait up to `grace_s`, then SIGKILL.

        Safe to call more than once and after the server died by itself; also reaps any
        process left in the group after the leader exited.
        """
        if self.proc is None:
            return None
        rc = proc_group.stop(self.proc, grace_s)
        if self._pump is not None:
            self._pump.join(timeout=5)  # the group is gone: its pipe ends
        if self._log is not None:
            self._log.close()
            self._log = None
        return rc

    # -- log --------------------------------------------------------------------------------------

    def log_text(self, max_bytes: int = 4 << 20) -> str:
        """The log so far (its last `max_bytes`)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def classify(self, *, hung: bool = False, served: bool = False) -> Classified:
        """Classify the server's state from its log and exit status."""
        return classify(self.log_text(), self.exit_code(), hung=hung, served=served)

    # -- readiness --------------------------------------------------------------------------------

    def wait_ready(self, base_url: str, *, deadline_s: float, stall_s: float | None = None,
                   poll_s: float = 0.5,
                   on_wait: Callable[[float, str], None] | None = None) -> Classified | None:
        """Wait until `GET /health_generate` answers 200.

        Args:
            base_url: `http://host:port`.
            deadline_s: give up (outcome `hang`) after this long in all (s).
            stall_s: give up earlier (outcome `hang`) when the log shows no start-up progress
                (weight loading, CUDA-graph capture, warm-up; see outcomes.PROGRESS) for this
                long (s); health-check and access lines do not count. None: never.
            poll_s: time between checks (s).
            on_wait: called with (seconds waited, last log line) on every check.

        Returns:
            None when ready, else the classified failure (the server is left running; call stop).
        """
        url = base_url.rstrip("/") + "/health_generate"
        watch = self.progress = ProgressWatch(self.log_path, self.started_at)
        while True:
            now = time.monotonic()
            waited = now - self.started_at
            if self.exit_code() is not None:
                watch.poll()
                return self.classify()
            status, _ = http_get(url, timeout_s=max(2.0, poll_s * 4))
            watch.poll()
            if status == 200:
                return None
            if on_wait:
                on_wait(waited, _last_line(self.log_text(16 << 10)))
            quiet = time.monotonic() - watch.last_progress_at
            if stall_s and quiet > stall_s:
                return _hung(self.classify(hung=True), f"no start-up progress for {quiet:.0f} s "
                                                       f"(stall timeout {stall_s:g} s)")
            if time.monotonic() - self.started_at > deadline_s:
                return _hung(self.classify(hung=True),
                             f"not ready after the {deadline_s:g} s start-up deadline")
            time.sleep(poll_s)


class ProgressWatch:
    """Follows a server log as it grows and notes when it last showed progress.

    A line is progress when it matches `outcomes.PROGRESS` and differs from the previous progress
    line once timestamps and bracketed tqdm timings are removed, so a progress bar redrawn
    without advancing does not count. Lines are split at newlines and at the carriage returns
    tqdm redraws with.

    Args:
        path: the log file.
        started_at: time.monotonic() of the start: the quiet time counts from here.
        max_read: bytes read per poll at most (the rest is read by later polls).
    """

    def __init__(self, path: Path, started_at: float, max_read: int = 1 << 20) -> None:
        self.path = path
        self.last_progress_at = started_at
        self.last_progress = ""
        self.count = 0
        self._offset = 0
        self._rest = ""
        self._key = ""
        self._max_read = max_read

    def poll(self) -> bool:
        """Read what the log gained; True when it showed progress."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(self._max_read)
        except OSError:
            return False
        self._offset += len(chunk)
        text = self._rest + chunk.decode("utf-8", "replace")
        lines = _LINE_BREAK.split(text)
        self._rest = lines.pop()
        moved = False
        for ln in lines:
            if not PROGRESS.search(ln) or ACCESS.search(ln):
                continue
            key = _BRACKETS.sub("", ln).strip()
            if key != self._key:
                self._key, self.last_progress = key, ln.strip()
                self.count += 1
                moved = True
        if moved:
            self.last_progress_at = time.monotonic()
        return moved


def _copy_redacted(src: IO[bytes], dst: IO[bytes], max_line: int = 1 << 16,
                   idle_s: float = 0.2) -> None:
    """Copy the server's output into its log as it comes, secrets masked: up to the last line
    break (newline, or the carriage return a progress bar redraws with); the unfinished rest
    once the output pauses for `idle_s` seconds (but for a tail that may be the head of a
    secret: pcieprof.redact.unfinished_at) or grows past `max_line` bytes."""
    fd = src.fileno()
    pending = b""

    def write(data: bytes) -> None:
        try:
            dst.write(redact(data.decode("utf-8", "replace")).encode("utf-8"))
        except (OSError, ValueError):  # the log is closed or its disk full: keep draining
            pass

    try:
        while True:
            if not select.select([fd], [], [], idle_s)[0]:
                if pending:  # all but a tail that may begin a secret the next burst ends
                    text = pending.decode("utf-8", "surrogateescape")  # round-trips bytes
                    cut = unfinished_at(text)
                    if cut > 0:
                        write(text[:cut].encode("utf-8", "surrogateescape"))
                        pending = text[cut:].encode("utf-8", "surrogateescape")
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            pending += chunk
            cut = max(pending.rfind(b"\n"), pending.rfind(b"\r"))
            if cut >= 0:
                write(pending[:cut + 1])
                pending = pending[cut + 1:]
            if len(pending) > max_line:
                write(pending)
                pending = b""
        if pending:
            write(pending)
    finally:
        src.close()


def _hung(c: Classified, summary: str) -> Classified:
    """A hang says which timeout ended it; a recognised failure line keeps its own summary."""
    return replace(c, summary=summary) if c.outcome is Outcome.HANG else c


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_BRACKETS = re.compile(r"\[[^\]]*\]")


def _last_line(text: str) -> str:
    for ln in reversed(text.splitlines()):
        if ln.strip():
            return ln.strip()[:120]
    return ""


def progress_waiter(label: str) -> Callable[[float, str], None]:
    """An `on_wait` callback that prints a progress line every few seconds on stderr."""
    state = {"next": 0.0}

    def on_wait(waited: float, last: str) -> None:
        if waited >= state["next"]:
            state["next"] = waited + 5.0
            hint = f" | {last}" if last and PROGRESS.search(last) or last else ""
            progress.info(f"{label}: waiting for /health_generate ({waited:.0f} s){hint}")

    return on_wait
