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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
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


@dataclass
class ApiState:
    """What the HTTP handlers share: the server's parts, its health and the request counter."""

    args: ServerArgs
    scheduler: Scheduler
    metrics: ServerMetrics
    cfg: TinyMoEConfig
    tok: Tokenizer = field(default_factory=Tokenizer)
    #: "Starting", "Up" or "UnHealthy"
    status: str = "Starting"
    #: requests made so far; seeds requests that bring no sampling_seed
    rid_seq: int = 0


STATE_KEY: web.AppKey[ApiState] = web.AppKey("state", ApiState)

#: SSE events (dicts), one `data:` line each
_Events = AsyncIterator[dict[str, Any]]


class _BadRequest(Exception):
    pass


def _orjson_response(body: Any) -> web.Response:
    return web.json_response(body, dumps=lambda o: orjson.dumps(o).decode())


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
    """The aiohttp application; `app[STATE_KEY].status` is "Starting", "Up" or "UnHealthy"."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SCHEDULER_KEY] = scheduler
    st = ApiState(args, scheduler, metrics, cfg)
    app[STATE_KEY] = st
    _add_health_routes(app, st)
    _add_generation_routes(app, st)
    _add_info_routes(app, st)
    _add_profile_routes(app, st)
    return app


# ---- requests: prompt and sampling params -> a scheduler Request ----

def _prompt_ids(tok: Tokenizer, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        ids = tok.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        ids = list(prompt)
        if any(not 0 <= i < tok.vocab_size for i in ids):
            raise _BadRequest(f"input_ids must be in [0, {tok.vocab_size})")
    else:
        raise _BadRequest("give 'text' (a string) or 'input_ids' (a list of ints)")
    return ids or [tok.bos_id]


def _sampling(sp: dict[str, Any]) -> tuple[int, float, float, int]:
    """(max_new_tokens, temperature, top_p, top_k) with SGLang's defaults for absent or null."""
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
    return max_new, temperature, top_p, top_k


def _make_request(st: ApiState, prompt: Any, sp: dict[str, Any], rid: str | None,
                  on_token: Any, log_metrics: bool = True,
                  return_logprob: bool = False) -> Request:
    ids = _prompt_ids(st.tok, prompt)
    max_new, temperature, top_p, top_k = _sampling(sp)
    if len(ids) + max_new > st.args.context_length:
        raise _BadRequest(f"The input ({len(ids)} tokens) plus max_new_tokens ({max_new}) is "
                          f"longer than the model's context length "
                          f"({st.args.context_length} tokens).")
    st.rid_seq += 1
    seed = sp.get("sampling_seed")
    if seed is None:
        seed = st.args.random_seed * 1_000_003 + st.rid_seq
    return Request(rid=rid or uuid.uuid4().hex, prompt_ids=ids, max_new_tokens=max_new,
                   temperature=temperature, top_p=top_p, top_k=top_k,
                   ignore_eos=bool(sp.get("ignore_eos", False)), seed=int(seed),
                   on_token=on_token, log_metrics=log_metrics,
                   return_logprob=return_logprob)


# ---- responses: waiting for tokens, streaming them ----

def _meta(req: Request, finish: dict[str, Any] | None) -> dict[str, Any]:
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


async def _tokens(stream: _Stream) -> AsyncIterator[tuple[int, dict[str, Any] | None]]:
    """Yield (token, finish) until the request finishes."""
    while True:
        token, finish = await stream.queue.get()
        yield token, finish
        if finish is not None:
            return


async def _drain(st: ApiState, req: Request, stream: _Stream) -> dict[str, Any] | None:
    """Wait for a non-streamed request to finish; a dropped client aborts it."""
    finish = None
    try:
        async for _tok, finish in _tokens(stream):
            pass
    except asyncio.CancelledError:
        st.scheduler.abort(req)
        raise
    return finish


async def _sse(st: ApiState, request: web.Request, req: Request,
               events: _Events) -> web.StreamResponse:
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
        st.scheduler.abort(req)
        raise
    return resp


# ---- /generate (SGLang native) ----

