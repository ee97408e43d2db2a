"""serve-bench's option checks: every value that would only fail after a launch (or measure
nothing) is refused first, in one line (exit 2)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pcieprof.analysis.box import Box
from pcieprof.cards import ModelCard
from pcieprof.errors import BadInput
from pcieprof.refserver.args import ArgsError, parse_injection
from pcieprof.serve.sglang_cmd import LaunchConfig
from pcieprof.serve.sweep import SweepEntry

def ints(text: str, what: str) -> tuple[int, ...]:
    """Comma-separated integers of at least 1; `0`, `none` or nothing is ()."""
    if text.strip().lower() in ("", "none", "0"):
        return ()
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BadInput(f"{what} {text!r}: give comma-separated integers, e.g. 1,4,16,64") from None
    if any(v < 1 for v in vals):
        raise BadInput(f"{what} values must be at least 1")
    return vals


#: Descriptors this process holds besides the client's connections: the server's pipes and log,
#: the bundle's files, Python's own (an assumed margin, not a measured count).
FD_MARGIN = 256


def _room_for_connections(concurrency: int) -> None:
    """Make room for `concurrency` open connections before anything is launched: raise this
    process's open-file soft limit (RLIMIT_NOFILE) up to its hard limit where needed, or refuse
    (BadInput) a level the hard limit cannot hold; past it every further request would fail
    with the client's own "Too many open files"."""
    import resource  # POSIX only; serve-bench runs on Linux

    need = concurrency + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        raise BadInput(f"--concurrency {concurrency}: needs about {need} open files, more than "
                       f"this process may open ({hard}: ulimit -Hn)",
                       hint="lower --concurrency, or raise the limit (ulimit -n, limits.conf)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    """--env KEY=VALUE pairs as a dict."""
    out = {}
    for p in pairs:
        if "=" not in p:
            raise BadInput(f"--env {p!r}: use KEY=VALUE")
        k, v = p.split("=", 1)
        out[k] = v
    return out


def check_modes(kw: dict[str, Any]) -> None:
    """Options that exclude or need each other."""
    if kw["sweep"] and kw["sweep_file"] is not None:
        raise BadInput("--sweep (the launch search) and --sweep-file (a fixed list) exclude "
                       "each other")
    if kw["resume"] and not kw["sweep"]:
        raise BadInput("--resume continues a launch search: give --sweep too")
    if kw["resume"] and not kw["out"]:
        raise BadInput("--resume needs --out: the bundle of the search to continue")
    if kw["url"] and (kw["sweep"] or kw["sweep_file"]):
        raise BadInput("--url attaches to a running server: nothing to launch or search")
    if kw["max_attempts"] < 1:
        raise BadInput("--max-attempts must be at least 1")
    if kw["arch"] is not None and not re.fullmatch(r"sm\d{2,3}", kw["arch"]):
        raise BadInput(f"--arch {kw['arch']!r}: give a compute capability as smXY (sm120 for "
                       f"RTX PRO 6000 Blackwell, sm100 for B200, sm90 for H100/H200)")


def check_values(card: ModelCard, kw: dict[str, Any]) -> None:
    """Option values that would only fail after a launch (or measure nothing), checked first."""
    if kw["inject"]:
        try:
            parse_injection(kw["inject"])
        except ArgsError as exc:
            raise BadInput(f"--inject {kw['inject']!r}: {str(exc).split(': ', 1)[-1]}") from None
    if kw["port"] is not None and not 0 < kw["port"] < 65536:
        raise BadInput(f"--port {kw['port']}: give a TCP port, 1-65535")
    levels = ints(kw["concurrency"], "--concurrency")
    if not levels:  # `0` or `none` is no level at all, not the default ones
        raise BadInput(f"--concurrency {kw['concurrency']!r}: give levels of at least 1, e.g. "
                       "1,4,16,64")
    _room_for_connections(max(levels))
    ints(kw["decode_batches"], "--decode-batches")
    rate = kw["request_rate"]
    if rate is not None and not rate > 0:  # NaN fails too
        raise BadInput(f"--request-rate {rate}: must be > 0 requests/s (inf sends all at once)")
    for name in ("input_len", "output_len", "decode_output_len", "probe_tokens", "profile_steps"):
        if kw[name] < 1:
            raise BadInput(f"--{name.replace('_', '-')} must be at least 1")
    if kw["num_requests"] is not None and kw["num_requests"] < 1:
        raise BadInput("--num-requests must be at least 1")
    if kw["warmup"] < 0:
        raise BadInput("--warmup must be 0 or more")
    for name in ("request_timeout", "startup_timeout", "probe_timeout"):
        if kw[name] is not None and not kw[name] > 0:
            raise BadInput(f"--{name.replace('_', '-')} must be > 0 seconds")
    if kw["stall_timeout"] is not None and not kw["stall_timeout"] >= 0:
        raise BadInput("--stall-timeout must be 0 (off) or more seconds")
    if kw["url"]:
        return  # the attached server's context is its own
    context = _context_length(card, kw["server_args"])
    need = kw["input_len"] + kw["output_len"]
    if context and need > context:
        raise BadInput(f"--input-len {kw['input_len']} + --output-len {kw['output_len']} = "
                       f"{need} tokens exceed {card.name}'s context of {context} tokens: every "
                       f"request would be refused",
                       hint="shorten them, or raise the server's --context-length after --")


def _context_length(card: ModelCard, server_args: tuple[str, ...]) -> int:
    """The context the server will have: `--context-length N` after `--`, else the card's."""
    args = list(server_args)
    for i, a in enumerate(args):
        value = a.split("=", 1)[1] if a.startswith("--context-length=") else (
            args[i + 1] if a == "--context-length" and i + 1 < len(args) else None)
        if value is not None:
            return int(value) if value.isdigit() else 0
    return card.max_context


def check_gpu_count(card: ModelCard, cfg: LaunchConfig, seen: tuple[Box | None, str], *,
                    elsewhere: bool, dry_run: bool, what: str = "") -> str | None:
    """The launch's GPUs per node against this machine's (NVML): refused (BadInput) when it
    needs more than NVML sees here and the server would start here; otherwise a note, or None
    when they fit.

    SGLang takes tp x pp GPUs per replica, times dp without --enable-dp-attention (the data
    parallel controller starts dp schedulers of tp x pp GPUs each; with DP attention dp lives
    inside the TP group: sglang/srt/managers/data_parallel_controller.py), split over --nnodes.

    Args:
        card: the model card (its default TP when none is given).
        cfg: the launch configuration (its tp/pp/dp/nnodes).
        seen: launch_arch.local_box()'s answer: (this machine's GPUs, "") or (None, why not).
        elsewhere: --launch-prefix runs the server (maybe on another machine): the local GPUs
            do not decide.
        dry_run: nothing is launched.
        what: the configuration's name, leading the line (a --sweep-file entry), or "".
    """
    tp = cfg.tp or card.sglang.tp_default
    replicas = cfg.dp if cfg.dp and cfg.dp > 1 and not cfg.dp_attention else 1
    need = tp * (cfg.pp or 1) * replicas // max(cfg.nnodes, 1)
    layout = (f"{what}: " if what else "") + " ".join(
        f"--{k} {v}" for k, v in (("tp", tp), ("pp", cfg.pp), ("dp", cfg.dp))
        if v and (k == "tp" or v > 1))
    nodes = f" over {cfg.nnodes} nodes" if cfg.nnodes > 1 else ""
    per = " per node" if cfg.nnodes > 1 else ""
    box, why = seen
    if box is None:
        return (f"{layout}{nodes} needs {need} GPUs{per}: not checked against this machine "
                f"(no GPU seen: {why})")
    if need <= box.gpus:
        return None
    said = (f"{layout}{nodes} needs {need} GPUs{per}; this machine has {box.gpus} (NVML)")
    if elsewhere:
        return f"{said}: --launch-prefix starts the server, so its machine's GPUs decide"
    if dry_run:
        return f"{said}: this launch would be refused here"
    raise BadInput(said, hint=f"lower --tp to at most {box.gpus}, or --launch-prefix to run "
                              "the server where the GPUs are")


def check_sweep_gpu_count(card: ModelCard, entries: list[SweepEntry],
                          seen: tuple[Box | None, str], *, elsewhere: bool, dry_run: bool,
                          source: Path) -> list[str]:
    """`check_gpu_count` for each configuration of a --sweep-file, before any is launched:
    the first that needs more GPUs than this machine has is refused (BadInput, exit 2: one
    line naming it); the notes of the others (one per configuration that says something)."""
    notes = []
    for i, e in enumerate(entries):
        what = f"--sweep-file {source.name} entry {i} ({e.config.name})"
        note = check_gpu_count(card, e.config, seen, elsewhere=elsewhere, dry_run=dry_run,
                               what=what)
        if note:
            notes.append(note)
    return notes
