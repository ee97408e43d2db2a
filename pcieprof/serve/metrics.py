"""Serving metrics, named and computed as vLLM's and SGLang's benchmark clients do.

Per request (times from the moment the request is sent, taken as bytes arrive):
  ttft      time to first token: first streamed chunk that carries text
  e2el      end-to-end latency: the last chunk (or [DONE])
  tpot      time per output token after the first: (e2el - ttft) / (output_tokens - 1),
            defined only when output_tokens > 1
  itl       inter-token latency: the gap between consecutive chunks, divided evenly over the
            tokens that chunk added (SGLang bench_serving's convention); one value per token
Per run:
  request_throughput = completed requests / duration_s               (req/s)
  output_throughput  = sum of output tokens of completed requests / duration_s   (tok/s)
  input_throughput   = sum of prompt tokens of completed requests / duration_s   (tok/s)
  duration_s         = first request sent to last request finished (warm-up excluded)
  mean, median, p90, p99 (numpy linear percentiles) and n for ttft_ms, tpot_ms, itl_ms, e2el_ms.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np

from pcieprof.bundle.serve_summary import RunSummary

#: The formulas, as written into summary.json and --help.
FORMULAS: dict[str, str] = {
    "ttft_ms": "time from sending the request to the first streamed chunk with text",
    "e2el_ms": "time from sending the request to its last chunk",
    "tpot_ms": "(e2el - ttft) / (output_tokens - 1), requests with output_tokens > 1",
    "itl_ms": "gap between consecutive chunks / tokens in the later chunk, one value per token "
              "(SGLang bench_serving convention)",
    "request_throughput": "completed requests / duration_s (req/s)",
    "output_throughput": "output tokens of completed requests / duration_s (tok/s)",
    "input_throughput": "prompt tokens of completed requests / duration_s (tok/s)",
    "duration_s": "first measured request sent to last measured request finished",
    "percentiles": "numpy.percentile, linear interpolation; n = number of samples",
    "decode_curve.step_time_ms": "batch of B requests sent at once: median gap between a "
                                 "request's consecutive tokens while all B are decoding",
}


@dataclass
class RequestRecord:
    """One request as the client timed it (times in seconds, relative to the run start).

    Attributes:
        run: label of the run (`c=4`, `rate=8`).
        index: request number within the run (warm-up requests first).
        warmup: True for warm-up requests (not counted in the summary).
        api: `generate` (SGLang native) or `completions` (OpenAI).
        input_len: prompt tokens sent.
        output_len_requested: max_new_tokens / max_tokens asked for (with ignore_eos).
        output_len: tokens generated (server's count when it gives one, else chunks).
        start_s: send time.
        ttft_s, e2el_s: first-token and end-to-end latency (None when it failed first).
        chunk_gaps_s: gaps between consecutive chunks after the first.
        chunk_tokens: tokens added by each of those chunks.
        error: "" when successful.
    """

    run: str
    index: int
    warmup: bool
    api: str
    input_len: int
    output_len_requested: int
    output_len: int = 0
    start_s: float = 0.0
    ttft_s: float | None = None
    e2el_s: float | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.e2el_s is not None

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.output_len <= 1:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_len - 1)  # type: ignore[operator]

    def itl_s(self) -> list[float]:
        """Per-token inter-token latencies (a chunk gap split evenly over its tokens)."""
        out: list[float] = []
        for gap, n in zip(self.chunk_gaps_s, self.chunk_tokens):
            if n > 0:
                out.extend([gap / n] * n)
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["ttft_ms"] = _ms(self.ttft_s)
        d["e2el_ms"] = _ms(self.e2el_s)
        d["tpot_ms"] = _ms(self.tpot_s)
        d["itl_ms"] = [round(x * 1e3, 4) for x in self.itl_s()]
        d["chunk_gaps_ms"] = [round(x * 1e3, 4) for x in self.chunk_gaps_s]
        del d["chunk_gaps_s"]
        return d


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def stats(values: Iterable[float]) -> dict[str, float | int | None]:
    """mean, median, p90, p99, min, max, std and n of `values` (None fields when empty)."""
    a = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if a.size == 0:
        return {"mean": None, "median": None, "p90": None, "p99": None, "min": None,
                "max": None, "std": None, "n": 0}
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "min": float(a.min()), "max": float(a.max()), "std": float(a.std()), "n": int(a.size)}


def summarize(records: list[RequestRecord], *, label: str, concurrency: int | None,
              request_rate: float | None, duration_s: float) -> RunSummary:
    """The summary of one run (warm-up requests are skipped).

    Args:
        records: the run's requests.
        label: the run label.
        concurrency: the concurrency limit, or None for a request-rate run.
        request_rate: requests/s of a rate run (inf: all at once), or None.
        duration_s: measured wall time of the run.
    """
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.ok]
    out_tokens = sum(r.output_len for r in done)
    in_tokens = sum(r.input_len for r in done)
    dur = duration_s if duration_s > 0 else float("nan")
    errors: dict[str, int] = {}
    for r in measured:
        if not r.ok:
            key = (r.error or "no response").splitlines()[0][:120]
            errors[key] = errors.get(key, 0) + 1
    return RunSummary(
        label=label, concurrency=concurrency,
        request_rate=None if request_rate is None else
        ("inf" if math.isinf(request_rate) else request_rate),
        num_requests=len(measured), completed=len(done), failed=len(measured) - len(done),
        errors=errors, duration_s=duration_s, total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        output_len_requested=sum(r.output_len_requested for r in done),
        output_len_mismatch=sum(1 for r in done if r.output_len != r.output_len_requested),
        request_throughput=len(done) / dur, output_throughput=out_tokens / dur,
        input_throughput=in_tokens / dur,
        ttft_ms=stats(r.ttft_s * 1e3 for r in done if r.ttft_s is not None),
        tpot_ms=stats(t * 1e3 for r in done if (t := r.tpot_s) is not None),
        itl_ms=stats(x * 1e3 for r in done for x in r.itl_s()),
        e2el_ms=stats(r.e2el_s * 1e3 for r in done if r.e2el_s is not None))


def format_table(runs: list[RunSummary]) -> str:
    """A fixed-width table of run summaries for stdout."""
    head = (f"{'run':<10} {'ok/n':>8} {'req/s':>8} {'out tok/s':>10} "
            f"{'TTFT med':>9} {'TTFT p99':>9} {'TPOT med':>9} {'ITL med':>8} {'ITL p99':>8} "
            f"{'E2E med':>9}")
    lines = [head, "-" * len(head)]
    for r in runs:
        def f(metric: str, key: str) -> str:
            v = getattr(r, metric).get(key)
            return "-" if v is None else f"{v:.1f}"
        lines.append(
            f"{r.label:<10} {str(r.completed) + '/' + str(r.num_requests):>8} "
            f"{r.request_throughput or 0:>8.2f} {r.output_throughput or 0:>10.1f} "
            f"{f('ttft_ms', 'median'):>9} {f('ttft_ms', 'p99'):>9} {f('tpot_ms', 'median'):>9} "
            f"{f('itl_ms', 'median'):>8} {f('itl_ms', 'p99'):>8} {f('e2el_ms', 'median'):>9}")
    lines.append("(times in ms; TPOT = (E2E - TTFT)/(output tokens - 1); ITL per token)")
    return "\n".join(lines)
