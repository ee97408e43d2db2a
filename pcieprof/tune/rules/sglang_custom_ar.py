"""SGLang's custom all-reduce is off above two PCIe GPUs: every decode all-reduce is NCCL's.

sgl-project/sglang python/sglang/srt/distributed/device_communicators/custom_all_reduce.py
(@004e6561cb8ae26d62166c15782955f99f058274): `if world_size > 2 and not full_nvlink:` logs "Custom
allreduce is disabled because it's not supported on more than two PCIe-only GPUs" and returns;
`should_custom_ar` also only returns True when `world_size == 2 or self.full_nvlink`. So at TP4
and TP8 on PCIe the NCCL curve of this bundle is what decode pays; at TP2 the custom kernel may
run (if SGLang's P2P check passes).
"""

from __future__ import annotations

from pcieprof.analysis.infer import NVLINK
from pcieprof.analysis.nodes import Nodes
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext

WARNING = "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs"
SOURCE = ("sgl-project/sglang python/sglang/srt/distributed/device_communicators/"
          "custom_all_reduce.py @004e6561")


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    nodes = Nodes.of(ctx.bundle)  # several nodes: a box is one node, its GPUs those of a node
    n = len(ctx.topology.gpus) or (nodes.layout.per_node if nodes else ctx.curves.max_nranks)
    if n <= 2:
        return []
    if ctx.topology.has_nvlink():
        return []
    nvlink = ctx.inferred.pairs_of(NVLINK) if ctx.inferred is not None else []
    if nvlink and len(nvlink) == n * (n - 1) // 2:
        return []
    measured = ctx.inferred is not None and ctx.inferred.measured
    if ctx.topology.nvlink_hidden() and not measured:
        return []  # topo -mp hides NVLink: this box may well be full NVLink (DeepEP issue #60)
    ev = [f"{SOURCE}: custom all-reduce needs world_size == 2 or full NVLink",
          f"this box: {n} GPUs" + (f" per node ({nodes.describe()})" if nodes else "") + ", "
          + (f"NVLink only between {', '.join(f'{a}-{b}' for a, b in nvlink)}"
             " (measured), not full NVLink" if nvlink
             else "no pair faster than PCIe measured (topology.json's levels come from nvidia-smi "
             "topo -mp, which hides NVLink)" if ctx.topology.nvlink_hidden()
             else "no NVLink pair in topology.json")]
    if WARNING in ctx.serve_log:
        ev.append("serve/server-*.log: SGLang printed the warning itself")
    return [Recommendation(
        rule="sglang_custom_ar", kind="info", priority=0.5, confidence="advice",
        # no TP size the box cannot hold is named (a 4-GPU box was told "TP4/TP8")
        title=(f"Above TP2 ({n} GPUs here) SGLang sends every all-reduce through NCCL (its "
               "custom all-reduce is off on >2 PCIe GPUs)"),
        # the NCCL price holds whether or not this run recommends NCCL settings (none above on
        # a box with nothing to set)
        gain_text="decode all-reduces pay NCCL's price (with any NCCL settings recommended here); "
                  "TP2 groups may use SGLang's custom kernel, which this bundle did not measure",
        evidence=ev,
        caveats=["nothing to set: --disable-custom-all-reduce only silences the warning"])]
