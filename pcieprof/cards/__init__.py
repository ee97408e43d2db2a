"""Model cards: the served models, as data (a foundation package: every layer reads cards).

A card (`ModelCard`, card.py) holds a model's architecture, the bytes of its weights and KV
cache, the SGLang launch facts and its launch-search table. It is made from one of:
- a card file shipped with pcieprof (`glm5-nvfp4`, `tiny-cpu`; pcieprof/cards/*.toml,
  toml_file.py), every number with its source;
- the model's own Hugging Face config.json (hf_config.py): a path to the file or to the
  checkpoint directory, or a repository id found in the local Hugging Face cache. What a config
  lacks comes from the card file of the same checkpoint, else is assumed (`card.assumed`).
step.py counts the collectives of a decode step and the prefill messages from a card alone.

Usage:
    card = load_card("glm5-nvfp4")                 # a shipped card
    card = load_card("Qwen/Qwen3-235B-A22B")       # its config.json in the local HF cache
    card = load_card("/models/gpt-oss-120b")       # a checkpoint directory (or its config.json)
    card.weight_bytes_per_gpu(tp=8)                # bytes
"""

from __future__ import annotations

import re
from pathlib import Path

from pcieprof.cards.card import (
    NVLINK,
    PCIE,
    AttentionSpec,
    BoxFit,
    BoxSetting,
    KVCacheSpec,
    LaunchFacts,
    LaunchTarget,
    ModelCard,
    WeightGroup,
)
from pcieprof.cards.hf_config import cached_config, card_from_config
from pcieprof.cards.toml_file import CARDS_DIR, available_cards, read_card_file, shipped_cards
from pcieprof.errors import BadInput

__all__ = ["AttentionSpec", "BoxFit", "BoxSetting", "CARDS_DIR", "DEFAULT_CARD", "KVCacheSpec",
           "LaunchFacts", "LaunchTarget", "ModelCard", "NVLINK", "PCIE", "WeightGroup",
           "available_cards", "load_card"]

#: The card a command uses when neither --model nor its bundle names one: GLM-5 in NVFP4, the
#: model of the 8x RTX PRO 6000 boxes pcieprof was first built for.
DEFAULT_CARD = "glm5-nvfp4"

_REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")


def load_card(ref: str | Path) -> ModelCard:
    """The card `ref` names: a .toml card file, a config.json (or the directory holding one), a
    shipped card's name, or a Hugging Face repository id in the local cache.

    Raises:
        BadInput: nothing found under that name, or a file that cannot be read as a card (one
            line, exit 2).
    """
    path = Path(ref).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        if path.suffix == ".toml":
            return read_card_file(path)
        if path.suffix == ".json":
            return card_from_config(path, shipped_cards())
        raise BadInput(f"{path}: not a model card", hint="a .toml card file or a config.json")
    name = str(ref)
    if name in available_cards():
        return read_card_file(CARDS_DIR / f"{name}.toml")
    if _REPO_ID.fullmatch(name) and not path.exists():
        found = cached_config(name)
        if found is not None:
            return card_from_config(found, shipped_cards())
    raise BadInput(f"unknown model card {name!r}",
                   hint=f"known: {', '.join(available_cards())}, a .toml card file, a config.json "
                        "(or its checkpoint directory), or a Hugging Face repository id in the "
                        "local cache")
