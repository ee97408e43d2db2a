"""Stream a PyTorch-profiler (Kineto) Chrome trace into compact columns, without loading it whole.

Three interchangeable event sources, all incremental, over the same blocks:
- `scan` (default): the file is read in 1 MB blocks (by a helper thread when the process has a
  second core to itself: zlib releases the interpreter lock, so decompression runs there while
  the first core parses), each block is cut after the last complete event of the traceEvents
  array, and trace_scan reads the GPU events, kernel launches and step annotations of the whole
  block with numpy, leaving CPU ops and Python frames undecoded. A block it cannot read (an
  unusual layout) goes to `chunked`. A trace without any GPU event is read again by `chunked`,
  since its CPU ops are then what attribution counts.
- `chunked`: the fields attribution needs are read from each block by one regex over Kineto's
  fixed key order (ph, cat, name, pid, tid, ts, dur, args), column-wise; a run whose layout is
  unusual (the match count differs from its number of `"ph": "X"` events) is parsed with orjson
  instead, and a cut that falls inside an event or a string does not parse, so an earlier one
  is tried.
- `ijson`: ijson's incremental parser (C backend yajl2_c when installed), one event at a time;
  `distributedInfo` is picked off the byte stream as it passes.
The document's head (keys before traceEvents) and tail (keys after it, e.g. distributedInfo) are
parsed as small JSON documents of their own. benchmarks/attribution_vs_hta.py measures the
readers. Of each event only what attribution needs is kept, in typed arrays (about 40 bytes per
GPU event, 17 per kernel launch), so memory grows with the number of GPU events and not with the
size of the file, and stays far below it. Plain and gzipped files are accepted (detected by their
magic bytes).
"""

from __future__ import annotations

import ctypes
import gzip
import json
import math
import os
import queue
import re
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np
import orjson

from pcieprof.analysis.classify import CLASS_BIT, COMM, Classifier
from pcieprof.analysis.trace_scan import PAD, Scanned, scan
from pcieprof.errors import BadInput

# The C backend (yajl2_c) parses about 10x faster than ijson's pure-Python one (measured by
# benchmarks/attribution_vs_hta.py); PCIEPROF_IJSON_BACKEND picks another, for that comparison.
_ijson = ijson.get_backend(os.environ["PCIEPROF_IJSON_BACKEND"]) if os.environ.get(
    "PCIEPROF_IJSON_BACKEND") else ijson
#: ijson backend in use; recorded in attribution.json.
IJSON_BACKEND = _ijson.backend
#: Event source: "scan" (vectorised), "chunked" (regex/orjson) or "ijson";
#: PCIEPROF_TRACE_READER overrides.
READER = os.environ.get("PCIEPROF_TRACE_READER", "scan")
READERS = ("scan", "chunked", "ijson")
_BLOCK = 1 << 20  # bytes read at a time (a block and its temporaries stay in a core's L2 cache)
_AHEAD = 4  # blocks the reading thread may have decompressed ahead of the parser
_MAX_EVENT = 64 << 20  # a single event larger than this means the file is not a trace
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_KEY_NAME = b'"traceEvents"'
_KEY_CUT = re.compile(rb'"traceEvents"\s*(?::\s*)?')  # what of a key a block's end can leave
# Assumed, not measured: how far into a file the traceEvents key may start. What Kineto writes
# before it (schemaVersion, deviceProperties, distributedInfo with its process groups) is a few
# KB to a few MB; past 64 MB the file is taken not to be a trace, rather than read to its end.
_KEY_WITHIN = 64 << 20
_HINT_TRACE = "pass the files torch.profiler / SGLang /start_profile wrote"
_TWO_DOCUMENTS = "holds more than one JSON document (concatenated traces?)"
_HINT_SPLIT = "give each trace its own file"
# How ijson's backends name data after the document: yajl's "trailing garbage" (yajl_parser.c,
# the C backends) and ijson/backends/python.py's "Additional data found".
_IJSON_TRAILING = ("trailing garbage", "Additional data found")

# Step markers: SGLang `step[...]`, torch.profiler `ProfilerStep#N`, vLLM's per-iteration
# `execute_context_<n>(<tokens>)_generation_<n>(<tokens>)` (vllm/v1/worker/gpu_worker.py,
# Worker.annotate_profile) and its model runner's `execute_model` (a record_function, or the
# Python frame `.../gpu_model_runner.py(<line>): execute_model` of a with_stack trace).
_STEP_RX = re.compile(r"^(ProfilerStep#\d+|step\[.*\]|execute_context_\d+\(.*\)_generation_\d+\(.*\)"
                      r"|(?:.*: )?execute_model)$")
_RANK_NAME_RX = (re.compile(r"TP-(\d+)"), re.compile(r"rank[-_]?(\d+)", re.I))
_DIST_KEY = b'"distributedInfo"'
_COMM_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
              "Process Group Name", "Process Group Ranks")
_JSON = json.JSONDecoder()


