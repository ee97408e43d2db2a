"""Which model card a command reads its bundles for: --model, else the card the bundle records,
else the default card; said in one line when the two disagree."""

from __future__ import annotations

from collections.abc import Sequence

from pcieprof import progress
from pcieprof.bundle import Bundle
from pcieprof.bundle.model import ModelRecord
from pcieprof.cards import DEFAULT_CARD, ModelCard, load_card
from pcieprof.errors import BadInput

#: The --model help of the commands that read bundles (recommend, report, compare).
MODEL_HELP = ("Model card: a shipped card's name, a .toml card, a config.json (or its checkpoint "
              "directory) or a Hugging Face repository id in the local cache (default: the card "
              f"the bundle was made for, else {DEFAULT_CARD}).")


def card_for(model: str | None, bundles: Sequence[Bundle]) -> ModelCard:
    """The card to read `bundles` with.

    Args:
        model: --model as given, or None.
        bundles: the bundles read; the first decides when --model is None (its recorded card,
            or the default card where it records none).

    Raises:
        BadInput: an unknown --model, or a bundle whose recorded card cannot be found here and
            no --model (one line naming it, with the hint to pass --model).
    """
    records = [(b, r) for b in bundles if (r := b.model()) is not None]
    if model is not None:
        card = load_card(model)
        for b, r in records:
            # the reference server stands in for any model by design (the demo serves it
            # beside a GLM-5 box): reading its bundle with another card is no disagreement
            if r.hash != card.content_hash and not _reference(r):
                progress.info(f"model: {card.name} ({card.short_hash()}, from --model), not "
                              f"{r.short()} that {b.path} was made for")
        return card
    if not records:
        return load_card(DEFAULT_CARD)
    if bundles[0].model() is None:
        # A bundle made before cards were recorded was read with the default card then: the
        # first bundle decides, so a search bundle's stand-in card given after it does not.
        card = load_card(DEFAULT_CARD)
        others = sorted({r.short() for _, r in records if r.hash != card.content_hash})
        if others:
            progress.info(f"model: {card.name} (the default; {bundles[0].path} records no card); "
                          f"the other bundles were made for {', '.join(others)} (pass --model "
                          "to choose)")
        return card
    b, r = records[0]
    card = _reload(b, r)
    others = sorted({o.short() for _, o in records[1:] if o.hash != r.hash})
    if card.content_hash != r.hash:
        progress.info(f"model: {r.ref} has changed since {b.path} was made ({r.hash[:12]} -> "
                      f"{card.short_hash()}); reading it as it is now")
    if others:
        progress.info(f"model: {r.short()} of {b.path}; the other bundles were made for "
                      f"{', '.join(others)} (pass --model to choose)")
    return card


def _reference(r: ModelRecord) -> bool:
    """Whether `r` is a card of pcieprof's reference server (not SGLang)."""
    try:
        return load_card(r.ref).sglang.is_reference
    except BadInput:
        return False


def _reload(b: Bundle, r: ModelRecord) -> ModelCard:
    """The recorded card as `ref` loads it here, else the copy the bundle holds."""
    try:
        return load_card(r.ref)
    except BadInput:
        kept = b.model_card()
        if kept is None:
            raise BadInput(f"{b.path} was made for model {r.name} ({r.ref}), which is not found "
                           "here", hint="pass --model with that card, config.json or checkpoint "
                           "directory") from None
        progress.info(f"model: {r.ref} is not here; reading {b.path} with the copy of "
                      f"{r.short()} it holds")
        return kept
