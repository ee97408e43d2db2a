"""SGLang's HTTP surface, served by aiohttp on rank 0.

Routes, bodies and stream framing follow sgl-project/sglang
python/sglang/srt/entrypoints/http_server.py and openai/serving_completions.py:

- `POST /generate` {text | input_ids, sampling_params {max_new_tokens, temperature, top_p,
  top_k, ignore_eos, sampling_seed}, stream, rid}: with stream, one `data: {json}\\n\\n` event per
  token whose `text` is the whole output so far (SGLang's default, not incremental) and whose
  `meta_info` has id, finish_reason (None, then {"type": "length", "length": N} or
  {"type": "stop", "matched": id}), prompt_tokens, completion_tokens, cached_tokens (and
  e2e_latency at the end), then `data: [DONE]\\n\\n`.
- `POST /v1/completions` (OpenAI): stream chunks {id, object: "text_completion", created, model,
  choices: [{index, text (delta), logprobs, finish_reason, matched_stop}]}, a usage chunk when
  stream_options.include_usage, then `data: [DONE]`.
- `GET /health`, `/health_generate`: SGLang's one handler for both: 503 while starting; else a
  one-token generation, 200 as soon as the scheduler produces anything, 503 after
  SGLANG_HEALTH_CHECK_TIMEOUT seconds (default 20) without progress.
- `GET /get_server_info`, `/get_model_info`, `/v1/models`, `/metrics`, and
  `/start_profile` (SGLang's ProfileReqInput body) / `/stop_profile`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from pcieprof import __version__
from pcieprof.refserver.args import ServerArgs, health_check_timeout_s
from pcieprof.refserver.logs import server_log
from pcieprof.refserver.metrics import ServerMetrics
from pcieprof.refserver.model import TinyMoEConfig
from pcieprof.refserver.names import IDENTITY
from pcieprof.refserver.scheduler import Request, Scheduler
from pcieprof.refserver.tokenizer import Tokenizer

SCHEDULER_KEY: web.AppKey[Scheduler] = web.AppKey("scheduler", Scheduler)
STATE_KEY: web.AppKey[dict[str, Any]] = web.AppKey("state", dict)


class _BadRequest(Exception):
    pass


def _error(message: str, status: int = 400) -> web.Response:
    # SGLang's ErrorResponse shape (openai/protocol.py)
    body = {"object": "error", "message": message, "type": "BadRequest", "param": None,
            "code": status}
    return web.json_response(body, status=status, dumps=lambda o: orjson.dumps(o).decode())


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest("the JSON body must be an object")
    return body


class _Stream:
    """Tokens of one request, handed from the scheduler thread to its HTTP handler."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[int, dict[str, Any] | None]] = asyncio.Queue()

    def on_token(self, _req: Request, token: int, finish: dict[str, Any] | None) -> None:
        self.queue.put_nowait((token, finish))


