"""The recommendation list block (shared by the summary and the recommendations section)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RecsBlock:
    """Recommendations as dicts (Recommendation.as_dict), rendered by recommendations.html.j2."""

    items: list[dict[str, Any]]
    needs_measuring: list[str] = field(default_factory=list)
    compact: bool = False
    kind: str = "recs"
