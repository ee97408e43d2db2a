"""A fault matrix: which fault to inject, decided by the SGLang flags the server was launched with.

`--inject-matrix FILE` (TOML or JSON) holds an ordered list of rules; the first rule that matches
the launch flags names the fault, as `--inject` would. This lets a launch search be tested end to
end on the reference server: the same flags that select kernels in SGLang select a failure here.

    [[fault]]                                  # unsupported backend: fails while loading
    when = { dsa-prefill-backend = ["flashmla_sparse", "flashmla_kv"] }
    fault = "unsupported-arch"
    line = "RuntimeError: Sparse Attention Forward Kernel is only supported on SM90a and SM100f architectures."
    [[fault]]                                  # hangs in CUDA-graph capture
    when = { dsa-decode-backend = ["flashinfer_sparse_mla"], cuda-graph = ["on"] }
    fault = "hang-in-capture"
    [[fault]]                                  # NaN in decode unless this pair is chosen
    unless = { attention-backend = ["dsa"], dsa-decode-backend = ["trtllm"] }
    fault = "nan-after 0"

Keys are flag names without the dashes' prefix (`attention-backend` for `--attention-backend`); a
flag that was not given has the value "" (so `[""]` matches "not given"). The pseudo-flag
`cuda-graph` is "off" when `--disable-cuda-graph` or `--cuda-graph-backend-decode disabled` was
given, else "on". A rule applies when every `when` key matches and not every `unless` key does.
Kept free of torch: the server parses its flags before importing it.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

FAULTS = ("nan-after N", "hang", "hang-after N", "crash-on-start", "unsupported-arch",
          "hang-in-capture")


class MatrixError(Exception):
    """A fault matrix that cannot be used; the message is one line."""


@dataclass(frozen=True)
class FaultRule:
    """One row of the matrix.

    Attributes:
        index: position in the file (0-based), for the log.
        when: flag -> values; all must match for the rule to apply.
        unless: flag -> values; the rule does not apply when all of them match.
        fault: what to inject (an `--inject` text).
        line: for `unsupported-arch`: the error line the failing rank raises.
    """

    index: int
    fault: str
    when: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unless: dict[str, tuple[str, ...]] = field(default_factory=dict)
    line: str = ""

    def matches(self, flags: Mapping[str, str]) -> bool:
        """True when this rule applies to a launch with `flags`."""
        hit = all(flags.get(k, "") in v for k, v in self.when.items())
        spared = bool(self.unless) and all(flags.get(k, "") in v for k, v in self.unless.items())
        return hit and not spared

    def describe(self) -> str:
        parts = [f"rule {self.index}"]
        if self.when:
            parts.append("when " + _show(self.when))
        if self.unless:
            parts.append("unless " + _show(self.unless))
        return " ".join(parts)


def _show(cond: Mapping[str, tuple[str, ...]]) -> str:
    return ", ".join(f"{k} in {list(v)}" for k, v in cond.items())


def load_matrix(path: str | Path) -> list[FaultRule]:
    """Read a fault matrix file.

    Raises:
        MatrixError: unreadable file, no rules, or a rule without a fault.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise MatrixError(f"argument --inject-matrix: {p}: unreadable ({exc})") from None
    raw = data.get("fault", []) if isinstance(data, dict) else data
    if not isinstance(raw, list) or not raw:
        raise MatrixError(f"argument --inject-matrix: {p}: no [[fault]] rules")
    rules = []
    for i, r in enumerate(raw):
        if not isinstance(r, dict) or not r.get("fault"):
            raise MatrixError(f"argument --inject-matrix: {p}: rule {i} has no fault")
        rules.append(FaultRule(index=i, fault=str(r["fault"]), when=_cond(r.get("when", {})),
                               unless=_cond(r.get("unless", {})), line=str(r.get("line", ""))))
    return rules


def _cond(d: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(d, dict):
        raise MatrixError("argument --inject-matrix: 'when' and 'unless' are tables of flag = [values]")
    return {str(k).lstrip("-"): tuple(str(x) for x in (v if isinstance(v, list) else [v]))
            for k, v in d.items()}


def launch_flags(ignored: Mapping[str, Any]) -> dict[str, str]:
    """The flag values a matrix is matched against, from the GPU flags the server ignored."""
    flags = {k: ("" if v is None else str(v)) for k, v in ignored.items()}
    off = ignored.get("disable-cuda-graph") or ignored.get("cuda-graph-backend-decode") == "disabled"
    flags["cuda-graph"] = "off" if off else "on"
    return flags


def choose(rules: list[FaultRule], flags: Mapping[str, str]) -> FaultRule | None:
    """The first rule that applies, or None (no fault)."""
    for r in rules:
        if r.matches(flags):
            return r
    return None
