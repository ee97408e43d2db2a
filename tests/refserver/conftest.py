"""Start the real reference server as a subprocess on a free port, and always tear it down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from builders.procs import alive, descendants, free_port

READY = "The server is fired up and ready to roll!"


class Server:
    """One reference-server process (rank 0) and its log."""

    def __init__(self, log: Path, extra: list[str], tp: int = 2,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "wb")
        argv = [sys.executable, "-m", "pcieprof.refserver", "--tp-size", str(tp),
                "--port", str(self.port), "--host", "127.0.0.1", *extra]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})},
                                     start_new_session=True)
        self.ranks: set[int] = set()

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if READY in self.log():
                self.ranks = descendants(self.proc.pid)
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited ({self.proc.returncode}):\n{self.log()}")
            time.sleep(0.2)
        raise AssertionError(f"server not ready in {timeout} s:\n{self.log()}")

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def all_gone(self, pids: set[int], timeout: float = 60) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not any(alive(p) for p in pids):
                return True
            time.sleep(0.1)
        return False

    def kill(self) -> None:
        """Kill the whole session: rank 0 and anything left below it."""
        pids = descendants(self.proc.pid) | self.ranks
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=60)
        self._log.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator:
    """Factory: start_server(extra_flags, tp=2, env=None) -> Server; all killed afterwards."""
    started: list[Server] = []

    def start(extra: list[str] | None = None, tp: int = 2,
              env: dict[str, str] | None = None) -> Server:
        s = Server(tmp_path / f"server-{len(started)}.log", list(extra or []), tp, env)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One TP=2 server shared by a module's tests."""
    s = Server(tmp_path_factory.mktemp("refserver") / "server.log", [], 2)
    try:
        s.wait_ready()
        yield s
    finally:
        s.kill()
