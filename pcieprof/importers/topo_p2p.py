"""`nvidia-smi topo -p2p r|w|rw|n|a`: the P2P status of every GPU pair for one capability.

The output is a tab-separated matrix (header underlined with ANSI codes, ` X ` or `X` on the
diagonal) followed by a legend of the status codes (OK, CNS, GNS, TNS, NS, DR, U). The command's
flag (which capability was asked) is not printed, so it is taken from the caller, or guessed from
the file name (`..._p2p_rw_...`), or left as `unknown`.
"""

from __future__ import annotations

import re

from pcieprof.importers._text import fail, split_lines, strip_ansi
from pcieprof.importers.records import Parsed

#: Status codes as the nvidia-smi legend spells them.
STATUS_CODES = {"OK": "Status Ok", "CNS": "Chipset not supported", "GNS": "GPU not supported",
                "TNS": "Topology not supported", "NS": "Not supported",
                "DR": "Disabled by regkey", "U": "Unknown"}

#: The -p2p flag letter -> the topology.json pair p2p keys it fills.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "r": ("read",), "w": ("write",), "rw": ("read", "write"), "n": ("nvlink",),
    "a": ("atomics",), "unknown": ("unknown",)}

_NAME_CAP = re.compile(r"(?:^|[^a-z])p2p[_\-. ]?(rw|r|w|n|a)(?:[^a-z]|$)", re.I)


def capability_from_name(name: str) -> str:
    """Guess the -p2p flag from a file name like `topo_p2p_rw_box.txt`; `unknown` otherwise."""
    m = _NAME_CAP.search(name)
    return m.group(1).lower() if m else "unknown"


def looks_like(text: str) -> bool:
    """True when `text` is a `topo -p2p` matrix (header of GPUn and only status codes in it)."""
    lines = [strip_ansi(l) for l in split_lines(text) if l.strip()]
    if not lines or not re.match(r"^\s*GPU0(\s|$)", lines[0]):
        return False
    codes = set(STATUS_CODES) | {"X"}
    for line in lines[1:3]:
        cells = line.split()
        if not cells or not cells[0].startswith("GPU"):
            return False
        if not set(cells[1:]) <= codes:
            return False
    return True


def parse_topo_p2p(text: str, name: str = "<topo -p2p>", capability: str | None = None) -> Parsed:
    """Parse `nvidia-smi topo -p2p` output.

    Args:
        text: the output.
        name: file name for messages (and for guessing the capability).
        capability: the -p2p flag (`r`, `w`, `rw`, `n`, `a`); guessed from `name` when None.

    Returns:
        Parsed with `pair_p2p[(a, b)] = {"read": "OK", ...}` for every ordered pair a != b.

    Raises:
        BadInput: a header without GPU columns, a row of the wrong length, an unknown status code,
            or fewer rows than columns (a truncated file).
    """
    cap = (capability or capability_from_name(name)).lower()
    if cap not in CAPABILITIES:
        fail(name, None, f"a -p2p capability in {sorted(CAPABILITIES)}", got=cap)
    keys = CAPABILITIES[cap]
    lines = split_lines(text)
    header_no = next((i for i, l in enumerate(lines) if l.strip()), None)
    if header_no is None:
        fail(name, 1, "a header row of GPU columns (GPU0 GPU1 ...)", got="")
    header = strip_ansi(lines[header_no]).split()
    gpus = [c for c in header if re.fullmatch(r"GPU\d+", c)]
    if not gpus or gpus != header[:len(gpus)]:
        fail(name, header_no + 1, "a header row of GPU columns (GPU0 GPU1 ...)",
             got=lines[header_no])
    n = len(gpus)
    result = Parsed(format="nvidia-smi-topo-p2p", name=name)
    rows = 0
    for i in range(header_no + 1, len(lines)):
        raw = strip_ansi(lines[i])
        if not raw.strip():
            break  # the legend follows a blank line
        cells = raw.split()
        if not re.fullmatch(r"GPU\d+", cells[0]):
            fail(name, i + 1, f"a row 'GPU{rows} <{n} status codes>'", got=raw)
        a = int(cells[0][3:])
        if len(cells) - 1 != n:
            fail(name, i + 1, f"{n} status codes after {cells[0]}", got=raw)
        for j, code in enumerate(cells[1:]):
            b = int(gpus[j][3:])
            if a == b:
                if code != "X":
                    fail(name, i + 1, f"'X' on the diagonal for {cells[0]}", got=code)
                continue
            if code not in STATUS_CODES:
                fail(name, i + 1, f"a status code in {sorted(STATUS_CODES)}", got=code)
            result.pair_p2p[(a, b)] = {k: code for k in keys}
        rows += 1
    if rows < n:
        fail(name, header_no + 2 + rows, f"{n} GPU rows (found {rows}): the file looks truncated")
    counts: dict[str, int] = {}
    for caps in result.pair_p2p.values():
        code = next(iter(caps.values()))
        counts[code] = counts.get(code, 0) + 1
    result.facts = {"capability": cap, "gpus": n, "status_counts": counts}
    result.summary = (f"nvidia-smi topo -p2p {cap}: {n} GPUs, "
                      + ", ".join(f"{v} pairs {k}" for k, v in sorted(counts.items())))
    return result