def _add_generation_routes(app: web.Application, st: ApiState) -> None:
    app.router.add_route("POST", "/generate", partial(_generate, st))
    app.router.add_route("PUT", "/generate", partial(_generate, st))
    app.router.add_post("/v1/completions", partial(_completions, st))


async def _generate(st: ApiState, request: web.Request) -> web.StreamResponse:
    try:
        body = await _json_body(request)
        if "text" in body and isinstance(body["text"], list) and not body.get("stream"):
            return await _generate_batch(st, body)
        prompt = body.get("text") if body.get("text") is not None else body.get("input_ids")
        sp = body.get("sampling_params") or {}
        stream = _Stream()
        req = _make_request(st, prompt, sp, body.get("rid"), stream.on_token,
                            return_logprob=bool(body.get("return_logprob")))
    except _BadRequest as exc:
        return _error(str(exc))
    st.scheduler.submit(req)
    if not body.get("stream"):
        finish = await _drain(st, req, stream)
        return _orjson_response({"text": st.tok.decode(req.output_ids),
                                 "output_ids": list(req.output_ids),
                                 "meta_info": _meta(req, finish)})
    return await _sse(st, request, req, _generate_events(st, req, stream))


async def _generate_events(st: ApiState, req: Request, stream: _Stream) -> _Events:
    async for _tok, finish in _tokens(stream):
        # SGLang's default: cumulative text in every chunk
        yield {"text": st.tok.decode(req.output_ids), "meta_info": _meta(req, finish)}


async def _generate_batch(st: ApiState, body: dict[str, Any]) -> web.Response:
    sp = body.get("sampling_params") or {}
    if isinstance(sp, list):
        raise _BadRequest("per-prompt sampling_params are not supported")
    pairs = []
    for text in body["text"]:
        stream = _Stream()
        pairs.append((_make_request(st, text, sp, None, stream.on_token), stream))
    for req, _s in pairs:
        st.scheduler.submit(req)
    out = []
    for req, stream in pairs:
        finish = await _drain(st, req, stream)
        out.append({"text": st.tok.decode(req.output_ids), "meta_info": _meta(req, finish)})
    return _orjson_response(out)


# ---- /v1/completions (OpenAI) ----

def _completion_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's request fields as SGLang sampling_params."""
    if body.get("n", 1) not in (1, None):
        raise _BadRequest("n > 1 is not supported by the reference server")
    return {"max_new_tokens": body.get("max_tokens", 16),
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "top_k": body.get("top_k", -1), "ignore_eos": body.get("ignore_eos", False),
            "sampling_seed": body.get("seed")}


def _choice(text: str, finish: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None,
            "finish_reason": finish["type"] if finish else None,
            "matched_stop": finish.get("matched") if finish else None}


def _usage(req: Request) -> dict[str, int]:
    n_out = len(req.output_ids)
    return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": n_out,
            "total_tokens": len(req.prompt_ids) + n_out}


async def _completions(st: ApiState, request: web.Request) -> web.StreamResponse:
    try:
        body = await _json_body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        sp = _completion_sampling(body)
        stream = _Stream()
        req = _make_request(st, prompt, sp, body.get("rid"), stream.on_token)
    except _BadRequest as exc:
        return _error(str(exc))
    head = {"id": req.rid, "object": "text_completion", "created": int(time.time()),
            "model": body.get("model") or st.args.served_model_name}
    st.scheduler.submit(req)
    if not body.get("stream"):
        finish = await _drain(st, req, stream)
        return _orjson_response({**head,
                                 "choices": [_choice(st.tok.decode(req.output_ids), finish)],
                                 "usage": _usage(req)})
    opts = body.get("stream_options") or {}
    return await _sse(st, request, req, _completion_chunks(st, req, stream, head, opts))


async def _completion_chunks(st: ApiState, req: Request, stream: _Stream,
                             head: dict[str, Any], opts: Any) -> _Events:
    async for token, finish in _tokens(stream):
        yield {**head, "choices": [_choice(st.tok.piece(token), finish)], "usage": None}
    # read after the tokens, as before: a non-object stream_options fails only at the end
    if opts.get("include_usage"):
        yield {**head, "choices": [], "usage": _usage(req)}


