"""Attribute decode time to communication, memory and compute from per-rank Kineto traces.

Definitions (all times in microseconds of GPU time; on CPU-only traces, of CPU time):
- union time of a class: time during which at least one event of that class runs, all streams
  (threads) merged;
- comm overlapped by compute: communication time during which some compute event runs too;
- exposed comm: communication time during which no compute runs (memcpy may);
- idle: time in the window during which no event runs; the window of a rank is its first event's
  start to its last event's end; that of a step, its events' first start to last end;
- per collective across ranks: the n-th call of a collective (same kernel name and process group)
  on every rank is one collective; the shortest of its durations is the transfer, and each rank's
  excess over it is time spent waiting for slower ranks (skew/wait).

Steps: GPU-timeline `step[...]` annotations (SGLang), else CPU `step[...]` or `ProfilerStep#N`
spans, else the intervals between CUDA graph launches. An event belongs to the step in which the
CPU launched it (its runtime call's correlation id), so attribution works under CUDA graphs, where
CPU ops are not re-emitted at replay, from kernel names and GPU times alone.

Rank files are parsed by a pool of processes, one per file up to the CPU count (the cores are
used; each worker holds one file's columns at a time, so memory is bounded by the largest rank,
not the sum; only the collectives' compact arrays travel back to be matched across ranks).
"""

from __future__ import annotations

import csv
import io
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from pcieprof import progress
from pcieprof.analysis import intervals
from pcieprof.analysis.classify import CLASS_BIT, COMM, COMPUTE, MEMORY, Classifier
from pcieprof.analysis.decode_share import decode_shares
from pcieprof.analysis.trace_stream import IJSON_BACKEND, READER, RankTrace, read_trace
from pcieprof.bundle.attribution import (Attribution, CrossRank, RankAttribution, RankSkew,
                                         StepAttribution)
from pcieprof.bundle.document import decode as decode_doc, encode
from pcieprof.errors import BadInput
from pcieprof.parent_death import set_parent_death_signal

_BIT_CLASS = {v: k for k, v in CLASS_BIT.items() if v}
_BS_RX = re.compile(r"bs=(\d+)")
_KIND_RX = re.compile(r"^step\[(\w+)")
# vLLM's step annotation (vllm/v1/worker/gpu_worker.py, Worker.annotate_profile):
# execute_context_<requests>(<tokens>)_generation_<requests>(<tokens>); the token counts may
# carry more after an underscore (seen in the TraceLens vLLM TP8 trace: "(888_788544)").
_VLLM_RX = re.compile(r"^execute_context_(\d+)\([^)]*\)_generation_(\d+)\([^)]*\)$")
#: Step kinds summarised as decode steps (ranks[].decode_steps).
_DECODE_KINDS = ("DECODE", "ProfilerStep", "graph", "step")
#: What a rank without any step marker says (attribution.json ranks[].steps_note, and the CLI).
NO_STEPS = ("no step markers (SGLang step[...], vLLM execute_context_*/execute_model, "
            "ProfilerStep#N, cudaGraphLaunch): totals only, no per-step split")
TOP_KERNELS = 25
_POOL_MIN_BYTES = 8 << 20  # files on disk, all ranks together, below which one process reads them

DEFINITIONS = {
    "comm_us": "union over all streams of communication events",
    "compute_us": "union over all streams of compute events",
    "memory_us": "union over all streams of memcpy/memset events",
    "comm_overlap_compute_us": "communication time during which some compute runs",
    "exposed_comm_us": "communication time during which no compute runs",
    "idle_us": "window minus the time in which any event runs",
    "span_us": "rank: first event start to last event end; step: same over the step's events",
    "transfer_us": "per collective, the minimum over ranks of its duration, summed",
    "wait_us": "per collective, a rank's duration minus the minimum over ranks, summed",
    "steps": "SGLang GPU step[...] annotations, else CPU step[...], vLLM execute_context_* "
             "(kind DECODE/EXTEND/MIXED/IDLE from its request counts), ProfilerStep#N or "
             "execute_model spans, else gaps between cudaGraphLaunch calls; events join the step "
             "whose CPU span launched them (GPU spans: in which they start)",
}


