"""serve/command.json: the server command serve-bench launched first, as recorded (secrets
masked); each attempt of serve/attempts.jsonl holds the same shape under `command`.

The process itself is started from pcieprof.serve.sglang_cmd.ServerCommand (exec_argv and the
server's environment unmasked); this is what the bundle keeps of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pcieprof.bundle.document import Document


@dataclass
class RecordedCommand(Document):
    """serve/command.json (no format tag: the file never had one).

    Attributes:
        argv: the server command (argv[0] is `python3` for SGLang).
        env: the variables the command sets for the server.
        notes: why the command is as it is (flags left out, renamed, added).
        checked_against: the SGLang version whose parser checked argv, or None.
        reference: True when it starts pcieprof's reference server, not SGLang.
        prefix: the words it was started through (`docker run ... IMAGE`), or None.
        exec_argv: what was executed (argv through the prefix).
        recorded_env: the command's variables and the inherited NCCL_*, SGLANG_*, CUDA_* ...
            (serve/command.json only; None in attempts.jsonl).
    """

    FILE = "serve/command.json"

    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    checked_against: str | None = None
    reference: bool = False
    prefix: list[str] | None = None
    exec_argv: list[str] = field(default_factory=list)
    recorded_env: dict[str, str] | None = None
