"""The published decode anchors (a card's `[decode_anchor]` table, pcieprof/cards/*.toml): a
published box's decode throughput per batch and the communication it paid, so a step's compute
can be taken from it (an assumption that the compute is the same here). Read by the layout tuner
and worded by the VM story and the rules, which know the model by its card's name."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pcieprof.cards.toml_file import shipped_cards


@lru_cache(maxsize=1)
def _anchors() -> dict[str, dict[str, Any]]:
    """card name -> its `[decode_anchor]` table, for the shipped cards that have one (a card
    made from a config.json of such a checkpoint takes that card's name and table)."""
    return {c.name: c.decode_anchor for c in shipped_cards() if c.decode_anchor}


def decode_anchor(model: str) -> dict[str, Any]:
    """The `[decode_anchor]` table of the card named `model`; {} when it has none."""
    return dict(_anchors().get(model, {}))


def published_compute_ms(model: str, batch: int) -> float | None:
    """The compute of one decode step at `batch` on the published box (its step less its own
    communication, the card's `[decode_anchor]`), or None where no anchor point is at that
    batch."""
    data = decode_anchor(model)
    if not data or not data.get("comm_ms"):
        return None
    steps = {int(c): c / tps * 1000.0 for c, tps in data["points"]}
    comm = {int(b): float(ms) for b, ms in data["comm_ms"]}
    return steps[batch] - comm[batch] if batch in steps and batch in comm else None


def token_share(model: str, batch: int, comm_ms: float, saved_ms: float) -> str:
    """`19% of a ~22.2 ms token, its compute 12.1 ms assumed as published` for a saving at `batch` on a step whose communication costs
    `comm_ms` here, the compute taken from the published box (assumed the same here); "" when
    the model has no anchor at that batch."""
    comp = published_compute_ms(model, batch)
    if comp is None or comp + comm_ms <= 0:
        return ""
    token = comp + comm_ms
    return (f"{saved_ms / token * 100:.0f}% of a ~{token:.1f} ms token, its compute "
            f"{comp:.1f} ms assumed as published")