# -- one rank (runs in a worker process) ---------------------------------------------------------

def _launch_times(rt: RankTrace) -> np.ndarray:
    """CPU launch time of each GPU event through its correlation id (NaN when unknown)."""
    out = np.full(rt.g_ts.size, np.nan)
    if rt.l_corr.size == 0 or rt.g_corr.size == 0:
        return out
    order = np.argsort(rt.l_corr, kind="stable")
    lc, lt = rt.l_corr[order], rt.l_ts[order]
    pos = np.searchsorted(lc, rt.g_corr)
    pos_c = np.minimum(pos, lc.size - 1)
    hit = (lc[pos_c] == rt.g_corr) & (rt.g_corr >= 0)
    out[hit] = lt[pos_c[hit]]
    return out


def _vllm_kind(name: str) -> tuple[str, int | None]:
    """(kind, batch size) of a vLLM `execute_context_<n>(<tokens>)_generation_<n>(<tokens>)` step:
    DECODE when only generation requests ran, EXTEND (prefill) when only context ones, MIXED
    when both, IDLE when none (a step that only polled, e.g. for KV transfers)."""
    m = _VLLM_RX.match(name)
    if not m:
        return "step", None
    ctx, gen = int(m.group(1)), int(m.group(2))
    kind = ("MIXED" if ctx and gen else "DECODE" if gen else "EXTEND" if ctx else "IDLE")
    return kind, ctx + gen


def _outermost(spans: list[tuple[str, str, float, float]]) -> list[tuple[str, str, float, float]]:
    """Spans not nested in an earlier one (vLLM's worker and model runner both have an
    execute_model frame, one inside the other)."""
    out: list[tuple[str, str, float, float]] = []
    for sp in sorted(spans, key=lambda s: (s[2], -s[3])):
        if out and sp[2] < out[-1][2] + out[-1][3]:
            continue
        out.append(sp)
    return out


def _find_steps(rt: RankTrace, gpu_mode: bool) -> tuple[str, list[dict[str, Any]]]:
    """Step windows: (how they were found, [{name, kind, bs, t0, t1, timeline}])."""
    def rows(spans: list[tuple[str, str, float, float]], timeline: str) -> list[dict[str, Any]]:
        out = []
        for name, _cat, ts, dur in sorted(spans, key=lambda s: s[2]):
            m = _KIND_RX.match(name)
            bs_m = _BS_RX.search(name)
            bs = int(bs_m.group(1)) if bs_m else None
            if m:
                kind = m.group(1)
            elif name.startswith("ProfilerStep"):
                kind = "ProfilerStep"
            elif name.startswith("execute_context_"):
                kind, bs = _vllm_kind(name)
            else:
                kind = "step"
            out.append({"name": name, "kind": kind, "bs": bs, "t0": ts, "t1": ts + dur,
                        "timeline": timeline})
        return out

    gpu_spans = [s for s in rt.spans if s[1] == "gpu_user_annotation"]
    cpu_spans = [s for s in rt.spans if s[1] != "gpu_user_annotation"]
    # the first kind of span the trace has, in this order of trust (GPU spans only in gpu_mode):
    # (how, timeline, is it a step, keep only spans not nested in another). vLLM: the CPU span of
    # each engine step first; its kernels join it by their launch, which also catches the ones
    # that run after the GPU-side annotation has closed
    tries: list[tuple[str, str, Callable[[str], bool], bool]] = [
        ("gpu step[] annotations", "gpu", lambda n: n.startswith("step["), False),
        ("cpu step[] annotations", "cpu", lambda n: n.startswith("step["), False),
        ("vLLM execute_context annotations", "cpu",
         lambda n: n.startswith("execute_context_"), False),
        ("vLLM execute_context annotations (GPU)", "gpu",
         lambda n: n.startswith("execute_context_"), False),
        ("ProfilerStep spans", "cpu", lambda n: n.startswith("ProfilerStep"), False),
        ("execute_model spans", "cpu", lambda n: n.endswith("execute_model"), True),
    ]
    for how, timeline, is_step, outermost in tries:
        if timeline == "gpu" and not gpu_mode:
            continue
        found = [s for s in (gpu_spans if timeline == "gpu" else cpu_spans) if is_step(s[0])]
        if found:
            return how, rows(_outermost(found) if outermost else found, timeline)
    if gpu_mode and rt.l_graph.any():
        t = np.sort(rt.l_ts[rt.l_graph])
        ends = np.append(t[1:], np.inf)
        return "cudaGraphLaunch gaps", [
            {"name": f"graph#{i}", "kind": "graph", "bs": None, "t0": float(a), "t1": float(b),
             "timeline": "cpu"} for i, (a, b) in enumerate(zip(t, ends))]
    return "none", []


