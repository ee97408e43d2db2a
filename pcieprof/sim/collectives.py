"""The NCCL all-reduce model: what NCCL would choose on a fabric, and how long it would take.

Choices (each returned with the prediction, for nccl_choices.json):
- transport per ring edge: P2P when the NCCL-visible path type is within the P2P level, else
  SHM through host memory. NCCL's default level is PXB ("don't use P2P across CPU host bridges",
  src/graph/paths.cc ncclTopoCheckP2p), raised to SYS on AMD hosts with at most two GPUs;
  NCCL_P2P_LEVEL overrides it and NCCL_P2P_DISABLE=1 turns P2P off. The *visible* path is what
  NCCL discovers: in a VM with a flat tree every pair looks like PHB, while the traffic itself
  follows the real tree (ACS redirect, IOMMU). On the real ASUS box this reproduces what its
  owners logged: P2P for PIX pairs, SHM for NODE pairs.
- channels: 2 on an AMD host whose ring crosses sockets (NCCL rates the AMD inter-CPU link at
  AMD_BW = 16 GB/s, src/graph/topo.h, and its search ends at the minimum; observed on dual Turin:
  2 channels, a 15/15 SYS/PIX ring), otherwise 4; NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS clamp
  it. An NCCL_GRAPH_FILE is taken to give NCCL the real bandwidth (4 channels, as observed).
- protocol: in that same AMD case Simple at every size (observed); otherwise the fastest of LL
  and Simple by this model's own estimate, standing in for NCCL's tuner. LL128 only when
  NCCL_PROTO asks for it (NCCL enables it by default only on NVLink systems; an assumption here).
- algorithm: Ring unless NCCL_ALGO asks for Tree (single-node PCIe; an assumption).

Time of one all-reduce of S bytes over n ranks on a ring of 2(n-1) steps:
  L = 2(n-1) * (step latency of the protocol + worst edge's extra: socket crossing, SHM, IOMMU)
  D = S * 2(n-1)/n / min(channels * per-channel bandwidth, ring bottleneck * wire efficiency)
  t = launch + (L^k + D^k)^(1/k)       (k fitted: latency and transfer overlap partly)
The ring bottleneck comes from `model.predict_concurrent` with every edge sending at once (P2P
edges) or the host path (SHM edges). LL moves 4 data bytes per 8-byte line (wire efficiency 0.5),
LL128 120 of 128, Simple a fitted share. dtype changes nothing but the element count: the
reduction arithmetic is not modelled.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pcieprof.errors import BadInput
from pcieprof.sim import model
from pcieprof.sim.fabric import Fabric, pair_level

#: NCCL path types in order (src/graph/topo.h); nvidia-smi's NODE is NCCL's PHB.
NCCL_PATHS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
#: NCCL_P2P_LEVEL legacy integers (NCCL user guide): 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 SYS.
LEGACY_LEVELS = {0: "LOC", 1: "PIX", 2: "PXB", 3: "PHB", 4: "SYS"}
PROTOS = ("LL", "LL128", "Simple")
ALGOS = ("Ring", "Tree")
WIRE_EFFICIENCY = {"LL": 0.5, "LL128": 120.0 / 128.0}
MAX_CHANNELS = 32
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "float32": 4, "bfloat16": 2, "float16": 2}


def _nccl_path(level: str) -> str:
    return {"X": "LOC", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}[level]


def _p2p_level(env: Mapping[str, str], fabric: Fabric, nranks: int) -> tuple[str, str]:
    """The P2P level in force and why."""
    if str(env.get("NCCL_P2P_DISABLE", "")).strip() == "1":
        return "LOC", "NCCL_P2P_DISABLE=1"
    text = str(env.get("NCCL_P2P_LEVEL", "")).strip()
    if text:
        if text.isdigit():
            return LEGACY_LEVELS.get(int(text), "SYS"), f"NCCL_P2P_LEVEL={text}"
        up = text.upper()
        if up not in NCCL_PATHS:
            raise BadInput(f"NCCL_P2P_LEVEL={text!r}: not a level NCCL knows",
                           hint=f"one of {', '.join(NCCL_PATHS)}")
        return up, f"NCCL_P2P_LEVEL={text}"
    if fabric.cpu_vendor == "amd" and nranks <= 2:
        return "SYS", "NCCL default on AMD hosts with at most 2 GPUs"
    return "PXB", "NCCL default: no P2P across CPU host bridges"


def _choice_list(env: Mapping[str, str], key: str, known: Sequence[str]) -> list[str] | None:
    """NCCL_PROTO / NCCL_ALGO: a comma list, or `^a,b` to exclude; None when unset."""
    text = str(env.get(key, "")).strip()
    if not text:
        return None
    exclude = text.startswith("^")
    names = [t.strip() for t in text.lstrip("^").split(",") if t.strip()]
    lookup = {k.lower(): k for k in known}
    unknown = [n for n in names if n.lower() not in lookup]
    if unknown:
        raise BadInput(f"{key}={text!r}: {unknown[0]!r} is not one of {', '.join(known)}")
    chosen = [lookup[n.lower()] for n in names]
    return [k for k in known if k not in chosen] if exclude else chosen


def _int_env(env: Mapping[str, str], key: str) -> int | None:
    text = str(env.get(key, "")).strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"{key}={text!r} is not an integer") from None


def transport_name(fabric: Fabric, p2p: bool) -> str:
    """The transport as NCCL_DEBUG=INFO names it (cuMem-based P2P since NCCL 2.19)."""
    if not p2p:
        return "SHM/direct/direct"
    major, minor = (int(x) for x in (fabric.nccl_version.split(".") + ["0", "0"])[:2])
    return "P2P/CUMEM" if (major, minor) >= (2, 19) else "P2P/IPC"


def _step_extra(fabric: Fabric, a: int, b: int, p2p: bool) -> float:
    """Per-step latency a ring edge adds beyond the protocol's own step cost, microseconds.

    NCCL's step time on PCIe is set by its protocol handshakes, not by the 0.4-1.3 us write
    latency of the path: the measured all-reduces show no trace of switch hops, but they do show
    the socket crossing and the host-memory (SHM) transport. So only those count, plus the IOMMU
    when it translates (one access per step for P2P, two for SHM: write and read of host memory).
    """
    nccl = model.params()["nccl"]
    iommu = model.params()["latency"]["iommu_us"] if fabric.translated else 0.0
    extra = 0.0
    if fabric.socket_of(a) != fabric.socket_of(b):
        extra += nccl["inter_socket_step_us"]
    if p2p:
        return extra + iommu
    return extra + nccl["shm_step_us"] + 2 * iommu


def _ring_bandwidth(fabric: Fabric, edges: list[tuple[int, int]], p2p: list[bool]) -> float:
    """Bottleneck GB/s of the ring with every edge sending at once, P2P and SHM edges sharing
    the links they both use (GPU links, switch uplinks, the inter-socket link). P2P edges are
    posted writes on their routes (`model.flow_routes`: window, collapse and IOMMU included); SHM
    edges go through host memory at the SHM transport's share of their slowest link."""
    nccl = model.params()["nccl"]
    p2p_edges = [e for e, ok in zip(edges, p2p) if ok]
    p2p_routes, p2p_limits = model.flow_routes(fabric, p2p_edges, "write") if p2p_edges else ([], [])
    factor = model.params()["iommu"]["translated_bw_factor"] if fabric.translated else 1.0
    routes, limits = [], []
    k = 0
    for (a, b), ok in zip(edges, p2p):
        if ok:
            routes.append(p2p_routes[k])
            limits.append(p2p_limits[k])
            k += 1
        else:
            # host memory DMA is translated too in a VM
            r = [model.Hop(h.key, h.gbps * factor, h.latency_us) for h in model.shm_route(fabric, a, b)]
            routes.append(r)
            limits.append(min(h.gbps for h in r) * nccl["shm_efficiency"])
    return min(model.share_routes(routes, limits))


