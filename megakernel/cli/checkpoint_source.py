"""Where ``generate`` gets its weights and end ids: the checkpoint it is given.

An HF checkpoint folder (or its config.json) is decoded with the folder's own
weights (``models.checkpoint.load_checkpoint``: safetensors, sharded or not,
quantized formats as shipped) and stops a row at the checkpoint's end ids
(``generation_config.json``'s ``eos_token_id``, else config.json's), as
transformers' ``generate`` does. Seeded random weights are used only when
asked for by name (``--random-weights``): a zoo card or an IR file has no
weights, and saying so beats decoding noise that looks like an answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from megakernel.errors import CheckError, ConfigError, shown

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"


@dataclass(frozen=True)
class Weights:
    arrays: dict            # IR-named weights (numpy, quantize.Packed where quantized)
    label: str              # what they are, for the output line
    folder: Path | None     # the checkpoint folder, when they come from one


def checkpoint_folder(source: str) -> Path | None:
    """The HF checkpoint folder ``source`` names (the folder, or its
    config.json), or None for a zoo card or an IR file."""
    path = Path(source)
    try:
        if path.is_dir() and (path / "config.json").is_file():
            return path
        if path.name == "config.json" and path.is_file():
            return path.parent
    except (OSError, ValueError):
        return None     # load_model has already named what is wrong with it
    return None


def weights_folder(source: str, *, random_weights: bool) -> Path | None:
    """The checkpoint folder whose weights ``generate`` decodes (None with
    random weights); an error, before anything is loaded, when ``source``
    has no weights and random ones were not asked for."""
    if random_weights:
        return None
    folder = checkpoint_folder(source)
    if folder is None:
        raise CheckError(f"{shown(source)} is a model description without weights",
                         path="generate.model",
                         hint="give a Hugging Face checkpoint folder, or pass "
                              "--random-weights to decode seeded random weights")
    if not ((folder / SINGLE).exists() or (folder / INDEX).exists()):
        raise CheckError(f"{shown(str(folder))} holds a config.json but no {SINGLE} or {INDEX}",
                         path="generate.model",
                         hint="give the folder with the checkpoint's weights, or pass "
                              "--random-weights to decode seeded random weights")
    return folder


def load(folder: Path | None, model, seed: int, *, first_layers: int | None = None) -> Weights:
    """The checkpoint's weights (``folder``), or seeded random ones (None);
    ``first_layers``: the model is the checkpoint's cut to that many layers."""
    if folder is None:
        from megakernel.models.weights import init_weights

        return Weights(init_weights(model, seed), f"random weights, seed {seed}", None)
    from megakernel.models.checkpoint import load_checkpoint

    return Weights(load_checkpoint(folder, model, first_layers=first_layers),
                   f"checkpoint weights of {folder}", folder)


def end_ids(folder: Path | None, vocab_size: int) -> tuple[int, ...]:
    """The checkpoint's end-of-sequence ids: ``generation_config.json``'s
    ``eos_token_id`` where the folder has one (transformers reads it first),
    else config.json's; () when neither names one."""
    from megakernel.ir.jsonfile import read_json

    if folder is None:
        return ()
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if not path.is_file():
            continue
        data = read_json(path, error=ConfigError)
        if not isinstance(data, dict):
            raise ConfigError(f"expected a JSON object, found {type(data).__name__}",
                              path=str(path))
        cfg = data.get("text_config") if "eos_token_id" not in data else data
        value = cfg.get("eos_token_id") if isinstance(cfg, dict) else None
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(type(i) is int and 0 <= i < vocab_size for i in ids):
            raise ConfigError(f"eos_token_id={shown(value)}: expected a token id or a list of "
                              f"token ids in [0, {vocab_size})", path=f"{path}: eos_token_id",
                              hint="fix the id, or pass --end-id to choose one")
        return tuple(dict.fromkeys(ids))
    return ()
