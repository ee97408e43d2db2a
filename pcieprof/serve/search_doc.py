"""serve/search.json, read back: the launch search of one serve-bench bundle, typed.

Written by pcieprof.serve.run through pcieprof.serve.search.search_document; this module has no
other pcieprof imports, so any layer that reads bundles can use it.

    doc = SearchDoc.from_json(json.loads((bundle / "serve" / "search.json").read_text()))
    if doc.winner:                      # the configuration that served correct tokens
        doc.winner.command              # one shell line, ready to paste (python3 -m sglang...)
        doc.winner.argv, doc.winner.env
    else:
        doc.status, doc.why             # exhausted | stopped | running | interrupted
        doc.exhausted_axes, doc.open_axes
    for a in doc.attempts:              # config, class, deciding log line, time to failure
        a.label, a.outcome, a.deciding_line, a.time_to_failure_s
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

#: Bumped when a field is added or changes meaning; readers fill in what older files lack.
SEARCH_SCHEMA = 1


@dataclass(frozen=True)
class SearchAttempt:
    """One row of search.json's attempts.

    Attributes:
        index: attempt number (its log is serve/server-<index>.log).
        label: the short configuration name.
        config: axis -> value ("" = not given).
        rule: the rule that chose it (`first` for the first).
        why: why it was chosen.
        changes: what changed from its parent, and why each value.
        outcome: how it ended (`ok`, `nan_in_decode`, ..., `interrupted`).
        deciding_line: the log line that decided the outcome.
        time_to_failure_s: seconds from launch to the failure (None when it served).
        time_to_ready_s: seconds from launch to ready (None when it never was).
        log: the server log's path.
    """

    index: int
    label: str
    config: dict[str, str]
    rule: str
    why: str
    changes: tuple[str, ...]
    outcome: str
    deciding_line: str
    time_to_failure_s: float | None
    time_to_ready_s: float | None
    log: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SearchAttempt":
        return cls(index=int(d["index"]), label=str(d.get("label", "")),
                   config={str(k): str(v) for k, v in d.get("config", {}).items()},
                   rule=str(d.get("rule", "")), why=str(d.get("why", "")),
                   changes=tuple(str(x) for x in d.get("changes", [])),
                   outcome=str(d.get("outcome", "")),
                   deciding_line=str(d.get("deciding_line", "")),
                   time_to_failure_s=_float(d.get("time_to_failure_s")),
                   time_to_ready_s=_float(d.get("time_to_ready_s")), log=str(d.get("log", "")))


@dataclass(frozen=True)
class Winner:
    """The configuration that served correct tokens.

    Attributes:
        index: its attempt.
        label: its short name.
        config: axis -> value.
        argv: the exact server command (argv[0] is `python3` for SGLang).
        env: the environment it set for the server.
        command: the same as one shell line, ready to paste (without the launch prefix).
        launch_prefix: the words it was started through (`docker run ... IMAGE`), or ().
    """

    index: int
    label: str
    config: dict[str, str]
    argv: tuple[str, ...]
    env: dict[str, str]
    command: str
    launch_prefix: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Winner":
        return cls(index=int(d["index"]), label=str(d.get("label", "")),
                   config={str(k): str(v) for k, v in d.get("config", {}).items()},
                   argv=tuple(str(x) for x in d.get("argv", [])),
                   env={str(k): str(v) for k, v in d.get("env", {}).items()},
                   command=str(d.get("command", "")),
                   launch_prefix=tuple(str(x) for x in d.get("launch_prefix") or []))


@dataclass(frozen=True)
class SearchDoc:
    """serve/search.json: the launch search of one serve-bench bundle.

    Attributes:
        card: the model card.
        arch: the GPU architecture searched for.
        status: `running`, `found`, `exhausted`, `stopped` or `interrupted`.
        why: one line: what was found, or why the search ended without it.
        attempts: every attempt, in order.
        winner: the configuration that served, or None.
        exhausted_axes: axes every value of which was tried or excluded.
        open_axes: axes with values never tried.
        sources: source key -> text (the card's [sources]).
    """

    card: str
    arch: str
    status: str
    why: str
    attempts: tuple[SearchAttempt, ...]
    winner: Winner | None
    exhausted_axes: tuple[str, ...] = ()
    open_axes: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SearchDoc":
        """Read the document; fields an older file lacks get their defaults."""
        w = d.get("winner")
        return cls(card=str(d.get("card", "")), arch=str(d.get("arch", "")),
                   status=str(d.get("status", "")), why=str(d.get("why", "")),
                   attempts=tuple(SearchAttempt.from_json(a) for a in d.get("attempts", [])),
                   winner=Winner.from_json(w) if w else None,
                   exhausted_axes=tuple(d.get("exhausted_axes", [])),
                   open_axes=tuple(d.get("open_axes", [])),
                   sources={str(k): str(v) for k, v in d.get("sources", {}).items()})

    @property
    def found(self) -> bool:
        return self.winner is not None


def _float(x: Any) -> float | None:
    return None if x is None else float(x)
