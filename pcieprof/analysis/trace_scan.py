"""Vectorised scan of one block of Kineto trace events: the GPU-timeline events, kernel launches
and step annotations that attribution needs, as numpy columns, without decoding the rest.

A block is a run of complete events (trace_stream cuts the file at event boundaries). One numpy
pass finds every double quote in it. Kineto writes the keys of an event in a fixed order (ph,
cat, name, pid, tid, ts, dur, args), so once the `"cat"` keys are found among the quotes, an
event's category, name, numbers and args sit at fixed quote offsets from its `"cat"`: index
arithmetic on arrays selects the wanted categories (kernel, gpu_memcpy, gpu_memset,
cuda_runtime, cuda_driver and the step annotations) for all the events of the block at once, and
CPU ops, Python frames and flows are never decoded. Bytes are compared a row at a time (the
bytes at an offset, viewed as 64-bit words), and numbers read from fixed-width rows with integer
arithmetic: the digits make an integer below 2**53 that one division by a power of ten turns into
the same double as `float()` (both are correctly rounded), so the figures are bit for bit those of
a JSON parser.

Per-event Python work is left only where it is cheaper than a vectorised step: the bytes of each
GPU event's name (interned by a dict lookup), the args of communication kernels (parsed once per
distinct collective), and annotation names. A block that does not fit (another key order, an
escaped backslash before a quote, a selected event without the keys attribution reads) gives
None, and trace_stream parses it with its general path instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_QUOTE = 0x22
_ROW = 24  # bytes compared or read as one row: the longest text matched, the longest number
#: What a block handed to scan() ends with: 8 quotes (so that indices a few quotes past the
#: last real one stay in range) and zero bytes (so that a row read near the end stays inside).
PAD = b'"' * 8 + bytes(56)
_SENTINELS = 8

# category -> code: GPU events 0-2, launches 3, then the categories that may hold step markers:
# CPU annotations 4, GPU-timeline annotations 5, CPU ops 6, Python frames 7.
_CATS: dict[bytes, int] = {b"kernel": 0, b"gpu_memcpy": 1, b"gpu_memset": 2, b"cuda_runtime": 3,
                           b"cuda_driver": 3, b"user_annotation": 4, b"gpu_user_annotation": 5,
                           b"cpu_op": 6, b"python_function": 7}
_MARK_CATS = {4: "user_annotation", 5: "gpu_user_annotation", 6: "cpu_op", 7: "python_function"}
# cpu_op and python_function events are many; only names that can be step markers are looked at
# (trace_stream._STEP_RX decides): CPU ops starting with P, s or e (ProfilerStep#, step[,
# execute_context_/execute_model), Python frames ending in "execute_model".
_CPU_STEP_FIRST = np.frombuffer(b"Pse", np.uint8)
_PY_STEP_SUFFIX = b"execute_model"

_TWO53 = np.uint64(2 ** 53)
# Where Kineto puts args.correlation and args.stream, in quotes after the "args" key: runtime
# calls ("External id", "cbid", "correlation"), kernels ("External id", "queued", "device",
# "context", "stream", "correlation"), memcpy/memset ("device", "context", "stream", ...), and
# the same without "External id" (seen in the vLLM sample).
_ARG_AT = {b"correlation": (6, 12, 8, 10, 4), b"stream": (10, 6, 8, 4)}
_NUM_RX = re.compile(rb"\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_DELIM = np.zeros(256, dtype=bool)  # what may follow a JSON number
_DELIM[list(b", \t\r\n}]")] = True
# [width][length]: the columns of a number of that length, right-aligned in a row of that width
_INSIDE = {w: np.arange(w)[None, :] >= (w - np.arange(w + 1))[:, None] for w in (16, _ROW)}
_P10 = 10.0 ** np.arange(_ROW)
_U10 = np.array([10 ** i for i in range(20)] + [1] * (_ROW + 1 - 20), dtype=np.uint64)
_M8, _M16, _M32 = (np.uint64(m) for m in (0x00FF00FF00FF00FF, 0x0000FFFF0000FFFF, 0xFFFFFFFF))


@dataclass
class Scanned:
    """The selected events of one block. Times in microseconds (trace clock)."""

    n_x: int  # complete ("ph": "X") events in the block, of every category
    # GPU events (kernel, gpu_memcpy, gpu_memset), in file order:
    g_code: np.ndarray  # int8: 0 kernel, 1 memcpy, 2 memset
    g_name: list[bytes]  # the name as written (JSON escapes kept)
    g_ts: np.ndarray  # float64
    g_dur: np.ndarray  # float64
    g_stream: np.ndarray  # int64: args.stream, else tid, else -1
    g_corr: np.ndarray  # int64: args.correlation, -1 unknown
    g_args: np.ndarray  # int64: offset of each event's args `{` in the block
    g_end: np.ndarray  # int64: offset where the next event starts (bounds the args)
    # kernel launches and other runtime calls with a correlation id:
    l_corr: np.ndarray  # int64
    l_ts: np.ndarray  # float64
    l_graph: np.ndarray  # bool: cudaGraphLaunch*
    # annotations that may mark steps: (name as written, category, ts, dur)
    marks: list[tuple[bytes, str, float, float]]


class _Misfit(Exception):
    """The block is not laid out the way the vectorised scan reads it."""


def _words(text: bytes) -> list[tuple[int, np.uint64, np.uint64]]:
    """`text` as (word index, mask, value) of little-endian 64-bit words, for row compares."""
    out = []
    for i in range(0, len(text), 8):
        chunk = text[i:i + 8]
        out.append((i // 8, np.uint64((1 << (8 * len(chunk))) - 1),
                    np.uint64(int.from_bytes(chunk, "little"))))
    return out


_WORDS: dict[bytes, list[tuple[int, np.uint64, np.uint64]]] = {}


def equals(u: np.ndarray, text: bytes) -> np.ndarray:
    """Whether each row of words u (from _Block.words) starts with `text`."""
    words = _WORDS.get(text)
    if words is None:
        words = _WORDS[text] = _words(text)
    i, mask, value = words[0]
    ok = (u[:, i] & mask) == value
    for i, mask, value in words[1:]:
        ok &= (u[:, i] & mask) == value
    return ok


class _Block:
    """A block's bytes (padded) and its quotes: q[j] is the offset of the j-th double quote
    outside escapes, gap[j] = q[j + 1] - q[j]."""

    def __init__(self, padded: bytes) -> None:
        self.raw = padded
        self.a = np.frombuffer(padded, dtype=np.uint8)
        q = np.flatnonzero(self.a == _QUOTE)  # the padding's quotes last
        if q.size == _SENTINELS or q[0] == 0:
            raise _Misfit("no strings, or starts inside one")
        if padded.find(b"\\") >= 0:  # backslashes are rare: look for escaped quotes only then
            esc = self.a[q - 1] == 0x5C
            if esc.any():
                if (self.a[q[esc] - 2] == 0x5C).any():
                    raise _Misfit("escaped backslash before a quote")  # needs a real tokenizer
                q = q[~esc]
        if q.size % 2:
            raise _Misfit("cut inside a string")
        self.nq = q.size - _SENTINELS
        self.q = q
        self.gap = np.diff(q)
        # _ROW bytes, or one 64-bit word, from any offset (fancy indexing copies whole rows)
        self.rows = sliding_window_view(self.a, _ROW)
        self.rows16 = sliding_window_view(self.a, 16)
        self.w8 = np.ndarray((self.a.size - 7,), dtype="<u8", buffer=self.a, strides=(1,))

    def words(self, p: np.ndarray) -> np.ndarray:
        """The _ROW bytes at each offset p, as rows of 64-bit words (for equals())."""
        return self.rows[p].view(np.uint64)

    def match(self, p: np.ndarray, text: bytes) -> np.ndarray:
        """Whether the bytes at offsets p are `text` (at most _ROW bytes), vectorised over p;
        up to 16 bytes as one or two unaligned 64-bit words (cheaper to gather than a row)."""
        if len(text) > 16:
            return equals(self.words(p), text)
        words = _WORDS.get(text)
        if words is None:
            words = _WORDS[text] = _words(text)
        i, mask, value = words[0]
        ok = (self.w8[p] & mask) == value
        for i, mask, value in words[1:]:
            ok &= (self.w8[p + 8 * i] & mask) == value
        return ok

    def keys(self, key: bytes) -> np.ndarray:
        """The quotes j that open the object key `key`: its text, its closing quote, then ':'
        (no string value is followed by ':')."""
        j = np.flatnonzero(self.gap[:self.nq] == len(key) + 1)
        return j[self.match(self.q[j], b'"' + key + b'":')]

    def is_key(self, j: np.ndarray, key: bytes) -> np.ndarray:
        """Whether quote j opens the object key `key` (vectorised over j)."""
        return self.match(self.q[np.minimum(j, self.q.size - 1)], b'"' + key + b'":')

    def value_at(self, j: np.ndarray, sp: np.ndarray) -> np.ndarray:
        """Offset of the value of the key whose opening quote is j (`"key": value`)."""
        return self.q[np.minimum(j + 1, self.q.size - 1)] + 2 + sp

    def numbers(self, pos: np.ndarray, width: int = 16) -> np.ndarray:
        """The JSON numbers at byte offsets `pos`, as float64, exactly as float() reads them.

        A number's length runs to the first byte that is not a digit, '.' or '-'. Read again
        right-aligned in a row of `width` bytes (16 or 24), with the dot and the bytes before
        the number zeroed, each 64-bit word of the row turns its eight digits into an integer by
        three multiply-and-shift steps; the dot (counted as a zero digit) is then taken out by a
        division, which leaves the digits as one integer, exact below 2**53, and one division by
        a power of ten gives the correctly rounded value. Other forms (negative, exponents,
        longer numbers, numbers right at the start of the block) are read by float() one by one.

        Raises:
            _Misfit: a value there is not a number.
        """
        k = pos.size
        if k == 0:
            return np.empty(0, dtype=np.float64)
        rows_w = self.rows if width == _ROW else self.rows16
        left = rows_w[pos]
        length = np.argmin(left - np.uint8(0x2D) < 13, axis=1)  # first byte not in '-./0-9'
        dot = np.argmax(left == 0x2E, axis=1)
        rows = np.arange(k)
        has_dot = (dot < length) & (left[rows, dot] == 0x2E)
        frac = np.where(has_dot, length - 1 - dot, 0)
        right = rows_w[np.maximum(pos + length - width, 0)]  # the number in the last columns
        d = right - np.uint8(0x30)
        dig = ((d < 10) & _INSIDE[width][length]).view(np.uint8)
        n_other = length - dig.sum(axis=1, dtype=np.uint8)  # bytes of the number not digits
        w = (d * dig).view(np.uint64)  # little-endian: the leftmost digit in the lowest byte
        w = (w & _M8) * np.uint64(10) + ((w >> np.uint64(8)) & _M8)
        w = (w & _M16) * np.uint64(100) + ((w >> np.uint64(16)) & _M16)
        w = (w & _M32) * np.uint64(10000) + (w >> np.uint64(32))
        v = w[:, -2] * np.uint64(10 ** 8) + w[:, -1]
        if width == _ROW:
            v += w[:, 0] * np.uint64(10 ** 16)
        p = _U10[frac + has_dot.view(np.uint8)]  # the dot's column and the fraction digits
        total = np.where(has_dot, (v // p) * _U10[frac] + v % p, v)
        out = total.astype(np.float64) / _P10[frac]
        ok = ((length > 0) & (length < min(width, 20)) & (pos + length >= width)
              & (n_other == has_dot) & (~has_dot | (frac > 0)) & (total < _TWO53)
              & (d[:, -1] < 10) & _DELIM[self.a[pos + length]])
        for i in np.flatnonzero(~ok).tolist():  # negative, exponents, long: float() the text
            hit = _NUM_RX.match(self.raw, int(pos[i]))
            if hit is None:
                raise _Misfit("not a number")
            out[i] = float(hit.group(1))
        return out


def scan(padded: bytes) -> Scanned | None:
    """Read the selected events of a run of complete events followed by PAD (offsets in the
    result are into it), or None if it does not fit."""
    try:
        return _scan(_Block(padded))
    except _Misfit:
        return None


def _scan(bk: _Block) -> Scanned:
    a, q = bk.a, bk.q
    # The string "traceEvents" among the events: a second document's key (concatenated traces)
    # or an odd name; trace_stream's general path tells which.
    j = np.flatnonzero(bk.gap[:bk.nq] == len(b'traceEvents"'))
    if j.size and bk.match(q[j], b'"traceEvents"').any():
        raise _Misfit('a "traceEvents" string')
    # X events: a one-letter string "X" that is the value of a "ph" key followed by a "cat" key
    # (Kineto's first two keys); kc is the quote opening each one's "cat"
    jv = np.flatnonzero(bk.gap[:bk.nq] == 2)
    jv = jv[(jv >= 2) & (a[q[jv] + 1] == ord("X"))]
    n_strings = jv.size
    jv = jv[bk.is_key(jv - 2, b"ph") & bk.is_key(jv + 2, b"cat")]
    kc = jv + 2
    n_x = int(kc.size)
    if n_strings != n_x:  # a string "X" elsewhere: a name, or an X event laid out otherwise
        kp = bk.keys(b"ph")
        if int(bk.match(q[kp + 2], b'"X"').sum()) != n_x:
            raise _Misfit("X events whose keys are not in Kineto order")
    if n_x == 0:
        return _empty(0)
    # the next X event's "ph" key bounds an event's keys (other events between have neither
    # args.correlation nor args.stream)
    bound = np.append(kc[1:] - 4, bk.nq)
    sp = q[kc + 2] - q[kc] - 6  # 1 for '": "', 0 for '":"'
    if ((sp != 0) & (sp != 1)).any():
        raise _Misfit("unusual separators")
    # the category of each; the other events are left undecoded
    code = np.full(kc.size, -1, dtype=np.int8)
    u = bk.words(q[kc + 2])
    for cat, c in _CATS.items():
        code[equals(u, b'"' + cat + b'"')] = c
    sel = np.flatnonzero(code >= 0)
    kc, sp, code, bound_k = kc[sel], sp[sel], code[sel], bound[sel]
    bound_b = q[bound_k]

    # keys in Kineto order; a string pid or tid (two more quotes) shifts the ones after it
    ok = bk.is_key(kc + 4, b"name") & bk.is_key(kc + 8, b"pid")
    j = kc + 10 + 2 * (a[bk.value_at(kc + 8, sp)] == _QUOTE)
    ok &= bk.is_key(j, b"tid")
    tid_pos = bk.value_at(j, sp)
    tid_str = a[tid_pos] == _QUOTE
    j = j + 2 + 2 * tid_str
    ok &= bk.is_key(j, b"ts") & bk.is_key(j + 2, b"dur") & (j + 3 < bound_k)
    if not ok.all():
        raise _Misfit("keys not in Kineto order")
    ja = j + 4
    has_args = (ja < bound_k) & bk.is_key(ja, b"args")
    args_pos = bk.value_at(ja, sp)
    if (has_args & (a[args_pos] != ord("{"))).any():
        raise _Misfit("args is not an object")
    gpu = code <= 2
    launch = code == 3
    if ((gpu | launch) & ~has_args).any():
        raise _Misfit("a GPU event or launch without args")

    # the numbers: ts (long), then in one read dur (not of launches), args.correlation and
    # args.stream
    corr_at = _arg_key(bk, b"correlation", ja, bound_k, gpu | launch)
    stream_at = _arg_key(bk, b"stream", ja, bound_k, gpu)
    m = kc.size
    timed = ~launch
    n_dur = int(timed.sum())
    n_corr = int((corr_at >= 0).sum())
    ts = bk.numbers(bk.value_at(j, sp), _ROW)
    nums = bk.numbers(np.concatenate([
        bk.value_at(j[timed] + 2, sp[timed]),
        bk.value_at(corr_at[corr_at >= 0], sp[corr_at >= 0]),
        bk.value_at(stream_at[stream_at >= 0], sp[stream_at >= 0])]))
    dur = np.zeros(m)
    dur[timed] = nums[:n_dur]
    corr = _ints(nums[n_dur:], corr_at)
    stream = _ints(nums[n_dur + n_corr:], stream_at)

    g = np.flatnonzero(gpu)
    name0, name1 = q[kc + 6] + 1, q[kc + 7]
    g_stream = stream[g]
    no_stream = np.flatnonzero((g_stream < 0) & ~tid_str[g])
    if no_stream.size:  # no args.stream: the tid of a GPU event is its stream
        g_stream[no_stream] = bk.numbers(tid_pos[g[no_stream]]).astype(np.int64)
    raw = bk.raw
    g_name = [raw[s:e] for s, e in zip(name0[g].tolist(), name1[g].tolist())]

    la = np.flatnonzero(launch & (corr >= 0))
    l_graph = bk.match(name0[la], b"cudaGraphLaunch")

    return Scanned(n_x=n_x, g_code=code[g], g_name=g_name, g_ts=ts[g], g_dur=dur[g],
                   g_stream=g_stream, g_corr=corr[g], g_args=args_pos[g], g_end=bound_b[g],
                   l_corr=corr[la], l_ts=ts[la], l_graph=l_graph,
                   marks=_marks(bk, code, name0, name1, ts, dur))


def _arg_key(bk: _Block, key: bytes, ja: np.ndarray, bound_k: np.ndarray,
             want: np.ndarray) -> np.ndarray:
    """The quote of args' `key` key of each event where `want` (-1 where there is none): the
    first such key after the event's "args" key and before the next event. Looked for first
    where Kineto writes it (_ARG_AT), then, for the events left, among all the block's keys."""
    out = np.full(ja.size, -1, dtype=np.int64)
    todo = np.flatnonzero(want)
    for at in _ARG_AT[key]:
        if not todo.size:
            return out
        j = ja[todo] + at
        hit = (j < bound_k[todo]) & bk.is_key(j, key)
        out[todo[hit]] = j[hit]
        todo = todo[~hit]
    found = bk.keys(key)
    if found.size and todo.size:
        i = np.searchsorted(found, ja[todo])
        k = found[np.minimum(i, found.size - 1)]
        hit = (i < found.size) & (k < bound_k[todo])
        out[todo[hit]] = k[hit]
    return out


