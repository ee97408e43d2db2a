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
    for a in doc.attempts:              # the same Attempt as each line of serve/attempts.jsonl
        a.label, a.outcome, a.deciding_line, a.time_to_failure_s, a.search
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pcieprof.bundle.document import Document, check_format, decode, encode
from pcieprof.bundle.serve_command import RecordedCommand
from pcieprof.errors import BadInput

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
class SearchStep:
    """The launch search's step that chose an attempt (None for an attempt no search chose).

    Attributes:
        config: axis -> value ("" = not given).
        label: the short configuration name.
        rule: the rule that chose it (`first` for the first).
        parent: the attempt it was derived from (None for the first).
        varied: the axes its rule changed.
        why: why it was chosen.
        changes: what changed from its parent, and why each value.
    """

    config: dict[str, str] = field(default_factory=dict)
    label: str = ""
    rule: str = ""
    parent: int | None = None
    varied: list[str] = field(default_factory=list)
    why: str = ""
    changes: list[str] = field(default_factory=list)


@dataclass
class Attempt:
    """One launch attempt: a row of serve/attempts.jsonl and an entry of serve/search.json's
    `attempts` (the same shape in both; pcieprof.serve.sweep launches and fills it).

    Attributes:
        index: attempt number (its log is serve/server-<index>.log).
        name: the configuration's name.
        config: the launch configuration as recorded (secrets masked; {"url": ...} when
            attached to a running server).
        command: the server command as recorded.
        log: the server log's path.
        why, source: why it was launched and where the reason comes from.
        outcome: how it ended (an Outcome value, or `running`).
        summary, hint: the outcome in one line, and what to do.
        excerpt: the log lines around the decisive one (that one starts with ">").
        line: the decisive line's number in the log; exit_code: the server's exit status.
        time_to_ready_s: seconds from launch to ready (None when it never was).
        time_to_failure_s: seconds from launch to the failure (None when it served).
        probe: the correct-tokens probe's result.
        benchmarked: whether the load ran on it.
        pid: the server's process (and process group) id.
        last_progress: the last start-up progress line of its log.
        search: the search step that chose it, or None.
    """

    index: int
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    command: RecordedCommand = field(default_factory=RecordedCommand)
    log: str = ""
    why: str = ""
    source: str = ""
    outcome: str = "running"
    summary: str = ""
    hint: str = ""
    excerpt: str = ""
    line: int | None = None
    exit_code: int | None = None
    time_to_ready_s: float | None = None
    time_to_failure_s: float | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    benchmarked: bool = False
    pid: int | None = None
    last_progress: str = ""
    search: SearchStep | None = None

    @property
    def ok(self) -> bool:
        """Whether it served correct tokens."""
        return self.outcome == Outcome.OK.value

    @property
    def label(self) -> str:
        """The search's short name of its configuration, else its name."""
        return self.search.label if self.search and self.search.label else self.name

    @property
    def rule(self) -> str:
        """The search rule that chose it ("" when no search did)."""
        return self.search.rule if self.search else ""

    @property
    def deciding_line(self) -> str:
        """The log line that decided a failure: the excerpt's marked line, else the last
        start-up progress line (a hang's); "" when it served."""
        if self.ok:
            return ""
        for ln in self.excerpt.splitlines():
            if ln.startswith(">"):
                return ln[1:].strip()
        return self.last_progress

    def excerpt_key(self) -> str:
        """`: <the deciding line of the excerpt, cut at 140 characters>`, or ""."""
        for ln in self.excerpt.splitlines():
            if ln.startswith(">"):
                s = ln[1:].strip()
                return ": " + (s[:140] + "..." if len(s) > 140 else s)
        return ""

    def one_line(self) -> str:
        """How it ended, in one line."""
        if self.ok:
            return f"attempt {self.index} {self.name}: ok (ready in {self.time_to_ready_s:.1f} s)"
        return (f"attempt {self.index} {self.name}: {self.outcome} after "
                f"{self.time_to_failure_s or 0:.1f} s: {self.summary}{self.excerpt_key()}")


ATTEMPTS_FILE = "serve/attempts.jsonl"


def attempts_jsonl(attempts: list[Attempt]) -> str:
    """serve/attempts.jsonl's text: one JSON line per attempt."""
    return "".join(json.dumps(encode(a), default=str) + "\n" for a in attempts)


def read_attempts(text: str, where: str = ATTEMPTS_FILE) -> list[Attempt]:
    """The attempts of serve/attempts.jsonl's text. A last line cut short (a kill mid-write) is
    left out; `search: {}`, how files written before SearchStep said "no search", reads as None.

    Raises:
        BadInput: a line before the last that is not a JSON object, or an attempt of the wrong
            shape.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    out = []
    for i, ln in enumerate(lines):
        try:
            row = json.loads(ln)
        except ValueError as exc:
            if i == len(lines) - 1:
                break
            raise BadInput(f"{where}: unreadable attempt row {i + 1} ({exc})") from None
        if not isinstance(row, dict):
            raise BadInput(f"{where}: attempt row {i + 1} is not a JSON object")
        if row.get("search") == {}:
            row["search"] = None
        out.append(decode(Attempt, row, f"{where}: attempt row {i + 1}"))
    return out


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
    #: 2: `attempts` are whole Attempts, as serve/attempts.jsonl holds them (1: a summary of
    #: each, read converted)
    VERSION = 2

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
    attempts: list[Attempt] = field(default_factory=list)
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

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> "ServeSearch":
        """Read it (Document.from_json); a version 1 file's attempts (index, label, config by
        axis, rule, parent, varied, why, changes, outcome, summary, deciding_line, times, log)
        are read as Attempts: the search's fields as their SearchStep, the deciding line as
        the excerpt's marked line."""
        if (isinstance(data, dict) and isinstance(data.get("attempts"), list)
                and check_format(data.get("format"), cls.FORMAT, cls.VERSION,
                                 where or cls.FILE) == 1):
            data = {**data, "attempts": [_attempt_of_v1(a) for a in data["attempts"]]}
        return super().from_json(data, where)

    @property
    def results(self) -> list[Attempt]:
        """The attempts that ended (an interrupted or running one is launched again)."""
        return [a for a in self.attempts if a.outcome not in NOT_A_RESULT]


#: A version 1 search.json attempt's keys that are its search step's
_V1_STEP = ("config", "label", "rule", "parent", "varied", "why", "changes")


def _attempt_of_v1(row: Any) -> Any:
    """A version 1 attempt entry as an Attempt's JSON (anything but an object as is, for the
    reader to refuse)."""
    if not isinstance(row, dict):
        return row
    out = {k: v for k, v in row.items() if k not in _V1_STEP and k != "deciding_line"}
    out["name"] = row.get("label", "")
    out["why"] = row.get("why", "")
    line = row.get("deciding_line")
    if line:
        out["excerpt"] = f"> {line}"
    out["search"] = {k: row[k] for k in _V1_STEP if k in row}
    return out
