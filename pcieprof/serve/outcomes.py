"""How a server launch ended, read from its log and exit status.

The patterns are the lines real SGLang/vLLM/PyTorch/NCCL failures print (tests/data/sglang_logs/
holds excerpts from public issue threads, each with its source). Order matters: a NaN in sampling
also trips a CUDA device-side assert, and an NCCL watchdog timeout also reads as an NCCL error, so
the more specific pattern is tried first.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from pcieprof.bundle.serve_search import Outcome


@dataclass(frozen=True)
class Rule:
    """One recognised failure: a pattern over log lines and what to tell the user."""

    outcome: Outcome
    pattern: re.Pattern[str]
    summary: str
    hint: str


def _r(outcome: Outcome, pattern: str, summary: str, hint: str) -> Rule:
    return Rule(outcome, re.compile(pattern, re.IGNORECASE), summary, hint)


#: Tried in order; the first rule with a matching line wins.
RULES: list[Rule] = [
    _r(Outcome.NAN_IN_DECODE,
       r"probability tensor contains either .?inf.?, .?nan.? or element < 0",
       "NaN/inf in the sampling probabilities during decode",
       "try another attention / FP4 GEMM / MoE backend (serve-bench --sweep), or --enable-nan-detection"),
    _r(Outcome.NCCL_TIMEOUT,
       r"Watchdog caught collective operation timeout|ProcessGroupNCCL's watchdog got stuck"
       r"|NCCL (?:communicator|operation).*timed? ?out",
       "NCCL collective timed out (watchdog)",
       "a collective hung: check P2P over the IOMMU/ACS path (iommu=pt) or try NCCL_P2P_DISABLE=1"),
    _r(Outcome.NCCL_ERROR,
       r"NCCL error|ncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclInvalidUsage"
       r"|NCCL WARN",
       "NCCL error",
       "rerun with NCCL_DEBUG=INFO; check NCCL_P2P_LEVEL / NCCL_IB_DISABLE and the PCIe path"),
    _r(Outcome.OOM,
       r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"
       r"|Not enough memory\. Please try to increase --mem-fraction-static",
       "out of GPU memory",
       "lower --mem-fraction-static, --max-running-requests or --cuda-graph-max-bs, or use more GPUs"),
    _r(Outcome.UNSUPPORTED_ARCH,
       r"Unsupported architecture|no kernel image is available for execution on the device"
       r"|only supported on sm\d+|Only SM \d",
       "a kernel does not support this GPU architecture",
       "pick a backend built for this GPU (SM120: --attention-backend flashinfer)"),
    _r(Outcome.CUDA_DEVICE_ASSERT,
       r"device-side assert triggered|Assertion .* failed\.",
       "CUDA device-side assert",
       "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; try another backend"),
    _r(Outcome.PORT_IN_USE,
       r"address already in use|Errno 98|EADDRINUSE",
       "the port is already in use",
       "stop the other server or pass --port"),
    _r(Outcome.MISSING_MODEL,
       r"does not appear to have a file named|Repository Not Found|RepositoryNotFoundError"
       r"|is not a local folder and is not a valid model identifier|weights missing from checkpoint"
       r"|No such file or directory: .*(?:safetensors|config\.json)|LocalEntryNotFoundError",
       "model files not found",
       "check --model-path, the Hugging Face cache and HF_TOKEN for gated repositories"),
    _r(Outcome.BAD_ARGUMENTS,
       r"error: unrecognized arguments|error: argument --|invalid choice:|is not supported by the "
       r"pcieprof reference server",
       "the server refused its arguments",
       "check the flags against the server's --help"),
]

# Lines that count as progress for hang detection: SGLang 0.5.23's own start-up and serving lines
# (model_runner.py "Load weight begin/end", weight_utils.py tqdm "Loading safetensors checkpoint
# shards", cuda_graph_setup.py "Capture target decode CUDA graph begin", the decode runner's tqdm
# "Capturing batches (bs=..)", kv_cache_configurator.py "Memory pool end", deep_gemm_wrapper
# "DeepGEMM warmup", warmup.py "Running warmup", metrics_reporter.py "Prefill batch" /
# "Decode batch", http_server.py "fired up"). Health-check failures and HTTP access lines are not
# progress: a hung server still answers (and logs) health checks.
PROGRESS = re.compile(r"Load weight|checkpoint shards|Init torch distributed"
                      r"|Captur(?:e|ing)\b.*(?:graph|batches|shape)|Memory pool|KV Cache is allocated"
                      r"|DeepGEMM warmup|Running warmup|Decode batch|Prefill batch|fired up"
                      r"|Uvicorn running|Application startup", re.IGNORECASE)
# HTTP access-log lines (never progress).
ACCESS = re.compile(r'"(?:GET|POST|PUT) /[^"]*" \d{3}')


@dataclass(frozen=True)
class Classified:
    """A classified launch end.

    Attributes:
        outcome: what happened.
        summary: a few words for the user.
        hint: what to try.
        excerpt: the log lines around the decisive one (up to a dozen).
        line: 1-based number of the decisive line in the log, or None.
        exit_code: the server's exit status, or None if still running / unknown.
    """

    outcome: Outcome
    summary: str
    hint: str
    excerpt: str
    line: int | None
    exit_code: int | None

    def one_line(self) -> str:
        """The single line shown to the user."""
        key = ""
        if self.line is not None:
            key = self.excerpt.splitlines()[self._key_index()].lstrip("> ").strip()
            if len(key) > 160:
                key = key[:157] + "..."
            key = f": {key}"
        code = f" (exit {self.exit_code})" if self.exit_code not in (None, 0) else ""
        return f"{self.outcome.value}{code}: {self.summary}{key} - {self.hint}"

    def _key_index(self) -> int:
        for i, ln in enumerate(self.excerpt.splitlines()):
            if ln.startswith(">"):
                return i
        return 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcome"] = self.outcome.value
        return d


def classify(log: str, exit_code: int | None, *, hung: bool = False, served: bool = False,
             context: int = 4) -> Classified:
    """Classify how a launch ended.

    Args:
        log: the server's combined stdout/stderr so far.
        exit_code: its exit status (None while it is still running).
        hung: the launcher's deadline passed with no progress.
        served: it answered requests correctly (then a clean exit is `ok`).
        context: log lines kept on each side of the decisive line.

    Returns:
        The outcome with its excerpt; recognised failure lines win over `hung` and `served`.
    """
    lines = log.splitlines()
    if served and not hung and exit_code in (None, 0):
        return Classified(Outcome.OK, "served", "", "", None, exit_code)
    for rule in RULES:
        for i, ln in enumerate(lines):
            if rule.pattern.search(ln):
                return Classified(rule.outcome, rule.summary, rule.hint,
                                  _excerpt(lines, i, context), i + 1, exit_code)
    if hung:
        last = _last_progress(lines)
        return Classified(Outcome.HANG, "no progress before the deadline",
                          "a collective may be stuck (broken P2P path?) or startup is slow: "
                          "raise --startup-timeout to tell them apart",
                          _excerpt(lines, last, context) if last is not None else _tail(lines),
                          last + 1 if last is not None else None, exit_code)
    if exit_code is not None and exit_code < 0 and exit_code in (-2, -15):
        return Classified(Outcome.INTERRUPTED, "stopped by a signal", "", _tail(lines), None,
                          exit_code)
    err = _last_error(lines)
    return Classified(Outcome.CRASHED, "the server exited" if exit_code is not None
                      else "the server stopped answering",
                      "see the server log in the bundle (serve/server-*.log)",
                      _excerpt(lines, err, context) if err is not None else _tail(lines),
                      err + 1 if err is not None else None, exit_code)


def _excerpt(lines: list[str], i: int, context: int) -> str:
    lo, hi = max(0, i - context), min(len(lines), i + context + 1)
    return "\n".join((">" if j == i else " ") + " " + lines[j] for j in range(lo, hi))


def _tail(lines: list[str], n: int = 8) -> str:
    return "\n".join("  " + ln for ln in lines[-n:])


def _last_progress(lines: list[str]) -> int | None:
    for i in range(len(lines) - 1, -1, -1):
        if PROGRESS.search(lines[i]):
            return i
    return None


_ERRORISH = re.compile(r"(Error|Exception|error:|Traceback|FAILED|Fatal)", re.IGNORECASE)
# The last line of a Python traceback: "RuntimeError: ...", "torch.AcceleratorError: ...".
_EXC_LINE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?[\w.]*(?:Error|Exception|Interrupt)\b[^:]*:")


def _last_error(lines: list[str]) -> int | None:
    """The decisive line of an unrecognised crash.

    The first traceback's exception line: the rank that failed first prints it, and the other
    ranks' follow-on errors (peers closing connections) come after. Else the last exception line,
    else the last error-ish line.
    """
    for t, ln in enumerate(lines):
        if "Traceback (most recent call last)" in ln:
            for i in range(t + 1, len(lines)):
                if _EXC_LINE.search(lines[i]) and not lines[i].lstrip().startswith("File "):
                    return i
            break
    for i in range(len(lines) - 1, -1, -1):
        if _EXC_LINE.search(lines[i]):
            return i
    for i in range(len(lines) - 1, -1, -1):
        if _ERRORISH.search(lines[i]) and not lines[i].lstrip().startswith("File "):
            return i
    return None