def _ints(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Values read for the events where at >= 0, spread over all events; -1 elsewhere and where
    negative (as the other readers, which take only unsigned ids)."""
    out = np.full(at.size, -1, dtype=np.int64)
    has = at >= 0
    v = values[:int(has.sum())]
    out[has] = np.where(v >= 0, v, -1).astype(np.int64)
    return out


def _marks(bk: _Block, code: np.ndarray, s: np.ndarray, e: np.ndarray, ts: np.ndarray,
           dur: np.ndarray) -> list[tuple[bytes, str, float, float]]:
    """Annotations whose names may mark steps (trace_stream's _STEP_RX has the last word)."""
    cand = (code == 4) | (code == 5) | ((code == 6) & np.isin(bk.a[s], _CPU_STEP_FIRST))
    py = np.flatnonzero(code == 7)
    if py.size:
        n = len(_PY_STEP_SUFFIX)
        ends = np.maximum(e[py] - n, 0)
        cand[py[((e[py] - s[py]) >= n) & bk.match(ends, _PY_STEP_SUFFIX)]] = True
    raw = bk.raw
    return [(raw[int(s[i]):int(e[i])], _MARK_CATS[int(code[i])], float(ts[i]), float(dur[i]))
            for i in np.flatnonzero(cand).tolist()]


def _empty(n_x: int) -> Scanned:
    f, i = np.empty(0, np.float64), np.empty(0, np.int64)
    return Scanned(n_x=n_x, g_code=np.empty(0, np.int8), g_name=[], g_ts=f, g_dur=f, g_stream=i,
                   g_corr=i, g_args=i, g_end=i, l_corr=i, l_ts=f, l_graph=np.empty(0, bool),
                   marks=[])
