"""`nvidia-smi topo -p2p r|w|rw|n|a|p`: the P2P status of every GPU pair for one capability.

The output is a matrix (a leading space, the header underlined with ANSI codes, tab separated in
a terminal and runs of spaces when pasted, `X` on the diagonal) followed by a legend of the
status codes (OK, CNS, GNS, TNS, NS, DR, U). The capability letters (nvidia-smi(1), `topo -p2p`:
r read, w write, n nvlink, a atomics, p pcie; `rw` is accepted by nvidia-smi too) are not
printed with the matrix, so the capability is taken from the caller, from the command when the
paste holds it (`$ nvidia-smi topo -p2p p`, `--p2pstatus r`), from the file name
(`..._p2p_rw_...`), or left as `unknown` with a warning.

Codes are kept as nvidia-smi prints them (topology.json `pairs[].p2p.<capability>`); `STATUS`
says what each means for a pair: `ok`, `not_supported` (CNS, GNS, TNS, NS, DR: no P2P of that
kind on that pair), `unknown` (U).
"""

from __future__ import annotations

import re

from pcieprof.bundle.topology import P2P_CODE_STATUS
from pcieprof.importers._text import clean_lines, fail, head_lines
from pcieprof.importers.records import Parsed

#: Status codes as the nvidia-smi legend spells them.
STATUS_CODES = {"OK": "Status Ok", "CNS": "Chipset not supported", "GNS": "GPU not supported",
                "TNS": "Topology not supported", "NS": "Not supported",
                "DR": "Disabled by regkey", "U": "Unknown"}

#: Code -> the status it means for the pair (the project's status vocabulary).
STATUS = P2P_CODE_STATUS

#: The -p2p flag letter -> the topology.json pair p2p keys it fills.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "r": ("read",), "w": ("write",), "rw": ("read", "write"), "n": ("nvlink",),
    "a": ("atomics",), "p": ("pcie",), "unknown": ("unknown",)}

_NAME_CAP = re.compile(r"(?:^|[^a-z])p2p[_\-. ]?(rw|r|w|n|a|p)(?:[^a-z]|$)", re.I)
_CMD_CAP = re.compile(r"topo\s+(?:-p2p|--p2pstatus)[\s=]+(rw|r|w|n|a|p)\b")
_GPU = re.compile(r"GPU\d+")


def capability_from_name(name: str) -> str:
    """Guess the -p2p flag from a file name like `topo_p2p_rw_box.txt`; `unknown` otherwise."""
    m = _NAME_CAP.search(name.rsplit("/", 1)[-1])
    return m.group(1).lower() if m else "unknown"


def status_of(code: str) -> str:
    """`ok`, `not_supported` or `unknown` for an nvidia-smi P2P status code."""
    return STATUS.get(code, "unknown")


def _header_tokens(tokens: list[str]) -> list[str]:
    """The GPU columns of a header line (a prompt pasted before `GPU0` dropped), or []."""
    if "GPU0" not in tokens:
        return []
    cols = tokens[tokens.index("GPU0"):]
    return cols if all(_GPU.fullmatch(t) for t in cols) else []


def _is_code_row(tokens: list[str]) -> bool:
    codes = set(STATUS_CODES) | {"X"}
    return (len(tokens) >= 2 and _GPU.fullmatch(tokens[0]) is not None
            and all(t in codes for t in tokens[1:]))


def _find(lines: list[str]) -> int | None:
    """Index of the header line of the first -p2p matrix (a header of GPU columns only, followed
    by a row of status codes)."""
    for i, line in enumerate(lines):
        if "GPU0" in line and _header_tokens(line.split()):
            nxt = next((l for l in lines[i + 1:i + 3] if l.strip()), "")
            if _is_code_row(nxt.split()):
                return i
    return None


def looks_like(text: str) -> bool:
    """True when `text` holds a `topo -p2p` matrix (a header of GPUn only, rows of codes)."""
    return _find(head_lines(text)) is not None


