"""Command-line flags of the reference server, spelled as SGLang spells them.

`python -m sglang.launch_server` takes `--model-path`, `--tp-size`, `--host`, `--port`,
`--max-running-requests`, `--random-seed`, ... (sgl-project/sglang
python/sglang/srt/server_args.py). The reference server accepts the same names for what it does,
a few GPU-only SGLang flags that have no meaning here (accepted, logged as ignored, so that a
serve-bench launch configuration can be pointed at it unchanged), and its own `--inject` for fault
injection. Anything else is refused with one clear line, as SGLang's argparse refuses unknown
flags.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn, Sequence

from pcieprof.refserver.faults import FAULTS, MatrixError, choose, launch_flags, load_matrix

MODEL_NAME = "tiny-cpu"

# SGLang flags that only steer GPU kernels. They are accepted and recorded so that the same launch
# line works here, and the log says they were ignored.
IGNORED_GPU_FLAGS: tuple[str, ...] = (
    "--attention-backend",
    "--prefill-attention-backend",
    "--decode-attention-backend",
    "--sampling-backend",
    "--kv-cache-dtype",
    "--mem-fraction-static",
    "--cuda-graph-max-bs",
    "--chunked-prefill-size",
    "--quantization",
    "--moe-runner-backend",
    "--fp8-gemm-backend",
    "--fp4-gemm-backend",
    "--dsa-prefill-backend",
    "--dsa-decode-backend",
    "--nsa-prefill-backend",
    "--nsa-decode-backend",
    "--dtype",
    "--cuda-graph-backend-decode",
    "--cuda-graph-backend-prefill",
    "--cuda-graph-max-bs-decode",
)
IGNORED_GPU_SWITCHES: tuple[str, ...] = (
    "--disable-cuda-graph",
    "--trust-remote-code",
    "--enable-metrics",
    "--disable-custom-all-reduce",
    "--enable-torch-compile",
    "--disable-radix-cache",
    "--log-requests",
)
# Accepted by SGLang, but meaning something the reference server cannot do: refused by name.
UNSUPPORTED: dict[str, str] = {
    "--nnodes": "multi-node serving",
    "--node-rank": "multi-node serving",
    "--dist-init-addr": "multi-node serving",
    "--ep-size": "expert parallelism",
    "--pp-size": "pipeline parallelism",
    "--dp-size": "data parallelism",
    "--enable-dp-attention": "DP attention",
    "--speculative-algorithm": "speculative decoding",
}


class ArgsError(Exception):
    """A flag the reference server cannot take; the message is one line for the user."""


@dataclass(frozen=True)
class Injection:
    """A fault to inject, for tests of crash classification, teardown and the launch search.

    Attributes:
        kind: "none", "nan-after", "hang", "crash-on-start", "unsupported-arch" (a rank fails
            while loading with an architecture error) or "hang-in-capture" (startup stops in
            CUDA-graph capture, before the server is ready).
        after_steps: decode steps served after readiness before the fault (nan-after, hang).
        line: the error line of "unsupported-arch".
        rule: the fault-matrix rule that chose this fault ("" when given by --inject).
    """

    kind: str = "none"
    after_steps: int = 0
    # Not in repr: the server logs its args, and the fault's own text must appear in the log
    # only where the fault happens.
    line: str = field(default="", repr=False)
    rule: str = field(default="", repr=False)

    def describe(self) -> str:
        if self.kind in ("nan-after", "hang") and self.after_steps:
            return f"{self.kind} {self.after_steps}"
        return self.kind


@dataclass
class ServerArgs:
    """What the reference server was started with (also reported by /get_server_info).

    Attributes:
        model_path: only "tiny-cpu", the built-in model.
        tp_size: tensor-parallel ranks (local processes, gloo).
        host: address to bind the HTTP server to (127.0.0.1 by default, unlike SGLang's).
        port: HTTP port.
        max_running_requests: most requests in one decode batch; more wait in the queue.
        random_seed: seeds the weights and the default per-request sampling seeds.
        served_model_name: the model name in OpenAI responses and metric labels.
        context_length: most tokens (prompt + output) per request.
        skip_server_warmup: do not send the warm-up request before saying ready.
        log_level: Python logging level name.
        decode_log_interval: decode steps between "Decode batch." log lines.
        inject: the fault to inject.
        ignored_flags: SGLang GPU flags that were given and ignored.
    """

    model_path: str = MODEL_NAME
    tp_size: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    max_running_requests: int = 64
    random_seed: int = 0
    served_model_name: str = MODEL_NAME
    context_length: int = 1024
    skip_server_warmup: bool = False
    log_level: str = "info"
    decode_log_interval: int = 40
    inject: Injection = field(default_factory=Injection)
    ignored_flags: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["inject"] = self.inject.describe()
        return data


# What an injected unsupported-arch fault raises when its matrix rule gives no line: the text
# of FlashInfer's TRT-LLM FMHA runner on SM120 (sgl-project/sglang#29562).
DEFAULT_ARCH_LINE = ("RuntimeError: Error in function 'TllmGenFmhaRunner' at "
                     "flashinfer/trtllm/fmha/fmhaRunner.cuh:37: Unsupported architecture")


def parse_injection(text: str | None, line: str = "") -> Injection:
    """Parse `--inject` ("nan-after N", "hang", "hang-after N", "crash-on-start",
    "unsupported-arch", "hang-in-capture").

    Args:
        text: the fault.
        line: the error line for "unsupported-arch" (default: DEFAULT_ARCH_LINE).

    Raises:
        ArgsError: on anything else.
    """
    if text is None or text.strip() in ("", "none"):
        return Injection()
    words = text.replace("=", " ").split()
    kind = words[0]
    rest = words[1:]
    if kind in ("crash-on-start", "hang-in-capture") and not rest:
        return Injection(kind)
    if kind == "unsupported-arch" and not rest:
        return Injection(kind, line=line or DEFAULT_ARCH_LINE)
    if kind == "hang" and not rest:
        return Injection("hang", 0)
    if kind in ("nan-after", "hang-after") and len(rest) == 1 and re.fullmatch(r"\d+", rest[0]):
        return Injection("nan-after" if kind == "nan-after" else "hang", int(rest[0]))
    raise ArgsError(f"argument --inject: {text!r} is not understood; use one of: "
                    + ", ".join(f"'{f}'" for f in FAULTS))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print usage and exit(2)
        raise ArgsError(message)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (exposed so `--help` and the CLI wrapper share it)."""
    p = _Parser(
        prog="python -m pcieprof.refserver",
        description="pcieprof reference server: SGLang's HTTP surface over a tiny MoE model with "
                    "real tensor parallelism (gloo) across local processes. A test and demo "
                    "target, not a serving engine.",
        allow_abbrev=False,
    )
    p.add_argument("--model-path", "--model", dest="model_path", default=MODEL_NAME,
                   help="Only 'tiny-cpu' (the built-in model; no download).")
    p.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int,
                   default=1, help="Tensor-parallel ranks (local processes over gloo).")
    p.add_argument("--host", default="127.0.0.1", help="Bind address (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=30000, help="HTTP port (default 30000).")
    p.add_argument("--max-running-requests", type=int, default=64,
                   help="Most requests decoded together in one step.")
    p.add_argument("--random-seed", "--seed", dest="random_seed", type=int, default=0,
                   help="Seed of the weights and of default sampling seeds.")
    p.add_argument("--served-model-name", default=None, help="Model name reported to clients.")
    p.add_argument("--context-length", type=int, default=1024,
                   help="Most tokens per request, prompt plus output.")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--inject", default=None,
                   help="Fault injection for tests: " + ", ".join(f"'{f}'" for f in FAULTS) + ".")
    p.add_argument("--inject-matrix", default=None, metavar="FILE",
                   help="Fault injection decided by the launch flags: a TOML/JSON list of "
                        "[[fault]] rules (when/unless flag values -> fault); the first that "
                        "matches applies. See pcieprof/refserver/faults.py.")
    for flag in IGNORED_GPU_FLAGS:
        p.add_argument(flag, dest=_ignored_dest(flag), default=None, help=argparse.SUPPRESS)
    for flag in IGNORED_GPU_SWITCHES:
        p.add_argument(flag, dest=_ignored_dest(flag), action="store_true", default=None,
                       help=argparse.SUPPRESS)
    return p


