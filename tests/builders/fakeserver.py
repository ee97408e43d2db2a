"""A fake-token server with SGLang's streaming shapes, for client tests and the client benchmark (test-only: not shipped in the package).

It does no model work: `/generate` and `/v1/completions` stream `max_new_tokens` chunks, one token
each, `token_delay_s` apart (0 streams as fast as the event loop can), so a client's ingest
capacity (tokens/s it can time) is what limits a run against it. Never a measurement target.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
from typing import Any

import orjson
from aiohttp import web


def build_app(token_delay_s: float = 0.0, ttft_s: float = 0.0) -> web.Application:
    """The aiohttp app: /health, /health_generate, /generate, /v1/completions."""

    async def health(_r: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def generate(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        n = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
        if n > 100_000:
            return web.json_response({"error": "too many tokens"}, status=400)
        prompt = len(body.get("input_ids") or body.get("text") or "")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if ttft_s:
            await asyncio.sleep(ttft_s)
        text = []
        for i in range(1, n + 1):
            text.append("x")
            ev = {"text": "".join(text), "meta_info": {"id": "r", "prompt_tokens": prompt,
                                                        "completion_tokens": i,
                                                        "finish_reason": None if i < n else
                                                        {"type": "length", "length": n}}}
            await resp.write(b"data: " + orjson.dumps(ev) + b"\n\n")
            if token_delay_s:
                await asyncio.sleep(token_delay_s)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def completions(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        n = int(body.get("max_tokens", 16))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if ttft_s:
            await asyncio.sleep(ttft_s)
        for _ in range(n):
            ch = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "x"}]}
            await resp.write(b"data: " + orjson.dumps(ch) + b"\n\n")
            if token_delay_s:
                await asyncio.sleep(token_delay_s)
        usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": len(body.get("prompt", [])),
                                                     "completion_tokens": n}}
        await resp.write(b"data: " + orjson.dumps(usage) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/completions", completions)
    return app


class FakeServer:
    """Runs the fake app on 127.0.0.1 in a background thread (context manager).

    Attributes:
        url: `http://127.0.0.1:<port>` once started.
    """

    def __init__(self, token_delay_s: float = 0.0, ttft_s: float = 0.0) -> None:
        self._app = build_app(token_delay_s, ttft_s)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def __enter__(self) -> "FakeServer":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        self._thread.start()

        async def start() -> None:
            self._runner = web.AppRunner(self._app, access_log=None)
            await self._runner.setup()
            await web.SockSite(self._runner, sock).start()

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *_exc: Any) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def main(argv: list[str] | None = None) -> None:
    """`python tests/builders/fakeserver.py --port P [--token-delay S]`: serve until killed."""
    p = argparse.ArgumentParser(prog="tests/builders/fakeserver.py")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--token-delay", type=float, default=0.0)
    a = p.parse_args(argv)
    web.run_app(build_app(a.token_delay), host=a.host, port=a.port, access_log=None,
                print=lambda *_: print(f"fake token server on {a.host}:{a.port}", flush=True))


if __name__ == "__main__":
    main()
