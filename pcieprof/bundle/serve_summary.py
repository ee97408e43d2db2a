"""serve/summary.json: what serve-bench measured (pcieprof.serve.run writes it as it goes).

Metric names and formulas as vLLM/SGLang spell them (`formulas` holds the ones the run used):
per run the request and output throughput and mean/median/p90/p99/n of `ttft_ms`, `tpot_ms`,
`itl_ms`, `e2el_ms`; the fixed-batch decode curve (also in serve/decode_curve.csv); the
profiler capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcieprof.bundle.document import Document
from pcieprof.bundle.rows import DecodeCurveRow


@dataclass
class RunSummary:
    """One load run (a concurrency or a request rate).

    Attributes:
        label: `c=4`, `rate=8`.
        concurrency: the concurrency limit, or None for a rate run.
        request_rate: requests/s of a rate run (`inf`: all at once), or None.
        completed, failed: measured requests that finished / did not.
        duration_s: first measured request sent to the last finished.
        request_throughput: req/s; output_throughput, input_throughput: tok/s.
        ttft_ms, tpot_ms, itl_ms, e2el_ms: {mean, median, p90, p99, min, max, std, n}.
    """

    label: str
    concurrency: int | None = None
    request_rate: float | str | None = None
    num_requests: int = 0
    completed: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    duration_s: float | None = None
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    output_len_requested: int = 0
    output_len_mismatch: int = 0
    request_throughput: float | None = None
    output_throughput: float | None = None
    input_throughput: float | None = None
    ttft_ms: dict[str, float | None] = field(default_factory=dict)
    tpot_ms: dict[str, float | None] = field(default_factory=dict)
    itl_ms: dict[str, float | None] = field(default_factory=dict)
    e2el_ms: dict[str, float | None] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServeSummary(Document):
    """serve/summary.json.

    Attributes:
        model: the model card served.
        tp: tensor-parallel ranks of the server (None in files older than the field).
        api: `generate` or `completions`.
        attempt: the launch attempt benchmarked.
        backend, source: provenance of the serving numbers.
        input_len, output_len: tokens per request; ignore_eos, seed, warmup_requests.
        formulas: metric -> how it was computed.
        runs: one per load run.
        decode_curve: the fixed-batch decode step per batch size.
        profile: the profiler capture (files, ranks, status, why) and its attribution.
        status: `running` until the benchmark finished, then `ok`.
    """

    FILE = "serve/summary.json"
    FORMAT = "pcieprof.serve_summary"
    VERSION = 1

    model: str = ""
    tp: int | None = None
    api: str = "generate"
    base_url: str = ""
    attempt: str = ""
    backend: str = ""
    source: str = ""
    input_len: int = 0
    output_len: int = 0
    ignore_eos: bool = True
    seed: int = 0
    warmup_requests: int = 0
    formulas: dict[str, str] = field(default_factory=dict)
    runs: list[RunSummary] = field(default_factory=list)
    client: dict[str, Any] = field(default_factory=dict)
    decode_curve: list[DecodeCurveRow] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    status: str = "running"
    extra: dict[str, Any] = field(default_factory=dict)
