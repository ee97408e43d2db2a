"""The SGLang (or reference-server) command line, built as an argv list from a card and a config.

Flags are written in the spelling of the pinned SGLang release (`PINNED_SGLANG`, read from its own
parser: `sglang.srt.server_args.ServerArgs.add_cli_args`). SGLang renames flags between releases,
so when an SGLang parser can be read (the installed sglang, or a parser-only install named by
`PCIEPROF_SGLANG_PATH`), every flag is checked against it: a renamed flag is translated to the
spelling that release knows (with a note), a flag it does not know at all is refused in one line.

Renames handled (old spelling <-> new spelling, verified in sgl-project/sglang):
  --nsa-prefill-backend / --nsa-decode-backend  <->  --dsa-prefill-backend / --dsa-decode-backend
  --attention-backend nsa                       <->  --attention-backend dsa
  --cuda-graph-max-bs                           <->  --cuda-graph-max-bs-decode
  --disable-cuda-graph                          <->  --cuda-graph-backend-decode disabled
                                                     --cuda-graph-backend-prefill disabled
  --dp-size N --enable-dp-attention             <->  --attn-dp-size N
  --enable-flashinfer-allreduce-fusion          <->  --flashinfer-allreduce-fusion-backend auto
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pcieprof.bundle.serve_command import RecordedCommand
from pcieprof.cards import LaunchTarget, ModelCard
from pcieprof.errors import BadInput, EnvironmentMissing
from pcieprof.redact import redact

#: The SGLang release whose flag spelling the builder writes and the parser test pins.
PINNED_SGLANG = "0.5.23"
#: Where .ci/run installs the pinned release's parser (pip --no-deps --target); overridable.
DEFAULT_SGLANG_PATH = Path.home() / ".cache" / "pcieprof" / f"sglang-{PINNED_SGLANG}"
SGLANG_PATH_ENV = "PCIEPROF_SGLANG_PATH"

#: A given setting -> the card settings it makes moot, left out of the server's environment so
#: that a command says one thing. NCCL reads NCCL_P2P_DISABLE before NCCL_P2P_LEVEL (ncclGetLevel,
#: called from ncclTopoCheckP2p in NVIDIA/nccl src/graph/paths.cc): with P2P disabled the level
#: is never read.
SUPERSEDES: dict[tuple[str, str], tuple[str, ...]] = {
    ("NCCL_P2P_DISABLE", "1"): ("NCCL_P2P_LEVEL",),
}


def server_env_of(card_env: dict[str, str], given: dict[str, str]) -> dict[str, str]:
    """The environment a command sets: the card's, less what `given` makes moot, then `given`."""
    moot = {m for (k, v), names in SUPERSEDES.items() if given.get(k) == v for m in names}
    return {**{k: v for k, v in card_env.items() if k not in moot}, **given}

# Environment variables passed through from the user's shell to the server (recorded).
PASSTHROUGH_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_", "TORCH_", "NVIDIA_", "GLOO_", "OMP_",
                        "FLASHINFER_", "PYTORCH_", "HF_")


