"""The model zoo: cards of published models (and two test-size ones) as JSON.

Each ``<name>.json`` beside this file is a ``megakernel.card/1`` card whose
numbers follow the model's published Hugging Face ``config.json``. For real
models ``max_seq_len`` is the serving context the KV caches are sized for
(4096 by default), not the model's maximum context.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

from megakernel.errors import IRError
from megakernel.ir.config import ModelConfig, build
from megakernel.ir.graph import Model
from megakernel.models.cards import read_card

_DIR = Path(__file__).parent


def names() -> list[str]:
    """Every zoo model name, sorted."""
    return sorted(p.stem for p in _DIR.glob("*.json"))


@functools.lru_cache(maxsize=None)
def card(name: str) -> ModelConfig:
    """The card of zoo model ``name``; its ``name`` field equals the file name."""
    if name not in names():
        close = difflib.get_close_matches(name, names(), n=1)
        known = f"did you mean {close[0]!r}?" if close else f"known: {names()}"
        raise IRError(f"no zoo model {name!r}; {known}", path="zoo")
    config = read_card(_DIR / f"{name}.json")
    if config.name != name:
        raise IRError(f"card is named {config.name!r}, expected {name!r}",
                      path=f"zoo.{name}.name")
    return config


def model(name: str) -> Model:
    """The layer graph of zoo model ``name``."""
    return build(card(name))
