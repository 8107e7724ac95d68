"""Model cards on disk: ``{"format": "megakernel.card/1", ...ModelConfig fields}``.

``moe`` and ``rope_scaling`` are nested objects (or null). Reading a card
checks its format tag and its field names (``ModelConfig.from_dict``); the
numbers themselves are checked when the card is built into a graph.
``card_from_dict(card_to_dict(c)) == c`` for every valid card.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megakernel.errors import IRError, error_context
from megakernel.ir.config import ModelConfig
from megakernel.ir.serialize import CARD_FORMAT


def card_to_dict(config: ModelConfig) -> dict[str, Any]:
    return {"format": CARD_FORMAT, **config.to_dict()}


def card_from_dict(data: dict[str, Any], *, source: str = "card") -> ModelConfig:
    """The card in ``data``; errors are prefixed with ``source`` (a file name)."""
    with error_context(source):
        if not isinstance(data, dict):
            raise IRError(f"expected a JSON object, found {type(data).__name__}")
        if data.get("format") != CARD_FORMAT:
            raise IRError(f"format={data.get('format')!r}, expected {CARD_FORMAT!r}",
                          path="format")
        body = {k: v for k, v in data.items() if k != "format"}
        return ModelConfig.from_dict(body)


def card_to_json(config: ModelConfig) -> str:
    return json.dumps(card_to_dict(config), indent=1)


def card_from_json(text: str, *, source: str = "card") -> ModelConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise IRError(f"not valid JSON: {err}", path=source) from None
    return card_from_dict(data, source=source)


def read_card(path: str | Path) -> ModelConfig:
    path = Path(path)
    return card_from_json(path.read_text(), source=path.name)
