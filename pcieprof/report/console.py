"""The short console summary of a topology bundle: the P2P matrix and decode-sized all-reduces.

Plain fixed-width text for stdout; the full picture is the report.
"""

from __future__ import annotations

import math
from typing import Iterable

import pandas as pd

from pcieprof.bundle import Bundle

#: Decode-sized all-reduce messages: batch x hidden x 2 bytes is about 12 KiB at batch 1 for
#: GLM-5-class hidden sizes and grows with the batch; the powers of two around 12..256 KiB.
DECODE_SIZES = [8 * 1024, 16 * 1024, 32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024]

_NOTES = {
    "cpu": "backend=cpu: processes on this machine and host memory copies; these numbers measure "
           "this machine and the harness, not a GPU fabric",
    "sim": "backend=sim: numbers from the fabric model (simulated), not measured",
}


def _fmt(v: float, width: int = 7, digits: int = 1) -> str:
    return f"{v:{width}.{digits}f}" if isinstance(v, (int, float)) and not math.isnan(v) else f"{'-':>{width}}"


def _size(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def p2p_matrix(df: pd.DataFrame, path: str) -> list[str]:
    """Lines of the uni-directional bandwidth matrix (GB/s) of one path at its largest size."""
    bw = df[(df["path"] == path) & (df["direction"] == "uni") & df["bandwidth_gbps"].notna()]
    bad = df[(df["path"] == path) & ~df["status"].isin(["ok"])]
    if bw.empty and bad.empty:
        return []
    size = int(bw["size_bytes"].max()) if not bw.empty else 0
    bw = bw[bw["size_bytes"] == size]
    devs = sorted(set(df.loc[df["path"] == path, "src"]) | set(df.loc[df["path"] == path, "dst"]))
    devs = [int(d) for d in devs if int(d) >= 0]
    lines = [f"{path} bandwidth, GB/s ({_size(size)} copies, src row -> dst column):",
             "       " + "".join(f"{d:>7}" for d in devs)]
    for a in devs:
        cells = []
        for b in devs:
            if a == b:
                cells.append(f"{'X':>7}")
                continue
            hit = bw[(bw["src"] == a) & (bw["dst"] == b)]
            status = bad[(bad["src"] == a) & (bad["dst"] == b)]["status"]
            if not hit.empty:
                cells.append(_fmt(float(hit["bandwidth_gbps"].iloc[0])))
            elif not status.empty:
                cells.append(f"{str(status.iloc[0])[:6]:>7}")
            else:
                cells.append(_fmt(float("nan")))
        lines.append(f"{a:>7}" + "".join(cells))
    return lines


def allreduce_decode(df: pd.DataFrame, nranks: int | None = None,
                     sizes: Iterable[int] = DECODE_SIZES) -> list[str]:
    """Lines of the all-reduce time (us) at decode-sized messages per variant (largest group)."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return []
    n = nranks or int(ok["nranks"].max())
    ok = ok[ok["nranks"] == n]
    dtype = "bf16" if (ok["dtype"] == "bf16").any() else str(ok["dtype"].iloc[0])
    ok = ok[ok["dtype"] == dtype]
    sizes = [s for s in sizes if (ok["size_bytes"] == s).any()]
    if not sizes:
        return []
    lines = [f"all-reduce time, us ({n} ranks, {dtype}, decode-sized messages):",
             f"{'variant':<16}" + "".join(f"{_size(s):>10}" for s in sizes)]
    for variant, g in ok.groupby("variant", sort=False):
        ranks = g["ranks"].iloc[0]
        g = g[g["ranks"] == ranks]
        cells = []
        for s in sizes:
            hit = g[g["size_bytes"] == s]["time_us"]
            cells.append(_fmt(float(hit.iloc[0]), 10) if not hit.empty else _fmt(float("nan"), 10))
        lines.append(f"{str(variant):<16}" + "".join(cells))
    if ok["detail"].astype(str).str.contains("gloo ignores").any():
        lines.append("  (NCCL_* variants on gloo: same transport as default, measured again)")
    bad = df[~df["status"].isin(["ok"])]
    for _, r in bad.iterrows():
        lines.append(f"  {r['variant']} ranks {r['ranks']} size {r['size_bytes']} B: "
                     f"{r['status']} ({r['detail']})")
    return lines


def summarize(bundle: Bundle) -> str:
    """The summary text of a topology bundle."""
    out: list[str] = []
    note = _NOTES.get(bundle.backend)
    if note:
        out.append(note)
    p2p = bundle.read_table("p2p")
    for path in ("p2p", "host_staged"):
        m = p2p_matrix(p2p, path)
        if m:
            out += [""] + m
    lat = p2p[(p2p["path"] == "p2p") & p2p["latency_us"].notna()]
    if not lat.empty:
        out.append(f"p2p latency: median {lat['latency_us'].median():.1f} us over "
                   f"{len(lat)} pairs ({_size(int(lat['size_bytes'].min()))} copies)")
    errors = p2p[p2p["status"].isin(["error", "hang"])]
    if not errors.empty:
        out.append(f"p2p: {len(errors)} case(s) with status error/hang (see p2p.csv)")
    ar = allreduce_decode(bundle.read_table("allreduce"))
    if ar:
        out += [""] + ar
    cc = bundle.read_table("concurrent")
    agg = cc[(cc["flow"] == -1) & (cc["status"] == "ok")]
    if not agg.empty:
        out.append("")
        out.append("concurrent traffic, aggregate GB/s:  " + "  ".join(
            f"{r['pattern']}/{r['op']} {r['bandwidth_gbps']:.1f}" for _, r in agg.iterrows()))
    return "\n".join(out)