def _visible_crosses_sockets(fabric: Fabric, ranks: Sequence[int]) -> bool:
    return any(pair_level(fabric, a, b, guest=True) == "SYS" for a in ranks for b in ranks if a != b)


def choices(fabric: Fabric, ranks: Sequence[int], env: Mapping[str, str]) -> dict[str, Any]:
    """What the model assumes NCCL chooses for this group and environment (size-independent part).

    Returns:
        {"nccl_version", "p2p_level", "p2p_level_why", "transport" {"a->b": name}, "channels",
        "channels_why", "algos", "protos", "amd_min_search": bool}
    """
    n = len(ranks)
    level, level_why = _p2p_level(env, fabric, n)
    edges = [(ranks[i], ranks[(i + 1) % n]) for i in range(n)] if n > 1 else []
    p2p = [NCCL_PATHS.index(_nccl_path(pair_level(fabric, a, b, guest=True))) <=
           NCCL_PATHS.index(level) and level != "LOC" for a, b in edges]
    graph_file = bool(str(env.get("NCCL_GRAPH_FILE", "")).strip())
    amd_min = (fabric.cpu_vendor == "amd" and _visible_crosses_sockets(fabric, ranks)
               and not graph_file)
    channels = 2 if amd_min else 4
    why = ("AMD host, ring crosses sockets: NCCL's search rates the link at AMD_BW and stops at "
           "2 channels" if amd_min else
           ("NCCL_GRAPH_FILE given: NCCL sees the real bandwidth" if graph_file else
            "search at PCIe speed, channels duplicated"))
    lo, hi = _int_env(env, "NCCL_MIN_NCHANNELS"), _int_env(env, "NCCL_MAX_NCHANNELS")
    if lo is not None and lo > channels:
        channels, why = lo, f"NCCL_MIN_NCHANNELS={lo}"
    if hi is not None and hi < channels:
        channels, why = max(1, hi), f"NCCL_MAX_NCHANNELS={hi}"
    channels = min(channels, MAX_CHANNELS)
    protos = _choice_list(env, "NCCL_PROTO", PROTOS)
    algos = _choice_list(env, "NCCL_ALGO", ALGOS)
    return {
        "nccl_version": fabric.nccl_version,
        "p2p_level": level, "p2p_level_why": level_why,
        "transport": {f"{a}->{b}": transport_name(fabric, ok) for (a, b), ok in zip(edges, p2p)},
        "p2p_edges": p2p, "edges": edges,
        "channels": channels, "channels_why": why,
        "protos_allowed": protos or ["LL", "Simple"],
        "protos_forced": protos is not None,
        "algos_allowed": algos or ["Ring"],
        "amd_min_search": amd_min,
    }


