"""One entry point from whatever names a model to its layer graph.

``load_model`` accepts, in this order: a zoo name; a JSON file holding a card
(``megakernel.card/1``), a full graph (``megakernel.ir/1``) or a Hugging Face
``config.json`` (recognised by ``model_type``); or a folder holding a HF
``config.json`` (a checkpoint folder). Anything else is an ``IRError`` that
lists what is accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from megakernel.errors import IRError, error_context, shown
from megakernel.ir import sizes
from megakernel.ir.config import build
from megakernel.ir.graph import Model
from megakernel.ir.jsonfile import read_json
from megakernel.ir.serialize import CARD_FORMAT, IR_FORMAT, model_from_dict
from megakernel.ir.types import DType
from megakernel.models import zoo
from megakernel.models.cards import card_from_dict
from megakernel.models.hf import from_hf


def _accepted() -> str:
    return (f"a zoo name ({', '.join(zoo.names())}), a {CARD_FORMAT} or {IR_FORMAT} "
            "JSON file, a Hugging Face config.json, or a folder holding one")


def load_model(source: str | Path, *, dtype: str | None = None) -> Model:
    """The model named by ``source`` (see the module docstring); ``dtype``, when
    given, replaces the storage dtype of weights and KV caches."""
    text = str(source)
    path = Path(source)
    kind = "zoo" if isinstance(source, str) and text in zoo.names() else _kind(path)
    if kind == "zoo":
        model = zoo.model(text)
    elif kind == "folder":
        model = build(from_hf(path, dtype=dtype))
    elif kind == "file":
        model = _from_json_file(path, dtype)
    else:
        close = difflib.get_close_matches(text, zoo.names(), n=1)
        if close:   # a near miss of a zoo name: say which, not the whole list
            raise IRError(f"{shown(text)} is neither a zoo name nor an existing file or "
                          f"folder with a config.json; did you mean {close[0]!r}?",
                          path="load", hint="`megakernel list` shows every zoo model")
        raise IRError(f"{shown(text)} is neither a zoo name nor an existing file or folder "
                      "with a config.json", path="load", hint=f"give {_accepted()}")
    if dtype is not None:
        model = dataclasses.replace(model, dtype=DType.parse(dtype))
        sizes.check_fits(sizes.of_model(model), path="model")   # f32 doubles the bytes
    return model


def _kind(path: Path) -> str:
    """"folder" (with a config.json), "file", or "" for anything else."""
    try:
        if path.is_dir() and (path / "config.json").is_file():
            return "folder"
        return "file" if path.is_file() else ""
    except (OSError, ValueError) as err:
        # e.g. a name too long for the file system, or a NUL byte in it
        # strerror, not str(err): the latter repeats the (long) path
        reason = getattr(err, "strerror", None) or str(err)
        raise IRError(f"cannot look at {shown(str(path))}: {shown(reason)}", path="load",
                      hint=f"give {_accepted()}") from None


def _from_json_file(path: Path, dtype: str | None) -> Model:
    try:
        data = read_json(path)
    except IRError as err:
        raise IRError(err.message, path=err.path,
                      hint=f"{err.hint}; give {_accepted()}" if err.hint else
                      f"give {_accepted()}") from None
    if not isinstance(data, dict):
        raise IRError(f"expected a JSON object, found {type(data).__name__}",
                      path=str(path), hint=f"give {_accepted()}")
    if data.get("format") == CARD_FORMAT:
        card = card_from_dict(data, source=path.name)
        with error_context(path.name):
            return build(card)
    if data.get("format") == IR_FORMAT:
        with error_context(path.name):
            return model_from_dict(data)
    if "model_type" in data:
        # dtype goes in here too: the file's own dtype may be one we only convert from.
        return build(from_hf(path, dtype=dtype))
    raise IRError(f"format={shown(data.get('format'))} and no model_type: not a model "
                  "description this project reads", path=str(path),
                  hint=f"give {_accepted()}")


def shipped_notes(source: str | Path) -> list[str]:
    """What loading the pre-quantized checkpoint ``source`` (a folder or its
    config.json) does differently from its ``quantization_config``: one line
    per weight kind whose shipped format the kernel cannot hold, dequantized
    on load (models/shipped_view.py ``card_table``); [] for anything else."""
    from megakernel.models import shipped, shipped_view

    path = Path(source)
    path = path / "config.json" if path.is_dir() else path
    if isinstance(source, str) and source in zoo.names() or not path.is_file():
        return []
    data = read_json(path, error=IRError)
    config = data.get("quantization_config") if isinstance(data, dict) else None
    if config is None:
        return []
    plain = {k: v for k, v in data.items() if k != "quantization_config"}
    model = build(from_hf(plain))
    return shipped_view.card_table(shipped.read(config), model, data)[1]
