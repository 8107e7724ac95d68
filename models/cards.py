"""Model cards on disk: ``{"format": "megakernel.card/1", ...ModelConfig fields}``.

``moe`` and ``rope_scaling`` are nested objects (or null). Reading a card
checks the file as JSON (``ir/jsonfile.py``: size, UTF-8, duplicate keys,
depth), its format tag, and every field's name, type and bound
(``ModelConfig``); ranges of the values copied into ops are checked when the
card is built into a graph (docs/validation.md).
``card_from_dict(card_to_dict(c)) == c`` for every valid card.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megakernel.errors import IRError, error_context, shown
from megakernel.ir.config import ModelConfig
from megakernel.ir.jsonfile import parse_json, read_json
from megakernel.ir.serialize import CARD_FORMAT


def card_to_dict(config: ModelConfig) -> dict[str, Any]:
    return config.to_dict()   # format tag included


def card_from_dict(data: dict[str, Any], *, source: str = "card") -> ModelConfig:
    """The card in ``data``; errors are prefixed with ``source`` (a file name)."""
    with error_context(source):
        if not isinstance(data, dict):
            raise IRError(f"expected a JSON object, found {type(data).__name__}")
        if data.get("format") != CARD_FORMAT:
            raise IRError(f"format={shown(data.get('format'))}, expected {CARD_FORMAT!r}",
                          path="format")
        body = {k: v for k, v in data.items() if k != "format"}
        return ModelConfig.from_dict(body)


def card_to_json(config: ModelConfig) -> str:
    return json.dumps(card_to_dict(config), indent=1)


def card_from_json(text: str, *, source: str = "card") -> ModelConfig:
    return card_from_dict(parse_json(text, source=source), source=source)


def read_card(path: str | Path) -> ModelConfig:
    path = Path(path)
    return card_from_dict(read_json(path), source=path.name)
