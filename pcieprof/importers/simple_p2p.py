"""cuda-samples `simpleP2P`: peer access per GPU pair, one copy bandwidth, and whether the data
that kernels moved over P2P was right.

What the sample prints (NVIDIA/cuda-samples Samples/0_Introduction/simpleP2P/simpleP2P.cu
@ca37378c):
- `> Peer access from <name> (GPU0) -> <name> (GPU1) : Yes|No` for every ordered pair;
- on the first pair with peer access: `cudaMemcpyPeer / cudaMemcpy between GPU0 and GPU1:
  10.39GB/s`: 100 copies of a 64 MiB buffer (16 Mi floats), alternating the two directions,
  timed by one event pair; the figure divides by 1024^3, so it is GiB/s and is stored here
  converted to GB/s (1e9 bytes/s);
- then a kernel on each GPU reads the other's buffer through P2P, the result is copied back and
  checked: `Verification error @ element i: val = nan, ref = 0.000000` (at most 12 lines), then
  `Test passed` or `Test failed!`; without a P2P-capable pair it waives (`waiving test`).

What goes where: the copy becomes one p2p.csv row (path `p2p`, `uni`, 64 MiB, status `error`
when the verification failed, since data moved over P2P was wrong); the peer-access answers and
the verification (passed, errors shown, the first ones) go to the facts.
"""

from __future__ import annotations

import re

from pcieprof.importers._text import clean_lines, fail, head_lines
from pcieprof.importers.records import GpuRecord, P2PRecord, Parsed

#: Bytes per copy: `buf_size = 1024 * 1024 * 16 * sizeof(float)` in simpleP2P.cu.
COPY_BYTES = 1024 * 1024 * 16 * 4
GIB = 1024 ** 3

_PEER = re.compile(r"^> Peer access from (.+?) \(GPU(\d+)\) -> (.+?) \(GPU(\d+)\) : (Yes|No)$")
_BW = re.compile(r"^cudaMemcpyPeer / cudaMemcpy between GPU(\d+) and GPU(\d+): ([0-9.]+|nan|inf)"
                 r" ?GB/s$")
_VERIFY = re.compile(r"^Verification error @ element (\d+): val = (\S+), ref = (\S+)$")
_COUNT = re.compile(r"^CUDA-capable device count: (\d+)$")
#: Releases of the CUDA 7-8 years first listed each GPU: `> GPU0 = "      Tesla K80" IS  capable
#: of Peer-to-Peer (P2P)` (or `IS NOT capable`), the name right-aligned in its quotes.
_CAPABLE = re.compile(r'^> GPU(\d+) = "\s*(.*?)" IS\s+(NOT\s+)?capable of Peer-to-Peer')
_MARKERS = ("Checking GPU(s) for support of peer to peer memory access",
            "cudaMemcpyPeer / cudaMemcpy between GPU", "simpleP2P] - Starting")


def looks_like(text: str) -> bool:
    """True for simpleP2P output (its banner, its peer-access check or its copy line)."""
    return any(any(m in line for m in _MARKERS) for line in head_lines(text)[:2000])


def parse_simple_p2p(text: str, name: str = "<simpleP2P>") -> Parsed:
    """Parse simpleP2P output.

    Args:
        text: the output (a prompt, Markdown fences or other lines around it are skipped).
        name: file name for messages.

    Returns:
        Parsed with the copy row (when the run got that far), the GPUs named, and facts
        `peer_access` ({"0->1": bool}), `verification` ({"result": "passed" | "failed" |
        "waived" | "not reached", "errors_shown", "first_errors"}), `copy_gib_per_s` (as
        printed).

    Raises:
        BadInput: no simpleP2P line at all, or a copy line whose number is not one.
    """
    lines = clean_lines(text)
    result = Parsed(format="simpleP2P", name=name)
    access: dict[str, bool] = {}
    names: dict[int, str] = {}
    errors: list[str] = []
    copy: tuple[int, int, float, int] | None = None
    verdict = "not reached"
    seen = False
    capable: dict[int, bool] = {}
    count: int | None = None
    for i, raw in enumerate(lines, start=1):
        s = raw.strip()
        if m := _PEER.match(s):
            seen = True
            a, b = int(m.group(2)), int(m.group(4))
            names.setdefault(a, m.group(1))
            names.setdefault(b, m.group(3))
            access[f"{a}->{b}"] = m.group(5) == "Yes"
        elif m := _BW.match(s):
            seen = True
            try:
                copy = (int(m.group(1)), int(m.group(2)), float(m.group(3)), i)
            except ValueError:
                fail(name, i, "a bandwidth in GB/s", got=s)
        elif m := _VERIFY.match(s):
            errors.append(f"element {m.group(1)}: val = {m.group(2)}, ref = {m.group(3)}")
        elif s == "Test passed":
            verdict = "passed"
        elif s == "Test failed!":
            verdict = "failed"
        elif "waiving test" in s.lower() or s == "Waiving test.":
            verdict = "waived"
        elif m := _CAPABLE.match(s):
            seen = True
            names.setdefault(int(m.group(1)), m.group(2))
            capable[int(m.group(1))] = not m.group(3)
        elif m := _COUNT.match(s):
            seen = True
            count = int(m.group(1))
        elif any(mk in s for mk in _MARKERS):
            seen = True
    if not seen:
        fail(name, None, "simpleP2P output ('> Peer access from ... : Yes|No' lines)")
    if errors and verdict == "not reached":
        verdict = "failed"  # the output was cut after the errors, before the verdict line
    result.gpus = [GpuRecord(i, n) for i, n in sorted(names.items())]
    verification = {"result": verdict, "errors_shown": len(errors), "first_errors": errors[:3]}
    result.facts = {"peer_access": access, "verification": verification}
    warnings: list[str] = []
    if capable:
        result.facts["p2p_capable"] = {str(k): v for k, v in sorted(capable.items())}
    if count is not None:
        result.facts["device_count"] = count
        expected = count * (count - 1)
        if access and len(access) < expected:
            warnings.append(f"{name}: {len(access)} of the {expected} ordered GPU pairs of "
                            f"{count} GPUs have a peer-access line; the others are unknown "
                            "(the output is cut short?)")
    if copy:
        a, b, gib, lineno = copy
        bad = verdict == "failed"
        detail = (f"simpleP2P line {lineno}: cudaMemcpy ping-pong GPU{a}<->GPU{b}, 100 x 64 MiB "
                  f"alternating directions, printed {gib} 'GB/s' = GiB/s")
        if bad:
            detail += (f"; verification FAILED: kernels reading peer memory got wrong data "
                       f"({len(errors)} errors shown, first: {errors[0] if errors else '?'})")
        result.p2p.append(P2PRecord(src=a, dst=b, path="p2p", direction="uni",
                                    size_bytes=COPY_BYTES, bandwidth_gbps=gib * GIB / 1e9,
                                    status="error" if bad else "ok", detail=detail))
        result.facts["copy_gib_per_s"] = gib
    yes = sum(access.values())
    result.summary = (f"simpleP2P: {len(names)} GPUs, peer access {yes}/{len(access)} pairs, "
                      + (f"copy {copy[2]} GiB/s, " if copy else "")
                      + f"verification {verdict}"
                      + (f" ({len(errors)} errors shown)" if errors else ""))
    if verdict == "failed":
        warnings.append(
            f"{name}: simpleP2P verification failed ({len(errors)} errors shown, first "
            f"{errors[0] if errors else '?'}): P2P reports success but moves wrong data")
    if warnings:
        result.facts["warnings"] = warnings
    return result
