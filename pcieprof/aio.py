"""Running a coroutine from synchronous code without losing a Ctrl-C.

`asyncio.run` turns SIGINT into a cancellation of its main task and raises KeyboardInterrupt
only if that task ends cancelled. A coroutine that swallows the cancellation (a client that counts
a cancelled request as failed) or converts it (a timeout context that turns it into
TimeoutError, which callers then catch as "no answer") ends otherwise, and the Ctrl-C is lost:
serve-bench's launch search once went on to serve after one (issue 25).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, except that a SIGINT during it always ends in KeyboardInterrupt,
    whatever the coroutine made of the cancellation it caused."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return asyncio.run(coro)  # nobody's Ctrl-C to keep here (a thread, or a handler of ours)
    hit = False
    main: asyncio.Task[T] | None = None

    async def wrapped() -> T:
        nonlocal main
        main = asyncio.current_task()  # type: ignore[assignment]
        if hit:
            raise KeyboardInterrupt
        return await coro

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal hit
        hit = True
        if main is not None and not main.done():
            main.get_loop().call_soon_threadsafe(main.cancel)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        try:
            result = asyncio.run(wrapped())
        except BaseException:
            if hit:
                raise KeyboardInterrupt from None
            raise
        if hit:
            raise KeyboardInterrupt
        return result
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
