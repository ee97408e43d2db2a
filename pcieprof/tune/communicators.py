"""Which NCCL communicators SGLang creates for a parallel layout, and whether an NCCL graph file
covers each of them (issue 22, point 5).

NCCL reads NCCL_GRAPH_FILE in every communicator it initialises, sub-communicators included
(src/graph/search.cc ncclTopoCompute), and maps each `<gpu dev=N>` of the file to a GPU of *that*
communicator (ncclTopoGetChannelFromXml): a communicator lacking a GPU the file names fails with
"XML Import Channel : dev N not found" (ncclSystemError) and the server does not start. A
communicator with GPUs the file does not name gets rings without them. So the file is safe for a
layout only when every communicator of more than one rank spans exactly the file's GPUs.

The groups are transcribed from SGLang 0.5.23 (the release pcieprof pins,
pcieprof.serve.sglang_cmd.PINNED_SGLANG), python/sglang/srt/distributed/parallel_state.py,
`initialize_model_parallel` (the TP, attention-CP/-TP, MoE-DP/-EP/-TP and PP groups, by
`init_model_parallel_group`) and `init_distributed_environment` (the world group), with the widths
of sglang/srt/runtime_context.py `derive_parallel_widths` (attn_tp = tp / attn_cp / attn_dp,
moe_tp = tp / moe_ep / moe_dp). A one-rank group makes no NCCL communicator (SGLang's
GroupCoordinator returns early at world size 1, and PyNccl is off there). pcieprof's layouts use
no context parallelism, MoE data parallelism or decode context parallelism (all 1 here).
tests/tune/test_tune_communicators.py runs the pinned SGLang's own `initialize_model_parallel`
for every layout and checks these groups against it.

Ranks map to GPUs as SGLang assigns them on one node: GPU = base_gpu_id + rank (gpu_id_step 1),
and `--dp N` without DP attention starts N servers, the i-th with base_gpu_id = i x tp x pp
(sglang/srt/managers/data_parallel_controller.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator SGLang creates.

    Attributes:
        group: SGLang's group name (`world`, `tp`, `attention_tp`, `moe_ep`, `moe_tp`,
            `moe_dp`, `pp`), with the replica for `--dp` servers (`tp of replica 1`).
        gpus: the GPU indices it spans, in rank order.
    """

    group: str
    gpus: tuple[int, ...]


