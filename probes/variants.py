"""The all-reduce variant table, and the GPU groups and ring orders a sweep runs over.

A *variant* is a named set of environment settings applied to one fresh process group (a fresh
torchrun launch), because NCCL reads its environment once, at communicator init.

Names and values are NCCL's own, checked against NVIDIA's NCCL user guide, "Environment Variables"
(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html):
- NCCL_P2P_DISABLE=1 disables the peer-to-peer transport (traffic goes through host memory, SHM).
- NCCL_P2P_LEVEL takes LOC, NVL, PIX, PXB, PHB, SYS; SYS allows P2P even across NUMA nodes.
- NCCL_PROTO takes LL, LL128, Simple; NCCL_ALGO takes Ring, Tree (and others).
- NCCL_MIN_NCHANNELS sets the minimum number of channels.
- NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH prints what NCCL chose at communicator
  init (rings, channels, transport per peer); TUNING adds the algorithm and protocol per
  collective, one line per collective from rank 0 while it runs (src/enqueue.cc), so it is only
  on in an untimed launch.
gloo (the cpu backend) reads none of these: rows of NCCL variants on gloo say so in `detail`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from pcieprof.errors import BadInput


@dataclass(frozen=True)
class Variant:
    """One named environment for a fresh process group.

    Attributes:
        name: the label in allreduce.csv (`variant` column) and nccl/<name>.log.
        env: environment variables set for the launch.
        what: one line on what it tests.
    """

    name: str
    env: dict[str, str] = field(default_factory=dict)
    what: str = ""


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("default", {}, "NCCL's own choices"),
    Variant("p2p_disable", {"NCCL_P2P_DISABLE": "1"}, "no P2P transport: everything through host memory"),
    Variant("p2p_level_sys", {"NCCL_P2P_LEVEL": "SYS"}, "P2P allowed at any distance, across sockets too"),
    Variant("proto_ll", {"NCCL_PROTO": "LL"}, "low-latency protocol only"),
    Variant("proto_simple", {"NCCL_PROTO": "Simple"}, "Simple protocol only"),
    Variant("algo_ring", {"NCCL_ALGO": "Ring"}, "ring algorithm only"),
    Variant("algo_tree", {"NCCL_ALGO": "Tree"}, "tree algorithm only"),
    Variant("nch2", {"NCCL_MIN_NCHANNELS": "2"}, "at least 2 channels"),
    Variant("nch8", {"NCCL_MIN_NCHANNELS": "8"}, "at least 8 channels"),
]}

#: Environment of every timed NCCL launch: what NCCL chose at init (nccl/<variant>.log), and no
#: line per collective inside the timed loop.
NCCL_DEBUG_ENV: dict[str, str] = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,GRAPH"}
#: Environment of the untimed launch before it, with the tuner's choice per collective
#: (nccl/<variant>.tuning.log).
NCCL_TUNING_LOG_ENV: dict[str, str] = {"NCCL_DEBUG": "INFO",
                                       "NCCL_DEBUG_SUBSYS": "INIT,ENV,GRAPH,TUNING"}

#: The `detail` of all-reduce rows whose NCCL_* settings a gloo process group does not read.
GLOO_IGNORES_NCCL = "gloo ignores NCCL_* settings: same transport as default, measured again"

#: Variants of `--quick`, per backend. cpu: default plus two NCCL variants (honestly labelled).
QUICK_VARIANTS: dict[str, list[str]] = {
    "cuda": ["default", "p2p_disable", "proto_ll"],
    "cpu": ["default", "p2p_disable", "proto_ll"],
    "sim": ["default", "p2p_disable", "proto_ll"],
}

#: Variants of the full plan without `--variants`: default and those a recommendation rule
#: compares with it (pcieprof/tune/rules: p2p_vs_shm reads NCCL_P2P_DISABLE=1, p2p_level
#: NCCL_P2P_LEVEL=SYS, proto_ll NCCL_PROTO=LL, min_nchannels the best NCCL_MIN_NCHANNELS
#: variant, 8 being the value its hint asks for). The other four (proto_simple, algo_ring,
#: algo_tree, nch2) are read by one rule only: allreduce_hang picks the fastest working variant
#: of any kind when the default hangs, so a plan without them offers fewer fallbacks there.
#: They show NCCL's choices forced and run with `--variants all` or by name; algo_ring also joins the plan whenever a --ring-order needs it as the baseline. Each
#: variant costs two launches on cuda (~37 s on 8 GPUs at probes/plan_time.py's assumed rates):
#: with all nine the default plan on the sim profile's 8-GPU box was ~11.0 min, with these
#: five ~8.5 min (issue 23: aim under 10).
DEFAULT_VARIANTS: list[str] = ["default", "p2p_disable", "p2p_level_sys", "proto_ll", "nch8"]

GROUP_KINDS = ("all", "pairs", "tp2", "tp4")


def variant(name: str) -> Variant:
    """The variant called `name`.

    Raises:
        BadInput: unknown name (the message lists the known ones).
    """
    try:
        return VARIANTS[name]
    except KeyError:
        raise BadInput(f"unknown variant {name!r}",
                       hint=f"known: {', '.join(VARIANTS)}") from None


def parse_variants(text: str | None) -> list[Variant] | None:
    """Parse `--variants a,b,c` (or `all`); None when not given."""
    if text is None or not text.strip():
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return list(VARIANTS.values())
    return [variant(n) for n in names]


def groups(devices: list[int], kind: str) -> list[list[int]]:
    """GPU groups for an all-reduce sweep, each in ring order.

    Args:
        devices: the GPUs (or cpu ranks) of the run, in their default order.
        kind: `all` (one group of every device), `pairs` (every unordered pair), `tp2` (the
            consecutive pairs a TP2 layout uses: 0-1, 2-3, ...; needs at least 4 devices, as with
            2 the pair is `all`), or `tp4` (the consecutive groups of four that a TP4 layout uses:
            0-3, 4-7, ...; none under 8 devices would give a single group equal to `all`, so it
            needs at least 8).

    Raises:
        BadInput: unknown kind.
    """
    if kind == "all":
        return [list(devices)]
    if kind == "pairs":
        return [list(p) for p in combinations(devices, 2)]
    if kind == "tp2":
        if len(devices) < 4:
            return []
        return [list(devices[i:i + 2]) for i in range(0, len(devices) - len(devices) % 2, 2)]
    if kind == "tp4":
        if len(devices) < 8:
            return []
        return [list(devices[i:i + 4]) for i in range(0, len(devices) - len(devices) % 4, 4)]
    raise BadInput(f"unknown group kind {kind!r}", hint=f"known: {', '.join(GROUP_KINDS)}")


def parse_order(text: str, devices: list[int]) -> list[int]:
    """Parse a ring order like `0,2,1,3`: a permutation of (a subset of) the run's devices.

    Raises:
        BadInput: not integers, repeats, or devices not in the run.
    """
    try:
        order = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise BadInput(f"ring order {text!r} is not a comma-separated list of indices") from None
    if len(order) < 2 or len(set(order)) != len(order):
        raise BadInput(f"ring order {text!r} needs at least two distinct indices")
    unknown = [d for d in order if d not in devices]
    if unknown:
        raise BadInput(f"ring order {text!r} names devices not in this run: {unknown}",
                       hint=f"devices: {','.join(map(str, devices))}")
    return order
