"""What the page carries besides its text: plotly.js once, packed, and every figure as JSON.

plotly.js (from the installed plotly package, so it always matches the figure specs) is 4.8 MB
of text. Deflated it is 1.5 MB of bytes, which the page carries as text 7 bits per character
(`pack7`): 1.7 MB, what keeps a report with thirty figures under 2 MB (base64 would be 2.0 MB on
its own). The page's loader (templates/report.js) undoes both with the browser's own
DecompressionStream (Chromium 80+, Firefox 113+, Safari 16.4+), so the file stays one offline
page that opens from anywhere.

The figure specs go into one JSON block: the plotly template once for the page, and every
array that two figures (or two traces) share stored once and referenced as {"$shared": k}.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.io as pio
from plotly.offline import get_plotlyjs

from pcieprof.report.figures import LOOK, plain
from pcieprof.report.model import Figure

#: 7-bit values that cannot stand for themselves inside a <script> element: NUL (the parser
#: makes it U+FFFD), CR (the parser turns it into LF) and '<' (it could start `</script`).
#: Each is written as one character U+0100 + (its index here << 7 | the next 7-bit value).
UNSAFE7 = (0x00, 0x0D, 0x3C)
#: Plotly figure config, once for the page: responsive, and no mode bar: it sits over the
#: legend and the first heatmap row; zoom (drag), reset (double-click) and hover work without it.
CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True, "displayModeBar": False}
#: A shared array must be at least this long as JSON to be worth a reference.
_SHARE_MIN_CHARS = 40


@dataclass(frozen=True)
class PackedScript:
    """plotly.js deflated (raw deflate) and written 7 bits per character (`pack7`).

    Attributes:
        version: e.g. "plotly.js v4.1.1", from the file's own header.
        nbytes: length of the deflated bytes.
        text: the packed text.
    """

    version: str
    nbytes: int
    text: str


@functools.lru_cache(maxsize=1)
def packed_plotly() -> PackedScript:
    """plotly.js of the installed plotly package, packed for the page (once per process)."""
    js = get_plotlyjs()
    found = re.search(r"plotly\.js v[0-9][\w.\-]*", js[:2000])
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15, 9)  # -15: raw deflate, no zlib header
    data = deflate.compress(js.encode("utf-8")) + deflate.flush()
    return PackedScript(found.group(0) if found else "plotly.js (version unknown)", len(data),
                        pack7(data))


def pack7(data: bytes) -> str:
    """`data` as text of 7 bits per character (most significant bit first, zero-padded).

    A 7-bit value in UNSAFE7 takes the next value with it into one character from U+0100 on,
    so the text holds no NUL, no CR and no '<' and can sit in a <script> element as it is.
    In UTF-8 that is 8 bits for 7 (base64 takes 8 for 6).
    """
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    n = -(-len(bits) // 7)  # values that carry data; one spare after them, for an escape
    bits = np.concatenate([bits, np.zeros((n + 1) * 7 - len(bits), dtype=np.uint8)])
    values = bits.reshape(-1, 7) @ (1 << np.arange(6, -1, -1))
    codes = values.astype(np.uint32)
    keep = np.ones(len(values), dtype=bool)
    for i in np.flatnonzero(np.isin(values[:n], UNSAFE7)):
        if keep[i]:  # not already taken by the unsafe value before it
            codes[i] = 0x100 + (UNSAFE7.index(int(values[i])) << 7) + int(values[i + 1])
            keep[i + 1] = False
    return codes[:n][keep[:n]].astype("<u4").tobytes().decode("utf-32-le")


def unpack7(text: str, nbytes: int) -> bytes:
    """Inverse of `pack7`; the page's loader does the same in JS."""
    values: list[int] = []
    for c in map(ord, text):
        if c < 0x80:
            values.append(c)
        else:
            values += [UNSAFE7[(c - 0x100) >> 7], (c - 0x100) & 0x7F]
    bits = ((np.array(values, dtype=np.uint8)[:, None] >> np.arange(6, -1, -1)) & 1).ravel()
    return np.packbits(bits[:nbytes * 8]).tobytes()


@functools.lru_cache(maxsize=1)
def _plotly_white() -> dict[str, Any]:
    return plain(pio.templates["plotly_white"].to_plotly_json())


def template(trace_types: set[str]) -> dict[str, Any]:
    """The page's one plotly template: plotly_white for the trace types drawn, and LOOK."""
    base = _plotly_white()
    data = {k: v for k, v in base.get("data", {}).items() if k in trace_types}
    layout = {**base.get("layout", {}), **LOOK}
    return {"data": data, "layout": layout}


def figures_json(figures: list[Figure]) -> str:
    """Every figure of the page as one JSON text, safe inside <script type="application/json">.

    Args:
        figures: the page's figures, each with its `id` set (the id of its plot <div>).
    """
    specs = [{"id": f.id, "data": f.spec["data"], "layout": f.spec["layout"]} for f in figures]
    specs, shared = share_arrays(specs)
    types = {str(t.get("type", "scatter")) for f in figures for t in f.spec["data"]}
    doc = {"config": CONFIG, "template": template(types), "shared": shared, "figures": specs}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # '<', '>' and '&' as JSON escapes: no bundle string can close the script element.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def share_arrays(specs: list[Any]) -> tuple[list[Any], list[Any]]:
    """Store every array that occurs twice or more (by value) once, as {"$shared": k}.

    Returns:
        (specs with references, the shared arrays).
    """
    counts: dict[str, int] = {}

    def count(v: Any) -> None:
        if isinstance(v, list):
            key = json.dumps(v, separators=(",", ":"))
            if len(key) >= _SHARE_MIN_CHARS:
                counts[key] = counts.get(key, 0) + 1
            for x in v:
                count(x)
        elif isinstance(v, dict):
            for x in v.values():
                count(x)

    for s in specs:
        count(s)
    shared: list[Any] = []
    index: dict[str, int] = {}

    def swap(v: Any) -> Any:
        if isinstance(v, list):
            key = json.dumps(v, separators=(",", ":"))
            if counts.get(key, 0) > 1:
                if key not in index:
                    index[key] = len(shared)
                    shared.append(v)
                return {"$shared": index[key]}
            return [swap(x) for x in v]
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        return v

    return [swap(s) for s in specs], shared