def _assign(points: np.ndarray, steps: list[dict[str, Any]]) -> np.ndarray:
    """Index of the step whose [t0, t1) holds each point, -1 for none (steps may not overlap)."""
    if not steps:
        return np.full(points.size, -1, dtype=np.int64)
    t0 = np.array([s["t0"] for s in steps])
    t1 = np.array([s["t1"] for s in steps])
    order = np.argsort(t0, kind="stable")
    t0, t1 = t0[order], t1[order]
    idx = np.searchsorted(t0, points, side="right") - 1
    ok = (idx >= 0) & ~np.isnan(points)
    idx_c = np.clip(idx, 0, None)
    ok &= points < t1[idx_c]
    return np.where(ok, order[idx_c], -1)


def analyze_rank(path: str, classes: str | None = None, drop_last_step: bool = False,
                 file_index: int = 0, ahead: bool = True) -> dict[str, Any]:
    """Everything attribution computes for one rank file (picklable plain data).

    Args:
        path: the trace file.
        classes: a user classification table (TOML) tried before the built-in one.
        drop_last_step: HTA-compatible window: keep only events launched before the start of
            the last ProfilerStep (HTA 0.5.0 drops the last iteration).
        file_index: position of the file in the input (rank of last resort).
        ahead: decompress on a second thread (trace_stream.read_trace); for a process that has
            a core to itself and another free.
    """
    t_start = time.perf_counter()
    clf = Classifier(Path(classes) if classes else None)
    rt = read_trace(path, clf, ahead)
    parse_s = time.perf_counter() - t_start
    gpu_mode = rt.g_ts.size > 0
    if gpu_mode:
        start, dur, bits = rt.g_ts, rt.g_dur, rt.g_bit
        name_ids, fam_ids, launch = rt.g_name, rt.g_family, _launch_times(rt)
    else:
        start, dur, bits = rt.c_ts, rt.c_dur, rt.c_bit
        name_ids, fam_ids, launch = rt.c_name, rt.c_family, rt.c_ts.copy()
    end = start + dur
    keep = np.ones(start.size, dtype=bool)
    window_note = "all events"
    if drop_last_step:
        ps = [s for s in rt.spans if s[0].startswith("ProfilerStep") and s[1] != "gpu_user_annotation"]
        if len(ps) >= 2:
            last = max(s[2] for s in ps)
            keep = ~np.isnan(launch) & (launch < last)
            window_note = "events launched before the last ProfilerStep (HTA-compatible)"
    if keep.all():  # no copies of the columns when every event counts
        idx_all = np.arange(start.size)
        s_, e_, b_ = start, end, bits
    else:
        idx_all = np.nonzero(keep)[0]
        s_, e_, b_ = start[keep], end[keep], bits[keep]
    total = intervals.split(s_, e_, b_)

    how, steps = _find_steps(rt, gpu_mode)
    if steps:
        pts = s_ if (steps[0]["timeline"] == "gpu" or not gpu_mode) else launch[keep]
        sid = _assign(pts, steps)
        order = np.argsort(sid, kind="stable")
        sid_sorted = sid[order]
        bounds = np.searchsorted(sid_sorted, np.arange(len(steps) + 1))
        step_rows = []
        for i, st in enumerate(steps):
            sel = order[bounds[i]:bounds[i + 1]]
            if sel.size == 0:
                continue
            sp = intervals.split(s_[sel], e_[sel], b_[sel])
            step_rows.append({"step": i, "name": st["name"], "kind": st["kind"], "bs": st["bs"],
                              "n_events": int(sel.size), "gpu_start_us": float(s_[sel].min()),
                              "cpu_span_us": (st["t1"] - st["t0"]) if st["timeline"] == "cpu"
                              and np.isfinite(st["t1"]) else None, **sp.as_dict()})
    else:
        step_rows = []

    # Per class and per family: sum of durations and counts (not unions), plus the unions.
    d_keep = dur if keep.all() else dur[keep]
    f_keep = fam_ids if keep.all() else fam_ids[keep]
    per_family = []
    fam_sum = np.bincount(f_keep, weights=d_keep, minlength=len(rt.families))
    fam_n = np.bincount(f_keep, minlength=len(rt.families))
    for i, fam in enumerate(rt.families):
        if fam_n[i] == 0:
            continue
        b = int(np.bincount(b_[f_keep == i].clip(0), minlength=8).argmax())
        per_family.append({"family": fam, "class": _BIT_CLASS.get(b, "ignore"),
                           "count": int(fam_n[i]), "sum_us": float(fam_sum[i])})

    n_ids = name_ids if keep.all() else name_ids[keep]
    nm_sum = np.bincount(n_ids, weights=d_keep, minlength=len(rt.names))
    nm_n = np.bincount(n_ids, minlength=len(rt.names))
    nm_bit = np.zeros(len(rt.names), dtype=np.int8)
    nm_bit[n_ids] = b_
    nm_fam = np.zeros(len(rt.names), dtype=np.int64)
    nm_fam[n_ids] = f_keep
    top = np.argsort(-nm_sum)[:TOP_KERNELS]
    top_rows = [{"name": rt.names[i], "class": _BIT_CLASS.get(int(nm_bit[i]), "ignore"),
                 "family": rt.families[int(nm_fam[i])], "count": int(nm_n[i]),
                 "total_us": float(nm_sum[i]), "mean_us": float(nm_sum[i] / nm_n[i])}
                for i in top if nm_n[i] > 0]

    # Communication events, for matching collectives across ranks: a key per distinct
    # (kernel name, process group), interned; arrays, so that a million collectives stay small.
    comm_sel = np.nonzero(b_ == CLASS_BIT[COMM])[0]
    arg_of = np.full(start.size, -1, dtype=np.int64)
    if gpu_mode and rt.comm_event.size:
        arg_of[rt.comm_event] = rt.comm_arg
    pair = n_ids[comm_sel].astype(np.int64) * (len(rt.comm_arg_table) + 1) + (arg_of[idx_all[comm_sel]] + 1)
    upair, kid = np.unique(pair, return_inverse=True)
    key_table = []
    for p_ in upair.tolist():
        nm, aid = divmod(p_, len(rt.comm_arg_table) + 1)
        a = rt.comm_arg_table[aid - 1] if aid > 0 else {}
        key_table.append(f"{rt.names[nm]}|{a.get('Process Group Ranks', a.get('Process Group Name', ''))}")
    comm = {"keys": key_table, "key": kid.astype(np.int32), "ts": s_[comm_sel], "dur": d_keep[comm_sel]}
    msg = []
    for a in rt.comm_arg_table:
        msg.append({k: a.get(k) for k in ("Collective name", "In msg nelems", "dtype", "Group size",
                                          "Process Group Ranks")})

    return {
        "path": str(rt.path), "file_index": file_index, "rank": rt.rank,
        "rank_source": rt.rank_source, "distributed_info": rt.distributed_info,
        "mode": "gpu" if gpu_mode else "cpu", "n_events": rt.n_events,
        "n_dropped_bad_duration": rt.n_bad_duration,
        "bytes_read": rt.bytes_read, "file_bytes": os.path.getsize(path),
        "n_gpu_events": int(rt.g_ts.size), "n_cpu_ops": int(rt.c_ts.size),
        "n_counted": int(keep.sum()), "window": window_note, "steps_from": how,
        "totals": total.as_dict(), "steps": step_rows, "families": per_family,
        "top_kernels": top_rows, "comm": comm, "collective_args": msg,
        "parse_s": parse_s, "analyze_s": time.perf_counter() - t_start,
        "peak_rss_bytes": _peak_rss(),
    }


