"""A Ctrl-C while synchronous code waits on a coroutine ends in KeyboardInterrupt, whatever the
coroutine makes of the cancellation (plain asyncio.run loses it when the coroutine swallows the
cancellation or turns it into TimeoutError: the launch search once went on serving after one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import asyncio, os, signal, threading, time
from pcieprof import aio

async def swallows():
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        return "swallowed"

async def converts():
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError as exc:
        raise TimeoutError("no answer") from exc

def later():
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=later, daemon=True).start()
t0 = time.monotonic()
try:
    # a caller that reads a TimeoutError as "no answer", like the server's readiness poll
    try:
        print("returned", aio.run({coro}()))
    except TimeoutError:
        print("caught TimeoutError")
except KeyboardInterrupt:
    print("KeyboardInterrupt", "in time" if time.monotonic() - t0 < 30 else "late")
print("handler restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
print("after:", aio.run(asyncio.sleep(0, result="ok")))
"""


@pytest.mark.parametrize("coro", ["swallows", "converts"])
def test_a_ctrl_c_during_a_coroutine_is_not_lost(coro: str) -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT.replace("{coro}", coro)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["KeyboardInterrupt in time", "handler restored True",
                                     "after: ok"], r.stdout + r.stderr
