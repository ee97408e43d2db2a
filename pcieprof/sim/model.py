"""P2P and concurrent-traffic predictions from a `Fabric`: routes, bottleneck links, sharing.

How a prediction is made (docs/fabric-model.md states the assumptions):
- A copy follows a route through the tree, a series of hops, each with a capacity and a latency:
  the GPU's link, the switch it sits behind (one traversal), the switch uplink, the root complex,
  the IOMMU when it translates, the inter-socket link, the far root complex, the far uplink, the
  far switch, the far GPU's link. With ACS redirect on, peer traffic cannot turn round inside a
  switch and goes up to the root complex; with it off, two GPUs of one switch (or of one chip
  whose partitions share a fabric) stay on the switch.
- Each PCIe link carries `raw x TLP efficiency x DLLP efficiency` per direction: raw is line rate
  after 128b/130b coding (63.0 GB/s for Gen5 x16), TLP efficiency is MPS / (MPS + 26 B header,
  framing, sequence and LCRC), the DLLP share is fitted. The inter-socket ceilings and the chip
  fabric come from the profile.
- A posted write that crosses the inter-socket link is held by the source root complex until the
  far side has taken it; a root complex keeps a bounded number of such writes in flight (the
  posted-write window, fitted). One source root complex's crossing writes therefore move at most
  window / round trip, where the round trip is that of the hops from the crossing to the far GPU.
  Behind a switch the far side is long (uplink, switch traversal) and the window, not a link,
  sets the rate (~40 GB/s on the ASUS box); on direct-attach boxes it is short and the link's own
  ceiling binds. Reads (non-posted, completion-paced) do not use the window.
- A translating IOMMU sits at the root complex where peer traffic enters: it costs a fixed share of
  bandwidth and some latency on every DMA that reaches it.
- Concurrent flows share links max-min fairly; then the posted-write collapse of the profile caps
  the write streams that trigger it.
- Latency is the sum of per-hop costs: a GPU base, switch traversals, root-complex and socket
  crossings, the IOMMU.
Parameters live in calibration/params.toml, each fitted on named reference points, fixed from a
source, or assumed.
"""

from __future__ import annotations

import copy
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Iterable, Iterator, Sequence

from pcieprof.errors import BadInput
from pcieprof.sim.fabric import Fabric, raw_link_gbps

PATHS = ("p2p", "host_staged", "h2d", "d2h")
DIRECTIONS = ("uni", "bi")
OPS = ("write", "read")


