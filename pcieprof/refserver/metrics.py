"""Counters behind /metrics (Prometheus text) and /get_server_info.

Metric names, kinds and default histogram buckets are SGLang's
(sgl-project/sglang python/sglang/srt/metrics/collector.py: SchedulerMetricsCollector and
TokenizerMetricsCollector), labelled with `model_name` as SGLang labels them. Metrics SGLang does
not have (the decode batch-size distribution and step times that show batching at work) carry the
prefix `pcieprof_refserver:` so that nobody mistakes them for SGLang's.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
               1200, 1800, 2400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
STEP_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]


class _Histogram:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = []
        cum = 0
        for bound, c in zip(self.buckets, self.counts):
            cum += c
            out.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {cum}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.n}')
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        out.append(f"{name}_count{{{labels}}} {self.n}")
        return out


class ServerMetrics:
    """Thread-safe counters updated by the scheduler and read by the HTTP handlers.

    Args:
        model_name: the `model_name` label.
        max_total_tokens: KV capacity used for token_usage (max running x context length).
    """

    def __init__(self, model_name: str, max_total_tokens: int) -> None:
        self.model_name = model_name
        self.max_total_tokens = max_total_tokens
        self._lock = threading.Lock()
        self.num_requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.decode_steps = 0
        self.prefill_steps = 0
        self.decode_batch_sizes: Counter[int] = Counter()
        self.prefill_batch_sizes: Counter[int] = Counter()
        self.num_running = 0
        self.num_queue = 0
        self.num_used_tokens = 0
        self.gen_throughput = 0.0
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.e2e = _Histogram(E2E_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS)
        self.decode_step_time = _Histogram(STEP_BUCKETS)
        self.prefill_step_time = _Histogram(STEP_BUCKETS)

    @property
    def token_usage(self) -> float:
        return self.num_used_tokens / max(self.max_total_tokens, 1)

    def observe_step(self, mode: str | None, batch_size: int, seconds: float) -> None:
        with self._lock:
            if mode == "DECODE":
                self.decode_steps += 1
                self.decode_batch_sizes[batch_size] += 1
                self.decode_step_time.observe(seconds)
            elif mode == "EXTEND":
                self.prefill_steps += 1
                self.prefill_batch_sizes[batch_size] += 1
                self.prefill_step_time.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        with self._lock:
            self.itl.observe(seconds)

    def observe_finished(self, prompt_tokens: int, output_tokens: int, ttft_s: float,
                         e2e_s: float) -> None:
        with self._lock:
            self.num_requests += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += output_tokens
            self.ttft.observe(ttft_s)
            self.e2e.observe(e2e_s)

    def set_load(self, running: int, queued: int, used_tokens: int) -> None:
        with self._lock:
            self.num_running, self.num_queue, self.num_used_tokens = running, queued, used_tokens

    def internal_state(self) -> dict[str, object]:
        """The batching figures for /get_server_info's internal_states."""
        with self._lock:
            bs = self.decode_batch_sizes
            return {
                "last_gen_throughput": self.gen_throughput,
                "#running-req": self.num_running,
                "#queue-req": self.num_queue,
                "num_decode_steps": self.decode_steps,
                "num_prefill_steps": self.prefill_steps,
                "decode_batch_size_counts": {str(k): v for k, v in sorted(bs.items())},
                "max_decode_batch_size": max(bs) if bs else 0,
                "mean_decode_batch_size": (sum(k * v for k, v in bs.items()) / sum(bs.values())
                                           if bs else 0.0),
                "mean_decode_step_ms": (1e3 * self.decode_step_time.sum
                                        / max(self.decode_step_time.n, 1)),
            }

    def prometheus(self) -> str:
        """The /metrics body (Prometheus text exposition format 0.0.4)."""
        lab = f'model_name="{self.model_name}"'
        out: list[str] = []

        def metric(name: str, kind: str, doc: str, value: float) -> None:
            out.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}",
                        f"{name}{{{lab}}} {value}"])

        with self._lock:
            metric("sglang:num_running_reqs", "gauge", "The number of running requests.",
                   self.num_running)
            metric("sglang:num_queue_reqs", "gauge",
                   "The number of requests in the waiting queue.", self.num_queue)
            metric("sglang:num_used_tokens", "gauge", "The number of used tokens.",
                   self.num_used_tokens)
            metric("sglang:token_usage", "gauge", "The token usage.", self.token_usage)
            metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
                   self.gen_throughput)
            metric("sglang:prompt_tokens_total", "counter",
                   "Number of prefill tokens processed.", self.prompt_tokens)
            metric("sglang:generation_tokens_total", "counter",
                   "Number of generation tokens processed.", self.generation_tokens)
            metric("sglang:num_requests_total", "counter", "Number of requests processed.",
                   self.num_requests)
            for name, doc, h in (
                ("sglang:time_to_first_token_seconds",
                 "Histogram of time to first token in seconds.", self.ttft),
                ("sglang:inter_token_latency_seconds",
                 "Histogram of inter-token latency in seconds.", self.itl),
                ("sglang:e2e_request_latency_seconds",
                 "Histogram of End-to-end request latency in seconds", self.e2e),
                ("pcieprof_refserver:decode_step_seconds",
                 "Reference server only: wall time of one decode step.", self.decode_step_time),
                ("pcieprof_refserver:prefill_step_seconds",
                 "Reference server only: wall time of one prefill step.", self.prefill_step_time),
            ):
                out.extend([f"# HELP {name} {doc}", f"# TYPE {name} histogram"])
                out.extend(h.lines(name, lab))
            name = "pcieprof_refserver:decode_steps_total"
            out.extend([f"# HELP {name} Reference server only: decode steps by batch size.",
                        f"# TYPE {name} counter"])
            for bs, n in sorted(self.decode_batch_sizes.items()):
                out.append(f'{name}{{{lab},batch_size="{bs}"}} {n}')
        return "\n".join(out) + "\n"