def _peak_rss() -> int | None:
    try:
        import resource  # optional: Unix only

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(kb * (1 if sys.platform == "darwin" else 1024))
    except Exception:  # not on every platform
        return None


# -- across ranks ----------------------------------------------------------------------------------

def cross_rank(ranks: list[dict[str, Any]]) -> CrossRank:
    """Split communication kernel time into transfer (min over ranks) and wait, per rank.

    The n-th call of a collective (same kernel name and process group) on each rank is one
    collective; only collectives present on every rank are compared.
    """
    if len(ranks) < 2:
        return CrossRank(status="waived", why="one rank: no cross-rank comparison")
    gid: dict[str, int] = {}
    coded = []
    for r in ranks:
        c = r["comm"]
        g = np.array([gid.setdefault(k, len(gid)) for k in c["keys"]], dtype=np.int64)
        key = g[c["key"]] if len(c["key"]) else np.empty(0, dtype=np.int64)
        order = np.lexsort((c["ts"], key))
        key_s = key[order]
        first = np.searchsorted(key_s, key_s, side="left")
        seq = np.arange(key_s.size) - first  # call number within its key
        code = key_s * (1 << 32) + seq
        o2 = np.argsort(code, kind="stable")
        coded.append((code[o2], np.asarray(c["dur"])[order][o2]))
    common = coded[0][0]
    for code, _ in coded[1:]:
        common = np.intersect1d(common, code, assume_unique=True)
    if common.size == 0:
        return CrossRank(status="not_supported", why="no collective appears on every rank "
                         "(different kernels or process groups)")
    d = np.vstack([dur[np.searchsorted(code, common)] for code, dur in coded])  # ranks x collectives
    mn = d.min(axis=0)
    per_rank = []
    for i, r in enumerate(ranks):
        total = float(d[i].sum())
        wait = float((d[i] - mn).sum())
        per_rank.append(RankSkew(rank=r["rank"], matched_comm_us=total,
                                 transfer_us=float(mn.sum()), wait_us=wait,
                                 wait_pct=100.0 * wait / total if total > 0 else None))
    return CrossRank(status="ok", n_collectives=int(common.size), transfer_us=float(mn.sum()),
                     per_rank=per_rank,
                     unmatched={int(r["rank"]): int(c[0].size - common.size)
                                for r, c in zip(ranks, coded)})