def _time(fabric: Fabric, ranks: Sequence[int], size_bytes: int, c: dict[str, Any], proto: str,
          algo: str, ring_bw: float) -> float:
    nccl = model.params()["nccl"]
    n = len(ranks)
    lat_edge = max(_step_extra(fabric, a, b, ok) for (a, b), ok in zip(c["edges"], c["p2p_edges"]))
    step = {"LL": nccl["ll_step_us"], "LL128": nccl["ll128_step_us"],
            "Simple": nccl["simple_step_us"]}[proto]
    per_channel = {"LL": nccl["ll_channel_gbps"], "LL128": nccl["ll128_channel_gbps"],
                   "Simple": nccl["simple_channel_gbps"]}[proto]
    wire = WIRE_EFFICIENCY.get(proto, nccl["simple_wire_efficiency"])
    bw = min(c["channels"] * per_channel, ring_bw * wire)
    steps = 2 * (n - 1)
    if algo == "Ring":
        moved = size_bytes * 2 * (n - 1) / n
    else:  # a chain: every link carries the whole message once each way, at a reduced rate
        moved = size_bytes
        bw *= nccl["tree_bw_factor"]
    latency = steps * (step + lat_edge)
    transfer = moved / (bw * 1e3)
    k = nccl["smooth_k_simple"] if proto == "Simple" else nccl["smooth_k"]
    return nccl["launch_us"] + (latency ** k + transfer ** k) ** (1.0 / k)


