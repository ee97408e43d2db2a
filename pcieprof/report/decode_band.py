"""The decode-message band: the all-reduce sizes a decode step actually sends.

At tensor parallelism each layer all-reduces the hidden states of the batch: batch x hidden x
2 bytes (bf16). For GLM-5 (hidden 6144) at batch 1..64 that is 12 KiB .. 768 KiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: GLM-5 hidden size; used when no model card is available (the model cards override it).
#: Source: zai-org/GLM-5 config.json, hidden_size 6144 (as the project brief states).
DEFAULT_MODEL = "glm5-nvfp4"
DEFAULT_HIDDEN = 6144


@dataclass(frozen=True)
class DecodeBand:
    """Message sizes of decode all-reduces for a model and a batch range."""

    model: str
    hidden: int
    batch_min: int = 1
    batch_max: int = 64
    bytes_per_elem: int = 2

    @property
    def lo_bytes(self) -> int:
        return self.batch_min * self.hidden * self.bytes_per_elem

    @property
    def hi_bytes(self) -> int:
        return self.batch_max * self.hidden * self.bytes_per_elem

    def message_bytes(self, batch: int) -> int:
        """All-reduce message at batch size `batch`, in bytes."""
        return batch * self.hidden * self.bytes_per_elem

    def label(self) -> str:
        from pcieprof.report.figures import size_label

        return (f"decode band {self.model}: batch {self.batch_min}..{self.batch_max} x hidden "
                f"{self.hidden} x {self.bytes_per_elem} B = {size_label(self.lo_bytes)}.."
                f"{size_label(self.hi_bytes)}")


def band_for(model: str | None = None, batch_min: int = 1, batch_max: int = 64) -> DecodeBand:
    """The band for `model`, from its card when pcieprof.serve.cards has it, else GLM-5's."""
    name = model or DEFAULT_MODEL
    hidden = DEFAULT_HIDDEN
    try:
        from pcieprof.serve.cards import load_card

        card = load_card(name)
        hidden = int(_get(card, "hidden_size") or _get(card, "hidden") or hidden)
    except Exception:  # no card module yet, or an unknown name: GLM-5's hidden size
        pass
    return DecodeBand(model=name, hidden=hidden, batch_min=batch_min, batch_max=batch_max)


def _get(obj: object, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)