@dataclass
class RankTrace:
    """What attribution keeps of one rank's trace. Times in microseconds (trace clock)."""

    path: Path
    rank: int | None
    rank_source: str  # distributedInfo | file name | order
    distributed_info: dict[str, Any] | None
    names: list[str]
    # GPU events (kernels, memcpy, memset), one entry each:
    g_name: np.ndarray  # int32 index into names
    g_ts: np.ndarray  # float64
    g_dur: np.ndarray  # float64
    g_stream: np.ndarray  # int32
    g_corr: np.ndarray  # int64 (-1 unknown)
    g_bit: np.ndarray  # int8 class bit (classify.CLASS_BIT)
    g_family: np.ndarray  # int32 index into families
    # Collective args of communication events, interned: event i (index into the g_ arrays
    # comm_event[k]) has the args comm_arg_table[comm_arg[k]]. Few distinct ones per trace.
    comm_event: np.ndarray  # int64
    comm_arg: np.ndarray  # int32
    comm_arg_table: list[dict[str, Any]]
    # CPU side:
    l_corr: np.ndarray  # int64 correlation of each kernel launch / runtime call
    l_ts: np.ndarray  # float64
    l_graph: np.ndarray  # bool: cudaGraphLaunch
    c_name: np.ndarray  # int32: CPU ops kept for CPU-only traces
    c_ts: np.ndarray
    c_dur: np.ndarray
    c_bit: np.ndarray  # int8
    c_family: np.ndarray
    spans: list[tuple[str, str, float, float]]  # (name, cat, ts, dur) of step annotations
    families: list[str] = field(default_factory=list)
    n_events: int = 0
    bytes_read: int = 0
    n_bad_duration: int = 0  # events dropped for a negative or non-finite duration or time


class _Tap:
    """A read-through file wrapper that picks the `distributedInfo` object off the byte stream."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.tail = b""
        self.capture: bytearray | None = None
        self.info: dict[str, Any] | None = None
        self.nbytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.nbytes += len(data)
        if self.info is None and data:
            self._scan(data)
        return data

    def _scan(self, data: bytes) -> None:
        if self.capture is None:
            buf = self.tail + data
            i = buf.find(_DIST_KEY)
            if i < 0:
                self.tail = buf[-len(_DIST_KEY):]
                return
            self.capture = bytearray(buf[i + len(_DIST_KEY):])
        else:
            self.capture += data
        text = bytes(self.capture).lstrip()
        if not text.startswith(b":"):
            self.capture = None  # the key appeared in some other context (e.g. a string)
            self.tail = b""
            return
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[1:].lstrip().decode("utf-8", "replace"))
        except ValueError:
            if len(self.capture) > 1 << 20:  # not a small object: give up on it
                self.capture = None
            return
        self.info = obj if isinstance(obj, dict) else None
        self.capture = None


class _Malformed(Exception):
    """The chunked reader met bytes that are not a complete JSON trace."""


class _NotTrace(Exception):
    """The file is JSON or text that is not one Kineto trace (the message says why)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


_X_RX = re.compile(
    rb'\{\s*"ph"\s*:\s*"X"\s*,\s*"cat"\s*:\s*"([^"\\]*)"\s*,\s*"name"\s*:\s*"([^"\\]*(?:\\.[^"\\]*)*)"'
    rb'\s*,\s*"pid"\s*:\s*(?:"[^"]*"|[-0-9]+)\s*,\s*"tid"\s*:\s*(?:"[^"]*"|([-0-9]+))'
    rb'\s*,\s*"ts"\s*:\s*([-+0-9.eE]+)\s*,\s*"dur"\s*:\s*([-+0-9.eE]+)'
    rb'(?:\s*,\s*"args"\s*:\s*\{([^{}]*)\})?')  # Kineto's args are flat (lists, no objects)
# Looked up inside args only for GPU events and launches (a look-ahead in _X_RX costs more).
_CORR = re.compile(rb'"correlation"\s*:\s*(\d+)')
_STREAM = re.compile(rb'"stream"\s*:\s*(\d+)')
_WITH_CORR = {b"kernel", b"gpu_memcpy", b"gpu_memset", b"cuda_runtime", b"cuda_driver"}
_WITH_STREAM = {b"kernel", b"gpu_memcpy", b"gpu_memset"}
_PH_X = re.compile(rb'"ph"\s*:\s*"X"')
# category -> code: 0-2 GPU events (kernel, memcpy, memset), 3 launches, 4 CPU ops and
# annotations, 5 GPU-timeline annotations, 6 the rest, 7 Python frames (vLLM's execute_model
# frame can mark steps)
_CODES: dict[str | bytes, int] = {
    "kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2, "cuda_runtime": 3, "cuda_driver": 3,
    "cpu_op": 4, "user_annotation": 4, "gpu_user_annotation": 5, "python_function": 7}
_CODES.update({k.encode(): v for k, v in list(_CODES.items()) if isinstance(k, str)})


