"""What one failed launch teaches the search: the rules, as data, tried in order.

Each rule matches an attempt's outcome class (pcieprof.bundle.serve_search.Outcome, classified by
pcieprof.serve.outcomes) and, optionally, a
condition on the log or the history; its action says what the search does next:

- `exclude`: the values the log names (or, failing that, the one value this attempt changed)
  leave the search for good; the next attempt changes those axes.
- `vary`: the next attempt changes one of `axes` (the first, in order, with a value not yet
  tried), starting from the failed configuration; then the card's axis order.
- `vary_together`: the next attempt changes every axis of `axes` at once (one attempt tests the
  whole group); if the outcome survives that too, the search goes back to the configuration
  before the group change.
- `stop`: no launch choice can fix this (the machine, the memory, the model files): the search
  ends with the rule's hint.

Conditions: `names_value` (the decisive log lines name a value of this configuration, by its
log_names or its flag), `one_axis_changed` (this attempt changed one axis from its parent),
`survived_attention_change` (an earlier attempt with the same outcome differs from this one only
on attention axes, `--attention-backend` among them, and the GEMM/MoE/KV group has not been tried
yet: a change of the DSA decode kernel alone keeps the search on the decode kernel, which is what
the field report needed), `in_graph_capture` (the last progress line before the end was
CUDA-graph capture).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pcieprof.bundle.serve_search import Outcome

#: Axes of the attention kernels (dense or DSA).
ATTENTION_AXES = ("attention_backend", "dsa_prefill_backend", "dsa_decode_backend")
#: Axes of the GEMM, MoE and KV-cache kernels.
GEMM_MOE_KV_AXES = ("fp4_gemm_backend", "moe_runner_backend", "fp8_gemm_backend", "kv_cache_dtype")

_O = Outcome

# Progress lines that say the server was capturing CUDA graphs (SGLang's cuda_graph_setup.py
# "Capture target decode CUDA graph begin", the decode runner's tqdm "Capturing batches (bs=..)").
CAPTURE = re.compile(r"Captur(?:e|ing)\b.*(?:graph|batches|shape)", re.IGNORECASE)


@dataclass(frozen=True)
class Rule:
    """One thing a failure teaches.

    Attributes:
        name: short id (recorded with each attempt it chose).
        outcomes: the outcome values it applies to; `*` for any failure.
        when: a condition (see the module docstring), "" for none.
        action: `exclude`, `vary`, `vary_together` or `stop`.
        axes: the axes to change next, in order ("()" = the card's order).
        why: one line for the user: what the failure means.
        hint: for `stop`: what to do instead.
    """

    name: str
    outcomes: tuple[str, ...]
    action: str
    why: str
    when: str = ""
    axes: tuple[str, ...] = ()
    hint: str = ""

    def covers(self, outcome: str) -> bool:
        return "*" in self.outcomes or outcome in self.outcomes


RULES: tuple[Rule, ...] = (
    Rule("arch-named", (_O.UNSUPPORTED_ARCH.value,), "exclude", when="names_value",
         why="the kernel named in the 'Unsupported architecture' line does not run on this GPU: "
             "its value leaves the search"),
    Rule("arch-changed", (_O.UNSUPPORTED_ARCH.value,), "exclude", when="one_axis_changed",
         why="'Unsupported architecture' right after changing one value: that value leaves the "
             "search"),
    Rule("refused-value", (_O.BAD_ARGUMENTS.value,), "exclude", when="names_value",
         why="the server refused a value of this configuration: it leaves the search"),
    Rule("nan-survived-attention", (_O.NAN_IN_DECODE.value,), "vary_together",
         when="survived_attention_change", axes=GEMM_MOE_KV_AXES,
         why="NaN in decode survived a change of attention backend: the GEMM, MoE and KV-cache "
             "kernels are changed together next"),
    Rule("nan-in-decode", (_O.NAN_IN_DECODE.value,), "vary",
         axes=("dsa_decode_backend", "attention_backend", "dsa_prefill_backend"),
         why="NaN in decode: the decode attention kernel is the first suspect"),
    Rule("device-assert", (_O.CUDA_DEVICE_ASSERT.value,), "vary",
         axes=("dsa_decode_backend", "attention_backend", "fp4_gemm_backend",
               "moe_runner_backend"),
         why="a CUDA device-side assert: attention, then the FP4 GEMM and MoE kernels"),
    Rule("bad-output", (_O.BAD_OUTPUT.value,), "vary",
         axes=("kv_cache_dtype", "dsa_decode_backend", "attention_backend", "fp4_gemm_backend"),
         why="served, but wrong tokens: the KV-cache dtype first (FP8 KV garbles on SM120, S6), "
             "then the attention and GEMM kernels"),
    Rule("hang-in-capture", (_O.HANG.value,), "vary", when="in_graph_capture",
         axes=("cuda_graph", "dsa_decode_backend", "attention_backend"),
         why="hung while capturing CUDA graphs: graphs off first, then the decode kernel"),
    Rule("oom-in-capture", (_O.OOM.value,), "vary", when="in_graph_capture", axes=("cuda_graph",),
         why="out of memory while capturing CUDA graphs: graphs off",
         hint="or lower --cuda-graph-max-bs-decode"),
    Rule("oom", (_O.OOM.value,), "stop",
         why="out of GPU memory outside graph capture: the layout or memory settings, not a "
             "kernel choice",
         hint="lower --mem-fraction-static or --max-running-requests, or use more GPUs"),
    Rule("nccl", (_O.NCCL_ERROR.value, _O.NCCL_TIMEOUT.value), "stop",
         why="NCCL failed: the interconnect, not a kernel choice",
         hint="pcieprof topology on this box, then pcieprof recommend (NCCL_P2P_LEVEL, iommu=pt)"),
    Rule("environment", (_O.PORT_IN_USE.value, _O.MISSING_MODEL.value), "stop",
         why="the launch environment is wrong (port, model files): no kernel choice fixes it",
         hint="see the attempt's log line"),
    Rule("arch-unattributed", (_O.UNSUPPORTED_ARCH.value,), "vary",
         why="'Unsupported architecture' from a kernel this configuration does not name: the "
             "next value in the card's order"),
    Rule("hang", (_O.HANG.value,), "vary",
         why="no start-up progress (not in graph capture): the next value in the card's order"),
    Rule("other", ("*",), "vary",
         why="no rule for this end: the next value in the card's order"),
)


def rule_named(name: str) -> Rule | None:
    """The rule with this name (None for `first` or an unknown name)."""
    for r in RULES:
        if r.name == name:
            return r
    return None


def in_graph_capture(last_progress: str, excerpt: str) -> bool:
    """True when the attempt ended while capturing CUDA graphs."""
    return bool(CAPTURE.search(last_progress or "")) or any(
        CAPTURE.search(ln) for ln in excerpt.splitlines() if ln.startswith(">"))