def parse_topo_p2p(text: str, name: str = "<topo -p2p>", capability: str | None = None) -> Parsed:
    """Parse `nvidia-smi topo -p2p` output.

    Args:
        text: the output, or a text holding it (prompt, prose, a `topo -m` matrix beside it).
        name: file name for messages (and for guessing the capability).
        capability: the -p2p flag (`r`, `w`, `rw`, `n`, `a`, `p`); when None, read from the
            command in the text or guessed from `name`.

    Returns:
        Parsed with `pair_p2p[(a, b)] = {"read": "OK", ...}` for every ordered pair a != b, facts
        `capability`, `capability_from` (`argument`, `command in the file`, `file name` or
        `unknown`), `gpus`, `status_counts` ({code: pairs}), `not_supported_pairs`.

    Raises:
        BadInput: no matrix, a row of the wrong length, an unknown status code, or fewer rows than
            columns (a truncated file); the line and what was expected there.
    """
    lines = clean_lines(text)
    header_no = _find(lines)
    if header_no is None:
        first = next((i for i, l in enumerate(lines) if "GPU0" in l), None)
        if first is None:
            fail(name, 1 if lines else None, "a header row of GPU columns (GPU0 GPU1 ...)",
                 got=lines[0] if lines else "")
        nxt = next((j for j in range(first + 1, len(lines)) if lines[j].strip()), None)
        if nxt is None:
            fail(name, first + 1, "rows of P2P status codes under the header 'GPU0 GPU1 ...' "
                 "(the file ends here)")
        fail(name, nxt + 1, f"a row 'GPU0 X <status code> ...' under the header of line "
             f"{first + 1} (codes {', '.join(STATUS_CODES)})", got=lines[nxt])
    cap, source = _capability(capability, lines[:header_no + 1], name)
    if cap not in CAPABILITIES:
        fail(name, None, f"a -p2p capability in {sorted(CAPABILITIES)}", got=cap)
    keys = CAPABILITIES[cap]
    gpus = _header_tokens(lines[header_no].split())
    n = len(gpus)
    result = Parsed(format="nvidia-smi-topo-p2p", name=name)
    rows = 0
    stop = len(lines)
    for i in range(header_no + 1, len(lines)):
        cells = lines[i].split()
        if not cells:
            if rows:
                stop = i
                break  # the legend follows a blank line
            continue
        if not _GPU.fullmatch(cells[0]):
            stop = i
            break  # prose or another table after the matrix
        a = int(cells[0][3:])
        if len(cells) - 1 != n:
            fail(name, i + 1, f"{n} status codes after {cells[0]}", got=lines[i])
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
        fail(name, stop + 1, f"{n} GPU rows (found {rows}): the file looks truncated",
             got=lines[stop] if stop < len(lines) else None)
    counts: dict[str, int] = {}
    for caps in result.pair_p2p.values():
        code = next(iter(caps.values()))
        counts[code] = counts.get(code, 0) + 1
    not_supported = sorted(f"{a}->{b}" for (a, b), caps in result.pair_p2p.items()
                           if status_of(next(iter(caps.values()))) == "not_supported")
    result.facts = {"capability": cap, "capability_from": source, "gpus": n,
                    "status_counts": counts, "not_supported_pairs": not_supported}
    if cap == "unknown":
        result.facts["warnings"] = [
            f"{name}: which -p2p capability (r, w, n, a, p) was asked is not in the file nor its "
            "name; the codes are kept under 'unknown' (name the file like topo_p2p_r.txt)"]
    result.summary = (f"nvidia-smi topo -p2p {cap}: {n} GPUs, "
                      + ", ".join(f"{v} pairs {k}" for k, v in sorted(counts.items())))
    return result


def _capability(given: str | None, before: list[str], name: str) -> tuple[str, str]:
    """(capability letter, where it came from): the argument, the command pasted above the
    matrix (the last one before it), the file name, else unknown."""
    if given:
        return given.lower(), "argument"
    for line in reversed(before):
        if m := _CMD_CAP.search(line):
            return m.group(1), "command in the file"
    cap = capability_from_name(name)
    return cap, "file name" if cap != "unknown" else "unknown"