def _tp_groups(world: int, tp: int) -> list[list[int]]:
    return [list(range(i * tp, (i + 1) * tp)) for i in range(world // tp)]


def server_groups(tp: int, pp: int = 1, ep: int = 1, attn_dp: int = 1) -> dict[str, list[list[int]]]:
    """The rank groups of one SGLang server, as initialize_model_parallel builds them (SGLang
    0.5.23; a group equal to the TP group is SGLang's TP group itself and not listed again).

    Args:
        tp: --tp-size.
        pp: --pp-size.
        ep: --ep-size (MoE expert parallel; 1: none).
        attn_dp: the DP-attention size (--dp with --enable-dp-attention; 1: none).

    Returns:
        group name -> its rank lists (one-rank groups included).
    """
    world = tp * pp
    groups: dict[str, list[list[int]]] = {"world": [list(range(world))],
                                          "tp": _tp_groups(world, tp)}
    ntp = world // tp
    attn_tp = tp // attn_dp
    if attn_tp != tp:
        groups["attention_tp"] = [list(range(g * tp + d * attn_tp, g * tp + (d + 1) * attn_tp))
                                  for g in range(ntp) for d in range(attn_dp)]
    moe_tp = tp // ep  # moe_dp 1
    moe_dp = 1
    if moe_dp != tp:  # moe_dp groups: strided by moe_tp x moe_ep = tp: one rank each
        groups["moe_dp"] = [list(range(g * tp + i, (g + 1) * tp + i, moe_tp * ep))
                            for g in range(ntp) for i in range(moe_tp * ep)]
    if ep != tp:
        groups["moe_ep"] = [list(range(g * tp + t, g * tp + t + ep * moe_tp, moe_tp))
                            for g in range(ntp) for t in range(moe_tp)]
    if moe_tp != tp:
        groups["moe_tp"] = [list(range(g * tp + e * moe_tp, g * tp + (e + 1) * moe_tp))
                            for g in range(ntp) for e in range(ep)]
    npp = world // pp
    groups["pp"] = [list(range(i, world, npp)) for i in range(npp)]
    return groups


def communicators(tp: int, pp: int = 1, ep: int = 1, attn_dp: int = 1,
                  replicas: int = 1) -> list[Communicator]:
    """Every NCCL communicator (groups of two or more ranks) of a layout, as GPU sets.

    Args:
        tp, pp, ep, attn_dp: as server_groups.
        replicas: servers started by --dp without DP attention, side by side on the GPUs.
    """
    out: list[Communicator] = []
    size = tp * pp
    for r in range(replicas):
        suffix = f" of replica {r}" if replicas > 1 else ""
        for name, ranks in server_groups(tp, pp, ep, attn_dp).items():
            for g in ranks:
                if len(g) > 1:
                    out.append(Communicator(name + suffix, tuple(r * size + x for x in g)))
    return out


def uncovered(comms: list[Communicator], file_gpus: set[int]) -> list[Communicator]:
    """The communicators an NCCL graph file naming `file_gpus` does not cover: one lacking a
    GPU the file names fails to initialise ("XML Import Channel : dev N not found"), one with
    GPUs the file does not name gets rings without them."""
    return [c for c in comms if set(c.gpus) != file_gpus]


def describe(comms: list[Communicator], limit: int = 4) -> str:
    """`pp [0,4], [1,5], ...; tp [0..3], [4..7]`: communicators by group, for a caveat."""
    by: dict[str, list[str]] = {}
    for c in comms:
        by.setdefault(c.group, []).append("[" + ",".join(map(str, c.gpus)) + "]")
    return "; ".join(f"{g} " + ", ".join(v[:limit]) + (", ..." if len(v) > limit else "")
                     for g, v in by.items())


#: The variable whose file every communicator reads (src/graph/search.cc ncclTopoCompute).
GRAPH_ENV = "NCCL_GRAPH_FILE"
#: Where NCCL fails and where SGLang makes its groups, for the notes.
SOURCES = ("NVIDIA/nccl src/graph/search.cc ncclTopoGetChannelFromXml: 'XML Import Channel : "
           "dev N not found' (ncclSystemError)",
           "sgl-project/sglang 0.5.23 python/sglang/srt/distributed/parallel_state.py "
           "initialize_model_parallel")


def env_for(env: dict[str, str], file_gpus: set[int] | None, tp: int, pp: int = 1, ep: int = 1,
            attn_dp: int = 1, replicas: int = 1) -> tuple[dict[str, str], list[str]]:
    """The environment of one layout's launch: `env` without NCCL_GRAPH_FILE when the file
    does not cover each of the layout's communicators (or its GPUs are unknown), and why.

    Args:
        env: the recommended environment.
        file_gpus: the GPUs the graph file names (the searched ring's); None: unknown.
        tp, pp, ep, attn_dp, replicas: the layout (see communicators).

    Returns:
        (the layout's environment, notes saying what was left out and why).
    """
    if GRAPH_ENV not in env:
        return dict(env), []
    comms = communicators(tp, pp, ep, attn_dp, replicas)
    bad = uncovered(comms, file_gpus) if file_gpus is not None else comms
    if not bad:
        return dict(env), []
    kept = {k: v for k, v in env.items() if k != GRAPH_ENV}
    named = (f"GPUs {','.join(map(str, sorted(file_gpus)))}" if file_gpus is not None
             else "GPUs not known here")
    return kept, [f"{GRAPH_ENV} left out of this layout: the file names {named}, and NCCL reads "
                  f"it in every communicator; SGLang creates {describe(bad)} here, which it does "
                  f"not cover (a communicator lacking a GPU the file names fails 'XML Import "
                  f"Channel : dev N not found')"]


def covered_layouts(file_gpus: set[int]) -> tuple[list[str], list[str]]:
    """(labels of the layouts tune.layout ranks on these GPUs that the file covers, the others)."""
    n = len(file_gpus)
    shapes = [(f"TP{n}", n, 1, 1, 1, 1), (f"TP{n}+EP{n}", n, 1, n, 1, 1),
              (f"TP{n} DP-attention{n}", n, 1, 1, n, 1)]
    shapes += [(f"PP{pp}xTP{n // pp}", n // pp, pp, 1, 1, 1) for pp in (2, 4)
               if n % pp == 0 and n // pp >= 1 and pp < n]
    if n % 2 == 0 and n >= 4:
        shapes.append((f"2 replicas x TP{n // 2}", n // 2, 1, 1, 1, 2))
    ok: list[str] = []
    not_ok: list[str] = []
    for label, tp, pp, ep, adp, rep in shapes:
        (not_ok if uncovered(communicators(tp, pp, ep, adp, rep), file_gpus) else ok).append(label)
    return ok, not_ok
