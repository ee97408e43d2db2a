"""Stream a PyTorch-profiler (Kineto) Chrome trace into compact columns, without loading it whole.

The JSON is parsed incrementally with ijson (its C backend, yajl2_c, when installed): one event
dict at a time, of which only what attribution needs is kept, in typed arrays (about 40 bytes per
GPU event, 24 per kernel launch), so memory grows with the number of GPU events and not with the
size of the file, and stays far below it. Plain and gzipped files are accepted (detected by their
magic bytes). `distributedInfo` may come before or after `traceEvents`; it is picked off the byte
stream as it passes.
"""

from __future__ import annotations

import gzip
import json
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np

from pcieprof.analysis.classify import CLASS_BIT, COMM, Classifier
from pcieprof.errors import BadInput

#: ijson backend in use ("yajl2_c" is the fast one); recorded in attribution.json.
IJSON_BACKEND = ijson.backend

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
    comm_args: dict[int, dict[str, Any]]  # GPU event index -> collective args (comm events only)
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
    names: list[str] = []
    name_ids: dict[str, int] = {}
    families: list[str] = []
    family_ids: dict[str, int] = {}
    cls_of_name: dict[int, tuple[int, int]] = {}
    cpu_cls_of_name: dict[int, tuple[int, int]] = {}
    g_name, g_stream, g_fam = array("i"), array("i"), array("i")
    g_ts, g_dur = array("d"), array("d")
    g_corr = array("q")
    g_bit = array("b")
    comm_args: dict[int, dict[str, Any]] = {}
    l_corr, l_ts, l_graph = array("q"), array("d"), array("b")
    c_name, c_fam = array("i"), array("i")
    c_ts, c_dur = array("d"), array("d")
    c_bit = array("b")
    spans: list[tuple[str, str, float, float]] = []
    n_events = 0

    def name_id(name: str) -> int:
        i = name_ids.get(name)
        if i is None:
            i = name_ids[name] = len(names)
            names.append(name)
        return i

    def family_id(fam: str) -> int:
        i = family_ids.get(fam)
        if i is None:
            i = family_ids[fam] = len(families)
            families.append(fam)
        return i

    raw = _open(path)
    tap = _Tap(raw)
    try:
        for ev in ijson.items(tap, "traceEvents.item", use_float=True):
            n_events += 1
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            name = ev.get("name")
            ts = ev.get("ts")
            if not isinstance(name, str) or not isinstance(ts, (int, float)):
                continue
            dur = ev.get("dur") or 0.0
            kind = _GPU_CATS.get(cat)  # type: ignore[arg-type]
            if kind is not None:
                args = ev.get("args") or {}
                nid = name_id(name)
                key = nid * 4 + kind
                hit = cls_of_name.get(key)
                if hit is None:
                    cls, fam = classifier.gpu(name, cat)  # type: ignore[arg-type]
                    hit = cls_of_name[key] = (CLASS_BIT[cls], family_id(fam))
                if hit[0] == CLASS_BIT[COMM]:
                    kept = {k: args[k] for k in _COMM_ARGS if k in args}
                    if kept:
                        comm_args[len(g_ts)] = kept
                g_name.append(nid)
                g_ts.append(float(ts))
                g_dur.append(float(dur))
                stream = args.get("stream", ev.get("tid", -1))
                g_stream.append(int(stream) if isinstance(stream, (int, float)) else -1)
                corr = args.get("correlation", -1)
                g_corr.append(int(corr) if isinstance(corr, (int, float)) else -1)
                g_bit.append(hit[0])
                g_fam.append(hit[1])
            elif cat in _LAUNCH_CATS:
                corr = (ev.get("args") or {}).get("correlation")
                if isinstance(corr, (int, float)):
                    l_corr.append(int(corr))
                    l_ts.append(float(ts))
                    l_graph.append(1 if name.startswith("cudaGraphLaunch") else 0)
            elif cat in ("cpu_op", "user_annotation", "gpu_user_annotation"):
                if _STEP_RX.match(name):
                    spans.append((name, cat, float(ts), float(dur)))
                    continue
                if cat == "gpu_user_annotation":
                    continue
                nid = name_id(name)
                hit = cpu_cls_of_name.get(nid)
                if hit is None:
                    cls, fam = classifier.cpu(name)
                    hit = cpu_cls_of_name[nid] = (CLASS_BIT[cls], family_id(fam))
                    if cls == "compute" and cat != "cpu_op":
                        hit = cpu_cls_of_name[nid] = (-1, hit[1])  # annotations are not compute
                if hit[0] < 0:
                    continue
                c_name.append(nid)
                c_ts.append(float(ts))
                c_dur.append(float(dur))
                c_bit.append(hit[0])
                c_fam.append(hit[1])
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
    if n_events == 0:
        raise BadInput(f"{path}: not a Kineto trace (no traceEvents)",
                       hint="pass the files torch.profiler / SGLang /start_profile wrote")
    if not g_ts and not c_ts:
        raise BadInput(f"{path}: Kineto trace without GPU kernels or CPU ops to attribute")

    info = tap.info
    rank: int | None = None
    source = "order"
    if info and isinstance(info.get("rank"), int):
        rank, source = int(info["rank"]), "distributedInfo"
    elif rank_from_name(path) is not None:
        rank, source = rank_from_name(path), "file name"

    return RankTrace(
        path=path, rank=rank, rank_source=source, distributed_info=info, names=names,
        g_name=np.frombuffer(g_name, dtype=np.int32).copy(),
        g_ts=np.frombuffer(g_ts, dtype=np.float64).copy(),
        g_dur=np.frombuffer(g_dur, dtype=np.float64).copy(),
        g_stream=np.frombuffer(g_stream, dtype=np.int32).copy(),
        g_corr=np.frombuffer(g_corr, dtype=np.int64).copy(),
        g_bit=np.frombuffer(g_bit, dtype=np.int8).copy(),
        g_family=np.frombuffer(g_fam, dtype=np.int32).copy(),
        comm_args=comm_args,
        l_corr=np.frombuffer(l_corr, dtype=np.int64).copy(),
        l_ts=np.frombuffer(l_ts, dtype=np.float64).copy(),
        l_graph=np.frombuffer(l_graph, dtype=np.int8).astype(bool),
        c_name=np.frombuffer(c_name, dtype=np.int32).copy(),
        c_ts=np.frombuffer(c_ts, dtype=np.float64).copy(),
        c_dur=np.frombuffer(c_dur, dtype=np.float64).copy(),
        c_bit=np.frombuffer(c_bit, dtype=np.int8).copy(),
        c_family=np.frombuffer(c_fam, dtype=np.int32).copy(),
        spans=spans, families=families, n_events=n_events, bytes_read=tap.nbytes,
    )
