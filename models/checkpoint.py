"""Load a local Hugging Face safetensors checkpoint into IR-named weights.

A checkpoint folder holds ``config.json`` and either ``model.safetensors`` or
shards listed in ``model.safetensors.index.json``. Every IR weight
(``Model.params()``) is taken from the HF tensors named in the table of the
folder's ``model_type`` (models/checkpoint_names.py), reshaped by its rule in
``_RULES``: HF linears are [out, in] and IR ones [in, out]; MoE experts are
stacked to [E, ...]. Experts
may be stored one tensor per expert or fused (transformers 5.x:
``experts.gate_up_proj`` [E, 2I, H] with gate first, ``experts.down_proj``
[E, H, I]; the [in, out] orientation is recognised by shape too, and when both
orientations have the same shape the 5.x one is assumed). Every weight must be
found with its shape, and every tensor of the files must be used.

Files are untrusted data (``models/tensor_files.py``): headers, offsets and
shard paths are checked before any tensor is read, integer or 8-bit tensors
are refused where a float weight is expected, NaN or infinite values are
errors naming the tensor, and float16, bfloat16, float32 and float64 tensors
are converted to the model's dtype. A checkpoint whose config.json has a
``quantization_config`` (DeepSeek fp8, compressed-tensors pack-quantized) is
read as shipped (models/shipped.py, models/shipped_view.py): the weights its
modules ship quantized keep their codes and scales.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from megakernel.quantize import Packed, quantize_weights
from megakernel.errors import ConfigError, shown
from megakernel.ir.graph import Model
from megakernel.ir.jsonfile import read_json
from megakernel.ir.types import DType, ParamSpec
from megakernel.models import hf_deepseek, shipped, shipped_view
from megakernel.models.checkpoint_families import family_tables
from megakernel.models.checkpoint_hybrid import LAYER_RULES
from megakernel.models.checkpoint_names import LAYER_PREFIX, PREFIXES, Source, weight_sources
from megakernel.models.hf import from_hf, supported
from megakernel.models.tensor_files import TensorFiles as _Files


# Derived buffers some older checkpoints carry; recomputed from the config.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# a decoder layer's tensors, under any family's prefix ("model.layers.3.", a
# vision-language checkpoint's "model.language_model.layers.3.")
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _fused_gate_up(files: _Files, name: str, spec: ParamSpec, half: int) -> np.ndarray:
    e, h, i = spec.shape
    shape = files.shape(name)
    if shape == (e, 2 * i, h):          # [E, 2I, H]: 5.x, [out, in] per expert
        return files.get(name)[:, half * i:(half + 1) * i, :].transpose(0, 2, 1)
    if shape == (e, h, 2 * i):          # [E, H, 2I]: [in, out] per expert
        return files.get(name)[:, :, half * i:(half + 1) * i]
    raise _shape_error(name, shape, f"[E, 2I, H] = {[e, 2 * i, h]} or [E, H, 2I]")


def _fused_down(files: _Files, name: str, spec: ParamSpec) -> np.ndarray:
    e, i, h = spec.shape
    shape = files.shape(name)
    if shape == (e, h, i):
        return files.get(name).transpose(0, 2, 1)
    if shape == (e, i, h):
        return files.get(name)
    raise _shape_error(name, shape, f"[E, H, I] = {[e, h, i]} or [E, I, H]")


def _fused_rows(files: _Files, name: str, spec: ParamSpec, part: str) -> np.ndarray:
    """One part of an HF [out, in] tensor fused along its rows, as IR [in, out]:
    q | k | v (k and v equally wide) or gate | up (halves)."""
    fan_in, width = spec.shape
    rows, cols = files.shape(name)
    if cols != fan_in:
        raise _shape_error(name, (rows, cols), f"[rows, {fan_in}]")
    start = {"q": 0, "k": rows - 2 * width, "v": rows - width, "gate": 0, "up": width}[part]
    fits = {"gate": rows == 2 * width, "up": rows == 2 * width,
            "q": rows > width and (rows - width) % 2 == 0}.get(part, rows > 2 * width)
    if not fits:
        raise _shape_error(name, (rows, cols), f"{part} rows of {width} within "
                           + ("gate|up" if part in ("gate", "up") else "q|k|v"))
    return files.get(name)[start:start + width].T


def _interleaved(files: _Files, name: str, spec: ParamSpec, parity: int) -> np.ndarray:
    """Columns ``parity::2`` of an [..., 2n] tensor whose last axis alternates two
    parts (gpt-oss: gate even, up odd)."""
    _expect(files, name, (*spec.shape[:-1], 2 * spec.shape[-1]))
    return files.get(name)[..., parity::2]


def _experts(files: _Files, name: str, spec: ParamSpec) -> np.ndarray:
    out = []
    for e in range(spec.shape[0]):
        n = name.format(e=e)
        if not files.has(n):
            raise ConfigError(f"expert tensor {n} is missing", path="checkpoint")
        _expect(files, n, spec.shape[:0:-1])
        out.append(files.get(n).T)
    return np.stack(out)


def _expect(files: _Files, name: str, shape: tuple[int, ...]) -> None:
    found = files.shape(name)
    if found != tuple(shape):
        raise _shape_error(name, found, list(shape))


def _shape_error(name, found, expected) -> ConfigError:
    return ConfigError(f"{name} has shape {list(found)}, expected {expected}",
                       path="checkpoint")


_RULES = {
    "copy": lambda f, n, s: (_expect(f, n, s.shape), f.get(n))[1],
    "T": lambda f, n, s: (_expect(f, n, s.shape[::-1]), f.get(n).T)[1],
    "experts_T": _experts,
    "fused_gate": lambda f, n, s: _fused_gate_up(f, n, s, 0),
    "fused_up": lambda f, n, s: _fused_gate_up(f, n, s, 1),
    "fused_down": _fused_down,
    **{f"rows_{p}": (lambda f, n, s, p=p: _fused_rows(f, n, s, p))
       for p in ("q", "k", "v", "gate", "up")},
    "even": lambda f, n, s: _interleaved(f, n, s, 0),
    "odd": lambda f, n, s: _interleaved(f, n, s, 1),
    **hf_deepseek.RULES,        # DeepSeek's rope permutation and kv_b_proj split
}
# Rules that also need the IR layer the weight belongs to (head counts of a fused
# or interleaved tensor), (files, name, spec, layer) -> array, are LAYER_RULES
# (models/checkpoint_hybrid.py).



def load_checkpoint(path: str | Path, model: Model | None = None, *,
                    dtype: str | DType | None = None,
                    first_layers: int | None = None) -> dict[str, np.ndarray]:
    """IR-named numpy weights of the checkpoint folder ``path``, in
    ``model.params()`` order, cast to ``dtype`` (default: the model's; weights
    the IR keeps in float32 stay float32); weights the model quantizes come
    back quantized (``quantize.Packed``): as shipped when the checkpoint ships
    them in that format, else rounded from the checkpoint's values. ``model``
    defaults to the folder's config.json imported with ``from_hf``.
    ``first_layers``: ``model`` is the checkpoint's model cut to its first K
    layers (``--layers``), so the tensors of later layers are left unread."""
    folder = Path(path)
    config = read_json(folder / "config.json", error=ConfigError)
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or model_type not in supported():
        raise ConfigError(f"model_type={shown(model_type)} is not supported; supported: "
                          f"{supported()}", path=str(folder / "config.json"))
    if model is None:
        from megakernel.ir.config import build

        model = build(from_hf(folder, dtype=None if dtype is None else DType.parse(dtype).value))
    target = DType.parse(dtype) if dtype is not None else model.dtype
    files = _Files(folder)
    names, ignored = family_tables(model_type, config, model)
    scheme = None
    if config.get("quantization_config") is not None:
        scheme = shipped.read(config["quantization_config"],
                              path=f"{folder / 'config.json'}: quantization_config")
        kinds = shipped_view.weight_kinds(model)
    weights = {}
    for weight, spec in model.params().items():
        keep = spec.dtype if spec.dtype != model.dtype else target
        if scheme is None:
            array = _load_one(files, model_type, names, weight, spec, model)
        else:
            array = shipped_view.load(
                files, scheme, weight, kinds.get(weight), spec, keep.value,
                lambda view, s, w=weight: _load_one(view, model_type, names, w, s, model))
        weights[weight] = array if isinstance(array, Packed) else np.asarray(array, keep.np)
    _check_leftovers(files, model, weights, ignored, () if scheme is None else scheme.unread,
                     first_layers)
    # Quantize on load: weights whose kind the model's quantize table names
    # are rounded to their format (megakernel/quantize.py).
    return quantize_weights(model, weights, target)


def _load_one(files: _Files, model_type: str, names: dict, weight: str, spec: ParamSpec,
              model: Model) -> np.ndarray:
    sources, layer = weight_sources(names, weight)
    prefixes = ("",) if layer is None else tuple(
        p.format(i=layer) for p in PREFIXES.get(model_type, (LAYER_PREFIX,)))
    tried = []
    for prefix in prefixes:
        for src in sources:
            name = prefix + src.name
            probe = name.format(e=0) if "{e}" in name else name
            tried.append(probe)
            if files.has(probe):
                return _apply(src, files, name, spec, weight,
                              None if layer is None else model.layers[layer])
    raise ConfigError(f"no tensor for this weight of shape {list(spec.shape)}; looked for "
                      f"{tried or 'nothing (no HF name known for it)'}", path=weight,
                      hint="is the checkpoint for this model and model_type?")


def _apply(src: Source, files: _Files, name: str, spec: ParamSpec, weight: str, layer):
    try:
        if src.rule in LAYER_RULES:
            return LAYER_RULES[src.rule](files, name, spec, layer)
        return _RULES[src.rule](files, name, spec, *src.args)
    except ConfigError as err:
        raise ConfigError(err.message, path=weight, hint=err.hint) from None


def _cut_off(name: str, first_layers: int | None) -> bool:
    """Whether tensor ``name`` belongs to a layer past a cut's first layers."""
    hit = _LAYER_INDEX.search(name) if first_layers is not None else None
    return bool(hit) and int(hit.group(1)) >= first_layers


def _check_leftovers(files: _Files, model: Model, weights: dict[str, np.ndarray],
                     ignored: tuple[str, ...] = (), unread: tuple[str, ...] = (),
                     first_layers: int | None = None) -> None:
    left = sorted(n for n in set(files.tensors) - files.used
                  if not n.endswith(_IGNORED_SUFFIXES + unread) and not n.startswith(ignored)
                  and not _cut_off(n, first_layers))
    if model.tie_embeddings and "lm_head.weight" in left:
        # Some tied checkpoints store the head anyway; it must be the embedding.
        if np.array_equal(files.get("lm_head.weight"), files.get("model.embed_tokens.weight")):
            left.remove("lm_head.weight")
    if left:
        shown = ", ".join(f"{n} {list(files.shape(n))}" for n in left[:20])
        more = f" and {len(left) - 20} more" if len(left) > 20 else ""
        raise ConfigError(f"{len(left)} tensors are not used by the model: {shown}{more}",
                          path="checkpoint", hint="the checkpoint has weights the IR "
                          "model does not (a different architecture or config?)")
