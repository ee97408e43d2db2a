"""Stream a PyTorch-profiler (Kineto) Chrome trace into compact columns, without loading it whole.

Two interchangeable event sources, both incremental:
- `chunked` (default): reads the file in blocks of a few MB and cuts each block after the last
  complete event of the traceEvents array. The fields attribution needs are read from the run of
  events by one regex over Kineto's fixed key order (ph, cat, name, pid, tid, ts, dur, args),
  column-wise, without building the events; a run whose layout is unusual (the match count
  differs from its number of `"ph": "X"` events) is parsed with orjson instead, and a cut that
  falls inside an event or a string does not parse, so an earlier one is tried. The document's
  head (keys before traceEvents) and tail (keys after it, e.g. distributedInfo) are parsed as
  small JSON documents of their own.
- `ijson`: ijson's incremental parser (C backend yajl2_c when installed), one event at a time;
  `distributedInfo` is picked off the byte stream as it passes.
benchmarks/attribution_vs_hta.py measures both. Of each event only what attribution needs is
kept, in typed arrays (about 40 bytes per GPU event, 24 per kernel launch), so memory grows with
the number of GPU events and not with the size of the file, and stays far below it. Plain and
gzipped files are accepted (detected by their magic bytes).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np
import orjson

from pcieprof.analysis.classify import CLASS_BIT, COMM, Classifier
from pcieprof.errors import BadInput

# The C backend (yajl2_c) parses about 10x faster than ijson's pure-Python one (measured by
# benchmarks/attribution_vs_hta.py); PCIEPROF_IJSON_BACKEND picks another, for that comparison.
_ijson = ijson.get_backend(os.environ["PCIEPROF_IJSON_BACKEND"]) if os.environ.get(
    "PCIEPROF_IJSON_BACKEND") else ijson
#: ijson backend in use; recorded in attribution.json.
IJSON_BACKEND = _ijson.backend
#: Event source: "chunked" (regex/orjson on blocks) or "ijson"; PCIEPROF_TRACE_READER overrides.
READER = os.environ.get("PCIEPROF_TRACE_READER", "chunked")
_BLOCK = 4 << 20  # bytes read at a time by the chunked reader
_MAX_EVENT = 64 << 20  # a single event larger than this means the file is not a trace
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')

_GPU_CATS = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_STEP_RX = re.compile(r"^(ProfilerStep#\d+|step\[.*\])$")
_BS_RX = re.compile(r"bs=(\d+)")
_RANK_NAME_RX = (re.compile(r"TP-(\d+)"), re.compile(r"rank[-_]?(\d+)", re.I))
_DIST_KEY = b'"distributedInfo"'
_COMM_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
              "Process Group Name", "Process Group Ranks")


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
# annotations, 5 GPU-timeline annotations, 6 the rest
_CODES: dict[str | bytes, int] = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2, "cuda_runtime": 3, "cuda_driver": 3,
          "cpu_op": 4, "user_annotation": 4, "gpu_user_annotation": 5}
_CODES.update({k.encode(): v for k, v in list(_CODES.items()) if isinstance(k, str)})


class _Builder:
    """Accumulates one rank's columns, a block of events at a time (vectorised per block)."""

    def __init__(self, classifier: Classifier) -> None:
        self.clf = classifier
        self.names: list[str] = []
        self.name_ids: dict[Any, int] = {}  # raw name (bytes or str) -> id
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
                        text = n if isinstance(n, str) else (json.loads(b'"' + n + b'"') if b"\\" in n
                                                             else n.decode("utf-8", "replace"))
                        v = self.name_ids[n] = len(self.names)
                        self.names.append(text)
                        self.flags.append((1 if _STEP_RX.match(text) else 0)
                                          | (2 if text.startswith("cudaGraphLaunch") else 0))
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
            keys = nid[g] * 4 + codes[g]
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
            gl = g.tolist()
            stream = [streams[i] if streams[i] >= 0 else
                      (tids[i] if isinstance(tids[i], int) else -1) for i in gl]
            corr = [corrs[i] for i in gl]
            for j in np.nonzero(bits == CLASS_BIT[COMM])[0].tolist():
                kept = self._comm_args(args[gl[j]] or (b"" if raw else {}), raw)
                if kept:
                    key = tuple((k, v if isinstance(v, (int, float, str)) else json.dumps(v))
                                for k, v in kept.items())
                    aid = self.arg_ids.get(key)
                    if aid is None:
                        aid = self.arg_ids[key] = len(self.arg_table)
                        self.arg_table.append(dict(key))
                    self.comm_event.append(self.n_gpu + j)
                    self.comm_arg.append(aid)
            self.n_gpu += g.size
            c = self.cols
            c["g_name"].append(nid[g].astype(np.int32))
            c["g_ts"].append(ts[g])
            c["g_dur"].append(dur[g])
            c["g_stream"].append(np.asarray(stream, dtype=np.int32))
            c["g_corr"].append(np.asarray(corr, dtype=np.int64))
            c["g_bit"].append(bits)
            c["g_family"].append(fam_u[inv])

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
        if self.n_gpu and self.cols["c_ts"]:
            for k in ("c_name", "c_ts", "c_dur", "c_bit", "c_family"):
                self.cols[k].clear()
        cpu = (codes == 4) | (codes == 5)
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


