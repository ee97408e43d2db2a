"""serve/search.json: serve-bench's launch search (`--sweep`), written after every attempt.

What was tried in which order and why, how each attempt ended and the log line that decided it,
what the failures taught (values excluded, axes exhausted), and the configuration that served
correct tokens, as a command ready to paste. Built by pcieprof.tune.search.search_document,
written by pcieprof.serve.run after every attempt (through the plan the command gives it); read by the tuner (the SGLang command of the layouts)
and the report (the attempts table).

    doc = bundle.read_doc(ServeSearch)
    if doc.winner:                      # the configuration that served correct tokens
        doc.winner.command              # one shell line, ready to paste (python3 -m sglang...)
    else:
        doc.status, doc.why             # exhausted | stopped | running | interrupted
    for a in doc.attempts:              # config, class, deciding log line, time to failure
        a.label, a.outcome, a.deciding_line, a.time_to_failure_s
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pcieprof.bundle.document import Document

class Outcome(str, Enum):
    """The classified end of one launch attempt (serve/attempts.jsonl, the attempts here);
    pcieprof.serve.outcomes classifies a launch log into one."""

    OK = "ok"  # served and answered correctly
    NAN_IN_DECODE = "nan_in_decode"
    CUDA_DEVICE_ASSERT = "cuda_device_assert"
    OOM = "out_of_memory"
    NCCL_TIMEOUT = "nccl_watchdog_timeout"
    NCCL_ERROR = "nccl_error"
    UNSUPPORTED_ARCH = "unsupported_architecture"
    PORT_IN_USE = "port_in_use"
    MISSING_MODEL = "missing_model_files"
    BAD_ARGUMENTS = "bad_arguments"
    HANG = "hang"  # no progress before a deadline
    BAD_OUTPUT = "bad_output"  # served, but the tokens are wrong (empty, wrong length)
    CRASHED = "crashed"  # exited with no recognised cause
    INTERRUPTED = "interrupted"


#: Attempt outcomes that are not a result (the attempt is launched again).
NOT_A_RESULT = ("running", "interrupted")

#: Search statuses: still going, served, nothing left to try, a rule or the limit ended it,
#: Ctrl-C (resumable).
STATUSES = ("running", "found", "exhausted", "stopped", "interrupted")


@dataclass
class AxisValue:
    """One value of an axis as the search ranked it: `works`, `unknown` or `fails`, and why."""

    value: str
    verdict: str = ""
    why: str = ""


@dataclass
class SearchAxis:
    """One launch choice the search varies (attention backend, DSA decode backend, ...).

    Attributes:
        name: the axis (pcieprof.tune.space.FLAGS names its SGLang flag).
        only_when: the axis applies only when these axes hold one of these values.
        values: its values in the order the search tries them.
    """

    name: str
    only_when: dict[str, list[str]] = field(default_factory=dict)
    values: list[AxisValue] = field(default_factory=list)


@dataclass
class SearchRule:
    """A learning rule (pcieprof.tune.learn): on which outcomes, what it does, and why."""

    name: str
    outcomes: list[str] = field(default_factory=list)
    when: str = ""
    action: str = ""
    axes: list[str] = field(default_factory=list)
    why: str = ""


@dataclass
class Exclusion:
    """A value that left the search: the attempt whose failure excluded it, and the rule."""

    axis: str
    value: str
    attempt: int
    rule: str


@dataclass
class SearchAttempt:
    """One launch attempt of the search.

    Attributes:
        index: attempt number (its log is serve/server-<index>.log).
        label: the short configuration name.
        config: axis -> value ("" = not given).
        rule: the rule that chose it (`first` for the first).
        parent: the attempt it was derived from (None for the first).
        varied: the axes its rule changed.
        why: why it was chosen.
        changes: what changed from its parent, and why each value.
        outcome: how it ended (`ok`, `nan_in_decode`, `unsupported_arch`, `oom`, `nccl_error`,
            `hang`, `crashed`, `interrupted`, `running`).
        summary: the outcome in one line.
        deciding_line: the log line that decided the outcome ("" when it served).
        time_to_failure_s: seconds from launch to the failure (None when it served).
        time_to_ready_s: seconds from launch to ready (None when it never was).
        log: the server log's path in the bundle.
    """

    index: int
    label: str = ""
    config: dict[str, str] = field(default_factory=dict)
    rule: str = ""
    parent: int | None = None
    varied: list[str] = field(default_factory=list)
    why: str = ""
    changes: list[str] = field(default_factory=list)
    outcome: str = ""
    summary: str = ""
    deciding_line: str = ""
    time_to_failure_s: float | None = None
    time_to_ready_s: float | None = None
    log: str = ""


@dataclass
class Winner:
    """The configuration that served correct tokens.

    Attributes:
        index: its attempt.
        label: its short name.
        config: axis -> value.
        argv: the exact server command (argv[0] is `python3` for SGLang).
        env: the environment it set for the server.
        command: the same as one shell line, ready to paste (without the launch prefix).
        launch_prefix: the words it was started through (`docker run ... IMAGE`), or [].
    """

    index: int
    label: str = ""
    config: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    command: str = ""
    launch_prefix: list[str] = field(default_factory=list)


@dataclass
class SearchEnd:
    """How a search ended without a winner: `stopped` or `exhausted`, why, what to do next."""

    status: str
    why: str = ""
    hint: str = ""


@dataclass
class ServeSearch(Document):
    """serve/search.json.

    Attributes:
        card: the model card searched.
        like: the card whose search this card plays (tiny-cpu playing glm5-nvfp4's), or "".
        arch: the GPU architecture the values were ranked for (`sm120`, ...).
        sglang: the SGLang version whose parser the flags were checked against, or None.
        status: one of STATUSES.
        why: one line: what was found, or why the search ended without it.
        axes: the axes with their values in search order.
        notes: what the space dropped or assumed (values the installed SGLang lacks, ...).
        rules: the learning rules in the order they are matched.
        excluded: the values that left the search.
        attempts: every attempt, in order.
        winner: the configuration that served, or None.
        end: how the search ended without a winner, or None.
        exhausted_axes: axes every value of which was tried or excluded.
        open_axes: axes with values never tried.
        sources: source key -> text (the card's [sources]).
    """

    FILE = "serve/search.json"
    FORMAT = "pcieprof.serve_search"
    VERSION = 1

    card: str = ""
    like: str = ""
    arch: str = ""
    sglang: str | None = None
    status: str = "running"
    why: str = ""
    axes: list[SearchAxis] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rules: list[SearchRule] = field(default_factory=list)
    excluded: list[Exclusion] = field(default_factory=list)
    attempts: list[SearchAttempt] = field(default_factory=list)
    winner: Winner | None = None
    end: SearchEnd | None = None
    exhausted_axes: list[str] = field(default_factory=list)
    open_axes: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        """Whether a configuration served correct tokens."""
        return self.winner is not None

    @property
    def results(self) -> list[SearchAttempt]:
        """The attempts that ended (an interrupted or running one is launched again)."""
        return [a for a in self.attempts if a.outcome not in NOT_A_RESULT]
