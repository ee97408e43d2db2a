"""The collectives of a decode step and the prefill messages, from the card alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.cards import load_card
from pcieprof.cards.step import (ALL_GATHER, Layout, count_collectives, message_bytes,
                                 prefill_sizes, step_allreduces)
from pcieprof.errors import BadInput

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "cards"


@pytest.mark.parametrize("model, allreduces, decode_bytes", [
    ("glm5-nvfp4", 1 + 78 + 3 + 75, 6144 * 2),
    (str(CONFIGS / "glm-5"), 1 + 78 + 3 + 75, 6144 * 2),
    (str(CONFIGS / "qwen3-235b-a22b"), 1 + 94 + 94, 4096 * 2),
    (str(CONFIGS / "gpt-oss-120b"), 1 + 36 + 36, 2880 * 2),
    (str(CONFIGS / "llama-3.1-70b"), 1 + 80 + 80, 8192 * 2),
    ("tiny-cpu", 1 + 4 + 1 + 3, 256 * 4),
])
def test_decode_step_per_architecture(model: str, allreduces: int, decode_bytes: int) -> None:
    """One all-reduce for the embedding, one after attention and one after the MLP/MoE of every
    layer; the message is batch x hidden x the activation bytes."""
    card = load_card(model)
    assert step_allreduces(card, tp=8) == allreduces
    assert message_bytes(card, 1) == decode_bytes
    assert step_allreduces(card, tp=1) == 0  # one GPU sends nothing
    gathers = [c for c in count_collectives(card, Layout(tp=8), 4) if c.op == ALL_GATHER]
    assert [g.size_bytes for g in gathers] == [4 * card.vocab_size * card.activation_bytes]


def test_prefill_sizes() -> None:
    card = load_card(str(CONFIGS / "llama-3.1-70b"))
    assert prefill_sizes(card, (8192,)) == (8192 * 8192 * 2,)
    assert len(prefill_sizes(card)) == 3
    with pytest.raises(BadInput):
        message_bytes(card, 0)
