"""The short console summary of a topology bundle: the P2P matrix and the all-reduce at decode
sizes. Plain fixed-width text for stdout; the full picture is the report.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pcieprof.analysis.concurrent_release import releases, summary_line
from pcieprof.analysis.curves import EXTRAPOLATED, Curves
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.matrices import gpu_indices, pair_matrix, pair_status
from pcieprof.analysis.nodes import Nodes
from pcieprof.analysis.provenance import CONSOLE_NOTES
from pcieprof.bundle import Bundle
from pcieprof.bundle.rows import format_ranks
from pcieprof.units import size_label


#: Matrix cells of pairs that are not ok, in the 7-character column.
_SHORT = {"not_supported": "no-P2P"}


def _fmt(v: float, width: int = 7, digits: int = 1) -> str:
    return f"{v:{width}.{digits}f}" if isinstance(v, (int, float)) and not math.isnan(v) else f"{'-':>{width}}"


def p2p_matrix(df: pd.DataFrame, path: str) -> list[str]:
    """Lines of the uni-directional bandwidth matrix (GB/s) of one path (each pair at its largest
    copy size), with the status of pairs that are not ok."""
    rows = df[df["path"] == path]
    if rows.empty:
        return []
    gpus = gpu_indices(rows)
    bw = pair_matrix(df, path=path, metric="bandwidth_gbps", gpus=gpus)
    status = pair_status(df, path=path, gpus=gpus)
    sizes = rows.loc[rows["bandwidth_gbps"].notna() & (rows["direction"] == "uni"), "size_bytes"]
    if np.isnan(bw).all() and not status:
        return []
    size = size_label(int(sizes.max())) if len(sizes) else "no"
    lines = [f"{path} bandwidth, GB/s ({size} copies, src row -> dst column):",
             "       " + "".join(f"{d:>7}" for d in gpus)]
    for i, a in enumerate(gpus):
        cells = []
        for j, b in enumerate(gpus):
            if a == b:
                cells.append(f"{'X':>7}")
            elif not np.isnan(bw[i, j]):
                cells.append(_fmt(float(bw[i, j])))
            elif (a, b) in status:
                cells.append(f"{_SHORT.get(status[(a, b)], status[(a, b)][:6]):>7}")
            else:
                cells.append(_fmt(float("nan")))
        lines.append(f"{a:>7}" + "".join(cells))
    if "not_supported" in status.values():
        lines.append("  no-P2P: no peer access (status not_supported); the pair copies through "
                     "host memory")
    return lines


def allreduce_decode(df: pd.DataFrame, band: DecodeBand, nodes: Nodes | None = None) -> list[str]:
    """Lines of the all-reduce time (us) at the decode band's sizes per variant over the largest
    group (plain ring order), by pcieprof.analysis.curves' rule; `*` marks an extrapolation.
    A multi-node bundle's group is named as its nodes (`2 nodes x 8 GPUs (16 ranks, ...)`)."""
    curves = [c for c in Curves(df).full_group() if c.plain_order]
    if not curves:
        return []
    sizes = [band.message_bytes(b) for b in band.batches]
    c0 = curves[0]
    who = nodes.group(c0.ranks) if nodes is not None else f"{c0.nranks} ranks"
    lines = [f"all-reduce time, us ({who}, {c0.dtype}, decode sizes of {band.model}, "
             f"batch {', '.join(map(str, band.batches))}):",
             f"{'variant':<16}" + "".join(f"{size_label(s):>10}" for s in sizes)]
    extrapolated = False
    for c in curves:
        cells = []
        for s in sizes:
            mark = c.extent(s) == EXTRAPOLATED
            extrapolated |= mark
            cells.append(_fmt(c.at(s), 9) + ("*" if mark else " "))
        lines.append(f"{c.variant:<16}" + "".join(cells))
    if extrapolated:
        lines.append("  * above the sweep's largest size: extrapolated linearly in size")
    if df["detail"].astype(str).str.contains("gloo ignores").any():
        lines.append("  (NCCL_* variants on gloo: same transport as default, measured again)")
    for _, r in df[~df["status"].isin(["ok"])].iterrows():
        lines.append(f"  {r['variant']} ranks {format_ranks(r['ranks'])} size {r['size_bytes']} B: "
                     f"{r['status']} ({r['detail']})")
    return lines


def summarize(bundle: Bundle, band: DecodeBand) -> str:
    """The summary text of a topology bundle."""
    out: list[str] = []
    note = CONSOLE_NOTES.get(bundle.backend)
    if note:
        out.append(note)
    p2p = bundle.read_table("p2p")
    for path in ("p2p", "host_staged"):
        m = p2p_matrix(p2p, path)
        if m:
            out += [""] + m
    lat = p2p[(p2p["path"] == "p2p") & p2p["latency_us"].notna() & (p2p["status"] == "ok")]
    if not lat.empty:
        out.append(f"p2p latency: median {lat['latency_us'].median():.1f} us over "
                   f"{len(lat)} pairs ({size_label(int(lat['size_bytes'].min()))} copies)")
    errors = p2p[p2p["status"].isin(["error", "hang"])]
    if not errors.empty:
        out.append(f"p2p: {len(errors)} case(s) with status error/hang (see p2p.csv)")
    skipped = p2p[p2p["status"] == "not_run"]
    if not skipped.empty:
        out.append(f"p2p: {len(skipped)} case(s) not run after cases of their kind hung "
                   "(see p2p.csv, detail)")
    nodes = Nodes.of(bundle)
    ar = allreduce_decode(bundle.read_table("allreduce"), band, nodes)
    if ar:
        out += [""] + ar
    if nodes is not None:
        out += [""] + nodes.lines()
    cc = bundle.read_table("concurrent")
    agg = cc[(cc["flow"] == -1) & (cc["status"] == "ok")]
    if not agg.empty:
        out.append("")
        out.append("concurrent traffic, aggregate GB/s:  " + "  ".join(
            f"{r['pattern']}/{r['op']} {r['bandwidth_gbps']:.1f}" for _, r in agg.iterrows()))
        if line := summary_line(releases(bundle)):
            out.append(line)
    return "\n".join(out)