def _ignored_dest(flag: str) -> str:
    return "ignored_" + flag.lstrip("-").replace("-", "_")


def parse_args(argv: Sequence[str]) -> ServerArgs:
    """Parse SGLang-style flags into ServerArgs.

    Raises:
        ArgsError: an unknown, unsupported or invalid flag, with a one-line message.
    """
    argv = list(argv)
    for flag, what in UNSUPPORTED.items():
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            raise ArgsError(f"{flag} ({what}) is not supported by the pcieprof reference server")
    parser = build_parser()
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ArgsError(f"unrecognized arguments: {' '.join(unknown)} (the pcieprof reference "
                        f"server accepts: {', '.join(_accepted(parser))})")
    if ns.model_path != MODEL_NAME:
        raise ArgsError(f"argument --model-path: {ns.model_path!r}: the reference server serves "
                        f"only its built-in model {MODEL_NAME!r}")
    if ns.tp_size not in (1, 2, 4, 8):
        raise ArgsError(f"argument --tp-size: {ns.tp_size}: the tiny-cpu model's 8 heads split "
                        f"over 1, 2, 4 or 8 local ranks")
    if not 0 <= ns.port <= 65535:
        raise ArgsError(f"argument --port: {ns.port} is not a TCP port")
    if ns.max_running_requests < 1:
        raise ArgsError("argument --max-running-requests: must be at least 1")
    if not 16 <= ns.context_length <= 8192:
        raise ArgsError("argument --context-length: must be between 16 and 8192")
    ignored = {k[len("ignored_"):].replace("_", "-"): v for k, v in vars(ns).items()
               if k.startswith("ignored_") and v is not None}
    return ServerArgs(
        model_path=ns.model_path, tp_size=ns.tp_size, host=ns.host, port=ns.port,
        max_running_requests=ns.max_running_requests, random_seed=ns.random_seed,
        served_model_name=ns.served_model_name or MODEL_NAME, context_length=ns.context_length,
        skip_server_warmup=ns.skip_server_warmup, log_level=ns.log_level,
        decode_log_interval=max(1, ns.decode_log_interval),
        inject=_injection(ns.inject, ns.inject_matrix, ignored), ignored_flags=ignored,
    )