def _read_chunked(raw: IO[bytes], b: _Builder, meta: dict[str, Any]) -> bool:
    """Feed every event to `b`; fill `meta` with the other top-level keys. False when the
    document has no traceEvents array."""
    buf = b""
    meta["_bytes"] = 0
    while True:
        m = _EVENTS_KEY.search(buf)
        if m:
            break
        data = raw.read(_BLOCK)
        if not data:
            try:
                doc = orjson.loads(buf)
            except orjson.JSONDecodeError as exc:
                raise _Malformed(str(exc)) from None
            if isinstance(doc, dict):
                meta.update(doc)
            return False
        meta["_bytes"] += len(data)
        buf += data
    head = buf[:m.start()].rstrip()
    if head.endswith(b","):
        head = head[:-1]
    try:
        doc = orjson.loads(head + b"}")
        if isinstance(doc, dict):
            meta.update(doc)
    except orjson.JSONDecodeError:
        pass  # a damaged head shows up below as a damaged body
    body = buf[m.end():]
    del buf
    while True:
        data = raw.read(_BLOCK)
        meta["_bytes"] += len(data)
        if not data:
            try:
                doc = orjson.loads(b'{"traceEvents":[' + body)
            except orjson.JSONDecodeError as exc:
                raise _Malformed(str(exc)) from None
            if not isinstance(doc, dict):
                raise _Malformed("not a JSON object")
            _add_dicts(b, doc.pop("traceEvents", []))
            meta.update(doc)
            return True
        body += data
        end, done = len(body), False
        for _ in range(8):  # a cut that does not parse: try an earlier one
            cut = _cut(body, end)
            if cut is None:
                break
            if _add_run(b, body[:cut]):
                body = body[body.find(b"{", cut):]
                done = True
                break
            end = cut - 1
        if not done and len(body) > _MAX_EVENT:
            raise _Malformed(f"no complete event in {len(body) >> 20} MB")


def _open(path: Path) -> IO[bytes]:
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise BadInput(f"{path}: cannot read trace ({exc.strerror})") from None
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return f


def rank_from_name(path: Path) -> int | None:
    """Rank from an SGLang (`...-TP-3-...`) or generic (`rank-3`, `rank3`) trace file name."""
    for rx in _RANK_NAME_RX:
        m = rx.search(path.name)
        if m:
            return int(m.group(1))
    return None


def read_trace(path: Path | str, classifier: Classifier) -> RankTrace:
    """Stream one Kineto trace file into a RankTrace.

    Raises:
        BadInput: the file is not JSON, is truncated, or is not a Kineto trace.
    """
    path = Path(path)
    b = _Builder(classifier)
    raw = _open(path)
    tap = _Tap(raw)
    meta: dict[str, Any] = {}
    try:
        if READER == "chunked":
            found = _read_chunked(raw, b, meta)
            info = meta.get("distributedInfo")
            nbytes = int(meta.get("_bytes", 0))
        else:
            found, batch = False, []
            for ev in _ijson.items(tap, "traceEvents.item", use_float=True):
                found = True
                batch.append(ev)
                if len(batch) >= 8192:
                    _add_dicts(b, batch)
                    batch = []
            _add_dicts(b, batch)
            info, nbytes = tap.info, tap.nbytes
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
    finally:
        raw.close()
    if not found:
        raise BadInput(f"{path}: not a Kineto trace (no traceEvents)",
                       hint="pass the files torch.profiler / SGLang /start_profile wrote")
    if b.n_gpu == 0 and not b.cols["c_ts"]:
        raise BadInput(f"{path}: Kineto trace without GPU kernels or CPU ops to attribute")
    if not isinstance(info, dict):
        info = None
    rank: int | None = None
    source = "order"
    if info and isinstance(info.get("rank"), int):
        rank, source = int(info["rank"]), "distributedInfo"
    elif rank_from_name(path) is not None:
        rank, source = rank_from_name(path), "file name"
    col = b.column
    return RankTrace(
        path=path, rank=rank, rank_source=source, distributed_info=info, names=b.names,
        g_name=col("g_name", np.int32), g_ts=col("g_ts", np.float64), g_dur=col("g_dur", np.float64),
        g_stream=col("g_stream", np.int32), g_corr=col("g_corr", np.int64),
        g_bit=col("g_bit", np.int8), g_family=col("g_family", np.int32),
        comm_event=np.frombuffer(b.comm_event, dtype=np.int64).copy(),
        comm_arg=np.frombuffer(b.comm_arg, dtype=np.int32).copy(), comm_arg_table=b.arg_table,
        l_corr=col("l_corr", np.int64), l_ts=col("l_ts", np.float64), l_graph=col("l_graph", bool),
        c_name=col("c_name", np.int32), c_ts=col("c_ts", np.float64), c_dur=col("c_dur", np.float64),
        c_bit=col("c_bit", np.int8), c_family=col("c_family", np.int32),
        spans=b.spans, families=b.families, n_events=b.n_x, bytes_read=nbytes,
    )
