"""The published decode anchors (decode_anchors.toml): a published box's decode throughput per
batch and the communication it paid, so a step's compute can be taken from it (an assumption that
the compute is the same here). Read by the layout tuner and worded by the VM story."""

from __future__ import annotations

import tomllib
from pathlib import Path

ANCHORS = Path(__file__).with_name("decode_anchors.toml")


def published_compute_ms(model: str, batch: int) -> float | None:
    """The compute of one decode step at `batch` on the published box (its step less its own
    communication, data/decode_anchors.toml), or None where no anchor point is at that batch."""
    data = tomllib.loads(ANCHORS.read_text(encoding="utf-8")).get(model)
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