def _injection(text: str | None, matrix: str | None, ignored: dict[str, Any]) -> Injection:
    """The fault to inject: --inject as given, or the first matching --inject-matrix rule."""
    if matrix is None:
        return parse_injection(text)
    if text is not None:
        raise ArgsError("argument --inject-matrix: not together with --inject")
    try:
        rule = choose(load_matrix(matrix), launch_flags(ignored))
    except MatrixError as exc:
        raise ArgsError(str(exc)) from None
    if rule is None:
        return Injection(rule=f"{matrix}: no rule matches")
    try:
        inj = parse_injection(rule.fault, rule.line)
    except ArgsError as exc:
        raise ArgsError(f"argument --inject-matrix: {matrix}: {rule.describe()}: {exc}") from None
    return Injection(inj.kind, inj.after_steps, inj.line, f"{matrix}: {rule.describe()}")


def _accepted(parser: argparse.ArgumentParser) -> list[str]:
    flags = []
    for action in parser._actions:
        if action.help is argparse.SUPPRESS or not action.option_strings:
            continue
        flags.append(action.option_strings[0])
    return [f for f in flags if f not in ("-h",)]


def health_check_timeout_s() -> float:
    """SGLang's /health_generate deadline: env SGLANG_HEALTH_CHECK_TIMEOUT, default 20 s
    (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py, HEALTH_CHECK_TIMEOUT)."""
    try:
        return float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
    except ValueError:
        return 20.0