def predict_allreduce(fabric: Fabric, ranks: Sequence[int], size_bytes: int, dtype: str,
                      env: Mapping[str, str]) -> tuple[float, dict[str, Any]]:
    """Predicted time of one NCCL all-reduce, and what the model assumed NCCL chose.

    Args:
        fabric: the box.
        ranks: GPU indices in ring order (a CUDA_VISIBLE_DEVICES permutation).
        size_bytes: message size in bytes (nccl-tests' size column).
        dtype: `bf16`, `fp16` or `fp32`; the size already counts the bytes, so only the element
            count differs.
        env: the NCCL_* environment of the launch (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, NCCL_PROTO,
            NCCL_ALGO, NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS, NCCL_GRAPH_FILE).

    Returns:
        (time_us, choice): microseconds, and {"nccl_version", "algo", "proto", "channels",
        "transport" {"a->b": "P2P/CUMEM" | "SHM/direct/direct"}, "p2p_level", "ring",
        "why" [...]}: the model's assumption of NCCL's choices (not read from a log).

    Raises:
        BadInput: fewer than one rank, repeated or unknown GPUs, an unknown dtype or NCCL value.
    """
    if len(ranks) < 1 or len(set(ranks)) != len(ranks):
        raise BadInput(f"all-reduce ranks must be distinct GPUs, got {list(ranks)}")
    for r in ranks:
        fabric.gpu(r)
    if dtype.lower() not in DTYPE_BYTES:
        raise BadInput(f"unknown dtype {dtype!r} (bf16, fp16 or fp32)")
    if size_bytes < 0:
        raise BadInput(f"negative all-reduce size {size_bytes}")
    n = len(ranks)
    nccl = model.params()["nccl"]
    if n == 1:
        return nccl["launch_us"], {"nccl_version": fabric.nccl_version, "algo": "none",
                                   "proto": "none", "channels": 0, "transport": {},
                                   "p2p_level": None, "ring": list(ranks),
                                   "why": ["one rank: no communication"]}
    c = choices(fabric, ranks, env)
    ring_bw = _ring_bandwidth(fabric, c["edges"], c["p2p_edges"])
    protos = c["protos_allowed"]
    if c["amd_min_search"] and not c["protos_forced"] and "Simple" in protos:
        protos = ["Simple"]
    candidates = [(_time(fabric, ranks, size_bytes, c, p, a, ring_bw), p, a)
                  for p in protos for a in c["algos_allowed"]]
    t, proto, algo = min(candidates)
    why = [c["p2p_level_why"], c["channels_why"]]
    if c["amd_min_search"] and not c["protos_forced"]:
        why.append("AMD host, ring crosses sockets: Simple at every size (as observed on dual Turin)")
    elif not c["protos_forced"]:
        why.append(f"{proto} is the faster of {', '.join(protos)} at this size by the model")
    return t, {"nccl_version": c["nccl_version"], "algo": algo, "proto": proto,
               "channels": c["channels"], "transport": c["transport"],
               "p2p_level": c["p2p_level"], "ring": list(ranks),
               "ring_bottleneck_gbps": round(ring_bw, 3), "why": why}


def busbw_gbps(size_bytes: int, time_us: float, nranks: int) -> float:
    """nccl-tests bus bandwidth of an all-reduce: size / time * 2(n-1)/n, GB/s."""
    if time_us <= 0 or nranks < 2:
        return 0.0
    return size_bytes / (time_us * 1e3) * 2 * (nranks - 1) / nranks