# -- the public entry point --------------------------------------------------------------------

def attribute_traces(paths: list[Path], bundle: Any | None = None, classes: Path | None = None,
                     *, drop_last_step: bool = False, workers: int | None = None) -> Attribution:
    """Attribute per-rank traces; write attribution.json and attribution/*.csv into `bundle`.

    Args:
        paths: Kineto trace files (plain or .gz), one per rank.
        bundle: a pcieprof.bundle.Bundle to write into (part `attribution`), or None.
        classes: a user classification table tried before the built-in one.
        drop_last_step: HTA-compatible window (drop events launched in the last ProfilerStep).
        workers: processes to use (default: one per file, at most the CPU count; one for less
            than 8 MB of files).

    Returns:
        The attribution document (what attribution.json holds).

    Raises:
        BadInput: no files, a file that is not a readable Kineto trace, or duplicate ranks.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise BadInput("no trace files given", hint="pass the per-rank *.trace.json(.gz) files")
    for p in paths:
        if not p.is_file():
            raise BadInput(f"{p}: no such trace file")
    Classifier(classes)  # validate the user table once, here, before forking
    t0 = time.perf_counter()
    if bundle is not None:
        bundle.set_part("attribution", "running", files=len(paths))
    n = min(len(paths), workers or os.cpu_count() or 1)
    if workers is None and sum(p.stat().st_size for p in paths) < _POOL_MIN_BYTES:
        n = 1  # small files: starting worker processes costs more than they save
    results: list[dict[str, Any]] = []
    # one process: decompression on a second thread, if there is a second core; several: each
    # process has its core
    ahead = n <= 1 and (os.cpu_count() or 1) > 1
    args = [(str(p), str(classes) if classes else None, drop_last_step, i, ahead)
            for i, p in enumerate(paths)]
    with progress.task("attributing traces", total=len(paths)) as bar:
        if n <= 1:
            for a in args:
                results.append(analyze_rank(*a))
                bar.advance()
        else:
            with worker_pool(n) as pool:
                futs = [pool.submit(analyze_rank, *a) for a in args]
                try:
                    for f in futs:
                        results.append(f.result())
                        bar.advance()
                except BaseException:
                    # Ctrl-C, SIGTERM or a failed rank: the other workers' files are not
                    # wanted any more; stop them now rather than wait out their parse
                    _kill_workers(pool)
                    raise
    _settle_ranks(results)
    results.sort(key=lambda r: r["rank"])
    for r in results:
        if r["n_dropped_bad_duration"]:
            progress.warn(f"{r['path']}: {r['n_dropped_bad_duration']} event(s) with a negative "
                          "or non-finite duration dropped (not counted)")
    doc = _document(results, classes, drop_last_step, time.perf_counter() - t0, n)
    if bundle is not None:
        write_bundle(bundle, doc)
    return doc


def _worker_start(parent: int) -> None:
    """In each worker: die with pcieprof (SIGKILL, even when pcieprof is SIGKILLed: a worker
    holds only its own parse), and leave Ctrl-C to the parent, which stops the workers."""
    set_parent_death_signal(signal.SIGKILL, parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker_pool(n: int) -> ProcessPoolExecutor:
    """The pool of `n` attribute workers, none of which outlives this process."""
    return ProcessPoolExecutor(max_workers=n, initializer=_worker_start,
                               initargs=(os.getpid(),))


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _settle_ranks(results: list[dict[str, Any]]) -> None:
    seen: dict[int, str] = {}
    for r in results:
        if r["rank"] is None:
            r["rank"] = r["file_index"]
            r["rank_source"] = "order"
    for r in results:
        if r["rank"] in seen:
            raise BadInput(f"{r['path']} and {seen[r['rank']]} both claim rank {r['rank']}",
                           hint="pass one trace per rank (of one profiling run)")
        seen[r["rank"]] = r["path"]


def _document(results: list[dict[str, Any]], classes: Path | None, drop_last_step: bool,
              wall_s: float, workers: int) -> Attribution:
    clf = Classifier(classes)
    xr = cross_rank(results)
    wait_of = {p.rank: p for p in xr.per_rank}
    ranks = []
    for r in results:
        steps = r["steps"]
        decode = [s for s in steps if s["kind"] in _DECODE_KINDS]
        kinds = {k: _step_summary([s for s in steps if s["kind"] == k])
                 for k in dict.fromkeys(s["kind"] for s in steps)}
        ranks.append(RankAttribution(
            rank=r["rank"], rank_source=r["rank_source"], path=r["path"], mode=r["mode"],
            file_bytes=r["file_bytes"], n_events=r["n_events"],
            n_dropped_bad_duration=r["n_dropped_bad_duration"],
            n_gpu_events=r["n_gpu_events"], n_cpu_ops=r["n_cpu_ops"], n_counted=r["n_counted"],
            window=r["window"], steps_from=r["steps_from"], n_steps=len(steps),
            totals=r["totals"], decode_steps=_step_summary(decode) if decode else None,
            step_kinds=kinds, steps_note=None if r["steps_from"] != "none" else NO_STEPS,
            skew=wait_of.get(r["rank"]), families=r["families"],
            collective_args=r["collective_args"], parse_s=r["parse_s"],
            peak_rss_bytes=r["peak_rss_bytes"]))
    mode = {r["mode"] for r in results}
    # the workers hand back plain data (picklable); it becomes typed here, read as a file is
    steps = [decode_doc(StepAttribution, {"rank": r["rank"], **s}, "step")
             for r in results for s in r["steps"]]
    share, by_batch = decode_shares(steps)
    return Attribution(
        timeline="cpu" if mode == {"cpu"} else "gpu",
        parser={"reader": READER, "ijson_backend": IJSON_BACKEND, "workers": workers,
                "wall_s": wall_s},
        window="hta" if drop_last_step else "all",
        definitions=dict(DEFINITIONS), classes=clf.table(), ranks=ranks, steps=steps,
        top_kernels=[{"rank": r["rank"], **k} for r in results for k in r["top_kernels"]],
        cross_rank=xr, decode_share=share, decode_share_by_batch=by_batch)


def _step_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean of each figure over the steps (us), their count, and the median span."""
    keys = ("span_us", "comm_us", "compute_us", "memory_us", "exposed_comm_us",
            "comm_overlap_compute_us", "idle_us")
    summary: dict[str, Any] = {f"mean_{k}": float(np.mean([s[k] for s in steps])) for k in keys}
    summary["n"] = len(steps)
    summary["median_span_us"] = float(np.median([s["span_us"] for s in steps]))
    return summary


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols: list[str] = []
    for row in rows:
        cols += [c for c in row if c not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def write_bundle(bundle: Any, doc: Attribution) -> None:
    """Write attribution.json and the tidy tables attribution/{per_rank,per_step,per_class,top_kernels}.csv."""
    per_rank = []
    for r in doc.ranks:
        row = {"rank": r.rank, "mode": r.mode, "window": doc.window, "n_steps": r.n_steps,
               **r.totals}
        sk = r.skew
        row.update({"transfer_us": None, "wait_us": None, "wait_pct": None} if sk is None else
                   {"transfer_us": sk.transfer_us, "wait_us": sk.wait_us, "wait_pct": sk.wait_pct})
        per_rank.append(row)
    per_class: list[dict[str, Any]] = []
    for r in doc.ranks:
        t = r.totals
        for cls, key in ((COMM, "comm_us"), (MEMORY, "memory_us"), (COMPUTE, "compute_us")):
            per_class.append({"rank": r.rank, "class": cls, "family": "", "union_us": t[key],
                              "sum_us": None, "count": None})
        for f in r.families:
            per_class.append({"rank": r.rank, "class": f["class"], "family": f["family"],
                              "union_us": None, "sum_us": f["sum_us"], "count": f["count"]})
    bundle.write_doc(doc)
    bundle.write_text("attribution/per_rank.csv", _table(per_rank))
    bundle.write_text("attribution/per_step.csv", _table([encode(s) for s in doc.steps]))
    bundle.write_text("attribution/per_class.csv", _table(per_class))
    bundle.write_text("attribution/top_kernels.csv", _table(doc.top_kernels))
    bundle.write_text("attribution/classes.csv", _table([encode(c) for c in doc.classes]))
    # Provenance: numbers read from traces of real GPUs (cuda) or of CPU processes (cpu).
    bundle.set_part("attribution", "ok", ranks=len(doc.ranks), steps=len(doc.steps),
                    timeline=doc.timeline, source="measured",
                    backend="cuda" if doc.timeline == "gpu" else "cpu")