@lru_cache(maxsize=1)
def _default_params() -> dict[str, dict[str, float]]:
    text = (resources.files("pcieprof.sim") / "calibration" / "params.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


_override: dict[str, dict[str, float]] | None = None


def params() -> dict[str, dict[str, float]]:
    """The model parameters in use (calibration/params.toml, or those set by `use_params`)."""
    return _override if _override is not None else _default_params()


def use_params(p: dict[str, dict[str, float]] | None) -> None:
    """Replace the parameters for this process (the calibration fit does this); None restores."""
    global _override
    _override = p


@contextmanager
def params_with(section: str, key: str, value: float) -> Iterator[None]:
    """The parameters in use with one value changed, for the block (a sensitivity run)."""
    before = _override
    changed = copy.deepcopy(params())
    changed[section][key] = value
    use_params(changed)
    try:
        yield
    finally:
        use_params(before)


# -- links and routes -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Hop:
    """One resource a copy uses: `key` identifies the link and direction (its first element is the
    hop's kind: gpu, switch, chip, uplink, rc, iommu, xgmi, window), `gbps` its capacity per
    direction, `latency_us` what crossing it adds to a small copy."""

    key: tuple[str, ...]
    gbps: float
    latency_us: float

    @property
    def kind(self) -> str:
        return self.key[0]


def pcie_efficiency() -> float:
    """Share of a PCIe link's raw rate that carries payload: TLP framing and DLLPs."""
    p = params()["pcie"]
    mps = p["mps_bytes"]
    return mps / (mps + p["tlp_overhead_bytes"]) * p["dllp_efficiency"]


def link_gbps(gen: int, width: int) -> float:
    """Payload bandwidth of a PCIe link per direction, GB/s."""
    return raw_link_gbps(gen, width) * pcie_efficiency()


def _inter_socket_latency(fabric: Fabric) -> float:
    inter = fabric.inter_socket
    if inter is not None and inter.latency_us is not None:
        return inter.latency_us
    return params()["latency"]["inter_socket_us"]


def _redirects(fabric: Fabric, index: int) -> bool:
    """Does ACS send this GPU's peer requests up to the root complex?"""
    sw = fabric.switch_of(index)
    if sw is not None:
        return sw.acs_redirect
    return fabric.root_port_of(index).acs_redirect


def switch_latency_us(fabric: Fabric, switch_id: str) -> float:
    """One traversal of a switch: the profile's own figure, else the calibrated default."""
    sw = fabric.switches[switch_id]
    return sw.latency_us if sw.latency_us is not None else params()["latency"]["switch_hop_us"]


def posted_window_kib(fabric: Fabric) -> float:
    """Posted writes in flight per source root complex for peer writes that cross the sockets."""
    inter = fabric.inter_socket
    if inter is not None and inter.posted_window_kib is not None:
        return inter.posted_window_kib
    return params()["inter_socket"]["posted_window_kib"]


def route(fabric: Fabric, src: int, dst: int) -> list[Hop]:
    """The resources a P2P write from GPU `src` to GPU `dst` crosses, in order (`flow_routes`
    turns them into a read's).

    A route that crosses the sockets ends with a `window` hop: the source root complex's
    posted-write window over the round trip of the hops behind the crossing (see the module
    docstring); it carries no latency of its own.

    Raises:
        BadInput: unknown GPU index or src == dst.
    """
    if src == dst:
        raise BadInput(f"{fabric.name}: a P2P copy needs two different GPUs (got {src} -> {dst})")
    lat = params()["latency"]
    ga, gb = fabric.gpu(src), fabric.gpu(dst)
    sa, sb = fabric.switch_of(src), fabric.switch_of(dst)
    redirect = _redirects(fabric, src) or _redirects(fabric, dst)
    hops = [Hop(("gpu", str(src), "up"), link_gbps(ga.gen, ga.width), 0.0)]
    down = [Hop(("gpu", str(dst), "down"), link_gbps(gb.gen, gb.width), 0.0)]
    if not redirect and sa is not None and sa is sb:
        return hops + [Hop(("switch", sa.id), float("inf"), switch_latency_us(fabric, sa.id))] + down
    if (not redirect and sa is not None and sb is not None and sa.chip and sa.chip == sb.chip
            and fabric.chips[sa.chip].internal_p2p):
        chip = fabric.chips[sa.chip]
        return hops + [Hop(("switch", sa.id), float("inf"), switch_latency_us(fabric, sa.id)),
                       Hop(("chip", chip.id), chip.fabric_gbps, 0.0),
                       Hop(("switch", sb.id), float("inf"), 0.0)] + down
    ra, rb = fabric.root_port_of(src), fabric.root_port_of(dst)
    if sa is not None:
        hops += [Hop(("switch", sa.id), float("inf"), switch_latency_us(fabric, sa.id)),
                 Hop(("uplink", sa.id, "up"), link_gbps(sa.gen, sa.width), 0.0)]
    hops.append(Hop(("rc", ra.root_complex), float("inf"), 0.0))
    if fabric.translated:
        # translation happens where the request enters the root complex, before it is forwarded
        hops.append(Hop(("iommu",), float("inf"), lat["iommu_us"]))
    far: list[Hop] = []
    if ra.socket != rb.socket:
        inter = fabric.inter_socket
        assert inter is not None  # validated: more than one socket needs an inter_socket link
        a, b = sorted((ra.socket, rb.socket))
        way = "fwd" if ra.socket == a else "rev"
        far.append(Hop(("xgmi", f"{a}-{b}", way), inter.write_gbps,
                       _inter_socket_latency(fabric) + lat["root_complex_us"]))
    if rb.root_complex != ra.root_complex:
        far.append(Hop(("rc", rb.root_complex), float("inf"), lat["root_complex_us"]))
    if sb is not None:
        far += [Hop(("uplink", sb.id, "down"), link_gbps(sb.gen, sb.width), 0.0),
                Hop(("switch", sb.id), float("inf"), switch_latency_us(fabric, sb.id))]
    hops += far
    if ra.socket != rb.socket:
        rtt_us = 2.0 * sum(h.latency_us for h in far)
        window_bytes = posted_window_kib(fabric) * 1024.0
        cap = window_bytes / (rtt_us * 1e3) if rtt_us > 0 else float("inf")
        hops.append(Hop(("window", ra.root_complex), cap, 0.0))
    return hops + down


def pair_class(fabric: Fabric, a: int, b: int) -> str:
    """The kind of route between two GPUs, by the real tree (not ACS, not the guest's view).

    `same switch`, `same chip` (two partitions of one switch chip), `cross chip` (a route that
    leaves a switch through its uplink), `same socket direct` and `cross socket direct` (both GPUs
    on CPU root ports).
    """
    sa, sb = fabric.switch_of(a), fabric.switch_of(b)
    if sa is not None and sa is sb:
        return "same switch"
    if sa is not None and sb is not None and sa.chip and sa.chip == sb.chip:
        return "same chip"
    if sa is not None or sb is not None:
        return "cross chip"
    return "cross socket direct" if fabric.socket_of(a) != fabric.socket_of(b) else "same socket direct"


def host_route(fabric: Fabric, gpu: int, to_host: bool) -> list[Hop]:
    """Resources of a copy between GPU `gpu` and pinned memory on its own socket."""
    g = fabric.gpu(gpu)
    sw = fabric.switch_of(gpu)
    way = "up" if to_host else "down"
    hops = [Hop(("gpu", str(gpu), way), link_gbps(g.gen, g.width), 0.0)]
    if sw is not None:
        hops.append(Hop(("uplink", sw.id, way), link_gbps(sw.gen, sw.width), 0.0))
    rp = fabric.root_port_of(gpu)
    hops.append(Hop(("rootport", rp.id, way), link_gbps(rp.gen, rp.width), 0.0))
    return hops


def _bottleneck(hops: Iterable[Hop]) -> float:
    return min(h.gbps for h in hops)


def _iommu_factor(fabric: Fabric) -> float:
    return params()["iommu"]["translated_bw_factor"] if fabric.translated else 1.0


def _size_factor(size_bytes: int, gbps: float) -> float:
    """Share of the peak a copy of `size_bytes` reaches once its fixed setup cost is counted."""
    if size_bytes <= 0:
        return 1.0
    transfer_us = size_bytes / (gbps * 1e3)
    return transfer_us / (transfer_us + params()["pcie"]["copy_setup_us"])


# -- the public API ---------------------------------------------------------------------------------

def p2p_latency_us(fabric: Fabric, src: int, dst: int) -> float:
    """Latency of a small P2P write from `src` to `dst`, microseconds."""
    return params()["latency"]["gpu_base_us"] + sum(h.latency_us for h in route(fabric, src, dst))


def predict_p2p(fabric: Fabric, src: int, dst: int, path: str, direction: str,
                size_bytes: int) -> tuple[float, float]:
    """Predicted bandwidth and latency of one copy, as p2p.csv rows report them.

    Args:
        fabric: the box.
        src: source GPU index (for `h2d` the GPU receiving; pass -1 for the host end).
        dst: destination GPU index (for `d2h` the GPU sending is `src`; -1 for the host end).
        path: `p2p` (peer access on: direct DMA, through the IOMMU/ACS path when there is one),
            `host_staged` (peer access off: through pinned host memory), `h2d` or `d2h`.
        direction: `uni`, or `bi` (both directions at once; the bandwidth is the sum of both, as
            p2pBandwidthLatencyTest and nvbandwidth report it).
        size_bytes: bytes per copy; small copies lose bandwidth to the fixed setup cost.

    Returns:
        (bandwidth_gbps, latency_us): GB/s (1e9 B/s) at that size, and the latency of a small
        copy on that path in microseconds.

    Raises:
        BadInput: unknown path, direction or GPU.
    """
    if path not in PATHS:
        raise BadInput(f"unknown P2P path {path!r} (one of {', '.join(PATHS)})")
    if direction not in DIRECTIONS:
        raise BadInput(f"unknown direction {direction!r} (uni or bi)")
    lat = params()["latency"]
    if path in ("h2d", "d2h"):
        gpu = src if src >= 0 else dst
        if path == "h2d" and dst >= 0:
            gpu = dst
        hops = host_route(fabric, gpu, to_host=(path == "d2h"))
        peak = _bottleneck(hops) * _iommu_factor(fabric)
        if direction == "bi":
            peak *= 2  # the two directions of a link are independent
        latency = lat["host_copy_us"] + (lat["iommu_us"] if fabric.translated else 0.0)
        return peak * _size_factor(size_bytes, peak), latency
    if path == "host_staged":
        def staged(a: int, b: int) -> float:
            legs = [_bottleneck(host_route(fabric, a, True)), _bottleneck(host_route(fabric, b, False))]
            if fabric.socket_of(a) != fabric.socket_of(b) and fabric.inter_socket is not None:
                legs.append(fabric.inter_socket.p2p_gbps)
            return min(legs) * params()["host_staged"]["efficiency"] * _iommu_factor(fabric)
        peak = staged(src, dst) + (staged(dst, src) if direction == "bi" else 0.0)
        latency = lat["host_staged_us"] + (2 * lat["iommu_us"] if fabric.translated else 0.0)
        return peak * _size_factor(size_bytes, peak), latency
    flows = [(src, dst)] + ([(dst, src)] if direction == "bi" else [])
    rates = _share(fabric, flows, op="write")
    peak = sum(rates)
    return peak * _size_factor(size_bytes, peak), p2p_latency_us(fabric, src, dst)


def predict_concurrent(fabric: Fabric, flows: Sequence[tuple[int, int]], op: str,
                       size_bytes: int) -> list[float]:
    """Per-flow bandwidth of several P2P copies running at once, GB/s.

    Links are shared max-min fairly; then, for `op="write"`, the profile's posted-write collapse
    caps every write stream that triggers it (two or more GPUs behind one switch uplink writing
    to peers behind two or more different root complexes), unless the IOMMU translates, which
    masks it. Reads (`op="read"`: dst pulls from src; the data still flows src -> dst) never
    collapse.

    Args:
        fabric: the box.
        flows: (src, dst) GPU pairs, one per concurrent copy.
        op: `write` or `read`.
        size_bytes: bytes per copy (small copies lose bandwidth to the fixed setup cost).

    Returns:
        One bandwidth per flow, in the order given; the aggregate is their sum.
    """
    rates = _share(fabric, list(flows), op=op)
    return [r * _size_factor(size_bytes, r) if r > 0 else 0.0 for r in rates]


def collapsed_flows(fabric: Fabric, flows: Sequence[tuple[int, int]]) -> set[int]:
    """Indices of the write flows the posted-write collapse would hit."""
    c = fabric.collapse
    if c is None or not c.enabled or fabric.translated:
        return set()
    by_uplink: dict[str, list[int]] = {}
    for i, (s, d) in enumerate(flows):
        for h in route(fabric, s, d):
            if h.key[0] == "uplink" and h.key[2] == "up":
                by_uplink.setdefault(h.key[1], []).append(i)
    hit: set[int] = set()
    for members in by_uplink.values():
        sources = {flows[i][0] for i in members}
        roots = {fabric.root_port_of(flows[i][1]).root_complex for i in members}
        if len(sources) >= 2 and len(roots) >= 2:
            hit.update(members)
    return hit


def flow_routes(fabric: Fabric, flows: Sequence[tuple[int, int]],
                op: str) -> tuple[list[list[Hop]], list[float]]:
    """The routes of concurrent P2P flows and each flow's own ceiling, GB/s, for `share_routes`.

    The capacities of the hops are already scaled for the flow: the IOMMU's translation share on
    routes through it, the read efficiency for reads; reads drop the posted-write window. A flow
    that crosses the sockets never exceeds the inter-socket per-stream ceiling; for writes, the
    profile's posted-write collapse caps the streams that trigger it.
    """
    if op not in OPS:
        raise BadInput(f"unknown op {op!r} (write or read)")
    pcie = params()["pcie"]
    routes: list[list[Hop]] = []
    limit: list[float] = []
    for s, d in flows:
        hops = route(fabric, s, d)
        factor = (_iommu_factor(fabric) if any(h.kind == "iommu" for h in hops) else 1.0) * \
            (pcie["read_efficiency"] if op == "read" else 1.0)
        if op == "read":
            # non-posted: no posted-write window; the link carries reads at their own measured
            # all-streams ceiling
            hops = [h for h in hops if h.kind != "window"]
            hops = [Hop(h.key, fabric.inter_socket.aggregate_gbps, h.latency_us)  # type: ignore[union-attr]
                    if h.kind == "xgmi" else h for h in hops]
        routes.append([Hop(h.key, h.gbps * factor, h.latency_us) for h in hops])
        cross = fabric.inter_socket is not None and fabric.socket_of(s) != fabric.socket_of(d)
        cap = fabric.inter_socket.p2p_gbps * factor if cross else float("inf")  # type: ignore[union-attr]
        limit.append(cap)
    if op == "write":
        for i in collapsed_flows(fabric, flows):
            limit[i] = min(limit[i], fabric.collapse.flow_gbps)  # type: ignore[union-attr]
    return routes, limit


def _share(fabric: Fabric, flows: list[tuple[int, int]], op: str) -> list[float]:
    """Max-min fair rates of concurrent P2P flows, with the per-stream and collapse caps."""
    routes, limit = flow_routes(fabric, flows, op)
    return share_routes(routes, limit)


def shm_route(fabric: Fabric, src: int, dst: int) -> list[Hop]:
    """Resources of a copy through host memory (NCCL's SHM transport): up from `src` to its
    socket's memory, across the sockets when they differ, down to `dst`."""
    hops = host_route(fabric, src, to_host=True)
    a, b = fabric.socket_of(src), fabric.socket_of(dst)
    if a != b and fabric.inter_socket is not None:
        lo, hi = sorted((a, b))
        hops.append(Hop(("xgmi", f"{lo}-{hi}", "fwd" if a == lo else "rev"),
                        fabric.inter_socket.aggregate_gbps, 0.0))
    return hops + host_route(fabric, dst, to_host=False)


def share_routes(routes: list[list[Hop]], limit: list[float], factor: float = 1.0) -> list[float]:
    """Max-min fair rates of flows over their routes (progressive filling), GB/s.

    Args:
        routes: the hops of each flow.
        limit: each flow's own ceiling (inf for none).
        factor: applied to every link capacity (IOMMU translation, read efficiency).
    """
    caps: dict[tuple[str, ...], float] = {}
    for r in routes:
        for h in r:
            if h.gbps != float("inf"):
                # a shared hop whose capacity differs by flow (the posted-write window: one
                # window, different round trips) counts at its tightest
                caps[h.key] = min(caps.get(h.key, float("inf")), h.gbps * factor)
    users_of = {key: [i for i, r in enumerate(routes) if any(h.key == key for h in r)] for key in caps}
    rate = [0.0] * len(routes)
    active = set(range(len(routes)))
    remaining = dict(caps)
    while active:
        # The tightest constraint: a shared link's fair share, or a flow's own cap.
        best = float("inf")
        for key, cap in remaining.items():
            users = [i for i in users_of[key] if i in active]
            if users:
                best = min(best, cap / len(users))
        best = min([best] + [limit[i] - rate[i] for i in active])
        if best == float("inf"):
            break
        for i in active:
            rate[i] += best
        for key in remaining:
            remaining[key] -= best * sum(1 for i in users_of[key] if i in active)
        frozen = {i for i in active if limit[i] - rate[i] <= 1e-9}
        for key, cap in remaining.items():
            if cap <= 1e-9:
                frozen |= {i for i in users_of[key] if i in active}
        if not frozen:
            break
        active -= frozen
    return rate


def describe_route(fabric: Fabric, src: int, dst: int) -> list[str]:
    """Human-readable hops of a P2P route (for `pcieprof sim describe` and tests): each hop's key,
    its capacity when it has one and the latency it adds when it adds any."""
    out = []
    for h in route(fabric, src, dst):
        cap = "" if h.gbps == float("inf") else f" {h.gbps:.1f} GB/s"
        lat = f" +{h.latency_us:.2f} us" if h.latency_us > 0 else ""
        out.append(":".join(h.key) + cap + lat)
    return out
