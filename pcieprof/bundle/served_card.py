"""serve/card.json: the model card serve-bench served, by name and file (`serve-bench --resume`
goes on only with the same card). The card itself is model_card.json (the manifest's `model`)."""

from __future__ import annotations

from dataclasses import dataclass

from pcieprof.bundle.document import Document


@dataclass
class ServedCard(Document):
    """serve/card.json (no format tag: the file never had one).

    Attributes:
        name: the card's name.
        path: the card file or config.json it was loaded from, None for a card built in memory.
    """

    FILE = "serve/card.json"

    name: str = ""
    path: str | None = None
