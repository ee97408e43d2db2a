"""The pcieprof reference server: SGLang's HTTP surface over a tiny tensor-parallel MoE model.

A test and demo target, not a serving engine. It lets serve-bench, the trace collection and the
attribution run for real on a machine without GPUs: concurrent requests are batched into shared
decode steps, every layer does real gloo all-reduces across N local rank processes, and
/start_profile writes one torch.profiler Chrome trace per rank, named as SGLang names them.

Launch: `python -m pcieprof.refserver --tp-size 2 --port 30000` (or `pcieprof reference-server`).
Modules: args (flags), server (rank 0: HTTP process), worker (ranks 1..N-1), ranks (group join,
model load), engine (per-step plan), scheduler (batching on rank 0), model, tokenizer,
names (file names and log lines, no torch), profiling, metrics, http_api, procs (no orphans),
logs.
"""

from pcieprof.refserver.names import (NAN_SAMPLING_ERROR, READY_LINE, SCHEDULER_EXCEPTION,
                                      SIGQUIT_LINE, default_output_dir, trace_file_name)

__all__ = ["NAN_SAMPLING_ERROR", "READY_LINE", "SCHEDULER_EXCEPTION", "SIGQUIT_LINE",
           "default_output_dir", "trace_file_name"]