class _Builder:
    """Accumulates one rank's columns, a block of events at a time (vectorised per block)."""

    def __init__(self, classifier: Classifier) -> None:
        self.clf = classifier
        self.names: list[str] = []
        self.name_ids: dict[Any, int] = {}  # raw name (bytes or str) -> id
        self.text_ids: dict[str, int] = {}  # decoded name -> id
        self.families: list[str] = []
        self.family_ids: dict[str, int] = {}
        self.gpu_cls: dict[int, tuple[int, int]] = {}  # name id * 4 + kind -> (bit, family)
        self.cpu_cls: dict[int, tuple[int, int]] = {}  # name id * 2 + is_cpu_op -> (bit, family)
        self.flags: list[int] = []  # per name id: 1 a step span name, 2 cudaGraphLaunch
        self.cols: dict[str, list[np.ndarray]] = {k: [] for k in (
            "g_name", "g_ts", "g_dur", "g_stream", "g_corr", "g_bit", "g_family",
            "l_corr", "l_ts", "l_graph", "c_name", "c_ts", "c_dur", "c_bit", "c_family")}
        self.comm_event, self.comm_arg = array("q"), array("i")
        self.arg_ids: dict[tuple[Any, ...], int] = {}
        self.arg_table: list[dict[str, Any]] = []
        self.spans: list[tuple[str, str, float, float]] = []
        self.comm_cache: dict[bytes, int] = {}  # args text -> _arg_id
        self.n_gpu = 0
        self.n_x = 0

    def _family(self, fam: str) -> int:
        i = self.family_ids.get(fam)
        if i is None:
            i = self.family_ids[fam] = len(self.families)
            self.families.append(fam)
        return i

    def _ids(self, raw_names: list[Any]) -> np.ndarray:
        get = self.name_ids.get
        ids = [get(n, -1) for n in raw_names]
        if -1 in ids:  # new names in this block (rare after the first blocks)
            for i, v in enumerate(ids):
                if v < 0:
                    n = raw_names[i]
                    v = self.name_ids.get(n, -1)
                    if v < 0:
                        # raw bytes (scan, regex) and decoded text (orjson) of one name: one id
                        text = n if isinstance(n, str) else (json.loads(b'"' + n + b'"') if b"\\" in n
                                                             else n.decode("utf-8", "replace"))
                        v = self.text_ids.get(text, -1)
                        if v < 0:
                            v = self.text_ids[text] = len(self.names)
                            self.names.append(text)
                            self.flags.append((1 if _STEP_RX.match(text) else 0)
                                              | (2 if text.startswith("cudaGraphLaunch") else 0))
                        self.name_ids[n] = v
                    ids[i] = v
        return np.asarray(ids, dtype=np.int64)

    def add(self, cats: list[Any], names: list[Any], tids: list[Any], ts: np.ndarray,
            dur: np.ndarray, streams: list[int], corrs: list[int], args: list[Any]) -> None:
        """One block of X events, as columns. streams/corrs: args.stream / args.correlation
        (-1 unknown); `args` holds the raw args body (bytes, fast path) or the args dict
        (orjson/ijson path) of each event, read only for collectives."""
        n = len(cats)
        if n == 0:
            return
        self.n_x += n
        get = _CODES.get
        codes = np.asarray([get(c, 6) for c in cats], dtype=np.int8)
        nid = self._ids(names)
        raw = not isinstance(args[0], dict) if args else True

        g = np.nonzero(codes <= 2)[0]
        if g.size:
            gl = g.tolist()
            stream = np.asarray([streams[i] if streams[i] >= 0 else
                                 (tids[i] if isinstance(tids[i], int) else -1) for i in gl])
            self._add_gpu(nid[g], codes[g], ts[g], dur[g], stream,
                          np.asarray([corrs[i] for i in gl], dtype=np.int64),
                          lambda js: [self._arg_id(self._comm_args(args[gl[j]] or (b"" if raw else {}),
                                                                   raw)) for j in js])

        la = np.nonzero(codes == 3)[0]
        if la.size:
            corr = [corrs[i] for i in la.tolist()]
            ok = np.asarray([x >= 0 for x in corr], dtype=bool)
            if ok.any():
                sel = la[ok]
                self.cols["l_corr"].append(np.asarray([x for x, k in zip(corr, ok) if k], dtype=np.int64))
                self.cols["l_ts"].append(ts[sel])
                self.cols["l_graph"].append((np.asarray(self.flags, dtype=np.int8)[nid[sel]] & 2) > 0)

        # CPU ops count only on traces without GPU events; once one is seen, stop keeping them.
        if self.n_gpu:
            self.drop_cpu_ops()
        cpu = (codes == 4) | (codes == 5) | (codes == 7)
        if cpu.any():
            step = cpu & ((np.asarray(self.flags, dtype=np.int8)[nid] & 1) > 0)
            for i in np.nonzero(step)[0].tolist():
                cat = cats[i] if isinstance(cats[i], str) else cats[i].decode()
                self.spans.append((self.names[int(nid[i])], cat, float(ts[i]), float(dur[i])))
            # CPU ops themselves count only while no GPU event has been seen
            cp = np.nonzero((codes == 4) & ~step)[0] if not self.n_gpu else np.empty(0, np.int64)
            keep_idx, keep_bit, keep_fam = [], [], []
            for i in cp.tolist():
                k = int(nid[i])
                cat = cats[i] if isinstance(cats[i], str) else cats[i].decode()
                key = k * 2 + (cat == "cpu_op")
                hit = self.cpu_cls.get(key)
                if hit is None:
                    cls, fam = self.clf.cpu(self.names[k])
                    bit = CLASS_BIT[cls] if (cls != "compute" or cat == "cpu_op") else -1
                    hit = self.cpu_cls[key] = (bit, self._family(fam))
                if hit[0] < 0:
                    continue  # annotations are not compute
                keep_idx.append(i)
                keep_bit.append(hit[0])
                keep_fam.append(hit[1])
            if keep_idx:
                ki = np.asarray(keep_idx, dtype=np.int64)
                self.cols["c_name"].append(nid[ki].astype(np.int32))
                self.cols["c_ts"].append(ts[ki])
                self.cols["c_dur"].append(dur[ki])
                self.cols["c_bit"].append(np.asarray(keep_bit, dtype=np.int8))
                self.cols["c_family"].append(np.asarray(keep_fam, dtype=np.int32))

    def _add_gpu(self, nid: np.ndarray, kind: np.ndarray, ts: np.ndarray, dur: np.ndarray,
                 stream: np.ndarray, corr: np.ndarray,
                 comm_args: Callable[[list[int]], list[int]]) -> None:
        """GPU events (kind 0 kernel, 1 memcpy, 2 memset): classified once per (name, kind);
        `comm_args(js)` gives the row of arg_table of each event js (-1: none), asked only for
        communication events."""
        keys = nid * 4 + kind
        uk, inv = np.unique(keys, return_inverse=True)
        bits_u, fam_u = np.empty(uk.size, np.int8), np.empty(uk.size, np.int32)
        cat_of = {0: "kernel", 1: "gpu_memcpy", 2: "gpu_memset"}
        for j, k in enumerate(uk.tolist()):
            hit = self.gpu_cls.get(k)
            if hit is None:
                cls, fam = self.clf.gpu(self.names[k // 4], cat_of[k % 4])
                hit = self.gpu_cls[k] = (CLASS_BIT[cls], self._family(fam))
            bits_u[j], fam_u[j] = hit
        bits = bits_u[inv]
        js = np.nonzero(bits == CLASS_BIT[COMM])[0].tolist()
        for j, aid in zip(js, comm_args(js) if js else []):
            if aid >= 0:
                self.comm_event.append(self.n_gpu + j)
                self.comm_arg.append(aid)
        self.n_gpu += nid.size
        c = self.cols
        c["g_name"].append(nid.astype(np.int32))
        c["g_ts"].append(ts)
        c["g_dur"].append(dur)
        c["g_stream"].append(stream.astype(np.int32))
        c["g_corr"].append(corr)
        c["g_bit"].append(bits)
        c["g_family"].append(fam_u[inv])

    def add_scanned(self, sc: Scanned, block: bytes) -> None:
        """One block read by trace_scan: GPU events, launches, and step annotations."""
        self.n_x += sc.n_x
        if sc.g_name:
            self._add_gpu(self._ids(sc.g_name), sc.g_code.astype(np.int64), sc.g_ts, sc.g_dur,
                          sc.g_stream, sc.g_corr,
                          lambda js: self._comm_ids(block, sc.g_args[js].tolist(),
                                                    sc.g_end[js].tolist()))
        if sc.l_corr.size:
            self.cols["l_corr"].append(sc.l_corr)
            self.cols["l_ts"].append(sc.l_ts)
            self.cols["l_graph"].append(sc.l_graph)
        if sc.marks:
            nid = self._ids([m[0] for m in sc.marks]).tolist()
            for i, (_, cat, t, d) in zip(nid, sc.marks):
                if self.flags[i] & 1:
                    self.spans.append((self.names[i], cat, t, d))

    def drop_cpu_ops(self) -> None:
        """Forget the CPU ops kept so far (they count only on traces without GPU events)."""
        for k in ("c_name", "c_ts", "c_dur", "c_bit", "c_family"):
            self.cols[k].clear()

    def _arg_id(self, kept: dict[str, Any]) -> int:
        """Row of arg_table holding these collective args (added when new); -1 for none."""
        if not kept:
            return -1
        key = tuple((k, v if isinstance(v, (int, float, str)) else json.dumps(v))
                    for k, v in kept.items())
        aid = self.arg_ids.get(key)
        if aid is None:
            aid = self.arg_ids[key] = len(self.arg_table)
            self.arg_table.append(dict(key))
        return aid

    def _comm_ids(self, block: bytes, starts: list[int], ends: list[int]) -> list[int]:
        """_arg_id of each event whose args object starts at block[start] (`end`: where the next
        event starts). Cached by the text from "Collective name" on when that text holds every
        kept key (then what comes before it, ids and correlation that vary per call, cannot hold
        one: JSON keys are unique, and the last of a repeated one wins); else by the whole."""
        find, cache, out = block.find, self.comm_cache, []
        for start, end in zip(starts, ends):
            i = find(b'"Collective name"', start, end)
            aid = cache.get(block[i:end]) if i > 0 else None
            if aid is None:
                aid = cache.get(block[start:end])
            if aid is None:
                aid = self._comm_miss(block, start, end, i)
            out.append(aid)
        return out

    def _comm_miss(self, block: bytes, start: int, end: int, i: int) -> int:
        """_comm_ids for args not seen before (i: where "Collective name" starts, or -1)."""
        try:
            obj, _ = _JSON.raw_decode(block[start:end].decode("utf-8", "replace"))
        except ValueError:
            obj = {}
        aid = self._arg_id(self._comm_args(obj, False))
        tail: Any = {}
        if i > 0:
            try:
                tail, _ = _JSON.raw_decode("{" + block[i:end].decode("utf-8", "replace"))
            except ValueError:
                pass
        holds_all = isinstance(tail, dict) and all(k in tail for k in _COMM_ARGS)
        self.comm_cache[block[i:end] if holds_all else block[start:end]] = aid
        return aid

    @staticmethod
    def _comm_args(a: Any, raw: bool) -> dict[str, Any]:
        if raw:
            try:
                a = orjson.loads(b"{" + a + b"}")
            except orjson.JSONDecodeError:
                return {}
        return {k: a[k] for k in _COMM_ARGS if k in a} if isinstance(a, dict) else {}

    def column(self, name: str, dtype: Any) -> np.ndarray:
        """One column as an array; its blocks are released (read each column once)."""
        parts = self.cols[name]
        out = np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype=dtype)
        parts.clear()
        return out


def _add_dicts(b: _Builder, events: list[Any]) -> int:
    """Feed parsed event dicts to the builder; returns how many events there were."""
    cats, names, tids, ts, dur, args, streams, corrs = [], [], [], [], [], [], [], []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        name, t = ev.get("name"), ev.get("ts")
        if not isinstance(name, str) or not isinstance(t, (int, float)):
            continue
        a = ev.get("args")
        cats.append(ev.get("cat"))
        names.append(name)
        tids.append(ev.get("tid", -1))
        ts.append(float(t))
        d = ev.get("dur")
        dur.append(float(d) if isinstance(d, (int, float)) else 0.0)
        a = a if isinstance(a, dict) else {}
        args.append(a)
        st, co = a.get("stream"), a.get("correlation")
        streams.append(st if isinstance(st, int) else -1)
        corrs.append(co if isinstance(co, int) and co >= 0 else -1)
    b.add(cats, names, tids, np.asarray(ts, dtype=np.float64), np.asarray(dur, dtype=np.float64),
          streams, corrs, args)
    return len(events)


def _add_run(b: _Builder, run: bytes) -> bool:
    """Feed a run of complete events; False when the run is not valid JSON (a bad cut)."""
    rows = _X_RX.findall(run)
    # Every X event holds the string "X" (as ph), so the cheap count can only be too high (a name
    # "X"), never hide an event the regex missed; the exact count decides when it is too high.
    if len(rows) == run.count(b'"X"') or len(rows) == len(_PH_X.findall(run)):
        if rows:
            cats, names, tids, ts, dur, args = zip(*rows)
            cs, ss = _CORR.search, _STREAM.search
            corrs = [(m := cs(a)) and int(m.group(1)) or -1 if c in _WITH_CORR else -1
                     for c, a in zip(cats, args)]
            streams = [(m := ss(a)) and int(m.group(1)) if c in _WITH_STREAM else -1
                       for c, a in zip(cats, args)]
            b.add(list(cats), list(names), [int(t) if t else -1 for t in tids],
                  np.array(ts).astype(np.float64), np.array(dur).astype(np.float64),
                  [x if isinstance(x, int) else -1 for x in streams], corrs, list(args))
        return True
    try:
        evs = orjson.loads(b"[" + run + b"]")
    except orjson.JSONDecodeError:
        return False
    _add_dicts(b, evs)
    return True


def _cut(body: bytes, end: int) -> int | None:
    """Offset just past the last event of body[:end] that another event follows
    (`}` `,` `{"ph"`), or None. Whether the cut is right is checked by parsing the run."""
    n = len(body)
    ws = b" \t\r\n"
    for _ in range(64):
        i = body.rfind(b"}", 0, end)
        if i < 0:
            return None
        j = i + 1
        while j < n and body[j] in ws:
            j += 1
        if j < n and body[j] == 44:  # ','
            k = j + 1
            while k < n and body[k] in ws:
                k += 1
            if body.startswith(b"{", k):
                q = k + 1
                while q < n and body[q] in ws:
                    q += 1
                if body.startswith(b'"ph"', q):
                    return i + 1
        end = i
    return None


class _Blocks:
    """Blocks of a file, read (and decompressed) by a helper thread up to _AHEAD blocks ahead, so
    that inflating and parsing overlap on two cores; errors are raised in the consumer."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.q: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=_AHEAD)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trace-reader", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                data = self.raw.read(_BLOCK)
                self._put(data)
                if not data:
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(exc)

    def _put(self, item: bytes | BaseException) -> None:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                item = self.q.get(timeout=0.5)
            except queue.Empty:
                if not self.thread.is_alive() and self.q.empty():
                    raise _Malformed("the reading thread ended early") from None
                continue
            if isinstance(item, BaseException):
                raise item
            if not item:
                return
            yield item

    def close(self) -> None:
        """Stop the thread (it ends at its next block boundary) and wait for it."""
        self.stop.set()
        self.thread.join(timeout=10)


class _Runs:
    """Hands runs of complete events to the builder in file order: scanned by trace_scan, else
    (a block laid out otherwise) by the regex/orjson path. A run neither can read (a cut that
    fell inside a string) is joined to the next one. Runs come followed by trace_scan.PAD (one
    copy makes both)."""

    def __init__(self, b: _Builder, fast: bool) -> None:
        self.b, self.fast = b, fast
        self.carry = b""  # unread events (without PAD)

    def add(self, padded: bytes) -> None:
        if self.carry:
            padded = self.carry + b"," + padded
        sc = scan(padded) if self.fast else None  # declines a run holding "traceEvents"
        if sc is not None:
            self.b.add_scanned(sc, padded)
        elif _EVENTS_KEY.search(padded):
            # A second "traceEvents" key after the first: a second document (two traces
            # concatenated, e.g. two gzip members each holding a whole trace, which gzip reads
            # as one stream) or a repeated key; either way whose events are whose is lost. (A
            # gzip whose members split one document, as bgzip and pigz write, is one document.)
            raise _NotTrace(_TWO_DOCUMENTS, _HINT_SPLIT)
        elif not _add_run(self.b, padded[:-len(PAD)]):
            if len(padded) > _MAX_EVENT:
                raise _Malformed(f"no readable event in {len(padded) >> 20} MB")
            self.carry = padded[:-len(PAD)]
            return
        self.carry = b""


def _find_key(buf: bytes | bytearray, start: int) -> tuple[re.Match[bytes] | None, int]:
    """The first "traceEvents" key in buf[start:]; when there is none, also where the next search
    must start once more bytes are appended: at a key the end of buf may have cut (its name, the
    blanks and colon after it so far), else a name's length before the end. So each byte is
    looked at about once, however long the stream."""
    m = _EVENTS_KEY.search(buf, start)
    if m:
        return m, start
    i = buf.rfind(_KEY_NAME, start)
    if i >= 0:
        cut = _KEY_CUT.match(buf, i)
        if cut and cut.end() == len(buf):
            return None, i
    return None, max(start, len(buf) - len(_KEY_NAME) + 1)


def _read_blocks(blocks: Iterable[bytes], b: _Builder, meta: dict[str, Any], fast: bool) -> bool:
    """Feed every event to `b` (through trace_scan when `fast`, else the regex/orjson path);
    fill `meta` with the other top-level keys. False when the document has no traceEvents.

    Raises:
        _NotTrace: no "traceEvents" key in the first _KEY_WITHIN bytes, a second one, or data
            after the document (two documents in one file).
        _Malformed: bytes that are not a complete JSON trace.
    """
    buf = bytearray()  # the head; appended in place (a bytes += would copy it per block)
    meta["_bytes"] = 0
    it = iter(blocks)
    start = 0
    while True:
        m, start = _find_key(buf, start)
        if m:
            break
        if len(buf) > _KEY_WITHIN:
            raise _NotTrace(f'not a Kineto trace (no "traceEvents" in the first '
                            f'{_KEY_WITHIN >> 20} MB)', _HINT_TRACE)
        data = next(it, b"")
        if not data:
            try:
                doc = orjson.loads(buf)
            except orjson.JSONDecodeError as exc:
                raise _NotTrace(f'not a Kineto trace: malformed JSON without "traceEvents" ({exc})',
                                _HINT_TRACE) from None
            if isinstance(doc, dict):
                meta.update(doc)
            return False
        meta["_bytes"] += len(data)
        buf += data
    head = bytes(buf[:m.start()]).rstrip()
    if head.endswith(b","):
        head = head[:-1]
    try:
        doc = orjson.loads(head + b"}")
        if isinstance(doc, dict):
            meta.update(doc)
    except orjson.JSONDecodeError:
        pass  # a damaged head shows up below as a damaged body
    body = bytearray(buf[m.end():])
    del buf
    runs = _Runs(b, fast)
    while True:
        data = next(it, b"")
        if not data:
            break
        meta["_bytes"] += len(data)
        cut = _cut(data, len(data))  # the last event boundary in the new data, if any
        if cut is None or cut <= 0:
            body += data
            if len(body) > _MAX_EVENT:
                raise _Malformed(f"no complete event in {len(body) >> 20} MB")
            continue
        # the run: what was left of the previous data, and this data up to the cut
        runs.add(b"".join((body, memoryview(data)[:cut], PAD)))
        body = bytearray(data[data.find(b"{", cut):])
    carry = runs.carry
    # the last events, the end of the array and the keys after it
    tail = b'{"traceEvents":[' + (carry + b"," if carry else b"") + body
    try:
        doc = orjson.loads(tail)
    except orjson.JSONDecodeError as exc:
        if _data_after_document(tail):
            raise _NotTrace(_TWO_DOCUMENTS, _HINT_SPLIT) from None
        raise _Malformed(str(exc)) from None
    if not isinstance(doc, dict):
        raise _Malformed("not a JSON object")
    _add_dicts(b, doc.pop("traceEvents", []))
    meta.update(doc)
    return True


def _data_after_document(text: bytes) -> bool:
    """True when `text` is a whole JSON document followed by more than blanks (checked only
    once orjson has refused it, to tell that from a damaged document)."""
    s = text.decode("utf-8", "replace")
    try:
        _, end = _JSON.raw_decode(s)
    except ValueError:
        return False
    return bool(s[end:].strip())


def _open(path: Path) -> IO[bytes]:
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise BadInput(f"{path}: cannot read trace ({exc.strerror})") from None
    magic = f.read(6)
    f.seek(0)
    if magic[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    for head, kind, tool in _OTHER_COMPRESSION:
        if magic.startswith(head):
            f.close()
            raise BadInput(f"{path}: a {kind} file; pcieprof reads traces plain or gzipped",
                           hint=f"decompress it first: {tool} {path.name}")
    return f


#: Magic numbers of the compressions a trace is not read from: (first bytes, name, the command
#: that undoes it). From each format's specification: bzip2 "BZh", zstd frame 0xFD2FB528 (RFC 8878,
#: little-endian), xz (xz file format 1.0.4), LZ4 frame 0x184D2204, zip local header "PK\3\4".
_OTHER_COMPRESSION = (
    (b"BZh", "bzip2", "bunzip2"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x04\x22\x4d\x18", "lz4", "lz4 -d"),
    (b"PK\x03\x04", "zip", "unzip"),
)


def rank_from_name(path: Path) -> int | None:
    """Rank from an SGLang (`...-TP-3-...`) or generic (`rank-3`, `rank3`) trace file name."""
    for rx in _RANK_NAME_RX:
        m = rx.search(path.name)
        if m:
            return int(m.group(1))
    return None


def _inline(raw: IO[bytes]) -> Iterator[bytes]:
    while data := raw.read(_BLOCK):
        yield data


def _read_file(path: Path, b: _Builder, meta: dict[str, Any], fast: bool, ahead: bool) -> bool:
    raw = _open(path)
    blocks = _Blocks(raw) if ahead else None
    try:
        return _read_blocks(blocks if blocks is not None else _inline(raw), b, meta, fast)
    finally:
        if blocks is not None:
            blocks.close()
        raw.close()


def _read_ijson(path: Path, b: _Builder) -> tuple[bool, dict[str, Any] | None, int]:
    raw = _open(path)
    tap = _Tap(raw)
    try:
        found, batch = False, []
        for ev in _ijson.items(tap, "traceEvents.item", use_float=True):
            found = True
            batch.append(ev)
            if len(batch) >= 8192:
                _add_dicts(b, batch)
                batch = []
        _add_dicts(b, batch)
        return found, tap.info, tap.nbytes
    except ijson.common.JSONError as exc:
        if any(t in str(exc) for t in _IJSON_TRAILING):
            raise _NotTrace(_TWO_DOCUMENTS, _HINT_SPLIT) from None
        raise
    finally:
        raw.close()


def _keep_freed_memory() -> None:
    """Let glibc reuse freed memory instead of returning it to the kernel at once.

    The temporaries of each block (a few MB of numpy arrays) are otherwise fresh mmaps whose
    page faults (about 1,200 per 1 MB block) cost a third of the scan. Arrays under 4 MB then
    come from the heap, and up to 16 MB of freed heap is kept for the next block (larger arrays,
    the columns, are still mapped and returned at once). Process-wide, so done only in the
    process that reads traces; a no-op where malloc is not glibc's.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 4 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 16 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def read_trace(path: Path | str, classifier: Classifier, ahead: bool = True) -> RankTrace:
    """Stream one Kineto trace file into a RankTrace.

    Args:
        path: the trace (plain or gzipped JSON).
        classifier: kernel-name classes.
        ahead: read and decompress on a helper thread, ahead of the parser (zlib releases the
            interpreter lock: a second core does it meanwhile). False when every core already
            runs a reader: the thread would only add switching.

    Raises:
        BadInput: the file is not JSON, is truncated, or is not a Kineto trace.
    """
    path = Path(path)
    if READER not in READERS:
        raise BadInput(f"PCIEPROF_TRACE_READER={READER!r} is not a reader",
                       hint=f"use one of {', '.join(READERS)}")
    _keep_freed_memory()
    b = _Builder(classifier)
    meta: dict[str, Any] = {}
    try:
        if READER == "ijson":
            found, info, nbytes = _read_ijson(path, b)
        else:
            found = _read_file(path, b, meta, READER == "scan", ahead)
            if found and READER == "scan" and b.n_gpu == 0:
                # No GPU events: the CPU ops, which the scan skips, are what attribution counts.
                b = _Builder(classifier)
                meta = {}
                found = _read_file(path, b, meta, False, ahead)
            info = meta.get("distributedInfo")
            nbytes = int(meta.get("_bytes", 0))
    except _NotTrace as exc:
        raise BadInput(f"{path}: {exc}", hint=exc.hint) from None
    except _Malformed as exc:
        raise BadInput(f"{path}: truncated or malformed trace JSON ({exc})",
                       hint="was the profiler stopped before it finished writing?") from None
    except ijson.common.IncompleteJSONError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else "incomplete JSON"
        raise BadInput(f"{path}: truncated or malformed trace JSON ({msg})",
                       hint="was the profiler stopped before it finished writing?") from None
    except ijson.common.JSONError as exc:
        raise BadInput(f"{path}: malformed trace JSON ({str(exc).splitlines()[0]})") from None
    except (EOFError, OSError, gzip.BadGzipFile) as exc:  # type: ignore[attr-defined]
        raise BadInput(f"{path}: truncated or corrupt file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not a text JSON trace ({exc.reason})") from None
    if not found:
        raise BadInput(f"{path}: not a Kineto trace (no traceEvents)", hint=_HINT_TRACE)
    if b.n_gpu == 0 and not b.cols["c_ts"]:
        raise BadInput(f"{path}: Kineto trace without GPU kernels or CPU ops to attribute")
    if b.n_gpu:
        b.drop_cpu_ops()
    if not isinstance(info, dict):
        info = None
    rank: int | None = None
    source = "order"
    if info and isinstance(info.get("rank"), int):
        rank, source = int(info["rank"]), "distributedInfo"
    elif rank_from_name(path) is not None:
        rank, source = rank_from_name(path), "file name"
    col = b.column
    g = {k: col(k, t) for k, t in (("g_name", np.int32), ("g_ts", np.float64),
                                   ("g_dur", np.float64), ("g_stream", np.int32),
                                   ("g_corr", np.int64), ("g_bit", np.int8),
                                   ("g_family", np.int32))}
    c = {k: col(k, t) for k, t in (("c_name", np.int32), ("c_ts", np.float64),
                                   ("c_dur", np.float64), ("c_bit", np.int8),
                                   ("c_family", np.int32))}
    comm_event = np.frombuffer(b.comm_event, dtype=np.int64).copy()
    comm_arg = np.frombuffer(b.comm_arg, dtype=np.int32).copy()
    # An event with a negative or non-finite duration is not a time span: it would subtract
    # from the totals (a negative top_kernels total). It is dropped and counted.
    g_ok = np.isfinite(g["g_dur"]) & (g["g_dur"] >= 0) & np.isfinite(g["g_ts"])
    c_ok = np.isfinite(c["c_dur"]) & (c["c_dur"] >= 0) & np.isfinite(c["c_ts"])
    spans = [sp for sp in b.spans if math.isfinite(sp[2]) and math.isfinite(sp[3]) and sp[3] >= 0]
    n_bad = int(g_ok.size - g_ok.sum() + c_ok.size - c_ok.sum()) + len(b.spans) - len(spans)
    if not g_ok.all():
        new_index = np.cumsum(g_ok) - 1
        kept = g_ok[comm_event]
        comm_event, comm_arg = new_index[comm_event[kept]], comm_arg[kept]
        g = {k: v[g_ok] for k, v in g.items()}
    if not c_ok.all():
        c = {k: v[c_ok] for k, v in c.items()}
    return RankTrace(
        path=path, rank=rank, rank_source=source, distributed_info=info, names=b.names,
        **g, comm_event=comm_event, comm_arg=comm_arg, comm_arg_table=b.arg_table,
        l_corr=col("l_corr", np.int64), l_ts=col("l_ts", np.float64), l_graph=col("l_graph", bool),
        **c, spans=spans, families=b.families, n_events=b.n_x, bytes_read=nbytes,
        n_bad_duration=n_bad,
    )
