"""Fixed-batch decode latency: per-step decode time at batch sizes 1, 2, 4, ..., 64.

For a batch size B, B requests with a short prompt and `output_len` tokens (ignore_eos) are sent
at once. While all B are decoding, each decode step emits one token to each of them, so the gap
between a request's consecutive tokens is the server's step time at batch B. The curve uses only
tokens that arrive while every request of the batch is past its first token and none has
finished (the steady state); when that window is empty it falls back to the middle half of each
request's tokens and says so in `window`. This is the curve the tuner fits (step time vs batch).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pcieprof.bundle.rows import DecodeCurveRow
from pcieprof.serve.client import LoadSpec, run_load
from pcieprof.serve.metrics import RequestRecord

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def _token_times(r: RequestRecord) -> list[tuple[float, float]]:
    """(arrival time, per-token gap) of each token after the first, run-relative seconds."""
    if r.ttft_s is None:
        return []
    t = r.start_s + r.ttft_s
    out = []
    for gap, n in zip(r.chunk_gaps_s, r.chunk_tokens):
        t += gap
        if n > 0:
            out.extend([(t, gap / n)] * n)
    return out


def steady_step_times(records: list[RequestRecord]) -> tuple[list[float], str]:
    """Per-token gaps (s) from the window where the whole batch is decoding, and the window used."""
    ok = [r for r in records if r.ok and r.ttft_s is not None and r.e2el_s is not None]
    if not ok:
        return [], "none"
    all_started = max(r.start_s + r.ttft_s for r in ok)  # type: ignore[operator]
    first_end = min(r.start_s + r.e2el_s for r in ok)  # type: ignore[operator]
    window = [g for r in ok for (t, g) in _token_times(r) if all_started < t <= first_end]
    if len(window) >= max(4, len(ok)):
        return window, "all_decoding"
    mid: list[float] = []
    for r in ok:
        tt = _token_times(r)
        lo, hi = len(tt) // 4, max(len(tt) // 4 + 1, 3 * len(tt) // 4)
        mid.extend(g for _, g in tt[lo:hi])
    return mid, "middle_half"


async def measure_curve(base_url: str, *, batch_sizes: tuple[int, ...] = DEFAULT_BATCHES,
                        api: str = "generate", input_len: int = 16, output_len: int = 64,
                        seed: int = 0, vocab_high: int = 256, backend: str = "",
                        timeout_s: float = 300.0,
                        on_row: Callable[[DecodeCurveRow], None] | None = None
                        ) -> list[DecodeCurveRow]:
    """Measure the per-step decode time at each batch size (one row per size).

    Args:
        base_url: the server.
        batch_sizes: batch sizes, measured in order (a warm-up batch of 1 runs first).
        api, input_len, output_len, seed, vocab_high: request shape (see client.LoadSpec).
        backend: the bundle backend label for each row.
        timeout_s: per-request deadline.
        on_row: called with each row as it is measured.
    """
    rows: list[DecodeCurveRow] = []
    warm = LoadSpec(api=api, input_len=input_len, output_len=min(8, output_len), num_requests=1,
                    concurrency=1, warmup=0, seed=seed, vocab_high=vocab_high, timeout_s=timeout_s)
    await run_load(base_url, warm)
    for b in batch_sizes:
        spec = LoadSpec(api=api, input_len=input_len, output_len=output_len, num_requests=b,
                        concurrency=b, warmup=0, seed=seed + b, vocab_high=vocab_high,
                        timeout_s=timeout_s)
        recs, _ = await run_load(base_url, spec)
        gaps, window = steady_step_times(recs)
        failed = [r for r in recs if not r.ok]
        row = DecodeCurveRow(backend=backend, batch_size=b, input_len=input_len,
                             output_len=output_len, window=window, n_samples=len(gaps))
        if gaps and not failed:
            a = np.asarray(gaps) * 1e3
            med = float(np.median(a))
            row.step_time_ms = med
            row.step_time_ms_p10 = float(np.percentile(a, 10))
            row.step_time_ms_p90 = float(np.percentile(a, 90))
            row.tokens_per_s = b * 1e3 / med if med > 0 else float("nan")
        else:
            row.status = "error"
            row.detail = (failed[0].error if failed else "no steady-state tokens")[:200]
        rows.append(row)
        if on_row:
            on_row(row)
        if failed:
            break  # a failing server will not get better at larger batches
    return rows
