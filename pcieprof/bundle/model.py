"""The manifest's `model`: the card a bundle was measured, served or tuned for.

`{"name": "glm5-nvfp4", "hash": "<sha256 of the card>", "ref": "glm5-nvfp4"}`: `ref` is what
pcieprof.cards.load_card takes to find the card again (a shipped card's name, a Hugging Face
repository id, or the path of a card file or config.json), `hash` the card's content hash, so a
reader can tell the card it loads now from the one the bundle was made with. Bundles written
before the key existed have none; their readers use the default card.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pcieprof.bundle.document import Document
from pcieprof.cards import CARDS_DIR, ModelCard
from pcieprof.cards.hf_config import repo_of
from pcieprof.cards.toml_file import card_from_dict, card_to_dict


@dataclass(frozen=True)
class ModelRecord:
    """The card a bundle is for.

    Attributes:
        name: the card's name.
        hash: the card's content hash (sha256 hex, pcieprof.cards.ModelCard.content_hash).
        ref: how to load it again (pcieprof.cards.load_card).
    """

    name: str
    hash: str
    ref: str

    @classmethod
    def of_card(cls, card: ModelCard) -> "ModelRecord":
        """The record of a card: a shipped card by name, a config from the Hugging Face cache by
        its repository id, anything else by its absolute path."""
        path = card.path
        if path is None or path.resolve().parent == CARDS_DIR.resolve():
            ref = card.name
        else:
            ref = repo_of(path) or str(path.resolve())
        return cls(name=card.name, hash=card.content_hash, ref=ref)

    def short(self) -> str:
        """`glm5-nvfp4 (61083d23936e)`: the name and the first 12 hex digits of the hash."""
        return f"{self.name} ({self.hash[:12]})"


@dataclass
class ModelCardFile(Document):
    """model_card.json: the card itself, so the bundle reads the same card on any machine.

    Its content is a card file's tables as JSON (pcieprof.cards.toml_file), decoded by the card's
    own decoder, the one that reads card files: a second description of the card's fields here
    would be a second decoder to keep equal. The tables are kept whole in `extra` (written back
    unchanged); `card()` decodes them."""

    FILE: ClassVar[str] = "model_card.json"

    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, card: ModelCard) -> ModelCardFile:
        return cls(extra=card_to_dict(card))

    def card(self, where: Path) -> ModelCard:
        """The card; BadInput (one line, naming `where`) for tables that are not a card."""
        return card_from_dict(self.extra, where)
