"""Classify trace events as communication, memory or compute from a table of name patterns.

The table is data (`kernel_classes.toml` beside this module), shown in the report and extensible by
the user: `--classes FILE` adds rules that are tried before the built-in ones.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pcieprof.bundle.attribution import ClassRule
from pcieprof.errors import BadInput

COMM = "communication"
MEMORY = "memory"
COMPUTE = "compute"
IGNORE = "ignore"  # counted in no class (e.g. the CPU op that only enqueues a collective)
CLASSES = (COMM, MEMORY, COMPUTE, IGNORE)
#: Bit per class in the interval maths (intervals.py); IGNORE has none.
CLASS_BIT = {COMM: 1, MEMORY: 2, COMPUTE: 4, IGNORE: 0}

BUILTIN_TABLE = Path(__file__).with_name("kernel_classes.toml")
_MEMORY_CATS = ("gpu_memcpy", "gpu_memset")


def load_rules(path: Path, origin: str) -> list[ClassRule]:
    """Read a classification table (TOML, `[[rule]]` entries)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"{path}: cannot read classification table ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not a valid TOML classification table ({exc})") from None
    rules = []
    for i, row in enumerate(data.get("rule", [])):
        if not isinstance(row, dict) or "pattern" not in row or "class" not in row:
            raise BadInput(f"{path}: rule {i + 1} needs 'pattern' and 'class'",
                           hint=f"class is one of {', '.join(CLASSES)}")
        if row["class"] not in CLASSES:
            raise BadInput(f"{path}: rule {i + 1} has unknown class {row['class']!r}",
                           hint=f"use one of {', '.join(CLASSES)}")
        try:
            re.compile(row["pattern"])
        except re.error as exc:
            raise BadInput(f"{path}: rule {i + 1} pattern {row['pattern']!r} is not a regex ({exc})") from None
        applies = row.get("applies_to", "any")
        if applies not in ("gpu", "cpu", "any"):
            raise BadInput(f"{path}: rule {i + 1} applies_to must be gpu, cpu or any")
        rules.append(ClassRule(pattern=row["pattern"], family=str(row.get("family", row["class"])),
                               applies_to=applies, source=str(row.get("source", "")),
                               origin=origin, class_=row["class"]))
    if not rules:
        raise BadInput(f"{path}: no [[rule]] entries")
    return rules


class Classifier:
    """Classifies event names; results are cached per (name, category), so each is matched once.

    Args:
        extra: a user table whose rules are tried before the built-in ones.
    """

    def __init__(self, extra: Path | None = None) -> None:
        self.rules: list[ClassRule] = (load_rules(extra, str(extra)) if extra else []) + \
            load_rules(BUILTIN_TABLE, "builtin")
        self._gpu = [(re.compile(r.pattern), r) for r in self.rules if r.applies_to != "cpu"]
        self._cpu = [(re.compile(r.pattern), r) for r in self.rules if r.applies_to != "gpu"]
        self._cache: dict[tuple[str, bool], tuple[str, str]] = {}

    def gpu(self, name: str, cat: str = "kernel") -> tuple[str, str]:
        """(class, family) of a GPU event (kernel, gpu_memcpy, gpu_memset)."""
        key = (name, cat in _MEMORY_CATS)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._match(self._gpu, name)
            if hit is None:
                hit = (MEMORY, "memcpy_memset") if key[1] else (COMPUTE, "compute")
            self._cache[key] = hit
        return hit

    def cpu(self, name: str) -> tuple[str, str]:
        """(class, family) of a CPU op on a trace without GPU events."""
        key = (name, None)  # type: ignore[assignment]
        hit = self._cache.get(key)  # type: ignore[arg-type]
        if hit is None:
            hit = self._match(self._cpu, name) or (COMPUTE, "cpu_op")
            self._cache[key] = hit  # type: ignore[index]
        return hit

    @staticmethod
    def _match(table: list[tuple[re.Pattern[str], ClassRule]], name: str) -> tuple[str, str] | None:
        for rx, rule in table:
            if rx.search(name):
                return rule.class_, rule.family
        return None

    def table(self) -> list[ClassRule]:
        """The rules in the order they are tried (for attribution.json and the report)."""
        return list(self.rules)
