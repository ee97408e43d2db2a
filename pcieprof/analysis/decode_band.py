"""The decode band: the all-reduce message sizes a decode step sends, from the model card.

At tensor parallelism each layer all-reduces the hidden states of the batch: batch x hidden x
the activation's bytes (bf16: 2; pcieprof.cards.step). For a hidden size of 6144 at batch 1..64
that is 12 KiB .. 768 KiB. "The decode size" is the message at the smallest batch (`DecodeBand.lo_bytes`); numbers
quoted "at decode sizes" (console summary, report, tuner gains, compare metrics) are read at the
band's `batches`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pcieprof.cards import DEFAULT_CARD, ModelCard, load_card
from pcieprof.units import size_label

#: Batch sizes at which decode numbers are quoted. The compare metric names carry the message
#: sizes these give (allreduce.<variant>.n8.time_us@12KiB, @96KiB, @384KiB, @768KiB at hidden 6144),
#: so scripts using `compare --fail-if` depend on them.
QUOTED_BATCHES = (1, 8, 32, 64)


@dataclass(frozen=True)
class DecodeBand:
    """Message sizes of decode all-reduces for a model and a batch range.

    Attributes:
        model: the card's name.
        hidden: the model's hidden size (elements).
        bytes_per_elem: bytes per activation element (2 for bf16).
        batch_min, batch_max: the batch range (requests decoding together).
        card: the card itself (its collectives per step), when the band was made from one.
    """

    model: str
    hidden: int
    bytes_per_elem: int = 2
    batch_min: int = 1
    batch_max: int = 64
    card: ModelCard | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_card(cls, card: ModelCard, batch_min: int = 1, batch_max: int = 64) -> "DecodeBand":
        """The band of `card` over batch_min..batch_max."""
        return cls(model=card.name, hidden=card.hidden_size, bytes_per_elem=card.activation_bytes,
                   batch_min=batch_min, batch_max=batch_max, card=card)

    @property
    def lo_bytes(self) -> int:
        """The decode size: the message at the smallest batch (bytes)."""
        return self.message_bytes(self.batch_min)

    @property
    def hi_bytes(self) -> int:
        """The message at the largest batch (bytes)."""
        return self.message_bytes(self.batch_max)

    @property
    def batches(self) -> tuple[int, ...]:
        """The batches decode numbers are quoted at: the smallest batch and QUOTED_BATCHES inside
        the range."""
        inside = {b for b in QUOTED_BATCHES if self.batch_min <= b <= self.batch_max}
        return tuple(sorted(inside | {self.batch_min}))

    def sizes(self) -> tuple[int, ...]:
        """Every decode message size the probes measure directly (bytes): batch_min x 2^k up to
        batch_max, and batch_max's own. Numbers quoted at these sizes are measured or simulated
        there, never interpolated."""
        out, b = [], self.batch_min
        while b <= self.batch_max:
            out.append(self.message_bytes(b))
            b *= 2
        if self.hi_bytes not in out:
            out.append(self.hi_bytes)
        return tuple(out)

    def message_bytes(self, batch: int) -> int:
        """All-reduce message at batch size `batch`, in bytes."""
        return batch * self.hidden * self.bytes_per_elem

    def label(self) -> str:
        return (f"decode band {self.model}: batch {self.batch_min}..{self.batch_max} x hidden "
                f"{self.hidden} x {self.bytes_per_elem} B = {size_label(self.lo_bytes)}.."
                f"{size_label(self.hi_bytes)}")


def band_for(model: str | None = None, batch_min: int = 1, batch_max: int = 64) -> DecodeBand:
    """The band of a model card (anything pcieprof.cards.load_card takes; DEFAULT_CARD when None).

    Raises:
        BadInput: an unknown model or an unreadable card (one line, exit 2).
    """
    return DecodeBand.of_card(load_card(model or DEFAULT_CARD), batch_min, batch_max)