def build_app(args: ServerArgs, scheduler: Scheduler, metrics: ServerMetrics,
              cfg: TinyMoEConfig) -> web.Application:
    """The aiohttp application; `state["status"]` is "Starting", "Up" or "UnHealthy"."""
    tok = Tokenizer()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SCHEDULER_KEY] = scheduler
    state: dict[str, Any] = {"status": "Starting", "rid_seq": 0}
    app[STATE_KEY] = state

    def make_request(prompt: Any, sp: dict[str, Any], rid: str | None, on_token: Any,
                     log_metrics: bool = True, return_logprob: bool = False) -> Request:
        if isinstance(prompt, str):
            ids = tok.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
            ids = list(prompt)
            if any(not 0 <= i < tok.vocab_size for i in ids):
                raise _BadRequest(f"input_ids must be in [0, {tok.vocab_size})")
        else:
            raise _BadRequest("give 'text' (a string) or 'input_ids' (a list of ints)")
        if not ids:
            ids = [tok.bos_id]
        max_new = sp.get("max_new_tokens", 128)
        if max_new is None:
            max_new = 128
        try:
            max_new = int(max_new)
            temperature = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None
                                else 1.0)
            top_p = float(sp.get("top_p", 1.0) if sp.get("top_p") is not None else 1.0)
            top_k = int(sp.get("top_k", -1) if sp.get("top_k") is not None else -1)
        except (TypeError, ValueError) as exc:
            raise _BadRequest(f"bad sampling_params: {exc}") from None
        if max_new < 1:
            raise _BadRequest("max_new_tokens must be at least 1 on the reference server")
        if temperature < 0 or not 0 < top_p <= 1:
            raise _BadRequest("temperature must be >= 0 and top_p in (0, 1]")
        if len(ids) + max_new > args.context_length:
            raise _BadRequest(f"The input ({len(ids)} tokens) plus max_new_tokens ({max_new}) is "
                              f"longer than the model's context length "
                              f"({args.context_length} tokens).")
        state["rid_seq"] += 1
        seed = sp.get("sampling_seed")
        if seed is None:
            seed = args.random_seed * 1_000_003 + state["rid_seq"]
        return Request(rid=rid or uuid.uuid4().hex, prompt_ids=ids, max_new_tokens=max_new,
                       temperature=temperature, top_p=top_p, top_k=top_k,
                       ignore_eos=bool(sp.get("ignore_eos", False)), seed=int(seed),
                       on_token=on_token, log_metrics=log_metrics,
                       return_logprob=return_logprob)

    def meta(req: Request, finish: dict[str, Any] | None) -> dict[str, Any]:
        m: dict[str, Any] = {"id": req.rid, "finish_reason": finish,
                             "prompt_tokens": len(req.prompt_ids),
                             "completion_tokens": len(req.output_ids), "cached_tokens": 0}
        if finish is not None:
            m["e2e_latency"] = time.perf_counter() - req.created
        if req.return_logprob:
            # SGLang's shape: [logprob, token_id, text or None] per output token
            m["output_token_logprobs"] = [[lp, t, None] for lp, t in
                                          zip(req.output_logprobs, req.output_ids)]
        return m

    async def tokens(req: Request, stream: _Stream) -> Any:
        """Yield (token, finish) until the request finishes."""
        while True:
            token, finish = await stream.queue.get()
            yield token, finish
            if finish is not None:
                return

    async def drain(req: Request, stream: _Stream) -> dict[str, Any] | None:
        """Wait for a non-streamed request to finish; a dropped client aborts it."""
        finish = None
        try:
            async for _tok, finish in tokens(req, stream):
                pass
        except asyncio.CancelledError:
            scheduler.abort(req)
            raise
        return finish

    async def sse(request: web.Request, req: Request, events: Any) -> web.StreamResponse:
        """Stream `events` (dicts) as `data: {...}` lines, then `data: [DONE]`, as SGLang does;
        a dropped client aborts the request."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            async for event in events:
                await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            scheduler.abort(req)
            raise
        return resp

    async def generate(request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            if "text" in body and isinstance(body["text"], list) and not body.get("stream"):
                return await generate_batch(body)
            prompt = body.get("text") if body.get("text") is not None else body.get("input_ids")
            sp = body.get("sampling_params") or {}
            stream = _Stream()
            req = make_request(prompt, sp, body.get("rid"), stream.on_token,
                               return_logprob=bool(body.get("return_logprob")))
        except _BadRequest as exc:
            return _error(str(exc))
        scheduler.submit(req)
        if not body.get("stream"):
            finish = await drain(req, stream)
            return web.json_response({"text": tok.decode(req.output_ids),
                                      "output_ids": list(req.output_ids),
                                      "meta_info": meta(req, finish)},
                                     dumps=lambda o: orjson.dumps(o).decode())

        async def events() -> Any:
            async for _tok, finish in tokens(req, stream):
                # SGLang's default: cumulative text in every chunk
                yield {"text": tok.decode(req.output_ids), "meta_info": meta(req, finish)}

        return await sse(request, req, events())

    async def generate_batch(body: dict[str, Any]) -> web.Response:
        sp = body.get("sampling_params") or {}
        if isinstance(sp, list):
            raise _BadRequest("per-prompt sampling_params are not supported")
        pairs = []
        for text in body["text"]:
            stream = _Stream()
            pairs.append((make_request(text, sp, None, stream.on_token), stream))
        for req, _s in pairs:
            scheduler.submit(req)
        out = []
        for req, stream in pairs:
            finish = await drain(req, stream)
            out.append({"text": tok.decode(req.output_ids), "meta_info": meta(req, finish)})
        return web.json_response(out, dumps=lambda o: orjson.dumps(o).decode())

    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if body.get("n", 1) not in (1, None):
                raise _BadRequest("n > 1 is not supported by the reference server")
            sp = {"max_new_tokens": body.get("max_tokens", 16),
                  "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
                  "top_k": body.get("top_k", -1), "ignore_eos": body.get("ignore_eos", False),
                  "sampling_seed": body.get("seed")}
            stream = _Stream()
            req = make_request(prompt, sp, body.get("rid"), stream.on_token)
        except _BadRequest as exc:
            return _error(str(exc))
        model = body.get("model") or args.served_model_name
        created = int(time.time())
        cid = req.rid
        scheduler.submit(req)
        if not body.get("stream"):
            finish = await drain(req, stream)
            n_out = len(req.output_ids)
            return web.json_response({
                "id": cid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": tok.decode(req.output_ids), "logprobs": None,
                             "finish_reason": finish["type"] if finish else None,
                             "matched_stop": finish.get("matched") if finish else None}],
                "usage": {"prompt_tokens": len(req.prompt_ids), "completion_tokens": n_out,
                          "total_tokens": len(req.prompt_ids) + n_out},
            }, dumps=lambda o: orjson.dumps(o).decode())
        opts = body.get("stream_options") or {}

        async def chunks() -> Any:
            async for token, finish in tokens(req, stream):
                yield {"id": cid, "object": "text_completion", "created": created, "model": model,
                       "choices": [{"index": 0, "text": tok.piece(token), "logprobs": None,
                                    "finish_reason": finish["type"] if finish else None,
                                    "matched_stop": finish.get("matched") if finish else None}],
                       "usage": None}
            if opts.get("include_usage"):
                n_out = len(req.output_ids)
                yield {"id": cid, "object": "text_completion", "created": created, "model": model,
                       "choices": [], "usage": {"prompt_tokens": len(req.prompt_ids),
                                                "completion_tokens": n_out,
                                                "total_tokens": len(req.prompt_ids) + n_out}}

        return await sse(request, req, chunks())

    async def health(_request: web.Request) -> web.Response:
        if state["status"] == "Starting":
            return web.Response(status=503)
        stream = _Stream()
        req = make_request([0], {"max_new_tokens": 1, "temperature": 0.0},
                           f"HEALTH_CHECK_{time.time()}", stream.on_token, log_metrics=False)
        tic = time.time()
        scheduler.submit(req)
        deadline = tic + health_check_timeout_s()
        while time.time() < deadline:
            await asyncio.sleep(0.05)
            if scheduler.last_output_time > tic:
                scheduler.abort(req)
                state["status"] = "Up"
                return web.Response(status=200)
        scheduler.abort(req)
        server_log.error(f"Health check failed. Server couldn't get a response from "
                         f"detokenizer for last {health_check_timeout_s():g} seconds.")
        state["status"] = "UnHealthy"
        return web.Response(status=503)

    async def model_info(_request: web.Request) -> web.Response:
        return web.json_response({"model_path": args.model_path, "tokenizer_path": None,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default"})

    async def server_info(_request: web.Request) -> web.Response:
        internal = {**metrics.internal_state(), "profile": scheduler.profile_state(),
                    "status": state["status"]}
        body = {**args.to_json(), "pcieprof_reference_server": True, "note": IDENTITY,
                "model_config": cfg.to_json(), "tokenizer": "pcieprof byte/bigram",
                "max_total_num_tokens": metrics.max_total_tokens, "backend": "cpu",
                "distributed_backend": "gloo", "internal_states": [internal],
                "version": f"pcieprof-refserver {__version__}"}
        return web.json_response(body, dumps=lambda o: orjson.dumps(o).decode())

    async def models(_request: web.Request) -> web.Response:
        card = {"id": args.served_model_name, "object": "model", "created": int(time.time()),
                "owned_by": "pcieprof", "root": args.served_model_name,
                "max_model_len": args.context_length}
        return web.json_response({"object": "list", "data": [card]})

    async def prometheus(_request: web.Request) -> web.Response:
        return web.Response(text=metrics.prometheus(),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def start_profile(request: web.Request) -> web.Response:
        try:
            body = await _json_body(request) if request.method == "POST" else {}
        except _BadRequest as exc:
            return _error(str(exc))
        ok, message = await asyncio.wrap_future(scheduler.command("start_profile", body))
        return web.Response(text=message if ok else message + "\n", status=200 if ok else 400)

    async def stop_profile(_request: web.Request) -> web.Response:
        ok, message = await asyncio.wrap_future(scheduler.command("stop_profile"))
        return web.Response(text=message if ok else message + "\n", status=200 if ok else 400)

    async def get_load(_request: web.Request) -> web.Response:
        return web.json_response(scheduler.load())

    for path in ("/health", "/health_generate"):
        app.router.add_get(path, health)
    app.router.add_route("POST", "/generate", generate)
    app.router.add_route("PUT", "/generate", generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_load", get_load)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", prometheus)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/start_profile", start_profile)
        app.router.add_route(method, "/stop_profile", stop_profile)
    return app


async def warm_up(app: web.Application, base_url: str) -> None:
    """SGLang's warm-up (http_server._execute_server_warmup): /get_model_info, then one
    /generate of "The capital city of France is" with 8 greedy tokens, over real HTTP."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(base_url + "/get_model_info") as r:
            r.raise_for_status()
        body = {"text": "The capital city of France is",
                "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        async with session.post(base_url + "/generate", json=body) as r:
            r.raise_for_status()
            await r.read()