# ---- /health, /health_generate ----

def _add_health_routes(app: web.Application, st: ApiState) -> None:
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, partial(_health, st))


async def _health(st: ApiState, _request: web.Request) -> web.Response:
    if st.status == "Starting":
        return web.Response(status=503)
    stream = _Stream()
    req = _make_request(st, [0], {"max_new_tokens": 1, "temperature": 0.0},
                        f"HEALTH_CHECK_{time.time()}", stream.on_token, log_metrics=False)
    tic = time.time()
    st.scheduler.submit(req)
    deadline = tic + health_check_timeout_s()
    while time.time() < deadline:
        await asyncio.sleep(0.05)
        if st.scheduler.last_output_time > tic:
            st.scheduler.abort(req)
            st.status = "Up"
            return web.Response(status=200)
    st.scheduler.abort(req)
    server_log.error(f"Health check failed. Server couldn't get a response from "
                     f"detokenizer for last {health_check_timeout_s():g} seconds.")
    st.status = "UnHealthy"
    return web.Response(status=503)


# ---- what the server is: model, server info, load, metrics ----

def _add_info_routes(app: web.Application, st: ApiState) -> None:
    app.router.add_get("/get_model_info", partial(_model_info, st))
    app.router.add_get("/get_server_info", partial(_server_info, st))
    app.router.add_get("/server_info", partial(_server_info, st))
    app.router.add_get("/get_load", partial(_get_load, st))
    app.router.add_get("/v1/models", partial(_models, st))
    app.router.add_get("/metrics", partial(_prometheus, st))


async def _model_info(st: ApiState, _request: web.Request) -> web.Response:
    return web.json_response({"model_path": st.args.model_path, "tokenizer_path": None,
                              "is_generation": True, "preferred_sampling_params": None,
                              "weight_version": "default"})


async def _server_info(st: ApiState, _request: web.Request) -> web.Response:
    internal = {**st.metrics.internal_state(), "profile": st.scheduler.profile_state(),
                "status": st.status}
    body = {**st.args.to_json(), "pcieprof_reference_server": True, "note": IDENTITY,
            "model_config": st.cfg.to_json(), "tokenizer": "pcieprof byte/bigram",
            "max_total_num_tokens": st.metrics.max_total_tokens, "backend": "cpu",
            "distributed_backend": "gloo", "internal_states": [internal],
            "version": f"pcieprof-refserver {__version__}"}
    return _orjson_response(body)


async def _models(st: ApiState, _request: web.Request) -> web.Response:
    card = {"id": st.args.served_model_name, "object": "model", "created": int(time.time()),
            "owned_by": "pcieprof", "root": st.args.served_model_name,
            "max_model_len": st.args.context_length}
    return web.json_response({"object": "list", "data": [card]})


async def _prometheus(st: ApiState, _request: web.Request) -> web.Response:
    return web.Response(text=st.metrics.prometheus(),
                        content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


async def _get_load(st: ApiState, _request: web.Request) -> web.Response:
    return web.json_response(st.scheduler.load())


# ---- /start_profile, /stop_profile ----

def _add_profile_routes(app: web.Application, st: ApiState) -> None:
    for method in ("GET", "POST"):
        app.router.add_route(method, "/start_profile", partial(_start_profile, st))
        app.router.add_route(method, "/stop_profile", partial(_stop_profile, st))


async def _start_profile(st: ApiState, request: web.Request) -> web.Response:
    try:
        body = await _json_body(request) if request.method == "POST" else {}
    except _BadRequest as exc:
        return _error(str(exc))
    ok, message = await asyncio.wrap_future(st.scheduler.command("start_profile", body))
    return web.Response(text=message if ok else message + "\n", status=200 if ok else 400)


async def _stop_profile(st: ApiState, _request: web.Request) -> web.Response:
    ok, message = await asyncio.wrap_future(st.scheduler.command("stop_profile"))
    return web.Response(text=message if ok else message + "\n", status=200 if ok else 400)


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
