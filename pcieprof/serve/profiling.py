"""Profile steady decode through SGLang's `/start_profile`, collect one trace per rank.

`POST /start_profile` takes SGLang's ProfileReq body (python/sglang/srt/managers/io_struct.py):
`output_dir`, `num_steps` (stop by itself after that many steps), `profile_by_stage` (separate
traces for prefill = EXTEND and DECODE), `activities`, `profile_prefix`, ... Each rank then
writes `[{prefix}-]{profile_id}-TP-{rank}[-{stage}].trace.json.gz` into output_dir. Load keeps
running while the profiler records, so the window is decode at a steady batch.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from pcieprof import progress
from pcieprof.serve.client import LoadSpec, run_load

#: Seconds between looks at the staging directory, and how long the set of complete traces must
#: hold still before it is taken (profile_by_stage writes a rank's stages one after the other).
POLL_S = 0.25
SETTLE_S = 1.0

_RANK = re.compile(r"-TP-(\d+)(?:-([A-Z]+))?\.trace\.json(?:\.gz)?$")


def trace_rank(path: Path) -> tuple[int, str | None] | None:
    """(tp rank, stage) from an SGLang trace file name, or None when it is not one."""
    m = _RANK.search(path.name)
    return (int(m.group(1)), m.group(2)) if m else None


def find_traces(directory: Path, nranks: int, prefix: str) -> dict[int, list[Path]]:
    """Complete trace files in `directory` named with `prefix`, by rank (hidden temp files skipped)."""
    out: dict[int, list[Path]] = {}
    if not directory.is_dir():
        return out
    for p in sorted(directory.iterdir()):
        if p.name.startswith(".") or not p.name.startswith(prefix):
            continue
        rs = trace_rank(p)
        if rs is not None and rs[0] < nranks:
            out.setdefault(rs[0], []).append(p)
    return out


def trace_state(path: Path) -> str:
    """"whole", "growing" or "cut". Whole: JSON whose last non-blank byte closes the document,
    and for `.gz` a gzip stream that reaches its end (the trailer gzip writes last) around it;
    cut: a gzip that ended around a document that did not (it will not grow any more). SGLang
    exports straight to the final name (torch's export_chrome_trace compresses into it), so a
    name that exists and has stopped changing can still be half written; and a whole gzip can
    hold a cut JSON: torch writes the JSON to a temporary file first and compresses whatever
    landed there, so a full disk (Kineto: "Failed to write to log file!") leaves a valid gzip
    of a truncated or empty document."""
    try:
        with path.open("rb") as f:
            if not path.name.endswith(".gz"):
                f.seek(max(0, path.stat().st_size - 64))
                return "whole" if _closes_document(f.read()) else "growing"
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
            tail = b""
            while not d.eof and (chunk := f.read(1 << 20)):
                out = d.decompress(chunk)
                if out := out.rstrip():  # the last non-blank bytes decide
                    tail = (tail + out)[-64:]
            if not d.eof:
                return "growing"
            return "whole" if _closes_document(tail) else "cut"
    except (OSError, zlib.error):
        return "growing"


def _closes_document(tail: bytes) -> bool:
    return tail.rstrip().endswith((b"}", b"]"))


def move_trace(src: Path, dest: Path) -> Path:
    """Move a complete trace into `dest` so that its name there only ever names the whole file:
    a rename on the same file system, else a copy to a hidden name, then a rename."""
    target = dest / src.name
    try:
        os.replace(src, target)
        return target
    except OSError:  # another file system
        pass
    tmp = dest / f".{src.name}.partial"
    shutil.copyfile(src, tmp)
    os.replace(tmp, target)
    src.unlink()
    return target


async def start_profile(session: aiohttp.ClientSession, base_url: str, body: dict[str, Any]) -> str:
    """POST /start_profile; returns the server's reply text (raises RuntimeError on non-200)."""
    async with session.post(base_url + "/start_profile", json=body,
                            timeout=aiohttp.ClientTimeout(total=60)) as r:
        text = await r.text()
        if r.status != 200:
            raise RuntimeError(f"/start_profile answered {r.status}: {text[:200]}")
        return text


async def capture(base_url: str, staging: Path, dest: Path, *, nranks: int, num_steps: int = 8,
                  profile_by_stage: bool = True, load: LoadSpec | None = None,
                  settle_s: float = 1.0, timeout_s: float = 120.0,
                  activities: list[str] | None = None,
                  alive: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Profile `num_steps` steps under load and move one trace per rank (or more) into `dest`.

    Args:
        base_url: the server.
        staging: the directory the server writes traces to (passed as output_dir; must be
            visible here, i.e. the server runs on this host or shares the file system).
        dest: the bundle's serve/traces directory.
        nranks: ranks expected (TP size x nodes on this host).
        num_steps: steps to record (per stage with profile_by_stage).
        profile_by_stage: separate EXTEND and DECODE traces, as SGLang offers.
        load: the background load during profiling (defaults to 8 concurrent long requests).
        settle_s: time between starting the load and starting the profiler (reach steady decode).
        timeout_s: how long to wait for every rank's trace.
        activities: profiler activities (None: the server's default).
        alive: whether the server process still runs (None: not ours to watch, e.g. --url);
            once it has ended, no trace is waited for any more.

    Returns:
        A record for the manifest: files (relative to dest's parent), ranks found, status, why.
    """
    staging.mkdir(parents=True, exist_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    load = load or LoadSpec(input_len=16, output_len=256, num_requests=16, concurrency=8,
                            warmup=0, seed=12345)
    prefix = f"pcieprof{int(time.time() * 1000)}"
    # with_stack off: attribution reads step spans and kernels, not Python frames, and stopping a
    # with_stack profiler under load is where SGLang's scheduler has crashed (SIGSEGV after "Stop
    # profiling": sgl-project/sglang#11232; vllm-project/vllm-ascend#15697). SGLang's default is
    # on (io_struct.py ProfileReqInput.with_stack None -> True); False is honoured as given.
    body: dict[str, Any] = {"output_dir": str(staging.resolve()), "num_steps": num_steps,
                            "profile_by_stage": profile_by_stage, "profile_prefix": prefix,
                            "with_stack": False}
    if activities:
        body["activities"] = activities
    load_task = asyncio.create_task(run_load(base_url, load))
    record: dict[str, Any] = {"request": body, "files": [], "ranks": [], "status": "failed",
                              "why": None}
    try:
        await asyncio.sleep(settle_s)
        async with aiohttp.ClientSession() as session:
            record["reply"] = (await start_profile(session, base_url, body)).strip()
        # By stage, the DECODE trace is the one profiled for (steady decode) and attributed; an
        # EXTEND window that opened first (a prefill right after /start_profile) closes at the
        # first decode step, so its file comes long before the DECODE one and must not end the wait.
        stage = "DECODE" if profile_by_stage else None
        found, unfinished, cut = await _wait_for_ranks(staging, nranks, prefix, timeout_s,
                                                       load_task, alive, stage)
        moved = [move_trace(p, dest) for rank in sorted(found) for p in found[rank]]
        record["files"] = [str(p.relative_to(dest.parent.parent)) for p in moved]
        complete = sorted(r for r, paths in found.items() if _has_stage(paths, stage))
        record["ranks"] = complete
        if len(complete) == nranks:
            record["status"] = "ok"
        else:
            missing = sorted(set(range(nranks)) - set(complete))
            when = ("before the server exited" if alive is not None and not alive()
                    else f"within {timeout_s:.0f} s")
            why = f"no complete {stage + ' ' if stage else ''}trace from rank(s) {missing}"
            if cut:
                why += (f": cut short ({', '.join(p.name for p in cut)}: a whole gzip of a "
                        "truncated document, as torch leaves when the disk fills)")
            if unfinished or not cut:
                why += f" {when}"
            if unfinished:
                why += f" (still being written: {', '.join(p.name for p in unfinished)})"
            record.update(status="partial" if complete else "failed", why=why)
    except (RuntimeError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        record["why"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        try:
            await asyncio.wait_for(load_task, timeout=timeout_s)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 (the load's own errors are in its records)
            load_task.cancel()
    return record


def _has_stage(paths: list[Path], stage: str | None) -> bool:
    """Whether one of a rank's traces is of `stage` (None: any trace will do). A trace named
    without a stage counts too: a server that does not split by stage records every step in it."""
    return any(stage is None or (trace_rank(p) or (0, None))[1] in (stage, None) for p in paths)


async def _wait_for_ranks(staging: Path, nranks: int, prefix: str, timeout_s: float,
                          load_task: asyncio.Future[Any], alive: Callable[[], bool] | None = None,
                          stage: str | None = None
                          ) -> tuple[dict[int, list[Path]], list[Path], list[Path]]:
    """Wait until every rank has a trace (of `stage`, when given) and every trace found is
    whole, `timeout_s`, or one look after `alive()` turned False (a server that has exited
    writes no more traces; the look lets the files it finished hold still and count).

    Returns (whole traces by rank, traces still being written when the wait ended, traces cut
    short). A file counts once its size has held still between two looks and its content is
    complete (`trace_state`, checked once per size); a cut one will not grow, so the wait ends
    once every other rank is whole; with profile_by_stage a rank may still start its other
    stage's file, so the set of files must also hold still for SETTLE_S."""
    deadline = time.monotonic() + timeout_s
    sizes: dict[Path, int] = {}
    state: dict[Path, str] = {}  # verdict per file at the size it had
    last: dict[int, list[Path]] = {}
    settled_since: float | None = None
    done: dict[int, list[Path]] = {}
    unfinished: list[Path] = []
    cut: list[Path] = []
    gone = False
    while True:
        found = find_traces(staging, nranks, prefix)
        done, unfinished, cut = {}, [], []
        cut_ranks: set[int] = set()
        for rank, paths in found.items():
            for p in paths:
                try:
                    size = p.stat().st_size
                except OSError:
                    continue  # renamed or removed under us
                if sizes.get(p) != size:
                    sizes[p] = size
                    state.pop(p, None)
                    unfinished.append(p)
                    continue
                if p not in state:
                    state[p] = trace_state(p)
                if state[p] == "whole":
                    done.setdefault(rank, []).append(p)
                elif state[p] == "cut":
                    cut.append(p)
                    if _has_stage([p], stage):
                        cut_ranks.add(rank)
                else:
                    unfinished.append(p)
        if len({r for r, ps in done.items() if _has_stage(ps, stage)} | cut_ranks) == nranks \
                and not unfinished:
            settled_since = settled_since if found == last and settled_since else time.monotonic()
            if time.monotonic() - settled_since >= SETTLE_S:
                return done, [], cut
        else:
            settled_since = None
        last = found
        if time.monotonic() >= deadline or gone:
            return done, unfinished, cut
        gone = alive is not None and not alive()
        if load_task.done() and not found and time.monotonic() > deadline - timeout_s + 30:
            progress.debug("profiling: the load finished before any trace appeared")
        await asyncio.sleep(POLL_S)
