"""The recommendation list block (shared by the summary and the recommendations section)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pcieprof.bundle.recommendations import Recommendation


@dataclass
class RecsBlock:
    """Recommendations, rendered by recommendations.html.j2."""

    items: list[Recommendation]
    needs_measuring: list[str] = field(default_factory=list)
    compact: bool = False
    kind: str = "recs"