@dataclass(frozen=True)
class LaunchConfig:
    """What to launch: parallel layout, backend choices and extras.

    Empty strings / None mean "leave it to the card, then to the server's default".

    Attributes:
        name: a label for this config (sweep entries are named).
        tp, ep, pp, dp: tensor, expert, pipeline and data parallel sizes.
        dp_attention: data-parallel attention (written as --attn-dp-size dp in SGLang >= 0.5.23).
        attention_backend: --attention-backend.
        dsa_prefill_backend, dsa_decode_backend: DSA (formerly NSA) backends.
        fp8_gemm_backend, fp4_gemm_backend, moe_runner_backend: GEMM / MoE kernels.
        kv_cache_dtype: --kv-cache-dtype.
        cuda_graph: False disables CUDA graphs for decode and prefill.
        extra_args: further argv tokens, appended last.
        env: extra environment for the server.
        card_backends: False leaves the card's own --attention-backend out too (a GPU
            architecture the card has no launch evidence for: SGLang chooses).
        inject: reference server only: a fault to inject (`nan-after 20`, `hang`, `crash-on-start`).
        model_path: overrides the card's checkpoint.
        host, port: where the server binds.
        nnodes, node_rank, dist_init_addr: multi-node (one server per node).
    """

    name: str = "default"
    tp: int | None = None
    ep: int | None = None
    pp: int | None = None
    dp: int | None = None
    dp_attention: bool = False
    attention_backend: str = ""
    dsa_prefill_backend: str = ""
    dsa_decode_backend: str = ""
    fp8_gemm_backend: str = ""
    fp4_gemm_backend: str = ""
    moe_runner_backend: str = ""
    kv_cache_dtype: str = ""
    cuda_graph: bool = True
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    card_backends: bool = True
    inject: str = ""
    model_path: str = ""
    host: str = "127.0.0.1"
    # SGLang 0.5.23's default (sglang/srt/arg_groups/fields/serving.py: port = 30000): the one
    # port every printed command (dry run, recommend, report) shows
    port: int = 30000
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str = ""

    def with_(self, **changes: Any) -> "LaunchConfig":
        """A copy with some fields changed."""
        return replace(self, **changes)

    def with_axes(self, axes: dict[str, str], name: str) -> "LaunchConfig":
        """A copy with a launch search's axis values (pcieprof.tune.space: field names, "" for
        unset; `cuda_graph` "on"/"off"); fields the search has no axis for stay as they are."""
        changes: dict[str, Any] = {"name": name}
        for axis, value in axes.items():
            changes[axis] = value != "off" if axis == "cuda_graph" else value
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (for attempts.jsonl)."""
        d = asdict(self)
        d["extra_args"] = list(self.extra_args)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "LaunchConfig":
        """Inverse of `to_json`; unknown keys are an error (BadInput)."""
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise BadInput(f"launch config has unknown keys {sorted(unknown)}",
                           hint=f"known: {', '.join(sorted(known))}")
        d = dict(d)
        if "extra_args" in d:
            d["extra_args"] = tuple(str(x) for x in d["extra_args"])
        if "env" in d:
            d["env"] = {str(k): str(v) for k, v in d["env"].items()}
        return cls(**d)


@dataclass(frozen=True)
class LaunchPrefix:
    """How the server is started where it runs: `docker run ... IMAGE`, `srun ...`, `ssh host`.

    The server command (with its environment as `env K=V ...`, since a container or a remote
    shell does not inherit this one's) goes after the prefix's words, or in place of a `{cmd}`
    word as one shell-quoted string (`ssh gpu01 {cmd}`, `bash -lc {cmd}`). `ssh` without `{cmd}`
    gets the string form too, since ssh hands its arguments to a remote shell.

    Attributes:
        words: the prefix, split as a shell would.
    """

    words: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> "LaunchPrefix | None":
        """The prefix from `--launch-prefix` text (None for empty text).

        Raises:
            BadInput: text a shell could not split.
        """
        if not text.strip():
            return None
        try:
            return cls(tuple(shlex.split(text)))
        except ValueError as exc:
            raise BadInput(f"--launch-prefix {text!r}: {exc}") from None

    def wrap(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """The argv to execute: `argv` (with `env`) run through the prefix."""
        inner = (["env", *[f"{k}={v}" for k, v in sorted(env.items())]] if env else []) + argv
        if any("{cmd}" in w for w in self.words):
            return [w.replace("{cmd}", shlex.join(inner)) for w in self.words]
        if Path(self.words[0]).name == "ssh":
            return [*self.words, shlex.join(inner)]
        return [*self.words, *inner]

    def text(self) -> str:
        return shlex.join(self.words)


@dataclass(frozen=True)
class ServerCommand:
    """An exact server command: argv (never a shell string) and the environment it adds.

    Attributes:
        argv: the server command itself: `python3 -m sglang.launch_server ...` (for the reference
            server without a prefix: this interpreter's path, since it is pcieprof's own module).
        env: variables set for the server on top of the inherited environment (recorded).
        notes: translations and checks applied (one line each).
        checked_against: SGLang version whose parser checked argv, or None.
        reference: True when this starts pcieprof's reference server, not SGLang.
        prefix: how it is started where it runs (None: here, as a child process).
    """

    argv: list[str]
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)
    checked_against: str | None = None
    reference: bool = False
    prefix: LaunchPrefix | None = None

    def exec_argv(self) -> list[str]:
        """What is executed: `argv`, through the launch prefix when there is one."""
        return self.prefix.wrap(self.argv, self.env) if self.prefix else list(self.argv)

    def shell(self) -> str:
        """The command as one copy-pasteable shell line, secrets masked (for display only;
        never executed)."""
        if self.prefix:
            return shlex.join(redact(self.exec_argv()))
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact(self.env).items()))
        return (envs + " " if envs else "") + shlex.join(redact(self.argv))

    def record(self, recorded_env: dict[str, str] | None = None) -> RecordedCommand:
        """The command as it is recorded (serve/command.json with `recorded_env`, attempts.jsonl
        without): secrets masked; the process itself gets `exec_argv()` and `server_env()`."""
        return RecordedCommand(
            argv=redact(list(self.argv)), env=redact(dict(self.env)),
            notes=redact(list(self.notes)),
            checked_against=redact(self.checked_against) if self.checked_against else None,
            reference=self.reference,
            prefix=redact(list(self.prefix.words)) if self.prefix else None,
            exec_argv=redact(self.exec_argv()), recorded_env=recorded_env)


# -- building -----------------------------------------------------------------------------------


#: The interpreter SGLang's documentation launches it with; it is resolved where it runs.
SGLANG_PYTHON = "python3"


def build_command(card: ModelCard, cfg: LaunchConfig, *, python: str | None = None,
                  parser: "ParserSpec | None" = None,
                  prefix: LaunchPrefix | None = None,
                  target: LaunchTarget | None = None) -> ServerCommand:
    """The server command for `card` with `cfg`, in the pinned SGLang spelling.

    Args:
        card: the model card (its `sglang` facts give module, quantization, flags, env).
        cfg: layout, backends and extras.
        python: interpreter for argv[0] (default: `python3` for SGLang, as its documentation
            writes it; this interpreter for the reference server run here).
        parser: an SGLang parser to check and translate the flags against (see `load_parser`);
            None leaves them unchecked (and says so in `notes`).
        prefix: how the server is started where it runs (docker, srun, ssh).
        target: the box the server runs on (architecture, fabric): the card's box settings
            (flags and environment for some boxes only) are set where their conditions hold
            there; None (unknown) sets none of them, and the notes say which were left out.

    Raises:
        BadInput: impossible settings, or a flag the given SGLang parser does not know.
    """
    facts = card.sglang
    tp = cfg.tp if cfg.tp is not None else facts.tp_default
    _check_layout(tp, cfg)
    if facts.is_reference:
        if cfg.nnodes > 1:
            raise BadInput("the reference server runs on one node (--nnodes 1)")
        argv = [python or (SGLANG_PYTHON if prefix else sys.executable), "-m",
                facts.launch_module, *_reference_args(card, cfg, tp)]
        env = server_env_of(facts.env, cfg.env)
        return ServerCommand(argv=argv, env=env, notes=["pcieprof reference server (not SGLang)"],
                             reference=True, prefix=prefix)
    argv = [python or SGLANG_PYTHON, "-m", facts.launch_module]
    model = cfg.model_path or facts.model_path or (card.hf_checkpoints[0] if card.hf_checkpoints else "")
    if not model:
        raise BadInput(f"card {card.name} names no checkpoint", hint="pass --model-path")
    a: list[str] = ["--model-path", model, "--tp-size", str(tp)]
    if cfg.ep and cfg.ep > 1:
        a += ["--ep-size", str(cfg.ep)]
    if cfg.pp and cfg.pp > 1:
        a += ["--pp-size", str(cfg.pp)]
    if cfg.dp and cfg.dp > 1:
        # SGLang 0.5.23: "--dp-size N --enable-dp-attention" is deprecated for "--attn-dp-size N".
        a += ["--attn-dp-size", str(cfg.dp)] if cfg.dp_attention else ["--dp-size", str(cfg.dp)]
    if facts.quantization:
        a += ["--quantization", facts.quantization]
    kv = cfg.kv_cache_dtype or facts.kv_cache_dtype
    if kv:
        a += ["--kv-cache-dtype", kv]
    att = cfg.attention_backend or (facts.attention_backend if cfg.card_backends else "")
    if att:
        a += ["--attention-backend", att]
    for flag, value in (("--dsa-prefill-backend", cfg.dsa_prefill_backend),
                        ("--dsa-decode-backend", cfg.dsa_decode_backend),
                        ("--fp8-gemm-backend", cfg.fp8_gemm_backend),
                        ("--fp4-gemm-backend", cfg.fp4_gemm_backend),
                        ("--moe-runner-backend", cfg.moe_runner_backend)):
        if value:
            a += [flag, value]
    if not cfg.cuda_graph:
        a += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    if cfg.nnodes > 1:
        if not cfg.dist_init_addr:
            raise BadInput("--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address)")
        a += ["--nnodes", str(cfg.nnodes), "--node-rank", str(cfg.node_rank),
              "--dist-init-addr", cfg.dist_init_addr]
    a += ["--host", cfg.host, "--port", str(cfg.port)]
    fit = facts.for_box(target)
    a += _merge_flags(list(fit.flags), list(cfg.extra_args), a)
    env = server_env_of(fit.env, cfg.env)
    notes: list[str] = list(fit.unknown)
    checked = None
    if parser is not None:
        a, translated = parser.reconcile(a)
        notes += translated
        checked = parser.version
    else:
        notes.append(f"flags in SGLang {PINNED_SGLANG} spelling; not checked (no SGLang parser "
                     f"importable: install sglang or set {SGLANG_PATH_ENV})")
    return ServerCommand(argv=argv + a, env=env, notes=notes, checked_against=checked,
                         prefix=prefix)


def _check_layout(tp: int, cfg: LaunchConfig) -> None:
    for name, v in (("tp", tp), ("ep", cfg.ep), ("pp", cfg.pp), ("dp", cfg.dp)):
        if v is not None and v < 1:
            raise BadInput(f"--{name} must be >= 1 (got {v})")
    if cfg.ep and cfg.ep > 1 and tp % cfg.ep:
        raise BadInput(f"--ep {cfg.ep} must divide --tp {tp} (SGLang runs EP inside the TP group)")
    if cfg.dp_attention and not (cfg.dp and cfg.dp > 1):
        raise BadInput("--enable-dp-attention needs --dp > 1")
    if cfg.nnodes < 1 or not 0 <= cfg.node_rank < cfg.nnodes:
        raise BadInput(f"--node-rank {cfg.node_rank} is not in 0..{cfg.nnodes - 1}")


def _merge_flags(card_flags: list[str], user: list[str], already: list[str]) -> list[str]:
    """Card flags then user extras; a flag the user gives (or the builder set) wins over the card's."""
    user_opts = {t.split("=", 1)[0] for t in user if t.startswith("--")}
    set_opts = {t for t in already if t.startswith("--")}
    out: list[str] = []
    i = 0
    while i < len(card_flags):
        tok = card_flags[i]
        j = i + 1
        while j < len(card_flags) and not card_flags[j].startswith("--"):
            j += 1
        if tok.split("=", 1)[0] not in user_opts | set_opts:
            out += card_flags[i:j]
        i = j
    return out + user


def _reference_args(card: ModelCard, cfg: LaunchConfig, tp: int) -> list[str]:
    a = ["--tp-size", str(tp), "--host", cfg.host, "--port", str(cfg.port)]
    if cfg.inject:
        a += ["--inject", cfg.inject]
    # SGLang's backend flags, as SGLang would get them: the reference server ignores them, but
    # its --inject-matrix fails by them (a launch search is tested that way).
    for flag, value in _backend_flags(cfg):
        a += [flag, value]
    if not cfg.cuda_graph:
        a += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    return a + list(card.sglang.recommended_flags) + list(cfg.extra_args)


def _backend_flags(cfg: LaunchConfig) -> list[tuple[str, str]]:
    return [(flag, value) for flag, value in (
        ("--attention-backend", cfg.attention_backend),
        ("--dsa-prefill-backend", cfg.dsa_prefill_backend),
        ("--dsa-decode-backend", cfg.dsa_decode_backend),
        ("--fp8-gemm-backend", cfg.fp8_gemm_backend),
        ("--fp4-gemm-backend", cfg.fp4_gemm_backend),
        ("--moe-runner-backend", cfg.moe_runner_backend),
        ("--kv-cache-dtype", cfg.kv_cache_dtype)) if value]


def server_env(cmd: ServerCommand, base: dict[str, str] | None = None) -> dict[str, str]:
    """The full environment to start the server with: the inherited one plus `cmd.env`."""
    env = dict(os.environ if base is None else base)
    env.update(cmd.env)
    return env


def recorded_env(cmd: ServerCommand, base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables worth recording: the command's own plus inherited NCCL_*, SGLANG_*, CUDA_*
    ..., secrets masked."""
    env = dict(os.environ if base is None else base)
    out = {k: v for k, v in env.items() if k.startswith(PASSTHROUGH_PREFIXES)}
    out.update(cmd.env)
    return redact(dict(sorted(out.items())))


# -- SGLang's own parser ------------------------------------------------------------------------

# (old tokens, new tokens): renames that carry the value over unchanged.
_VALUE_RENAMES: list[tuple[str, str]] = [
    ("--nsa-prefill-backend", "--dsa-prefill-backend"),
    ("--nsa-decode-backend", "--dsa-decode-backend"),
    ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
]
# attention backend values renamed: old -> new
_VALUE_ALIASES = {"--attention-backend": {"nsa": "dsa"}}


@dataclass
class ParserSpec:
    """The option table of one SGLang release's argument parser.

    Attributes:
        version: the SGLang version it came from.
        options: option string -> {dest, nargs, choices, action, new_flag}.
        source: where it was read (a path).
    """

    version: str
    options: dict[str, dict[str, Any]]
    source: str = ""

    def knows(self, flag: str) -> bool:
        return flag in self.options

    def deprecated(self, flag: str) -> bool:
        return "Deprecated" in str(self.options.get(flag, {}).get("action", ""))

    def reconcile(self, args: list[str]) -> tuple[list[str], list[str]]:
        """Translate renamed flags to this release's spelling; refuse unknown ones.

        Args:
            args: server arguments (without the interpreter and module).

        Returns:
            (args in this release's spelling, one note per translation).

        Raises:
            BadInput: a flag this release does not know and no rename covers.
        """
        notes: list[str] = []
        toks = _split_equals(args)
        toks = self._translate_dp_attention(toks, notes)
        toks = self._translate_cuda_graph(toks, notes)
        toks = self._translate_fusion(toks, notes)
        out: list[str] = []
        for i, tok in enumerate(toks):
            if not tok.startswith("--"):
                out.append(tok)
                continue
            flag = tok
            if not self.knows(flag):
                renamed = self._renamed(tok)
                if renamed is None:
                    raise BadInput(f"SGLang {self.version} does not know {tok}",
                                   hint=f"checked against its own parser ({self.source}); "
                                        f"drop it or spell it as that release does")
                flag = renamed
                notes.append(f"{tok} -> {flag} (SGLang {self.version} spelling)")
            elif self.deprecated(flag):
                newf = self.options[flag].get("new_flag")
                notes.append(f"{flag} is deprecated in SGLang {self.version}"
                             + (f"; use {newf}" if newf else ""))
            out.append(flag)
            if flag in _VALUE_ALIASES and i + 1 < len(toks):
                choices = self.options[flag].get("choices") or []
                val = toks[i + 1]
                for old, new in _VALUE_ALIASES[flag].items():
                    if val == new and choices and new not in choices and old in choices:
                        toks[i + 1] = old
                        notes.append(f"{flag} {new} -> {old} (SGLang {self.version} spelling)")
            choices = self.options[flag].get("choices")
            nargs = self.options[flag].get("nargs")
            if choices and nargs in (None, "?") and i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                if toks[i + 1] not in [str(c) for c in choices]:
                    raise BadInput(f"SGLang {self.version}: {flag} {toks[i + 1]!r} is not one of "
                                   f"{', '.join(map(str, choices))}")
        return out, notes

    def _renamed(self, flag: str) -> str | None:
        for old, new in _VALUE_RENAMES:
            if flag == old and self.knows(new):
                return new
            if flag == new and self.knows(old):
                return old
        return None

    def _translate_dp_attention(self, toks: list[str], notes: list[str]) -> list[str]:
        if "--attn-dp-size" in toks and not self.knows("--attn-dp-size") and self.knows("--enable-dp-attention"):
            i = toks.index("--attn-dp-size")
            n = toks[i + 1]
            toks = toks[:i] + ["--dp-size", n, "--enable-dp-attention"] + toks[i + 2:]
            notes.append(f"--attn-dp-size {n} -> --dp-size {n} --enable-dp-attention "
                         f"(SGLang {self.version} spelling)")
        elif "--enable-dp-attention" in toks and self.knows("--attn-dp-size"):
            toks = [t for t in toks if t != "--enable-dp-attention"]
            if "--dp-size" in toks:
                i = toks.index("--dp-size")
                n = toks[i + 1]
                toks = toks[:i] + ["--attn-dp-size", n] + toks[i + 2:]
                notes.append(f"--dp-size {n} --enable-dp-attention -> --attn-dp-size {n} "
                             f"(SGLang {self.version} spelling)")
        return toks

    def _translate_cuda_graph(self, toks: list[str], notes: list[str]) -> list[str]:
        new = ["--cuda-graph-backend-decode", "--cuda-graph-backend-prefill"]
        if "--disable-cuda-graph" in toks and all(self.knows(f) for f in new):
            toks = [t for t in toks if t != "--disable-cuda-graph"]
            for f in new:
                if f not in toks:
                    toks += [f, "disabled"]
            notes.append("--disable-cuda-graph -> --cuda-graph-backend-{decode,prefill} disabled "
                         f"(SGLang {self.version} spelling)")
        elif any(f in toks for f in new) and not all(self.knows(f) for f in new) \
                and self.knows("--disable-cuda-graph"):
            out: list[str] = []
            skip = False
            for i, t in enumerate(toks):
                if skip:
                    skip = False
                    continue
                if t in new:
                    skip = True
                    continue
                out.append(t)
            out.append("--disable-cuda-graph")
            notes.append("--cuda-graph-backend-{decode,prefill} disabled -> --disable-cuda-graph "
                         f"(SGLang {self.version} spelling)")
            toks = out
        return toks

    def _translate_fusion(self, toks: list[str], notes: list[str]) -> list[str]:
        old, new = "--enable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend"
        if old in toks and self.deprecated_by_help(old) and self.knows(new):
            i = toks.index(old)
            toks = toks[:i] + [new, "auto"] + toks[i + 1:]
            notes.append(f"{old} -> {new} auto (SGLang {self.version} spelling)")
        elif new in toks and not self.knows(new) and self.knows(old):
            i = toks.index(new)
            toks = toks[:i] + [old] + toks[i + 2:]
            notes.append(f"{new} -> {old} (SGLang {self.version} spelling)")
        return toks

    def choices(self, flags: list[str]) -> dict[str, list[str] | None]:
        """flag -> the values this release accepts (None: any value), for the flags it knows
        under this or a renamed spelling; flags it does not know are left out."""
        out: dict[str, list[str] | None] = {}
        for flag in flags:
            known = flag if self.knows(flag) else self._renamed(flag)
            if known is None:
                continue
            ch = self.options[known].get("choices")
            out[flag] = [str(c) for c in ch] if ch else None
        return out

    def deprecated_by_help(self, flag: str) -> bool:
        return "deprecated" in str(self.options.get(flag, {}).get("help", "")).lower()[:40]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "source": self.source, "options": self.options}


def _split_equals(args: list[str]) -> list[str]:
    out: list[str] = []
    for t in args:
        if t.startswith("--") and "=" in t:
            out += t.split("=", 1)
        else:
            out.append(t)
    return out


def sglang_search_path() -> str | None:
    """The parser-only SGLang install to use: $PCIEPROF_SGLANG_PATH, else the default if present."""
    p = os.environ.get(SGLANG_PATH_ENV)
    if p:
        return p
    return str(DEFAULT_SGLANG_PATH) if DEFAULT_SGLANG_PATH.is_dir() else None


def load_parser(path: str | None = None, *, python: str | None = None,
                timeout_s: float = 120.0) -> ParserSpec | None:
    """Read SGLang's own argument parser, in a subprocess so its imports stay out of this one.

    Args:
        path: a directory holding an `sglang` package (pip --target install) to put first on
            PYTHONPATH; None tries the interpreter's own sglang, then `sglang_search_path()`.
        python: interpreter to run (default: this one).
        timeout_s: how long building the parser may take.

    Returns:
        The parser's option table, or None when sglang cannot be imported there.
    """
    candidates = [path] if path else [None, sglang_search_path()]
    for cand in candidates:
        if cand is None and path is None and not _has_module("sglang"):
            continue
        spec, _why = _dump_parser(cand, python=python, timeout_s=timeout_s)
        if spec is not None:
            return spec
    return None


def load_parser_in(prefix: LaunchPrefix, *, timeout_s: float = 300.0
                   ) -> tuple[ParserSpec | None, str]:
    """Read the parser of the SGLang that the launch prefix runs (`python3` inside it).

    Returns:
        (the option table, "") or (None, why it could not be read: one line).
    """
    return _dump_parser(None, python=SGLANG_PYTHON, timeout_s=timeout_s, prefix=prefix)


def parse_many_with_sglang(arg_lists: list[list[str]], path: str | None = None, *,
                           python: str | None = None,
                           timeout_s: float = 120.0) -> list[dict[str, Any] | str]:
    """Parse several argument lists in one child (building the parser costs seconds).

    Returns:
        Per list: the parsed namespace as a dict, or the parser's error message (str).

    Raises:
        EnvironmentMissing: sglang cannot be imported.
    """
    if path is None and not _has_module("sglang"):
        path = sglang_search_path()
    out, _why = _run_probe(["parse", json.dumps(arg_lists)], path, python=python,
                           timeout_s=timeout_s)
    if out is None:
        raise EnvironmentMissing("sglang is not importable",
                                 hint=f"pip install sglang or set {SGLANG_PATH_ENV}")
    return [r["namespace"] if "namespace" in r else f"SGLang {out['version']}: {r['error']}"
            for r in out["results"]]


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _dump_parser(path: str | None, *, python: str | None, timeout_s: float,
                 prefix: LaunchPrefix | None = None) -> tuple[ParserSpec | None, str]:
    out, why = _run_probe(["dump"], path, python=python, timeout_s=timeout_s, prefix=prefix)
    if out is None:
        return None, why
    where = f"inside {prefix.text()}" if prefix else (path or "installed sglang")
    return ParserSpec(version=str(out["version"]), options=out["options"],
                      source=str(out.get("source", where)) + (f" ({where})" if prefix else "")), ""


def _run_probe(cmd: list[str], path: str | None, *, python: str | None, timeout_s: float,
               prefix: LaunchPrefix | None = None) -> tuple[dict[str, Any] | None, str]:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = [python or sys.executable, "-c", _PROBE, *cmd]
    if prefix:
        argv = prefix.wrap(argv)
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except OSError as exc:
        return None, f"{argv[0]}: {exc.strerror or exc}"
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout_s:g} s"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        what = "sglang is not importable there" if proc.returncode == 3 else \
            f"exit {proc.returncode}" + (f": {tail}" if tail else "")
        return None, what
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, "its output was not the parser's table"


# Runs in a child interpreter. `import sglang` would run sglang/__init__.py, which pulls in the
# whole runtime (torch, triton kernels, tokenizers); the parser lives in sglang.srt.server_args,
# so the package object is created by hand and only that module's own imports are needed.
_PROBE = r"""
import argparse, contextlib, importlib.util, io, json, sys, types
spec = importlib.util.find_spec("sglang")
if spec is None or not spec.submodule_search_locations:
    sys.exit(3)
root = list(spec.submodule_search_locations)[0]
pkg = types.ModuleType("sglang"); pkg.__path__ = [root]; sys.modules["sglang"] = pkg
version = "unknown"
try:
    vs = {}
    exec(open(root + "/version.py").read(), vs)
    version = vs.get("__version__", version)
except OSError:
    pass
with contextlib.redirect_stdout(io.StringIO()):
    from sglang.srt.server_args import ServerArgs
    p = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(p)
def jsonable(x):
    try:
        json.dumps(x); return x
    except TypeError:
        return str(x)
if sys.argv[1] == "dump":
    opts = {}
    for a in p._actions:
        for s in a.option_strings:
            opts[s] = {"dest": a.dest, "nargs": jsonable(a.nargs),
                       "choices": [jsonable(c) for c in a.choices] if a.choices else None,
                       "action": type(a).__name__, "new_flag": getattr(a, "new_flag", None),
                       "help": (a.help or "")[:200]}
    print(json.dumps({"version": version, "source": root, "options": opts}))
else:
    results = []
    for args in json.loads(sys.argv[2]):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ns = p.parse_args(args)
        except SystemExit:
            results.append({"error": " ".join(err.getvalue().strip().splitlines()[-1:])})
        except argparse.ArgumentError as exc:
            results.append({"error": str(exc)})
        else:
            results.append({"namespace": {k: jsonable(v) for k, v in vars(ns).items()}})
    print(json.dumps({"version": version, "results": results}))
"""
