"""Names SGLang gives its profiler outputs, and the readiness and failure lines it logs.

Kept free of torch so that clients (serve-bench, the trace collector) can import them cheaply.

Trace files (sgl-project/sglang python/sglang/srt/managers/scheduler_profiler_mixin.py,
stop_profile): one per TP rank,

    [{profile_prefix}-]{profile_id}-TP-{tp_rank}[-{stage}].trace.json.gz

with profile_id the time of the request (`str(time.time())`) and stage `EXTEND` or `DECODE`
under profile_by_stage; the directory is the request's output_dir, else env
SGLANG_TORCH_PROFILER_DIR, else /tmp.
"""

from __future__ import annotations

import os

IDENTITY = ("pcieprof reference server: a test and demo target (tiny MoE model on CPU, tensor "
            "parallel over gloo), not a serving engine")
READY_LINE = "The server is fired up and ready to roll!"  # http_server._wait_and_warmup
SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."
SCHEDULER_EXCEPTION = "Scheduler hit an exception:"  # scheduler.run_scheduler_process
NAN_SAMPLING_ERROR = "probability tensor contains either `inf`, `nan` or element < 0"  # aten


def default_output_dir() -> str:
    """Where traces go without an explicit output_dir (SGLang's rule)."""
    return os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")


def trace_file_name(profile_id: str, tp_rank: int, stage: str | None = None,
                    prefix: str | None = None) -> str:
    """The file name SGLang gives a rank's trace (see the module docstring)."""
    head = f"{prefix}-" if prefix else ""
    tail = f"-{stage}" if stage else ""
    return f"{head}{profile_id}-TP-{tp_rank}{tail}.trace.json.gz"


def step_span_name(mode: str, batch_size: int, new_tokens: int) -> str:
    """SGLang's per-step span name: `step[DECODE bs=N]` or `step[EXTEND bs=N toks=T]`."""
    if mode == "EXTEND":
        return f"step[EXTEND bs={batch_size} toks={new_tokens}]"
    return f"step[{mode} bs={batch_size}]"
